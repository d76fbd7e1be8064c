#include "tiers/tier_copy.h"

#include <memory>
#include <vector>

#include "common/checksum.h"

namespace kvpool::tiers {

Status WriteDown(BlockStore& store, std::span<DiskWrite> writes,
                 std::span<const DemotionEncoding* const> encodings, bool sync) {
  if (!encodings.empty() && encodings.size() != writes.size()) {
    return Status::InvalidArgument("WriteDown: one encoding per write, or none");
  }
  std::vector<std::unique_ptr<uint8_t[]>> encoded(encodings.size());
  for (size_t i = 0; i < encodings.size(); ++i) {
    const DemotionEncoding* enc = encodings[i];
    if (enc == nullptr) continue;
    // An encoded copy gets a checksum of its own, and a block read back from it a fresh one:
    // bytes that no longer match the block's checksum (an in-place writer that lied about them)
    // would come back looking good. Such a block is written raw instead, so its disk copy keeps
    // failing its checksum when read.
    if (BlockChecksum(writes[i].data, writes[i].meta.size) != writes[i].meta.checksum) continue;
    encoded[i].reset(new uint8_t[enc->encoded_bytes()]);
    KVPOOL_RETURN_IF_ERROR(enc->Encode(writes[i].data, encoded[i].get()));
    DiskBlockMeta& m = writes[i].meta;
    m.encoding = static_cast<uint8_t>(enc->encoding());
    m.stored_size = enc->encoded_bytes();
    m.stored_checksum = BlockChecksum(encoded[i].get(), m.stored_size);
    m.layout = enc->layout();
    writes[i].data = encoded[i].get();
  }
  return store.Write(writes, sync);
}

namespace {

// The meta record of encoded copy `copy`, checked against the index and its layout.
Result<DiskBlockMeta> EncodedMeta(const BlockStore& store, const DiskCopy& copy) {
  KVPOOL_ASSIGN_OR_RETURN(DiskBlockMeta meta, store.ReadMeta(copy.ns, copy.key));
  if (meta.encoding != copy.encoding || meta.size != copy.size) {
    return Status::Corruption("block " + copy.key.ShortHex() +
                              ": its meta record on disk differs from the index");
  }
  const DemotionEncoding enc(meta.layout);
  if (enc.encoded_bytes() != meta.stored_size || enc.raw_bytes() != meta.size) {
    return Status::Corruption("block " + copy.key.ShortHex() +
                              ": encoded sizes on disk do not match its layout");
  }
  return meta;
}

}  // namespace

Result<DiskBlockMeta> ReadEncoded(const BlockStore& store, const DiskCopy& copy,
                                  std::unique_ptr<uint8_t[]>* body) {
  if (copy.encoding == 0) {
    return Status::InvalidArgument("block " + copy.key.ShortHex() + " is stored raw");
  }
  KVPOOL_ASSIGN_OR_RETURN(DiskBlockMeta meta, EncodedMeta(store, copy));
  body->reset(new uint8_t[meta.stored_size]);
  KVPOOL_RETURN_IF_ERROR(store.Read(copy.ns, copy.key, meta, body->get()));
  return meta;
}

Status ReadUp(const BlockStore& store, const DiskCopy& copy, uint8_t* dst, uint64_t* checksum) {
  if (copy.encoding == 0) {
    DiskBlockMeta expected;
    expected.size = copy.size;
    expected.checksum = copy.checksum;
    KVPOOL_RETURN_IF_ERROR(store.Read(copy.ns, copy.key, expected, dst));
    *checksum = copy.checksum;
    return Status::OK();
  }
  // Encoded: the meta record says how; the body is checked against it, then decoded.
  std::unique_ptr<uint8_t[]> body;
  KVPOOL_ASSIGN_OR_RETURN(DiskBlockMeta meta, ReadEncoded(store, copy, &body));
  const DemotionEncoding enc(meta.layout);
  KVPOOL_RETURN_IF_ERROR(
      enc.Decode(body.get(), dst).WithContext("decoding " + copy.key.ShortHex()));
  *checksum = BlockChecksum(dst, meta.size);
  return Status::OK();
}

}  // namespace kvpool::tiers
