#include <kvpool/block_key.h>

#include <openssl/sha.h>

#include <cstring>

namespace kvpool {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

BlockKey Sha256(std::string_view data) {
  BlockKey out;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.bytes.data());
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string BlockKey::ToHex() const {
  std::string s(kSize * 2, '0');
  for (size_t i = 0; i < kSize; ++i) {
    s[2 * i] = kHexDigits[bytes[i] >> 4];
    s[2 * i + 1] = kHexDigits[bytes[i] & 0xf];
  }
  return s;
}

std::string BlockKey::ShortHex() const { return ToHex().substr(0, 16); }

Result<BlockKey> BlockKey::FromHex(std::string_view hex) {
  if (hex.size() != kSize * 2) {
    return Status::InvalidArgument("block key must be 64 hex characters, got " +
                                   std::to_string(hex.size()));
  }
  BlockKey k;
  for (size_t i = 0; i < kSize; ++i) {
    int hi = HexValue(hex[2 * i]);
    int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Status::InvalidArgument("block key has a non-hex character");
    k.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return k;
}

Result<BlockKey> BlockKey::FromBytes(std::string_view raw) {
  if (raw.size() != kSize) {
    return Status::InvalidArgument("block key must be 32 bytes, got " + std::to_string(raw.size()));
  }
  BlockKey k;
  std::memcpy(k.bytes.data(), raw.data(), kSize);
  return k;
}

bool BlockKey::IsZero() const {
  for (uint8_t b : bytes) {
    if (b != 0) return false;
  }
  return true;
}

BlockKey NamespaceSalt(std::string_view namespace_secret) { return Sha256(namespace_secret); }

BlockKey LayoutFingerprint(std::string_view layout) { return Sha256(layout); }

ChainHasher::ChainHasher(std::string_view namespace_secret, std::string_view layout,
                         uint32_t tokens_per_block)
    : salt_(NamespaceSalt(namespace_secret)),
      layout_fp_(LayoutFingerprint(layout)),
      tokens_per_block_(tokens_per_block) {}

std::vector<BlockKey> ChainHasher::Hash(std::span<const int32_t> tokens,
                                        const BlockKey& parent) const {
  std::vector<BlockKey> keys;
  if (tokens_per_block_ == 0) return keys;
  const size_t blocks = tokens.size() / tokens_per_block_;
  keys.reserve(blocks);
  // One buffer per block: prev key, salt, layout fingerprint, then the tokens (LE int32).
  std::vector<uint8_t> buf(3 * BlockKey::kSize + 4 * static_cast<size_t>(tokens_per_block_));
  std::memcpy(buf.data() + BlockKey::kSize, salt_.bytes.data(), BlockKey::kSize);
  std::memcpy(buf.data() + 2 * BlockKey::kSize, layout_fp_.bytes.data(), BlockKey::kSize);
  BlockKey prev = parent;
  for (size_t b = 0; b < blocks; ++b) {
    std::memcpy(buf.data(), prev.bytes.data(), BlockKey::kSize);
    uint8_t* out = buf.data() + 3 * BlockKey::kSize;
    for (uint32_t t = 0; t < tokens_per_block_; ++t) {
      const uint32_t v = static_cast<uint32_t>(tokens[b * tokens_per_block_ + t]);
      out[4 * t] = static_cast<uint8_t>(v);
      out[4 * t + 1] = static_cast<uint8_t>(v >> 8);
      out[4 * t + 2] = static_cast<uint8_t>(v >> 16);
      out[4 * t + 3] = static_cast<uint8_t>(v >> 24);
    }
    BlockKey k;
    SHA256(buf.data(), buf.size(), k.bytes.data());
    keys.push_back(k);
    prev = k;
  }
  return keys;
}

std::string LayoutSpec::ToCanonicalString() const {
  return "model=" + model + ";dtype=" + dtype + ";layers=" + std::to_string(layers) +
         ";kv_heads=" + std::to_string(kv_heads) + ";head_dim=" + std::to_string(head_dim) +
         ";tokens_per_block=" + std::to_string(tokens_per_block) +
         ";tp_rank=" + std::to_string(tp_rank) + ";tp_size=" + std::to_string(tp_size) +
         ";encoding=" + encoding;
}

}  // namespace kvpool
