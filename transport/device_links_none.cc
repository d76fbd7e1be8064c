// NcclDeviceLinks in a build without CUDA or NCCL's header (transport/device_link.h): there are
// no device links, and blocks move between daemons over UCX only.

#include "transport/device_link.h"

namespace kvpool::transport {

Result<std::unique_ptr<DeviceLinks>> NcclDeviceLinks() {
  return Status::Unavailable("kvpool was built without CUDA and NCCL: no device links");
}

}  // namespace kvpool::transport
