#pragma once
// Copying a block's bytes between tiers: down to the block store, as put or encoded by the
// namespace's demotion encoding, and back up, verified and decoded. No index and no lock: the
// tier manager decides what moves (and accounts for it) and calls these with its mutex released.
//
// Thread safety: both functions may run concurrently on different blocks; the store is
// thread-safe.

#include <cstdint>
#include <span>

#include <kvpool/block_key.h>

#include "common/status.h"
#include "tiers/demotion_encoding.h"
#include "tiers/tier.h"

namespace kvpool::tiers {

// What reading a block's disk copy needs (taken from its index entry).
struct DiskCopy {
  NamespaceId ns = 0;
  BlockKey key;
  uint64_t size = 0;      // bytes as put
  uint64_t checksum = 0;  // of the bytes as put
  uint8_t encoding = 0;   // kernels::Encoding of the stored body; 0 = raw
};

// Writes `writes` to `store` in one batch. Where encodings[i] is set, writes[i] is encoded first:
// its meta then names the encoding, the stored size and checksum and the layout, and its data
// points at the encoded body (valid only during the call). A write whose bytes do not match its
// meta's checksum is written raw instead (an encoded copy would launder them). `encodings` is
// empty (all raw) or has one entry per write.
Status WriteDown(BlockStore& store, std::span<DiskWrite> writes,
                 std::span<const DemotionEncoding* const> encodings, bool sync);

// Reads `copy` into `dst` (copy.size bytes), decoding an encoded body; `checksum` gets the
// checksum of what `dst` now holds (copy.checksum for a raw copy). NotFound, Corruption (the body
// or its meta record does not verify), IoError.
Status ReadUp(const BlockStore& store, const DiskCopy& copy, uint8_t* dst, uint64_t* checksum);

// Reads an encoded copy's body as stored, not decoded, into a new `body` (meta.stored_size bytes),
// verified against its meta record, which it returns (layout, stored size and checksum).
// InvalidArgument for a raw copy; otherwise as ReadUp.
Result<DiskBlockMeta> ReadEncoded(const BlockStore& store, const DiskCopy& copy,
                                  std::unique_ptr<uint8_t[]>* body);

}  // namespace kvpool::tiers
