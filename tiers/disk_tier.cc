#include "tiers/disk_tier.h"

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"

namespace kvpool::tiers {
namespace {

constexpr uint32_t kBodyMagic = 0x4B565042;  // "BPVK"
constexpr size_t kBodyHeaderBytes = 20;
// Version 1: {1, size, checksum, parent}. Version 2 (a body stored encoded) adds
// {encoding, stored size, stored checksum}; raw blocks are still written as version 1.
constexpr uint8_t kMetaVersion1 = 1;
constexpr uint8_t kMetaVersion2 = 2;
constexpr size_t kMetaBytes = 1 + 8 + 8 + BlockKey::kSize;
constexpr size_t kMetaLayoutBytes = 4 * 4 + 1;  // layers, kv heads, head dim, tokens, dtype
constexpr size_t kMetaBytesV2 = kMetaBytes + 1 + 8 + 8 + kMetaLayoutBytes;

void PutLe(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetLe(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

std::string EncodeMeta(const DiskBlockMeta& m) {
  const bool v2 = m.encoding != 0;
  std::string s(v2 ? kMetaBytesV2 : kMetaBytes, '\0');
  auto* p = reinterpret_cast<uint8_t*>(s.data());
  p[0] = v2 ? kMetaVersion2 : kMetaVersion1;
  PutLe(p + 1, m.size, 8);
  PutLe(p + 9, m.checksum, 8);
  std::memcpy(p + 17, m.parent.bytes.data(), BlockKey::kSize);
  if (v2) {
    p[kMetaBytes] = m.encoding;
    PutLe(p + kMetaBytes + 1, m.stored_size, 8);
    PutLe(p + kMetaBytes + 9, m.stored_checksum, 8);
    uint8_t* l = p + kMetaBytes + 17;
    PutLe(l, static_cast<uint32_t>(m.layout.num_layers), 4);
    PutLe(l + 4, static_cast<uint32_t>(m.layout.num_kv_heads), 4);
    PutLe(l + 8, static_cast<uint32_t>(m.layout.head_dim), 4);
    PutLe(l + 12, static_cast<uint32_t>(m.layout.tokens), 4);
    l[16] = static_cast<uint8_t>(m.layout.dtype);
  }
  return s;
}

bool DecodeMeta(std::string_view v, DiskBlockMeta* m) {
  if (v.empty()) return false;
  const uint8_t version = static_cast<uint8_t>(v[0]);
  if (!(version == kMetaVersion1 && v.size() == kMetaBytes) &&
      !(version == kMetaVersion2 && v.size() == kMetaBytesV2)) {
    return false;
  }
  auto* p = reinterpret_cast<const uint8_t*>(v.data());
  m->size = GetLe(p + 1, 8);
  m->checksum = GetLe(p + 9, 8);
  std::memcpy(m->parent.bytes.data(), p + 17, BlockKey::kSize);
  m->encoding = 0;
  m->stored_size = 0;
  m->stored_checksum = 0;
  if (version == kMetaVersion2) {
    m->encoding = p[kMetaBytes];
    m->stored_size = GetLe(p + kMetaBytes + 1, 8);
    m->stored_checksum = GetLe(p + kMetaBytes + 9, 8);
    const uint8_t* l = p + kMetaBytes + 17;
    m->layout.num_layers = static_cast<int>(GetLe(l, 4));
    m->layout.num_kv_heads = static_cast<int>(GetLe(l + 4, 4));
    m->layout.head_dim = static_cast<int>(GetLe(l + 8, 4));
    m->layout.tokens = static_cast<int>(GetLe(l + 12, 4));
    m->layout.dtype = static_cast<kernels::DType>(l[16]);
    m->layout.encoding = static_cast<kernels::Encoding>(m->encoding);
    if (m->encoding == 0 || !kernels::ValidateBlockLayout(m->layout).ok()) return false;
  }
  return true;
}

bool DecodeKey(std::string_view raw, NamespaceId* ns, BlockKey* key) {
  if (raw.size() != 4 + BlockKey::kSize) return false;
  auto* p = reinterpret_cast<const uint8_t*>(raw.data());
  *ns = static_cast<NamespaceId>(p[0]) << 24 | p[1] << 16 | p[2] << 8 | p[3];
  std::memcpy(key->bytes.data(), p + 4, BlockKey::kSize);
  return true;
}

}  // namespace

std::string DiskTier::EncodeKey(NamespaceId ns, const BlockKey& key) {
  // Big-endian namespace first: one namespace's blocks are contiguous in the LSM.
  std::string s(4 + BlockKey::kSize, '\0');
  s[0] = static_cast<char>(ns >> 24);
  s[1] = static_cast<char>(ns >> 16);
  s[2] = static_cast<char>(ns >> 8);
  s[3] = static_cast<char>(ns);
  std::memcpy(s.data() + 4, key.bytes.data(), BlockKey::kSize);
  return s;
}

DiskTier::DiskTier(RocksStore& store) : store_(store) {}

Status DiskTier::Write(std::span<const DiskWrite> blocks, bool sync) {
  rocksdb::WriteBatch batch;
  for (const DiskWrite& w : blocks) {
    const std::string key = EncodeKey(w.ns, w.key);
    uint8_t header[kBodyHeaderBytes];
    PutLe(header, kBodyMagic, 4);
    PutLe(header + 4, w.meta.body_size(), 8);
    PutLe(header + 12, w.meta.body_checksum(), 8);
    // The batch copies header and body once into its buffer: no intermediate string.
    const rocksdb::Slice key_slice(key);
    const rocksdb::Slice parts[2] = {
        rocksdb::Slice(reinterpret_cast<const char*>(header), kBodyHeaderBytes),
        rocksdb::Slice(reinterpret_cast<const char*>(w.data), w.meta.body_size())};
    KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(batch.Put(
        store_.blocks(), rocksdb::SliceParts(&key_slice, 1), rocksdb::SliceParts(parts, 2))));
    KVPOOL_RETURN_IF_ERROR(
        KVPOOL_ROCKS_STATUS(batch.Put(store_.block_meta(), key, EncodeMeta(w.meta))));
  }
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  return KVPOOL_ROCKS_STATUS(store_.db()->Write(wo, &batch));
}

uint64_t DiskTier::bytes_on_device() const { return store_.FilesBytes(); }

std::optional<uint64_t> DiskTier::free_bytes() const { return store_.FreeBytes(); }

uint64_t DiskTier::memory_bytes() const { return store_.MemoryBytes(); }

std::unique_ptr<PendingRead> DiskTier::StartRead(NamespaceId ns, const BlockKey& key,
                                                 const DiskBlockMeta& expected,
                                                 uint8_t* dst) const {
  return std::make_unique<ReadyRead>(ReadNow(ns, key, expected, dst));
}

Status DiskTier::ReadNow(NamespaceId ns, const BlockKey& key, const DiskBlockMeta& expected,
                         uint8_t* dst) const {
  rocksdb::PinnableSlice value;
  rocksdb::ReadOptions ro;
  // RocksDB's own CRC32c of the blob is not checked: the body's xxh3 below is, against the
  // index's checksum, and so are its length and header. (Debian's librocksdb computes CRC32c in
  // portable code, ~1 GB/s here: checking both doubled the CPU a 1 MiB disk read costs.)
  ro.verify_checksums = false;
  KVPOOL_RETURN_IF_ERROR(
      KVPOOL_ROCKS_STATUS(store_.db()->Get(ro, store_.blocks(), EncodeKey(ns, key), &value)));
  auto* p = reinterpret_cast<const uint8_t*>(value.data());
  if (value.size() < kBodyHeaderBytes || GetLe(p, 4) != kBodyMagic) {
    return Status::Corruption("block " + key.ShortHex() + ": bad body header on disk");
  }
  const uint64_t size = GetLe(p + 4, 8);
  const uint64_t checksum = GetLe(p + 12, 8);
  if (size != expected.body_size() || value.size() != kBodyHeaderBytes + size ||
      checksum != expected.body_checksum()) {
    return Status::Corruption("block " + key.ShortHex() + ": length or checksum on disk (" +
                              std::to_string(size) + " bytes) differs from the index (" +
                              std::to_string(expected.body_size()) + " bytes)");
  }
  if (BlockChecksum(p + kBodyHeaderBytes, size) != expected.body_checksum()) {
    return Status::Corruption("block " + key.ShortHex() + ": xxh3 checksum mismatch on disk");
  }
  std::memcpy(dst, p + kBodyHeaderBytes, size);
  return Status::OK();
}

Result<DiskBlockMeta> DiskTier::ReadMeta(NamespaceId ns, const BlockKey& key) const {
  rocksdb::PinnableSlice value;
  KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(
      store_.db()->Get(rocksdb::ReadOptions(), store_.block_meta(), EncodeKey(ns, key), &value)));
  DiskBlockMeta meta;
  if (!DecodeMeta({value.data(), value.size()}, &meta)) {
    return Status::Corruption("block " + key.ShortHex() + ": undecodable meta record on disk");
  }
  return meta;
}

Status DiskTier::Delete(std::span<const std::pair<NamespaceId, BlockKey>> blocks) {
  rocksdb::WriteBatch batch;
  for (const auto& [ns, key] : blocks) {
    const std::string k = EncodeKey(ns, key);
    KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(batch.Delete(store_.blocks(), k)));
    KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(batch.Delete(store_.block_meta(), k)));
  }
  return KVPOOL_ROCKS_STATUS(store_.db()->Write(rocksdb::WriteOptions(), &batch));
}

Status DiskTier::DeleteRaw(std::string_view raw_key) {
  rocksdb::WriteBatch batch;
  KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(batch.Delete(store_.blocks(), raw_key)));
  KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(batch.Delete(store_.block_meta(), raw_key)));
  return KVPOOL_ROCKS_STATUS(store_.db()->Write(rocksdb::WriteOptions(), &batch));
}

Status DiskTier::ForEachMeta(
    const MetaRange& range,
    const std::function<void(NamespaceId, const BlockKey&, const DiskBlockMeta&)>& visit,
    const std::function<void(std::string_view raw_key)>& bad) const {
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  ro.readahead_size = 4 << 20;  // one sequential pass over the family
  const rocksdb::Slice lower(range.lower);
  const rocksdb::Slice upper(range.upper);
  if (!range.lower.empty()) ro.iterate_lower_bound = &lower;
  if (!range.upper.empty()) ro.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(store_.db()->NewIterator(ro, store_.block_meta()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    NamespaceId ns;
    BlockKey key;
    DiskBlockMeta meta;
    const rocksdb::Slice k = it->key();
    const rocksdb::Slice v = it->value();
    if (!DecodeKey({k.data(), k.size()}, &ns, &key) || !DecodeMeta({v.data(), v.size()}, &meta)) {
      bad({k.data(), k.size()});
      continue;
    }
    visit(ns, key, meta);
  }
  return KVPOOL_ROCKS_STATUS(it->status());
}

namespace {

// A key's first 8 bytes as a big-endian number (shorter keys padded with zeros), and back: a
// coarse position in the key space to place cuts between two keys.
uint64_t KeyPosition(std::string_view key) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) {
    v = v << 8 | (i < key.size() ? static_cast<uint8_t>(key[i]) : 0);
  }
  return v;
}

std::string KeyAtPosition(uint64_t v) {
  std::string key(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) key[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return key;
}

}  // namespace

std::vector<MetaRange> DiskTier::SplitMeta(int parts) const {
  std::vector<MetaRange> out(1);
  if (parts <= 1) return out;
  // Candidate cuts: every SST file's first key, and kCutsPerFile - 1 positions evenly spaced
  // between its first and last key. Block keys are hashes, uniform within a namespace, so even
  // files that span the whole key space (level 0) are cut into pieces of about equal size.
  constexpr uint64_t kCutsPerFile = 16;
  std::vector<rocksdb::LiveFileMetaData> files;
  store_.db()->GetLiveFilesMetaData(&files);
  const std::string family = store_.block_meta()->GetName();
  std::vector<std::string> cuts;
  for (const rocksdb::LiveFileMetaData& f : files) {
    if (f.column_family_name != family) continue;
    cuts.push_back(f.smallestkey);
    const uint64_t lo = KeyPosition(f.smallestkey);
    const uint64_t hi = KeyPosition(f.largestkey);
    for (uint64_t j = 1; hi > lo && j < kCutsPerFile; ++j) {
      cuts.push_back(KeyAtPosition(lo + (hi - lo) / kCutsPerFile * j));
    }
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  if (!cuts.empty() && cuts.front().empty()) cuts.erase(cuts.begin());
  if (cuts.empty()) return out;
  // RocksDB's estimate of the bytes between consecutive cuts (the last piece ends past any key).
  const std::string end_of_keys(48, '\xff');
  std::vector<rocksdb::Range> pieces;
  pieces.reserve(cuts.size() + 1);
  pieces.emplace_back(rocksdb::Slice(), cuts.front());
  for (size_t i = 0; i + 1 < cuts.size(); ++i) pieces.emplace_back(cuts[i], cuts[i + 1]);
  pieces.emplace_back(cuts.back(), end_of_keys);
  std::vector<uint64_t> bytes(pieces.size(), 0);
  rocksdb::SizeApproximationOptions so;
  so.include_memtables = true;
  so.include_files = true;
  if (!store_.db()
           ->GetApproximateSizes(so, store_.block_meta(), pieces.data(),
                                 static_cast<int>(pieces.size()), bytes.data())
           .ok()) {
    return out;  // one range: slower, never wrong
  }
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  // Walk the pieces in key order and cut after the one that reaches the next share.
  uint64_t seen = 0;
  for (size_t i = 0; i + 1 < pieces.size() && static_cast<int>(out.size()) < parts; ++i) {
    seen += bytes[i];
    const uint64_t share = total / static_cast<uint64_t>(parts) * out.size();
    if (seen >= share && seen > 0) {
      out.back().upper = cuts[i];
      out.push_back(MetaRange{cuts[i], ""});
    }
  }
  return out;
}

uint64_t DiskTier::EstimateMetaRecords() const {
  uint64_t keys = 0;
  store_.db()->GetIntProperty(store_.block_meta(), rocksdb::DB::Properties::kEstimateNumKeys,
                              &keys);
  return keys;
}

Status DiskTier::CorruptForTest(NamespaceId ns, const BlockKey& key) {
  const std::string k = EncodeKey(ns, key);
  std::string value;
  KVPOOL_RETURN_IF_ERROR(
      KVPOOL_ROCKS_STATUS(store_.db()->Get(rocksdb::ReadOptions(), store_.blocks(), k, &value)));
  if (value.size() > kBodyHeaderBytes) value[kBodyHeaderBytes] ^= 0x5a;
  return KVPOOL_ROCKS_STATUS(store_.db()->Put(rocksdb::WriteOptions(), store_.blocks(), k, value));
}

}  // namespace kvpool::tiers
