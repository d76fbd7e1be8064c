#pragma once
// SessionStore: named chains persisted in RocksDB's `sessions` column family, keyed by
// (namespace, session id). A record is the wire schema's SessionRecord (protobuf, so fields can
// be added compatibly). Writes are synced: a saved session survives a kill -9 or a power cut.
//
// The store only persists records; pinning the chain's blocks is the caller's job (see
// daemon/session_handlers.h), and at start the caller re-pins every record's chain. A deletion
// is a record too (SessionRecord.deleted, a tombstone, so that an older copy elsewhere in a
// cluster cannot come back): Get returns it, List skips it.
//
// Thread safety: all methods may be called concurrently.

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/namespace_id.h"
#include "common/status.h"
#include "control.pb.h"
#include "tiers/rocks_store.h"

namespace kvpool::daemon {

class SessionStore {
 public:
  explicit SessionStore(tiers::RocksStore& store) : store_(store) {}

  // A session id is 1-256 bytes without NUL.
  static Status ValidateId(std::string_view session_id);

  Status Put(NamespaceId ns, const wire::SessionRecord& record);
  // NotFound when absent.
  Result<wire::SessionRecord> Get(NamespaceId ns, std::string_view session_id) const;
  // NotFound when absent. A damaged record is deleted too.
  Status Delete(NamespaceId ns, std::string_view session_id);
  // Live records of `ns` whose id starts with `prefix` and sorts after `start_after`, in id
  // order, at most `limit`; `*truncated` when another live one follows.
  Result<std::vector<wire::SessionRecord>> List(NamespaceId ns, std::string_view prefix,
                                                std::string_view start_after, uint32_t limit,
                                                bool* truncated) const;
  // Every record of every namespace, in key order. An undecodable record is logged and skipped.
  // Read 256 (or 16 MiB) at a time, each page with an iterator released before its records are
  // visited: a visitor may take long (it holds no RocksDB read view) and sees records saved
  // meanwhile only if they sort after the page it is in.
  Status ForEach(const std::function<void(NamespaceId, const wire::SessionRecord&)>& visit) const;
  // What `record` takes in the store (key and value), as charged to its namespace's disk use.
  static uint64_t StoredBytes(const wire::SessionRecord& record);
  // The store's key of a record: the namespace, then the id.
  static std::string Key(NamespaceId ns, std::string_view session_id);

 private:
  tiers::RocksStore& store_;
};

}  // namespace kvpool::daemon
