#pragma once
// DemotionEncoding: the form a namespace's blocks take on disk, a strategy chosen by name.
//
//   "raw"        the bytes as put (the default; no DemotionEncoding object at all)
//   "int8", "fp8-e4m3", "int4-g32", "int4-g64"
//                lossy: a block is quantized by the kernels' CPU twins (kernels/quantize.h) when it
//                is written to disk and dequantized back to the layout's dtype when it is read
//                from there, so every reader still gets the layout's raw format. Only for a
//                namespace that declares its block layout (a block of any other size stays raw)
//                and says it accepts lossy copies (namespaces file: `lossy: true`).
//
// Disk capacity counts the stored (encoded) bytes. A block read back from an encoded copy is no
// longer the bytes that were put: the tier manager gives it the checksum of the decoded bytes and
// reports the encoding it went through with the read (BlockRead::lossy_encoding), so a get tells
// its caller the bytes are approximate. Error bounds: docs/KERNELS.md and
// kernels/quantize_test.cc; measured capacity and error: docs/BENCHMARKS.md.
//
// Thread safety: immutable after creation; Encode and Decode may run concurrently.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "kernels/block_layout.h"
#include "tiers/strategy_registry.h"

namespace kvpool::tiers {

class DemotionEncoding {
 public:
  // `layout`: the namespace's raw block layout with the encoding to store in.
  explicit DemotionEncoding(const kernels::BlockLayout& layout) : layout_(layout) {}

  std::string name() const;
  kernels::Encoding encoding() const { return layout_.encoding; }
  const kernels::BlockLayout& layout() const { return layout_; }
  uint64_t raw_bytes() const;
  uint64_t encoded_bytes() const;
  // Whether a block of `size` bytes is stored encoded (it has the layout's raw size).
  bool Applies(uint64_t size) const { return size == raw_bytes(); }
  // raw (raw_bytes) -> out (encoded_bytes).
  Status Encode(const uint8_t* raw, uint8_t* out) const;
  // encoded (encoded_bytes) -> raw (raw_bytes), in the layout's dtype.
  Status Decode(const uint8_t* encoded, uint8_t* raw) const;

 private:
  const kernels::BlockLayout layout_;
};

// Encodings by name; the context is the namespace's raw layout (its encoding field is ignored).
StrategyRegistry<DemotionEncoding, kernels::BlockLayout>& DemotionEncodingRegistry();

// "raw" -> null (store as put); a lossy name -> its encoding over `raw_layout`, checked
// (InvalidArgument for an unknown name or a layout the encoding cannot take).
Result<std::shared_ptr<const DemotionEncoding>> CreateDemotionEncoding(
    std::string_view name, const kernels::BlockLayout& raw_layout);

}  // namespace kvpool::tiers
