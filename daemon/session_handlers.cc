#include "daemon/session_handlers.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "control.pb.h"
#include "daemon/request_codec.h"

namespace kvpool::daemon {

using transport::Response;

namespace {

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

SessionHandlers::SessionHandlers(tiers::TierManager& tiers, SessionStore& sessions,
                                 Metrics& metrics, const ClusterRef& cluster)
    : tiers_(tiers), sessions_(sessions), metrics_(metrics), cluster_(cluster) {}

Status SessionHandlers::LoadSessions() {
  uint64_t n = 0;
  KVPOOL_RETURN_IF_ERROR(sessions_.ForEach([&](NamespaceId ns, const wire::SessionRecord& r) {
    std::vector<BlockKey> keys;
    if (!DecodeKeys(r.keys(), UINT32_MAX, &keys).ok()) {
      LOG(ERROR) << "session '" << r.session_id() << "' has a malformed key; not pinned";
      return;
    }
    tiers_.PinExisting(ns, keys);
    ++n;
  }));
  LOG(INFO) << "pinned the chains of " << n << " persisted sessions";
  return Status::OK();
}

Response SessionHandlers::Save(Connection& c, std::string_view body) {
  wire::SessionSaveRequest req;
  wire::SessionSaveResponse resp;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "SESSION_SAVE");
  wire::SessionRecord& record = *req.mutable_record();
  if (st.ok()) st = SessionStore::ValidateId(record.session_id());
  if (st.ok()) st = DecodeKeys(record.keys(), UINT32_MAX, &keys);
  if (!st.ok()) {
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::SESSION_SAVE, resp, st);
  }
  absl::MutexLock lock(&mu_);
  Result<wire::SessionRecord> old = sessions_.Get(c.ns, record.session_id());
  if (!old.ok() && !old.status().IsNotFound()) return Reply(wire::SESSION_SAVE, resp, old.status());
  Result<uint64_t> bytes = tiers_.PinChain(c.ns, keys);
  if (!bytes.ok()) {
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::SESSION_SAVE, resp, bytes.status());
  }
  const int64_t now = NowUnixMs();
  record.set_created_unix_ms(old.ok() ? old->created_unix_ms() : now);
  record.set_updated_unix_ms(now);
  record.set_total_bytes(*bytes);
  st = sessions_.Put(c.ns, record);
  if (!st.ok()) {
    tiers_.UnpinChain(c.ns, keys);
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::SESSION_SAVE, resp, st);
  }
  if (old.ok()) {
    std::vector<BlockKey> old_keys;
    if (DecodeKeys(old->keys(), UINT32_MAX, &old_keys).ok()) tiers_.UnpinChain(c.ns, old_keys);
  }
  if (ClusterHooks* cluster = cluster_.Get(); cluster != nullptr && !c.peer) {
    cluster->ReplicateSession(c.ns, c.ns_name, record);
  }
  return Reply(wire::SESSION_SAVE, resp, Status::OK());
}

Response SessionHandlers::Load(Connection& c, std::string_view body) {
  wire::SessionLoadRequest req;
  wire::SessionLoadResponse resp;
  Status st = Parse(body, &req, "SESSION_LOAD");
  if (st.ok()) {
    ClusterHooks* cluster = cluster_.Get();
    Result<wire::SessionRecord> record = sessions_.Get(c.ns, req.session_id());
    const bool remote =
        !record.ok() && record.status().IsNotFound() && cluster != nullptr && !c.peer;
    if (remote) {
      // Saved through another node (maybe one that is down now): ask the session's homes.
      record = cluster->LoadRemoteSession(c.ns_name, req.session_id());
    }
    if (record.ok()) {
      std::vector<BlockKey> keys;
      st = DecodeKeys(record->keys(), UINT32_MAX, &keys);
      if (st.ok()) {
        // A remote session's blocks come here now, so the gets that follow are local hits.
        if (remote && !req.no_prefetch()) cluster->FetchMissing(c.ns, c.ns_name, keys);
        resp.set_cached_blocks(tiers_.CountCached(c.ns, keys));
        if (!req.no_prefetch()) tiers_.Prefetch(c.ns, keys);
        if (!req.no_prefetch() && req.to_gpu()) {
          // Queued on that GPU's copy worker; the load answers now, whatever becomes of the hint.
          Result<uint32_t> queued = tiers_.PlaceOnGpu(c.ns, keys, req.gpu_device(), /*wait=*/false);
          if (!queued.ok()) {
            LOG_EVERY_N(WARNING, 100)
                << "SESSION_LOAD to gpu " << req.gpu_device() << ": " << queued.status().ToString();
          }
        }
        *resp.mutable_record() = std::move(*record);
      }
    } else {
      st = record.status();
    }
  }
  return Reply(wire::SESSION_LOAD, resp, st);
}

Response SessionHandlers::Delete(Connection& c, std::string_view body) {
  wire::SessionDeleteRequest req;
  wire::SessionDeleteResponse resp;
  Status st = Parse(body, &req, "SESSION_DELETE");
  if (st.ok()) {
    absl::MutexLock lock(&mu_);
    Result<wire::SessionRecord> old = sessions_.Get(c.ns, req.session_id());
    st = old.status();
    if (st.ok()) st = sessions_.Delete(c.ns, req.session_id());
    if (st.ok()) {
      std::vector<BlockKey> keys;
      if (DecodeKeys(old->keys(), UINT32_MAX, &keys).ok()) tiers_.UnpinChain(c.ns, keys);
    }
    ClusterHooks* cluster = cluster_.Get();
    if (cluster != nullptr && !c.peer && (st.ok() || st.IsNotFound())) {
      // Its copies on the session's home nodes go too (a session saved elsewhere as well).
      const bool remote_only =
          st.IsNotFound() && cluster->LoadRemoteSession(c.ns_name, req.session_id()).ok();
      cluster->DeleteRemoteSession(c.ns_name, req.session_id());
      if (remote_only) st = Status::OK();
    }
  }
  return Reply(wire::SESSION_DELETE, resp, st);
}

Response SessionHandlers::List(Connection& c, std::string_view body) {
  wire::SessionListRequest req;
  wire::SessionListResponse resp;
  Status st = Parse(body, &req, "SESSION_LIST");
  if (st.ok()) {
    bool truncated = false;
    const uint32_t limit = req.limit() == 0 ? 1000 : std::min<uint32_t>(req.limit(), 100000);
    Result<std::vector<wire::SessionRecord>> list =
        sessions_.List(c.ns, req.prefix(), limit, &truncated);
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
  return Reply(wire::SESSION_LIST, resp, st);
}

}  // namespace kvpool::daemon
