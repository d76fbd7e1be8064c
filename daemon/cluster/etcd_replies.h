#pragma once
// Reading etcd's v3 JSON gateway replies (proto3 JSON mapping: int64 fields as strings, bytes
// as base64, empty fields omitted). A reply is input from another process, possibly broken or
// hostile: nothing here throws or trusts a field's type; a reply of the wrong shape is
// Corruption. Split from etcd_client.cc so the parsing is fuzzed on its own
// (fuzz/fuzz_etcd_replies.cc).
//
// Thread safety: pure functions.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"
#include "daemon/cluster/etcd_client.h"

namespace kvpool::daemon::cluster {

// An integer field (a JSON string or number); 0 when absent, null, or not an int64.
int64_t JsonInt(const nlohmann::json& j, const char* field);
// `header.revision` of a reply; 0 when absent.
int64_t HeaderRevision(const nlohmann::json& j);

// A unary reply's body: a JSON object, or Corruption.
Result<nlohmann::json> ParseReplyBody(std::string_view body);
// The error a reply with HTTP status `http_status` (not 200) stands for; `where` names the
// endpoint and call for messages. Unavailable means another endpoint may do better.
Status ErrorOfReply(const std::string& where, unsigned http_status, const nlohmann::json& j);

Result<RangeResult> ParseRangeReply(const nlohmann::json& j);
// PutIfAbsent's transaction (compare create_revision == 0; success: put; failure: range).
Result<PutIfAbsentResult> ParseTxnReply(const nlohmann::json& j);
Result<LeaseGrant> ParseLeaseGrantReply(const nlohmann::json& j);
// The TTL left; NotFound when etcd says the lease expired, Unavailable for an error message.
Result<int64_t> ParseKeepAliveReply(const nlohmann::json& j, int64_t lease);

// One line of a watch stream.
struct WatchMessage {
  enum class Kind {
    kInvalid,    // not a JSON object, or events that do not parse (`reason`)
    kError,      // the stream ended with an error (`reason`)
    kCanceled,   // etcd cancelled the watch (`reason`)
    kCompacted,  // cancelled: the revisions to resume from were compacted (`revision`: now)
    kCreated,    // the watch is established (`revision`: the store's revision)
    kProgress,   // nothing up to `revision` is left to deliver
    kEvents,     // `update` (not a snapshot)
  };
  Kind kind = Kind::kInvalid;
  int64_t revision = 0;
  std::string reason;
  WatchUpdate update;
};
WatchMessage ParseWatchMessage(std::string_view line);

}  // namespace kvpool::daemon::cluster
