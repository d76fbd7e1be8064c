// Block keys against the spec's known-answer vectors (spec/block-keys.md, computed with
// Python's hashlib), plus chain extension, hex parsing and the canonical layout string.

#include <kvpool/block_key.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace kvpool {
namespace {

nlohmann::json LoadVectors() {
  std::ifstream in(KVPOOL_KEY_VECTORS);
  EXPECT_TRUE(in.good()) << "cannot open " << KVPOOL_KEY_VECTORS;
  nlohmann::json j;
  in >> j;
  return j;
}

std::vector<int32_t> TokensOf(const nlohmann::json& c) {
  std::vector<int32_t> tokens;
  for (const auto& t : c.at("tokens")) tokens.push_back(t.get<int32_t>());
  return tokens;
}

TEST(BlockKeyTest, ReproducesEveryKnownAnswerVector) {
  const nlohmann::json vectors = LoadVectors();
  const auto& cases = vectors.at("cases");
  ASSERT_GE(cases.size(), 7u);
  size_t keys_checked = 0;
  for (const auto& c : cases) {
    const std::string name = c.at("name");
    SCOPED_TRACE(name);
    const std::string secret = c.at("namespace_secret");
    const std::string layout = c.at("layout");
    const uint32_t tpb = c.at("tokens_per_block");

    EXPECT_EQ(NamespaceSalt(secret).ToHex(), c.at("namespace_salt_hex").get<std::string>());
    EXPECT_EQ(LayoutFingerprint(layout).ToHex(), c.at("layout_fingerprint_hex").get<std::string>());

    const ChainHasher hasher(secret, layout, tpb);
    EXPECT_EQ(hasher.tokens_per_block(), tpb);
    EXPECT_EQ(hasher.salt().ToHex(), c.at("namespace_salt_hex").get<std::string>());
    EXPECT_EQ(hasher.layout_fingerprint().ToHex(),
              c.at("layout_fingerprint_hex").get<std::string>());

    const std::vector<int32_t> tokens = TokensOf(c);
    const std::vector<BlockKey> keys = hasher.Hash(tokens);
    const auto& expected = c.at("keys_hex");
    ASSERT_EQ(keys.size(), expected.size());
    EXPECT_EQ(keys.size(), tokens.size() / tpb);  // a partial tail gets no key
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::string want = expected[i];
      EXPECT_EQ(keys[i].ToHex(), want) << "key " << i;
      // Byte for byte, not only through ToHex.
      Result<BlockKey> parsed = BlockKey::FromHex(want);
      ASSERT_TRUE(parsed.ok());
      EXPECT_EQ(keys[i].bytes, parsed->bytes) << "key " << i;
      ++keys_checked;
    }
  }
  EXPECT_GT(keys_checked, 15u);
}

TEST(BlockKeyTest, ExtendingAParentChainEqualsHashingAllAtOnce) {
  const nlohmann::json vectors = LoadVectors();
  for (const auto& c : vectors.at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const uint32_t tpb = c.at("tokens_per_block");
    const ChainHasher hasher(c.at("namespace_secret").get<std::string>(),
                             c.at("layout").get<std::string>(), tpb);
    const std::vector<int32_t> tokens = TokensOf(c);
    const std::vector<BlockKey> all = hasher.Hash(tokens);
    // Split at every block boundary: the second part continues from the first's last key.
    for (size_t split_blocks = 1; split_blocks < all.size(); ++split_blocks) {
      const size_t split = split_blocks * tpb;
      std::span<const int32_t> span(tokens);
      const std::vector<BlockKey> first = hasher.Hash(span.subspan(0, split));
      ASSERT_EQ(first.size(), split_blocks);
      const std::vector<BlockKey> second = hasher.Hash(span.subspan(split), first.back());
      std::vector<BlockKey> joined = first;
      joined.insert(joined.end(), second.begin(), second.end());
      EXPECT_EQ(joined, all) << "split after block " << split_blocks;
    }
  }
}

TEST(BlockKeyTest, ExplicitZeroParentEqualsNewChain) {
  const ChainHasher hasher("tenant-a", "x", 4);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(hasher.Hash(tokens, BlockKey{}), hasher.Hash(tokens));
}

TEST(BlockKeyTest, ParentChangesEveryKey) {
  const ChainHasher hasher("tenant-a", "x", 4);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  BlockKey parent;
  parent.bytes[31] = 1;
  const auto a = hasher.Hash(tokens);
  const auto b = hasher.Hash(tokens, parent);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_NE(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
}

TEST(BlockKeyTest, EmptyInputAndZeroBlockSizeGiveNoKeys) {
  const ChainHasher hasher("s", "x", 16);
  EXPECT_TRUE(hasher.Hash(std::vector<int32_t>{}).empty());
  const ChainHasher zero("s", "x", 0);
  EXPECT_TRUE(zero.Hash(std::vector<int32_t>{1, 2, 3}).empty());
}

TEST(BlockKeyTest, HexRoundTrip) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100; ++i) {
    BlockKey k;
    for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
    const std::string hex = k.ToHex();
    ASSERT_EQ(hex.size(), 64u);
    for (char c : hex) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << hex;
    Result<BlockKey> back = BlockKey::FromHex(hex);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, k);
    EXPECT_EQ(k.ShortHex(), hex.substr(0, 16));
    Result<BlockKey> raw = BlockKey::FromBytes(k.AsStringView());
    ASSERT_TRUE(raw.ok());
    EXPECT_EQ(*raw, k);
  }
}

TEST(BlockKeyTest, FromHexAcceptsUpperCase) {
  const std::string lower = "3eb998f0f9461d6e9ac076dc8097f0f10028f81958fab78ad9c717b7876154f2";
  std::string upper = lower;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  Result<BlockKey> a = BlockKey::FromHex(lower);
  Result<BlockKey> b = BlockKey::FromHex(upper);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(b->ToHex(), lower);
}

TEST(BlockKeyTest, FromHexRejectsBadInput) {
  const std::string good(64, 'a');
  EXPECT_TRUE(BlockKey::FromHex(good).ok());
  const std::vector<std::string> bad = {
      "",
      std::string(63, 'a'),
      std::string(65, 'a'),
      std::string(32, 'a'),
      std::string(128, 'a'),
      std::string(63, 'a') + "g",
      "g" + std::string(63, 'a'),
      std::string(62, 'a') + " a",
      std::string(62, 'a') + "0x",
      std::string(63, 'a') + '\0',
      std::string(63, 'a') + "-",
      std::string(63, 'a') + "\xff",
  };
  for (const std::string& s : bad) {
    Result<BlockKey> r = BlockKey::FromHex(s);
    EXPECT_FALSE(r.ok()) << "accepted '" << s << "'";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(BlockKeyTest, FromBytesRejectsOtherLengths) {
  for (size_t n : {0, 1, 31, 33, 64}) {
    Result<BlockKey> r = BlockKey::FromBytes(std::string(n, 'x'));
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(BlockKeyTest, IsZeroAndOrdering) {
  BlockKey zero;
  EXPECT_TRUE(zero.IsZero());
  BlockKey one;
  one.bytes[31] = 1;
  EXPECT_FALSE(one.IsZero());
  EXPECT_LT(zero, one);
  EXPECT_NE(zero, one);
  EXPECT_EQ(zero.ToHex(), std::string(64, '0'));
}

TEST(BlockKeyTest, LayoutSpecMatchesTheVectorsLayoutString) {
  LayoutSpec spec;
  spec.model = "llama-3-8b";
  spec.dtype = "bf16";
  spec.layers = 32;
  spec.kv_heads = 8;
  spec.head_dim = 128;
  spec.tokens_per_block = 16;
  spec.tp_rank = 0;
  spec.tp_size = 1;
  spec.encoding = "raw";
  const std::string canonical = spec.ToCanonicalString();

  const nlohmann::json vectors = LoadVectors();
  std::set<std::string> llama_layouts;
  for (const auto& c : vectors.at("cases")) {
    const std::string layout = c.at("layout");
    if (layout.rfind("model=llama-3-8b;", 0) == 0) llama_layouts.insert(layout);
  }
  ASSERT_TRUE(llama_layouts.count(canonical)) << canonical;
  EXPECT_EQ(LayoutFingerprint(canonical).ToHex(),
            "f4574deb77df43cd7f5f364e4a635b835fd9f46c8b3fb80a91cd6128e804e84e");

  spec.encoding = "int8";
  const std::string int8 = spec.ToCanonicalString();
  EXPECT_TRUE(llama_layouts.count(int8)) << int8;
  EXPECT_EQ(LayoutFingerprint(int8).ToHex(),
            "770343f33d2dc89912eeab2f728e59f2d44aab8b21a179784cb51a865a34cec0");
}

TEST(BlockKeyTest, LayoutSpecNamesFieldsInTheSpecOrder) {
  LayoutSpec spec;
  spec.model = "m";
  spec.dtype = "fp16";
  spec.layers = 1;
  spec.kv_heads = 2;
  spec.head_dim = 3;
  spec.tokens_per_block = 4;
  spec.tp_rank = 5;
  spec.tp_size = 6;
  spec.encoding = "fp8_e4m3";
  EXPECT_EQ(spec.ToCanonicalString(),
            "model=m;dtype=fp16;layers=1;kv_heads=2;head_dim=3;tokens_per_block=4;tp_rank=5;"
            "tp_size=6;encoding=fp8_e4m3");
  // Any change of a field changes the fingerprint.
  LayoutSpec other = spec;
  other.tp_rank = 4;
  EXPECT_NE(LayoutFingerprint(spec.ToCanonicalString()),
            LayoutFingerprint(other.ToCanonicalString()));
}

TEST(BlockKeyTest, HashFunctorUsesKeyBytes) {
  BlockKey a;
  BlockKey b;
  b.bytes[0] = 1;
  EXPECT_NE(BlockKeyHash()(a), BlockKeyHash()(b));
  EXPECT_EQ(BlockKeyHash()(a), BlockKeyHash()(BlockKey{}));
}

}  // namespace
}  // namespace kvpool
