#include "daemon/session_handlers.h"

#include <glog/logging.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "control.pb.h"
#include "daemon/request_codec.h"

namespace kvpool::daemon {

using transport::Response;

SessionHandlers::SessionHandlers(tiers::TierManager& tiers, SessionStore& sessions,
                                 Metrics& metrics, const ClusterRef& cluster, std::string node_id,
                                 bool cluster_mode)
    : tiers_(tiers),
      sessions_(sessions),
      metrics_(metrics),
      cluster_(cluster),
      node_id_(std::move(node_id)),
      cluster_mode_(cluster_mode) {}

bool SessionHandlers::Newer(const wire::SessionRecord& a, const wire::SessionRecord& b) {
  return a.version() != b.version() ? a.version() > b.version() : a.origin() > b.origin();
}

uint64_t SessionHandlers::NextVersion() {
  const uint64_t wall = static_cast<uint64_t>(UnixMillis()) << 16;
  last_version_ = std::max(wall, last_version_ + 1);
  return last_version_;
}

bool SessionHandlers::Plausible(uint64_t version) {
  // An hour ahead of this node's clock at most: a version far in the future would make every
  // later save lose to it (and could wrap the clock).
  return version <= static_cast<uint64_t>(UnixMillis() + 3600 * 1000) << 16;
}

void SessionHandlers::ObserveLocked(uint64_t version) {
  if (Plausible(version)) last_version_ = std::max(last_version_, version);
}

bool SessionHandlers::MayRestore(const wire::SessionRecord& r, int64_t now_unix_ms) {
  return r.deleted() || r.updated_unix_ms() >= now_unix_ms - kTombstoneTtl.count();
}

uint64_t SessionHandlers::Count() const {
  absl::MutexLock lock(&books_mu_);
  return live_total_;
}

uint64_t SessionHandlers::CountIn(NamespaceId ns) const {
  absl::MutexLock lock(&books_mu_);
  const auto it = live_.find(ns);
  return it == live_.end() ? 0 : it->second;
}

void SessionHandlers::CountLive(NamespaceId ns, int delta) {
  if (delta == 0) return;
  absl::MutexLock lock(&books_mu_);
  uint64_t& n = live_[ns];
  if (delta > 0) {
    ++n;
    ++live_total_;
  } else if (n > 0) {
    --n;
    --live_total_;
  }
  if (n == 0) live_.erase(ns);
}

Result<wire::SessionRecord> SessionHandlers::OwnRecordLocked(NamespaceId ns,
                                                             const std::string& session_id,
                                                             bool* damaged) {
  Result<wire::SessionRecord> r = sessions_.Get(ns, session_id);
  const bool bad = !r.ok() && r.status().code() == StatusCode::kCorruption;
  if (damaged != nullptr) *damaged = bad;
  if (bad) {
    LOG(ERROR) << r.status().ToString() << ": it is replaced by this save or delete";
    return Status::NotFound("no session '" + session_id + "'");
  }
  return r;
}

Status SessionHandlers::LoadSessions() {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  std::vector<std::pair<NamespaceId, std::string>> expired;
  absl::flat_hash_map<NamespaceId, uint64_t> bytes;  // the records kept, per namespace
  const int64_t expire_before = UnixMillis() - kTombstoneTtl.count();
  KVPOOL_RETURN_IF_ERROR(sessions_.ForEach([&](NamespaceId ns, const wire::SessionRecord& r) {
    ObserveLocked(r.version());
    if (r.deleted() && r.updated_unix_ms() < expire_before) {
      expired.emplace_back(ns, r.session_id());
      return;
    }
    const uint64_t stored = SessionStore::StoredBytes(r);
    bytes[ns] += stored;
    booked_[SessionStore::Key(ns, r.session_id())] = Booked{stored, !r.deleted()};
    if (r.deleted()) return;
    CountLive(ns, +1);
    std::vector<BlockKey> keys;
    if (!DecodeKeys(r.keys(), UINT32_MAX, &keys).ok()) {
      LOG(ERROR) << "session '" << r.session_id() << "' has a malformed key; not pinned";
      return;
    }
    tiers_.PinExisting(ns, keys);
    ++n;
  }));
  for (const auto& [ns, id] : expired) {
    if (Status st = sessions_.Delete(ns, id); !st.ok()) {
      LOG(WARNING) << "cannot drop the expired deletion record of session '" << id
                   << "': " << st.ToString();
    }
  }
  // Already on disk: charged as they are, whatever the capacity now (blocks make room later).
  for (const auto& [ns, b] : bytes) tiers_.ChargeDisk(ns, b, /*force=*/true).IgnoreError();
  LOG(INFO) << "pinned the chains of " << n << " persisted sessions (" << expired.size()
            << " deletion records expired)";
  return Status::OK();
}

Status SessionHandlers::StoreLocked(NamespaceId ns, wire::SessionRecord& record,
                                    const Result<wire::SessionRecord>& old,
                                    std::optional<uint64_t> pinned_bytes) {
  std::vector<BlockKey> keys;
  if (!record.deleted()) {
    KVPOOL_RETURN_IF_ERROR(DecodeKeys(record.keys(), UINT32_MAX, &keys));
    if (!pinned_bytes.has_value()) {
      KVPOOL_ASSIGN_OR_RETURN(pinned_bytes, tiers_.PinChain(ns, keys));
    }
    record.set_total_bytes(*pinned_bytes);
  }
  const std::string key = SessionStore::Key(ns, record.session_id());
  const auto booked = booked_.find(key);
  const Booked was = booked != booked_.end() ? booked->second : Booked{};
  const uint64_t now = SessionStore::StoredBytes(record);
  // A deletion record is charged without making room: deleting must work at a full quota.
  Status st = now > was.bytes ? tiers_.ChargeDisk(ns, now - was.bytes, /*force=*/record.deleted())
                              : Status::OK();
  if (st.ok()) {
    st = sessions_.Put(ns, record);
    if (!st.ok() && now > was.bytes) tiers_.UnchargeDisk(ns, now - was.bytes);
  }
  if (!st.ok()) {
    if (!record.deleted()) tiers_.UnpinChain(ns, keys);
    return st;
  }
  if (now < was.bytes) tiers_.UnchargeDisk(ns, was.bytes - now);
  booked_[key] = Booked{now, !record.deleted()};
  CountLive(ns, (record.deleted() ? 0 : 1) - (was.live ? 1 : 0));
  if (old.ok() && !old->deleted()) {
    std::vector<BlockKey> old_keys;
    if (DecodeKeys(old->keys(), UINT32_MAX, &old_keys).ok()) tiers_.UnpinChain(ns, old_keys);
  }
  return Status::OK();
}

template <typename Message>
Response SessionHandlers::Answer(uint16_t type, Message& msg, const Status& st) {
  if (!st.ok() && !st.IsNotFound()) metrics_.Add(metrics_.requests_failed);
  return Reply(type, msg, st);
}

Response SessionHandlers::Save(Connection& c, std::string_view body) {
  wire::SessionSaveRequest req;
  wire::SessionSaveResponse resp;
  Status st = Parse(body, &req, "SESSION_SAVE");
  wire::SessionRecord& record = *req.mutable_record();
  if (st.ok()) st = SessionStore::ValidateId(record.session_id());
  if (st.ok() && req.replica() && !c.peer) {
    st = Status::PermissionDenied("only a peer daemon may store a session's copy as given");
  }
  if (st.ok() && record.deleted() && (!req.replica() || record.keys_size() > 0)) {
    st = Status::InvalidArgument("a deletion record comes from a peer and has no chain");
  }
  if (!st.ok()) {
    return Answer(wire::SESSION_SAVE, resp, st);
  }
  if (req.replica() && !Plausible(record.version())) {
    return Answer(wire::SESSION_SAVE, resp,
                  Status::InvalidArgument("a session copy whose version is more than an hour ahead "
                                          "of this node's clock"));
  }
  // A client's save pins its chain before it takes the lock: pinning writes the chain's blocks
  // that are not on disk yet, synced (seconds for a long chain), and other tenants' saves and
  // deletes wait for the lock. Pins are counts, so a chain pinned early is pinned once more.
  // (A peer's copy pins under the lock, only where it is newer than this node's record.)
  std::optional<uint64_t> pinned;
  std::vector<BlockKey> keys;
  if (!req.replica()) {
    st = DecodeKeys(record.keys(), UINT32_MAX, &keys);
    if (st.ok()) {
      Result<uint64_t> bytes = tiers_.PinChain(c.ns, keys);
      if (bytes.ok()) pinned = *bytes;
      st = bytes.status();
    }
    if (!st.ok()) {
      return Answer(wire::SESSION_SAVE, resp, st);
    }
  }
  absl::MutexLock lock(&mu_);
  Result<wire::SessionRecord> old = OwnRecordLocked(c.ns, record.session_id());
  if (!old.ok() && !old.status().IsNotFound()) {
    if (pinned.has_value()) tiers_.UnpinChain(c.ns, keys);
    return Answer(wire::SESSION_SAVE, resp, old.status());
  }
  // Every version seen here moves the clock, so that what this node writes next is newer.
  if (old.ok()) ObserveLocked(old->version());
  if (req.replica()) {
    // A copy from a peer: the newest wins; an older one changes nothing here.
    ObserveLocked(record.version());
    if (old.ok() && !Newer(record, *old)) return Answer(wire::SESSION_SAVE, resp, Status::OK());
  } else {
    const int64_t now = UnixMillis();
    record.set_created_unix_ms(old.ok() && !old->deleted() ? old->created_unix_ms() : now);
    record.set_updated_unix_ms(now);
    record.set_version(NextVersion());
    record.set_origin(node_id_);
  }
  st = StoreLocked(c.ns, record, old, pinned);
  if (!st.ok()) {
    return Answer(wire::SESSION_SAVE, resp, st);
  }
  if (ClusterHooks* cluster = cluster_.Get(); cluster != nullptr && !req.replica()) {
    cluster->ReplicateSession(c.ns, c.ns_name, record);
  }
  return Answer(wire::SESSION_SAVE, resp, Status::OK());
}

Response SessionHandlers::Load(Connection& c, std::string_view body) {
  wire::SessionLoadRequest req;
  wire::SessionLoadResponse resp;
  Status st = Parse(body, &req, "SESSION_LOAD");
  if (!st.ok()) return Answer(wire::SESSION_LOAD, resp, st);
  Result<wire::SessionRecord> record = sessions_.Get(c.ns, req.session_id());
  if (!record.ok() && !record.status().IsNotFound()) {
    return Answer(wire::SESSION_LOAD, resp, record.status());
  }
  ClusterHooks* cluster = cluster_.Get();
  bool remote = false;
  bool fetched = false;  // the chain's blocks were already brought here
  // Whether a home this node did not hear from may hold a newer record (or any record).
  bool unsure = cluster_mode_ && !c.peer && cluster == nullptr;
  std::string silent = "its homes (this node has not joined its cluster yet)";
  if (cluster != nullptr && !c.peer) {
    // Saved, re-saved or deleted through other nodes too: the newest copy among this node and
    // the session's homes wins.
    RemoteSession theirs = cluster->LoadRemoteSession(c.ns_name, req.session_id());
    unsure = !theirs.every_home_answered;
    silent = theirs.silent;
    if (theirs.newest.has_value()) {
      absl::MutexLock lock(&mu_);
      ObserveLocked(theirs.newest->version());
    }
    if (theirs.newest.has_value() && (!record.ok() || Newer(*theirs.newest, *record))) {
      if (record.ok()) {
        // This node's copy is older: bring it up to date (its blocks first, when it is a chain).
        if (!theirs.newest->deleted()) {
          std::vector<BlockKey> keys;
          if (DecodeKeys(theirs.newest->keys(), UINT32_MAX, &keys).ok()) {
            cluster->FetchMissing(c.ns, c.ns_name, keys, /*gpu_device=*/-1);
            fetched = true;
          }
        }
        absl::MutexLock lock(&mu_);
        Result<wire::SessionRecord> old = OwnRecordLocked(c.ns, req.session_id());
        wire::SessionRecord copy = *theirs.newest;
        if (old.ok() && Newer(copy, *old)) {
          if (Status repaired = StoreLocked(c.ns, copy, old); !repaired.ok()) {
            VLOG(1) << "session '" << req.session_id()
                    << "': newer copy not stored here: " << repaired.ToString();
          }
        }
      }
      record = std::move(*theirs.newest);
      remote = true;
    } else if (record.ok() && (theirs.newest.has_value() ? Newer(*record, *theirs.newest)
                                                         : theirs.every_home_answered &&
                                                               MayRestore(*record, UnixMillis()))) {
      // The homes hold an older copy, or none (the copy sent when it was saved was lost: a
      // home was down, or this node died before sending it): send them this one (read repair).
      // "None" only when every home said so: a home that did not answer may hold a deletion.
      cluster->ReplicateSession(c.ns, c.ns_name, *record);
    }
  }
  if (unsure && (!record.ok() || record->deleted())) {
    // Neither here nor on the homes that answered (or only deleted), but a home that did not
    // answer may hold it (or a newer save): that is not "no such session".
    record = Status::Unavailable("session '" + req.session_id() +
                                 "' is neither on this node nor on the homes that answered; no "
                                 "answer from " +
                                 silent + " (try again)");
  }
  if (record.ok() && record->deleted() && !(c.peer && req.include_deleted())) {
    record = Status::NotFound("no session '" + req.session_id() + "'");
  }
  if (!record.ok()) return Answer(wire::SESSION_LOAD, resp, record.status());
  if (!record->deleted()) {
    std::vector<BlockKey> keys;
    st = DecodeKeys(record->keys(), UINT32_MAX, &keys);
    if (!st.ok()) return Answer(wire::SESSION_LOAD, resp, st);
    // A remote session's blocks come here now, so the gets that follow are local hits.
    if (remote && !fetched && !req.no_prefetch())
      cluster->FetchMissing(c.ns, c.ns_name, keys, /*gpu_device=*/-1);
    resp.set_cached_blocks(tiers_.CountCached(c.ns, keys));
    if (!req.no_prefetch()) tiers_.Prefetch(c.ns, keys);
    if (!req.no_prefetch() && req.to_gpu()) {
      // Queued on that GPU's copy worker; the load answers now, whatever becomes of the hint.
      Result<uint32_t> queued = tiers_.PlaceOnGpu(c.ns, keys, req.gpu_device(), /*wait=*/false);
      if (!queued.ok()) {
        LOG_EVERY_N(WARNING, 100) << "SESSION_LOAD to gpu " << req.gpu_device() << ": "
                                  << queued.status().ToString();
      }
    }
  }
  *resp.mutable_record() = std::move(*record);
  return Answer(wire::SESSION_LOAD, resp, Status::OK());
}

Response SessionHandlers::Delete(Connection& c, std::string_view body) {
  wire::SessionDeleteRequest req;
  wire::SessionDeleteResponse resp;
  Status st = Parse(body, &req, "SESSION_DELETE");
  if (st.ok()) st = SessionStore::ValidateId(req.session_id());
  if (!st.ok()) return Answer(wire::SESSION_DELETE, resp, st);
  ClusterHooks* cluster = c.peer ? nullptr : cluster_.Get();
  // Whether a live copy exists on the session's homes (saved through another node), or may
  // exist: a home did not answer (or this node has not joined its cluster yet).
  bool live_elsewhere = false;
  bool maybe_elsewhere = cluster_mode_ && !c.peer && cluster == nullptr;
  uint64_t their_version = 0;
  if (cluster != nullptr) {
    RemoteSession theirs = cluster->LoadRemoteSession(c.ns_name, req.session_id());
    live_elsewhere = theirs.newest.has_value() && !theirs.newest->deleted();
    maybe_elsewhere = !theirs.every_home_answered;
    if (theirs.newest.has_value()) their_version = theirs.newest->version();
  }
  wire::SessionRecord tombstone;
  {
    absl::MutexLock lock(&mu_);
    bool damaged = false;  // deleted all the same
    Result<wire::SessionRecord> old = OwnRecordLocked(c.ns, req.session_id(), &damaged);
    if (!old.ok() && !old.status().IsNotFound())
      return Answer(wire::SESSION_DELETE, resp, old.status());
    // The deletion must be newer than every copy it replaces, here and on the homes.
    ObserveLocked(their_version);
    if (old.ok()) ObserveLocked(old->version());
    const bool live_here = old.ok() && !old->deleted();
    if (!live_here && !live_elsewhere && !maybe_elsewhere && !damaged) {
      return Answer(wire::SESSION_DELETE, resp,
                    Status::NotFound("no session '" + req.session_id() + "'"));
    }
    if (!cluster_mode_) {
      // Standalone: no copy elsewhere can come back, so no deletion record is kept.
      st = sessions_.Delete(c.ns, req.session_id());
      if (!st.ok()) return Answer(wire::SESSION_DELETE, resp, st);
      if (auto b = booked_.find(SessionStore::Key(c.ns, req.session_id())); b != booked_.end()) {
        tiers_.UnchargeDisk(c.ns, b->second.bytes);
        if (b->second.live) CountLive(c.ns, -1);
        booked_.erase(b);
      }
      std::vector<BlockKey> keys;
      if (live_here && DecodeKeys(old->keys(), UINT32_MAX, &keys).ok()) {
        tiers_.UnpinChain(c.ns, keys);
      }
      return Answer(wire::SESSION_DELETE, resp, st);
    }
    // A deletion record, newer than every save it replaces, so no older copy comes back. Also
    // kept (and the delete answered OK) where no copy was found but a home did not answer: it may
    // hold one, which would come back from there otherwise.
    tombstone.set_session_id(req.session_id());
    tombstone.set_deleted(true);
    tombstone.set_version(NextVersion());
    tombstone.set_origin(node_id_);
    tombstone.set_updated_unix_ms(UnixMillis());
    st = StoreLocked(c.ns, tombstone, old);
  }
  if (st.ok() && cluster != nullptr) cluster->ReplicateSession(c.ns, c.ns_name, tombstone);
  return Answer(wire::SESSION_DELETE, resp, st);
}

Response SessionHandlers::List(Connection& c, std::string_view body) {
  wire::SessionListRequest req;
  wire::SessionListResponse resp;
  Status st = Parse(body, &req, "SESSION_LIST");
  if (st.ok()) {
    bool truncated = false;
    const uint32_t limit = req.limit() == 0 ? 1000 : std::min<uint32_t>(req.limit(), 100000);
    Result<std::vector<wire::SessionRecord>> list =
        sessions_.List(c.ns, req.prefix(), req.start_after(), limit, &truncated);
    if (list.ok()) {
      for (const wire::SessionRecord& r : *list) {
        wire::SessionSummary* s = resp.add_sessions();
        s->set_session_id(r.session_id());
        s->set_blocks(static_cast<uint32_t>(r.keys_size()));
        s->set_token_count(r.token_count());
        s->set_updated_unix_ms(r.updated_unix_ms());
        s->set_total_bytes(r.total_bytes());
      }
      resp.set_truncated(truncated);
    } else {
      st = list.status();
    }
  }
  return Answer(wire::SESSION_LIST, resp, st);
}

Response SessionHandlers::Versions(Connection& c, std::string_view body) {
  wire::SessionVersionsRequest req;
  wire::SessionVersionsResponse resp;
  Status st = Parse(body, &req, "SESSION_VERSIONS");
  if (st.ok() && !c.peer) {
    st = Status::PermissionDenied("SESSION_VERSIONS is for peer daemons only");
  }
  if (st.ok() && req.sessions_size() > kMaxVersionsAsked) {
    st = Status::InvalidArgument("SESSION_VERSIONS names " + std::to_string(req.sessions_size()) +
                                 " records; at most " + std::to_string(kMaxVersionsAsked));
  }
  for (int i = 0; st.ok() && i < req.sessions_size(); ++i) {
    const wire::SessionVersion& v = req.sessions(i);
    st = SessionStore::ValidateId(v.session_id());
    if (!st.ok()) break;
    wire::SessionRecord theirs;
    theirs.set_version(v.version());
    theirs.set_origin(v.origin());
    Result<wire::SessionRecord> mine = sessions_.Get(c.ns, v.session_id());
    // A damaged record here is wanted too: a copy replaces it (OwnRecordLocked).
    const bool damaged = !mine.ok() && mine.status().code() == StatusCode::kCorruption;
    if (mine.ok() ? Newer(theirs, *mine) : mine.status().IsNotFound() || damaged) {
      resp.add_wanted(static_cast<uint32_t>(i));
    } else if (!mine.ok()) {
      // Unreadable for now (an I/O error): asked again on the next offer.
      LOG_EVERY_N(WARNING, 64) << "SESSION_VERSIONS: session '" << v.session_id()
                               << "': " << mine.status().ToString();
    }
  }
  if (!st.ok()) resp.clear_wanted();
  return Answer(wire::SESSION_VERSIONS, resp, st);
}

}  // namespace kvpool::daemon
