#pragma once
// DiskTier: block bodies on NVMe through RocksDB (BlobDB), keyed by (namespace, block key).
//
// Each block is two records written in one WriteBatch: the body in the `blocks` family
// (a 20-byte header {magic, length, xxh3-64} then the stored bytes) and a small meta record in
// `block_meta` (length, checksum, parent key and, for a body stored encoded, the encoding and
// the stored length and checksum). Every read verifies length and checksum against
// both the header and the caller's expectation; a mismatch is Corruption and the caller drops
// the block and reports a miss. The tier does not account capacity: the tier manager does,
// from the index, and decides what to drop.
//
// Thread safety: all methods may be called concurrently.

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include <kvpool/block_key.h>

#include "common/status.h"
#include "tiers/rocks_store.h"
#include "tiers/tier.h"

namespace kvpool::tiers {

class DiskTier final : public BlockStore {
 public:
  explicit DiskTier(RocksStore& store);

  // StorageTier
  Tier id() const override { return Tier::kDisk; }

  // BlockStore
  // Writes blocks atomically (all or none). `sync`: fsync the WAL before returning.
  // IoError or ResourceExhausted (disk full) from RocksDB.
  Status Write(std::span<const DiskWrite> blocks, bool sync) override;
  // Reads a block's stored body into `dst` (expected.body_size() bytes) and verifies it against
  // its header and `expected` (stored length and checksum): NotFound, Corruption (length or
  // checksum mismatch), IoError. RocksDB's Get is synchronous: the read is done when handed back.
  std::unique_ptr<PendingRead> StartRead(NamespaceId ns, const BlockKey& key,
                                         const DiskBlockMeta& expected,
                                         uint8_t* dst) const override;
  Result<DiskBlockMeta> ReadMeta(NamespaceId ns, const BlockKey& key) const override;
  // Deletes blocks (body and meta) atomically.
  Status Delete(std::span<const std::pair<NamespaceId, BlockKey>> blocks) override;
  // Visits the block meta records of `range` (keys as EncodeKey makes them) without reading
  // bodies. An undecodable record's raw key goes to `bad`, so the caller can delete it.
  using BlockStore::ForEachMeta;
  Status ForEachMeta(
      const MetaRange& range,
      const std::function<void(NamespaceId, const BlockKey&, const DiskBlockMeta&)>& visit,
      const std::function<void(std::string_view raw_key)>& bad) const override;
  // Cuts where RocksDB estimates equal shares of the meta family's bytes, among candidate keys
  // taken from its SST files' key ranges (block keys are uniform within a namespace).
  std::vector<MetaRange> SplitMeta(int parts) const override;
  // RocksDB's estimate of the meta family's keys.
  uint64_t EstimateMetaRecords() const override;
  // Deletes a record whose key could not be decoded (see ForEachMeta).
  Status DeleteRaw(std::string_view raw_key) override;
  // RocksDB's SST and blob files.
  uint64_t bytes_on_device() const override;
  std::optional<uint64_t> free_bytes() const override;
  uint64_t memory_bytes() const override;

  // Test hook: overwrites the stored body's bytes (keeps its header) to simulate bit rot.
  Status CorruptForTest(NamespaceId ns, const BlockKey& key);

  static std::string EncodeKey(NamespaceId ns, const BlockKey& key);

 private:
  Status ReadNow(NamespaceId ns, const BlockKey& key, const DiskBlockMeta& expected,
                 uint8_t* dst) const;

  RocksStore& store_;
};

}  // namespace kvpool::tiers
