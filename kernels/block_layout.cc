#include "kernels/block_layout.h"

#include <string>

namespace kvpool {
namespace kernels {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat32:
      return "fp32";
  }
  return "unknown";
}

const char* EncodingName(Encoding encoding) {
  switch (encoding) {
    case Encoding::kRaw:
      return "raw";
    case Encoding::kInt8:
      return "int8";
    case Encoding::kFp8E4M3:
      return "fp8_e4m3";
    case Encoding::kInt4G32:
      return "int4_g32";
    case Encoding::kInt4G64:
      return "int4_g64";
  }
  return "unknown";
}

Status ValidateBlockLayout(const BlockLayout& l) {
  auto in_range = [](int v, int hi) { return v >= 1 && v <= hi; };
  if (!in_range(l.num_layers, kMaxLayers) || !in_range(l.num_kv_heads, kMaxKvHeads) ||
      !in_range(l.head_dim, kMaxHeadDim) || !in_range(l.tokens, kMaxTokensPerBlock)) {
    return Status::InvalidArgument(
        "block layout out of range: layers=" + std::to_string(l.num_layers) +
        " kv_heads=" + std::to_string(l.num_kv_heads) + " head_dim=" + std::to_string(l.head_dim) +
        " tokens=" + std::to_string(l.tokens));
  }
  if (!IsKnownDType(l.dtype)) {
    return Status::InvalidArgument("unknown dtype " + std::to_string(static_cast<int>(l.dtype)));
  }
  switch (l.encoding) {
    case Encoding::kRaw:
    case Encoding::kInt8:
    case Encoding::kFp8E4M3:
      break;
    case Encoding::kInt4G32:
    case Encoding::kInt4G64:
      if (l.head_dim % Int4GroupSize(l.encoding) != 0) {
        return Status::InvalidArgument("head_dim " + std::to_string(l.head_dim) +
                                       " is not a multiple of the int4 group size " +
                                       std::to_string(Int4GroupSize(l.encoding)));
      }
      break;
    default:
      return Status::InvalidArgument("unknown encoding " +
                                     std::to_string(static_cast<int>(l.encoding)));
  }
  return Status::OK();
}

size_t EncodedDataBytes(const BlockLayout& l) {
  switch (l.encoding) {
    case Encoding::kRaw:
      return RawBytes(l);
    case Encoding::kInt8:
    case Encoding::kFp8E4M3:
      return BlockElements(l);
    case Encoding::kInt4G32:
    case Encoding::kInt4G64:
      return BlockElements(l) / 2;
  }
  return 0;
}

size_t EncodedScaleBytes(const BlockLayout& l) {
  const size_t planes = static_cast<size_t>(l.num_layers) * 2;
  switch (l.encoding) {
    case Encoding::kRaw:
      return 0;
    case Encoding::kInt8:
      return planes * l.tokens * l.num_kv_heads * sizeof(float);
    case Encoding::kFp8E4M3:
      return planes * l.num_kv_heads * sizeof(float);
    case Encoding::kInt4G32:
    case Encoding::kInt4G64:
      return BlockElements(l) / Int4GroupSize(l.encoding) * 2 * sizeof(uint16_t);
  }
  return 0;
}

}  // namespace kernels
}  // namespace kvpool
