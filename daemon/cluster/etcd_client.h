#pragma once
// EtcdClient: the few etcd v3 operations kvpool's cluster layer needs (put, range, delete,
// put-if-absent transaction, lease grant / keepalive / revoke, prefix watch), spoken to etcd's
// v3 JSON gateway (`POST /v3/...`, HTTP/1.1, keys and values base64) with Boost.Beast.
//
// Why the JSON gateway and not gRPC: Debian 12 packages libgrpc++-dev and
// protobuf-compiler-grpc (1.51), but not etcd's protos (rpc.proto, kv.proto, auth.proto and the
// gogoproto / google.api annotations they import). Using gRPC would mean vendoring and patching
// those files, adding gRPC (and its own threads and event engine) to the daemon, for six
// calls. etcd 3.4 serves every v3 RPC on the client port as JSON (grpc-gateway), streaming
// ones included (watch, lease keepalive: one JSON message per line of a chunked response).
// Beast, nlohmann_json and OpenSSL are already in the daemon. The cost: int64 fields are JSON
// strings, and errors arrive as HTTP status + {"error", "code"} rather than gRPC status.
//
// Endpoints: "etcd://h1:p1,h2:p2" (or "h1:p1,h2:p2"). A call goes to the endpoint that last
// answered and fails over to the next ones while its deadline allows; a connection that is
// refused, reset or times out counts as that endpoint being down.
//
// Errors: Unavailable when no endpoint answered in time (etcd down or unreachable),
// DeadlineExceeded never (a timeout is reported as Unavailable: the caller cannot tell a slow
// etcd from a dead one and treats both alike), NotFound for a lease etcd does not know,
// FailedPrecondition / InvalidArgument for what etcd rejected, Corruption for a reply that is
// not the JSON it should be.
//
// Thread safety: every method of EtcdClient may be called concurrently; each call opens its
// own connection (loopback or LAN, a few hundred microseconds, at most a few calls a second
// per daemon). An EtcdWatch runs on its own thread (named through common/threads.h) and calls
// its callback there, one update at a time.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpool::daemon::cluster {

struct EtcdEndpoint {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// Parses "etcd://h1:p1[,h2:p2...]" (the scheme is optional). InvalidArgument otherwise.
Result<std::vector<EtcdEndpoint>> ParseEtcdEndpoints(std::string_view spec);

struct EtcdOptions {
  // Deadline of each unary call, failover included. Default: 500 ms (a healthy etcd answers
  // in about a millisecond on a LAN; a keepalive must fit well inside a 2 s lease).
  std::chrono::milliseconds request_timeout{500};
  // Longest wait for one endpoint's TCP connect before trying the next. Default: 200 ms.
  std::chrono::milliseconds connect_timeout{200};
  // Largest reply body accepted (a range over the member prefix). Default: 16 MiB.
  uint64_t max_response_bytes = 16ull << 20;
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;  // the store's revision the range was read at
};

struct PutIfAbsentResult {
  bool created = false;              // true: the key was absent and now holds the value
  std::optional<KeyValue> existing;  // when !created: what holds the key
  int64_t revision = 0;
};

struct LeaseGrant {
  int64_t id = 0;
  int64_t ttl_seconds = 0;  // etcd may raise a small TTL to its minimum (1.5 s rounded up: 2 s)
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete only key and mod_revision are set
};

// What a watch callback receives. `snapshot` updates carry the complete current contents of
// the watched range as kPut events (the receiver replaces its view); they come first and again
// whenever etcd compacted away the revisions the watch needed to resume from, or its revision
// went back below what the watch had seen (data restored or replaced).
struct WatchUpdate {
  bool snapshot = false;
  std::vector<WatchEvent> events;
  int64_t revision = 0;  // the view is complete up to and including this revision
};

// A running watch over a key prefix. Destroying it (or Stop) ends the stream and joins its
// thread; the callback is never called after Stop returns. Never destroy it from its own
// callback.
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
  virtual void Stop() = 0;
  // Drops the current stream and resumes from the last delivered revision (e.g. after the
  // owner learnt that etcd came back, to not wait for TCP to notice a half-open connection).
  virtual void Reconnect() = 0;
  // Like Reconnect, but starts again from a snapshot of the prefix (e.g. after the owner found
  // that etcd lost its lease: the store may have been restored and its history rewritten).
  virtual void Resync() = 0;
  // True while a stream is established (its create request acknowledged).
  virtual bool connected() const = 0;
};

class EtcdClient {
 public:
  static Result<std::unique_ptr<EtcdClient>> Create(std::string_view endpoints,
                                                    EtcdOptions options = {});
  ~EtcdClient();

  const std::vector<EtcdEndpoint>& endpoints() const { return endpoints_; }

  // Writes key = value, attached to `lease` when non-zero. Returns the new revision. NotFound
  // when the lease does not exist (expired or revoked).
  Result<int64_t> Put(std::string_view key, std::string_view value, int64_t lease = 0);
  // The key's current value; an empty `kvs` when absent.
  Result<RangeResult> Get(std::string_view key);
  // Every key starting with `prefix`, in key order.
  Result<RangeResult> GetPrefix(std::string_view prefix);
  // Deletes the key; returns how many keys were deleted (0 or 1).
  Result<int64_t> Delete(std::string_view key);
  // Deletes every key starting with `prefix`; returns how many.
  Result<int64_t> DeletePrefix(std::string_view prefix);
  // One transaction: if the key does not exist, put it (under `lease` when non-zero); else
  // read what holds it. NotFound when the lease does not exist.
  Result<PutIfAbsentResult> PutIfAbsent(std::string_view key, std::string_view value,
                                        int64_t lease = 0);

  // A new lease of `ttl_seconds`.
  Result<LeaseGrant> GrantLease(int64_t ttl_seconds);
  // Renews the lease once; returns its TTL in seconds. NotFound when etcd no longer knows the
  // lease (it expired: every key under it is gone).
  Result<int64_t> KeepAliveOnce(int64_t lease);
  // Ends the lease now, deleting its keys. NotFound when it no longer exists.
  Status RevokeLease(int64_t lease);

  // Discards the history before `revision` (etcd's compaction; watches resuming from an older
  // revision get a fresh snapshot). FailedPrecondition when already compacted past it.
  Status Compact(int64_t revision);

  // Watches every key under `prefix`. With start_revision 0 the first update is a snapshot of
  // the prefix; otherwise events from start_revision on. The watch retries for ever (backoff
  // 100 ms doubling to 1 s, failing over between endpoints) until stopped; `callback` runs on
  // the watch's own thread. This client must outlive the watch.
  std::unique_ptr<EtcdWatch> Watch(std::string prefix, int64_t start_revision,
                                   std::function<void(const WatchUpdate&)> callback);

  // The first key after every key starting with `prefix` (etcd's range_end for a prefix).
  static std::string PrefixEnd(std::string_view prefix);

 private:
  class Http;
  friend class WatchImpl;
  EtcdClient(std::vector<EtcdEndpoint> endpoints, EtcdOptions options);

  std::vector<EtcdEndpoint> endpoints_;
  EtcdOptions options_;
  // Index of the endpoint that answered last; relaxed: only a hint for where to start.
  std::atomic<size_t> preferred_{0};
};

}  // namespace kvpool::daemon::cluster
