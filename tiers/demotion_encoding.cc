#include "tiers/demotion_encoding.h"

#include "kernels/quantize.h"

namespace kvpool::tiers {

std::string DemotionEncoding::name() const {
  switch (layout_.encoding) {
    case kernels::Encoding::kInt8:
      return "int8";
    case kernels::Encoding::kFp8E4M3:
      return "fp8-e4m3";
    case kernels::Encoding::kInt4G32:
      return "int4-g32";
    case kernels::Encoding::kInt4G64:
      return "int4-g64";
    case kernels::Encoding::kRaw:
      break;
  }
  return "raw";
}

uint64_t DemotionEncoding::raw_bytes() const { return kernels::RawBytes(layout_); }
uint64_t DemotionEncoding::encoded_bytes() const { return kernels::EncodedBytes(layout_); }

Status DemotionEncoding::Encode(const uint8_t* raw, uint8_t* out) const {
  const void* in[1] = {raw};
  void* outs[1] = {out};
  return kernels::QuantizeBlocksCpu(layout_, in, outs, 1);
}

Status DemotionEncoding::Decode(const uint8_t* encoded, uint8_t* raw) const {
  const void* in[1] = {encoded};
  void* outs[1] = {raw};
  return kernels::DequantizeBlocksCpu(layout_, in, outs, 1);
}

namespace {

using Registry = StrategyRegistry<DemotionEncoding, kernels::BlockLayout>;

Registry::Factory Make(kernels::Encoding encoding) {
  return [encoding](std::string_view,
                    const kernels::BlockLayout& raw) -> Result<std::unique_ptr<DemotionEncoding>> {
    kernels::BlockLayout l = raw;
    l.encoding = encoding;
    KVPOOL_RETURN_IF_ERROR(kernels::ValidateBlockLayout(l));
    return std::make_unique<DemotionEncoding>(l);
  };
}

}  // namespace

Registry& DemotionEncodingRegistry() {
  static auto* r = [] {
    auto* r = new Registry("encoding on demotion");
    r->Register("raw",
                [](std::string_view,
                   const kernels::BlockLayout&) -> Result<std::unique_ptr<DemotionEncoding>> {
                  return std::unique_ptr<DemotionEncoding>();
                });
    r->Register("int8", Make(kernels::Encoding::kInt8));
    r->Register("fp8-e4m3", Make(kernels::Encoding::kFp8E4M3));
    r->Register("int4-g32", Make(kernels::Encoding::kInt4G32));
    r->Register("int4-g64", Make(kernels::Encoding::kInt4G64));
    return r;
  }();
  return *r;
}

Result<std::shared_ptr<const DemotionEncoding>> CreateDemotionEncoding(
    std::string_view name, const kernels::BlockLayout& raw_layout) {
  if (name.empty()) return std::shared_ptr<const DemotionEncoding>();
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<DemotionEncoding> e,
                          DemotionEncodingRegistry().Create(name, raw_layout));
  return std::shared_ptr<const DemotionEncoding>(std::move(e));
}

}  // namespace kvpool::tiers
