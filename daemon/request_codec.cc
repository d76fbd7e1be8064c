#include "daemon/request_codec.h"

#include <glog/logging.h>
#include <google/protobuf/stubs/logging.h>

#include <cstring>

namespace kvpool::daemon {

void SetStatus(wire::Status* out, const Status& st) {
  out->set_code(static_cast<int32_t>(st.code()));
  out->set_message(st.message());
}

Status DecodeKeys(const google::protobuf::RepeatedPtrField<std::string>& in, uint32_t max,
                  std::vector<BlockKey>* out) {
  if (static_cast<uint64_t>(in.size()) > max) {
    return Status::InvalidArgument("request has " + std::to_string(in.size()) +
                                   " keys; the limit is " + std::to_string(max));
  }
  out->reserve(in.size());
  for (int i = 0; i < in.size(); ++i) {
    Result<BlockKey> k = BlockKey::FromBytes(in[i]);
    if (!k.ok()) return k.status().WithContext("key " + std::to_string(i));
    out->push_back(*k);
  }
  return Status::OK();
}

Status DecodeKeysOf(const google::protobuf::RepeatedPtrField<std::string>& keys,
                    const std::string& packed, uint32_t max, std::vector<BlockKey>* out) {
  if (packed.empty()) return DecodeKeys(keys, max, out);
  if (!keys.empty()) return Status::InvalidArgument("keys given both packed and one by one");
  if (packed.size() % BlockKey::kSize != 0) {
    return Status::InvalidArgument("packed keys are not a multiple of 32 bytes");
  }
  const size_t n = packed.size() / BlockKey::kSize;
  if (n > max) {
    return Status::InvalidArgument("request has " + std::to_string(n) + " keys; the limit is " +
                                   std::to_string(max));
  }
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy((*out)[i].bytes.data(), packed.data() + i * BlockKey::kSize, BlockKey::kSize);
  }
  return Status::OK();
}

wire::Tier ToWire(Tier tier) {
  switch (tier) {
    case Tier::kGpu:
      return wire::TIER_GPU;
    case Tier::kHost:
      return wire::TIER_HOST;
    case Tier::kDisk:
      return wire::TIER_DISK;
    case Tier::kRemote:
      return wire::TIER_REMOTE;
    case Tier::kNone:
      break;
  }
  return wire::TIER_NONE;
}

void QuietProtobufLogs() {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
        if (level == google::protobuf::LOGLEVEL_FATAL) {
          LOG(FATAL) << "protobuf " << file << ":" << line << ": " << message;
        }
        VLOG(1) << "protobuf " << file << ":" << line << ": " << message;
      });
}

}  // namespace kvpool::daemon
