// libFuzzer target: etcd's replies as kvpool's cluster layer reads them
// (daemon/cluster/etcd_replies.h) and the member records peers publish through etcd
// (daemon/cluster/membership.h). etcd, or whatever answers on its port, controls every byte.
//
// Input: the first byte picks the reader (and, for unary replies, the HTTP status); the rest is
// the reply body or watch line. Nothing may throw or crash; what parses must be self-consistent.

#include <cstdint>
#include <string_view>

#include "daemon/cluster/etcd_replies.h"
#include "daemon/cluster/membership.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvpool::daemon::cluster;
  if (size == 0) return 0;
  const uint8_t pick = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (pick % 4) {
    case 0: {  // a unary reply: each call's reader, and the error reading for non-200 answers
      auto j = ParseReplyBody(text);
      if (!j.ok()) return 0;
      const unsigned status = (pick >> 2) % 2 ? 200 : 400 + (pick >> 3);
      if (status != 200) {
        kvpool::Status st = ErrorOfReply("fuzz", status, *j);
        if (st.ok()) __builtin_trap();  // an error reply never reads as success
        return 0;
      }
      (void)HeaderRevision(*j);
      (void)JsonInt(*j, "deleted");
      auto range = ParseRangeReply(*j);
      auto txn = ParseTxnReply(*j);
      if (txn.ok() && !txn->created && !txn->existing.has_value()) __builtin_trap();
      auto grant = ParseLeaseGrantReply(*j);
      if (grant.ok() && (grant->id == 0 || grant->ttl_seconds <= 0)) __builtin_trap();
      auto ttl = ParseKeepAliveReply(*j, 7);
      if (ttl.ok() && *ttl <= 0) __builtin_trap();
      return 0;
    }
    case 1: {  // one line of a watch stream
      WatchMessage m = ParseWatchMessage(text);
      if (m.kind == WatchMessage::Kind::kEvents && m.update.events.empty()) __builtin_trap();
      return 0;
    }
    default: {  // a member record (another daemon's, or anyone's who can write to etcd)
      auto record = DecodeMemberRecord(text);
      (void)record;
      return 0;
    }
  }
}
