#pragma once
// Connection: what the daemon knows about one control connection (daemon/block_service.h
// creates it at connect and routes every request of the connection to the handlers with it):
// whether it said hello and as which namespace, its owner id for leases and reservations, its
// data-path delivery (socket until hello grants more), and the PUT_COMMIT being received.
//
// Thread safety: none needed: ControlServer never runs two requests of one connection at once,
// and OnDisconnect runs after the last.

#include <cstdint>
#include <memory>
#include <string>

#include "common/namespace_id.h"
#include "daemon/delivery.h"
#include "transport/control_server.h"

namespace kvpool::daemon {

class UcxDelivery;

struct Connection : transport::ConnectionState {
  transport::ConnectionInfo info;
  bool hello = false;
  NamespaceId ns = kNoNamespace;
  std::string ns_name;
  uint64_t owner = 0;     // owner id of this connection's reservations and leases
  bool peer = false;      // another kvpoold (cluster fetch or replication): no replication back
  bool admin = false;     // may run admin requests (daemon/access_control.h)
  std::string challenge;  // what this connection's hello proof covers, once issued
  // How block bodies travel; never null. Chosen at hello (daemon/delivery.h).
  std::unique_ptr<BlockDelivery> delivery;
  // The UCX layer on top of `delivery` when UCX was granted (a repeated hello keeps it).
  UcxDelivery* ucx = nullptr;
  bool ucx_offered = false;  // the hello offered UCX (its listener's port)
  // Set by PayloadSinks (or the commit handler) for the PUT_COMMIT being received.
  PendingCommit commit;
};

}  // namespace kvpool::daemon
