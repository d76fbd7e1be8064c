#pragma once
// SessionHandlers: SESSION_SAVE, SESSION_LOAD, SESSION_DELETE and SESSION_LIST, and the pins
// of persisted sessions at start. A session is a named chain of blocks kept in the session
// store (daemon/session_store.h); saving one pins its chain in the tier manager (written to
// disk, never evicted) and unpins the chain it replaces; deleting unpins it. In cluster mode a
// save is copied to the session's home nodes, and a load or delete that misses here asks them.
//
// Called by BlockService (daemon/block_service.h) after hello, on request workers, concurrently
// for different connections. Saves and deletes are serialized among themselves.

#include <string_view>

#include "absl/synchronization/mutex.h"
#include "daemon/cluster_hooks.h"
#include "daemon/connection.h"
#include "daemon/metrics.h"
#include "daemon/session_store.h"
#include "tiers/tier_manager.h"
#include "transport/control_server.h"

namespace kvpool::daemon {

class SessionHandlers {
 public:
  // All references outlive the handlers.
  SessionHandlers(tiers::TierManager& tiers, SessionStore& sessions, Metrics& metrics,
                  const ClusterRef& cluster);

  // Pins the chains of every persisted session (at start, after TierManager::Recover).
  Status LoadSessions();

  transport::Response Save(Connection& c, std::string_view body);
  transport::Response Load(Connection& c, std::string_view body);
  transport::Response Delete(Connection& c, std::string_view body);
  transport::Response List(Connection& c, std::string_view body);

 private:
  tiers::TierManager& tiers_;
  SessionStore& sessions_;
  Metrics& metrics_;
  const ClusterRef& cluster_;
  // Serializes session saves and deletes: a save pins the new chain, writes the record and
  // unpins the old chain as one step.
  absl::Mutex mu_;
};

}  // namespace kvpool::daemon
