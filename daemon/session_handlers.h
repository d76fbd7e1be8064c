#pragma once
// SessionHandlers: SESSION_SAVE, SESSION_LOAD, SESSION_DELETE and SESSION_LIST, and the pins
// of persisted sessions at start. A session is a named chain of blocks kept in the session
// store (daemon/session_store.h); saving one pins its chain in the tier manager (written to
// disk, never evicted) and unpins the chain it replaces; deleting unpins it.
//
// Versions: every save and delete taken here gets a version from a hybrid logical clock
// (wall-clock milliseconds << 16, above every version this daemon has seen, its own and its
// peers') and this node's id; in cluster mode a delete leaves a deletion record (a tombstone)
// with its version, dropped at start once older than kTombstoneTtl (standalone, it removes the
// record). In cluster mode saves and deletions are
// copied to the session's home nodes, where a copy replaces what is there only when newer; a
// load compares this node's record with its homes' and answers the newest (NotFound when that
// is a deletion), updating whichever side is older. So an older save never wins over a newer
// one, and a deleted session does not come back from a copy that missed the delete.
//
// Called by BlockService (daemon/block_service.h) after hello, on request workers, concurrently
// for different connections. Saves and deletes are serialized among themselves, after a client's
// save has pinned (and so written down) its chain.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
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
  // `cluster_mode`: the daemon runs in a cluster (its hooks may come after the first requests):
  // deletes leave deletion records.
  SessionHandlers(tiers::TierManager& tiers, SessionStore& sessions, Metrics& metrics,
                  const ClusterRef& cluster, std::string node_id, bool cluster_mode);

  // How long a deletion record is kept: longer than any copy can take to reach every home
  // (a node away for longer may bring a deleted session back). 7 days.
  static constexpr std::chrono::milliseconds kTombstoneTtl{7LL * 24 * 3600 * 1000};

  // Whether `a` is a newer save (or deletion) of its session than `b`.
  static bool Newer(const wire::SessionRecord& a, const wire::SessionRecord& b);
  // Whether `r` may be sent to homes that may hold none of its session: a deletion always; a save
  // only while younger than kTombstoneTtl, since an older one may have been deleted since and its
  // deletion record dropped, and sending it would bring the session back.
  static bool MayRestore(const wire::SessionRecord& r, int64_t now_unix_ms);

  // Pins the chains of every persisted session (at start, after TierManager::Recover).
  Status LoadSessions();

  transport::Response Save(Connection& c, std::string_view body);
  transport::Response Load(Connection& c, std::string_view body);
  transport::Response Delete(Connection& c, std::string_view body);
  transport::Response List(Connection& c, std::string_view body);
  // SESSION_VERSIONS, from a peer: which of the records it names this node would keep.
  transport::Response Versions(Connection& c, std::string_view body);
  // The most records one SESSION_VERSIONS may name.
  static constexpr int kMaxVersionsAsked = 4096;

  // Live sessions (deletion records not counted), of every namespace and of `ns`: exact, kept as
  // records are written (for stats and /metrics; never waits for a save in progress).
  uint64_t Count() const ABSL_LOCKS_EXCLUDED(books_mu_);
  uint64_t CountIn(NamespaceId ns) const ABSL_LOCKS_EXCLUDED(books_mu_);

 private:
  // This node's record of a session. A damaged one is logged and reads as none (`damaged` set),
  // so that a save or delete can replace it. Its charge and count are given back from booked_;
  // the pins of its chain, which it no longer names, stay until a restart.
  Result<wire::SessionRecord> OwnRecordLocked(NamespaceId ns, const std::string& session_id,
                                              bool* damaged = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reply, counting an answer with an error in requests_failed (NotFound, a miss, is not one).
  template <typename Message>
  transport::Response Answer(uint16_t type, Message& msg, const Status& st);
  // Counts a live session in or out of `ns`.
  void CountLive(NamespaceId ns, int delta) ABSL_LOCKS_EXCLUDED(books_mu_);
  // The next version of a save or deletion taken here.
  uint64_t NextVersion() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the clock past `version`, a version seen here (a record read, a peer's copy), unless
  // it is implausible.
  void ObserveLocked(uint64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `version` is at most an hour ahead of this node's clock.
  static bool Plausible(uint64_t version);
  // Stores `record` over `old` (this node's record, or NotFound): pins its chain (setting
  // total_bytes) unless it is a deletion, charges what the record grows by to the namespace's
  // disk use (TierManager::ChargeDisk: a record counts against the disk capacity and quota as
  // blocks do), writes it, and unpins the old chain. `pinned_bytes`: the chain was pinned
  // already (PinChain's answer); its pins are StoreLocked's from here (undone where it fails).
  Status StoreLocked(NamespaceId ns, wire::SessionRecord& record,
                     const Result<wire::SessionRecord>& old,
                     std::optional<uint64_t> pinned_bytes = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  tiers::TierManager& tiers_;
  SessionStore& sessions_;
  Metrics& metrics_;
  const ClusterRef& cluster_;
  const std::string node_id_;
  const bool cluster_mode_;
  // Serializes session saves and deletes: a save writes the record and unpins the old chain as
  // one step (a client's save has pinned its new chain before it takes this; see Save).
  absl::Mutex mu_;
  uint64_t last_version_ ABSL_GUARDED_BY(mu_) = 0;
  // What each record in the store was charged (ChargeDisk) and whether it is a live session,
  // by SessionStore::Key: what a save or delete gives back comes from here, not from the record
  // it replaces, which may no longer be readable.
  struct Booked {
    uint64_t bytes = 0;
    bool live = false;
  };
  absl::flat_hash_map<std::string, Booked> booked_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex books_mu_;
  absl::flat_hash_map<NamespaceId, uint64_t> live_ ABSL_GUARDED_BY(books_mu_);
  uint64_t live_total_ ABSL_GUARDED_BY(books_mu_) = 0;
};

}  // namespace kvpool::daemon
