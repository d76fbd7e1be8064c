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
#include "kernels/block_layout.h"
#include "tiers/host_tier.h"
#include "tiers/rocks_store.h"

namespace kvpool::tiers {

struct DiskBlockMeta {
  uint64_t size = 0;      // the block's bytes as put
  uint64_t checksum = 0;  // xxh3-64 of those
  BlockKey parent;        // zero when the block starts a chain or its parent is unknown
  // How the stored body is encoded (kernels::Encoding; 0: raw, the bytes as put) and, when it is
  // encoded, its length and checksum. See tiers/demotion_encoding.h.
  uint8_t encoding = 0;
  uint64_t stored_size = 0;
  uint64_t stored_checksum = 0;
  kernels::BlockLayout layout;  // when encoded: what the body decodes with (its encoding too)

  // The body's length and checksum, as stored.
  uint64_t body_size() const { return encoding != 0 ? stored_size : size; }
  uint64_t body_checksum() const { return encoding != 0 ? stored_checksum : checksum; }
};

struct DiskWrite {
  NamespaceId ns = 0;
  BlockKey key;
  DiskBlockMeta meta;
  const uint8_t* data = nullptr;  // meta.body_size() bytes
};

class DiskTier {
 public:
  explicit DiskTier(RocksStore& store);

  // Writes blocks atomically (all or none). `sync`: fsync the WAL before returning.
  // IoError or ResourceExhausted (disk full) from RocksDB.
  Status Write(std::span<const DiskWrite> blocks, bool sync);
  // Reads a block's stored body into `dst` (expected.body_size() bytes) and verifies it against
  // its header and `expected` (stored length and checksum). NotFound, Corruption (length or
  // checksum mismatch), IoError.
  Status Read(NamespaceId ns, const BlockKey& key, const DiskBlockMeta& expected,
              uint8_t* dst) const;
  // A block's meta record. NotFound, Corruption (undecodable), IoError.
  Result<DiskBlockMeta> ReadMeta(NamespaceId ns, const BlockKey& key) const;
  // Deletes blocks (body and meta) atomically.
  Status Delete(std::span<const std::pair<NamespaceId, BlockKey>> blocks);
  // Visits every block's meta record without reading bodies. Stops at the first non-OK
  // status the visitor returns; Corruption for an undecodable record is passed to `visit`'s
  // caller via `bad`, which receives the raw key so the caller can delete it.
  Status ForEachMeta(
      const std::function<void(NamespaceId, const BlockKey&, const DiskBlockMeta&)>& visit,
      const std::function<void(std::string_view raw_key)>& bad) const;
  // Deletes a record whose key could not be decoded (see ForEachMeta).
  Status DeleteRaw(std::string_view raw_key);

  // Test hook: overwrites the stored body's bytes (keeps its header) to simulate bit rot.
  Status CorruptForTest(NamespaceId ns, const BlockKey& key);

  static std::string EncodeKey(NamespaceId ns, const BlockKey& key);

 private:
  RocksStore& store_;
};

}  // namespace kvpool::tiers
