#include "daemon/socket_delivery.h"

#include <string>

namespace kvpool::daemon {

Status SocketDelivery::Check(const PathAsk& ask) const {
  if (ask.in_place) {
    return Status::FailedPrecondition("the shared-memory path was not granted at hello");
  }
  if (ask.via_ucx) return Status::FailedPrecondition("the UCX data path was not granted at hello");
  return Status::OK();
}

LeaseTerms SocketDelivery::TermsFor(const PathAsk& ask) const {
  // Released once the response's payload is written (or the connection died).
  return LeaseTerms{owner_, std::chrono::milliseconds(0)};
}

uint64_t SocketDelivery::Send(const PathAsk& ask, uint32_t position, tiers::BlockRead& read,
                              wire::BlockInfo* info, transport::Response* response) {
  response->payload.emplace_back(read.data, read.size);
  return read.size;
}

transport::PayloadSink SocketDelivery::InFrameSink(uint64_t id, uint64_t size, Status* why) {
  transport::PayloadSink sink{nullptr, size};
  Result<tiers::ReservationTarget> t = tiers_.TargetOf(owner_, id);
  if (!t.ok()) {
    *why = t.status();
  } else if (t->size != size) {
    *why = Status::InvalidArgument("reservation " + std::to_string(id) + " is for " +
                                   std::to_string(t->size) + " bytes, not " + std::to_string(size));
  } else {
    sink.data = t->data;
  }
  return sink;
}

}  // namespace kvpool::daemon
