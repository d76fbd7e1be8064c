#include "daemon/cluster/etcd_client.h"

#include <utility>  // before Asio (Boost 1.74 with C++20)

#include <glog/logging.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster/base64.h"
#include "daemon/cluster/cluster_threads.h"
#include "daemon/cluster/etcd_replies.h"
#include "transport/address.h"

namespace kvpool::daemon::cluster {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kScheme = "etcd://";

Result<std::vector<tcp::endpoint>> Resolve(const EtcdEndpoint& ep) {
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(ep.host, ec);
  if (!ec) return std::vector<tcp::endpoint>{tcp::endpoint(addr, ep.port)};
  // A host name: getaddrinfo, unbounded by our deadline (use addresses where that matters).
  asio::io_context io;
  tcp::resolver resolver(io);
  const auto results = resolver.resolve(ep.host, std::to_string(ep.port), ec);
  if (ec || results.empty()) {
    return Status::Unavailable("cannot resolve etcd host " + ep.host + ": " + ec.message());
  }
  std::vector<tcp::endpoint> out;
  for (const auto& r : results) out.push_back(r.endpoint());
  return out;
}

// Runs one asynchronous operation started by `start` to completion on `io`; returns its error.
template <typename Start>
boost::system::error_code RunOp(asio::io_context& io, Start&& start) {
  boost::system::error_code result = asio::error::operation_aborted;
  start([&result](boost::system::error_code ec, auto&&...) { result = ec; });
  io.restart();
  io.run();
  return result;
}

// Connects `stream` to one of `addrs` within `timeout`.
boost::system::error_code Connect(asio::io_context& io, beast::tcp_stream& stream,
                                  const std::vector<tcp::endpoint>& addrs,
                                  Clock::time_point deadline) {
  stream.expires_at(deadline);
  return RunOp(io, [&](auto handler) { stream.async_connect(addrs, handler); });
}

http::request<http::string_body> MakePost(const EtcdEndpoint& ep, std::string_view path,
                                          std::string body) {
  http::request<http::string_body> req{http::verb::post, std::string(path), 11};
  req.set(http::field::host, ep.ToString());
  req.set(http::field::content_type, "application/json");
  req.set(http::field::user_agent, "kvpoold");
  req.body() = std::move(body);
  req.prepare_payload();
  return req;
}

struct HttpReply {
  unsigned status = 0;
  std::string body;
};

// One POST to one endpoint, bounded by `deadline`. Unavailable when the endpoint cannot be
// reached or does not answer in time.
Result<HttpReply> PostOnce(const EtcdEndpoint& ep, std::string_view path, const std::string& body,
                           Clock::time_point deadline, const EtcdOptions& options) {
  KVPOOL_ASSIGN_OR_RETURN(const auto addrs, Resolve(ep));
  asio::io_context io;
  beast::tcp_stream stream(io);
  auto ec = Connect(io, stream, addrs, std::min(deadline, Clock::now() + options.connect_timeout));
  if (ec) return Status::Unavailable("etcd " + ep.ToString() + ": connect: " + ec.message());
  stream.socket().set_option(tcp::no_delay(true), ec);
  stream.expires_at(deadline);
  auto req = MakePost(ep, path, body);
  req.keep_alive(false);
  ec = RunOp(io, [&](auto handler) { http::async_write(stream, req, handler); });
  if (ec) return Status::Unavailable("etcd " + ep.ToString() + ": send: " + ec.message());
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(options.max_response_bytes);
  ec = RunOp(io, [&](auto handler) { http::async_read(stream, buffer, parser, handler); });
  if (ec == http::error::body_limit) {
    return Status::ResourceExhausted("etcd " + ep.ToString() + ": reply larger than " +
                                     std::to_string(options.max_response_bytes) + " bytes");
  }
  if (ec) return Status::Unavailable("etcd " + ep.ToString() + ": receive: " + ec.message());
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return HttpReply{parser.get().result_int(), parser.release().body()};
}

json RangeRequest(std::string_view key, const std::string* range_end) {
  json req = {{"key", Base64Encode(key)}};
  if (range_end != nullptr) req["range_end"] = Base64Encode(*range_end);
  return req;
}

}  // namespace

Result<std::vector<EtcdEndpoint>> ParseEtcdEndpoints(std::string_view spec) {
  if (spec.substr(0, kScheme.size()) == kScheme) spec.remove_prefix(kScheme.size());
  std::vector<EtcdEndpoint> out;
  while (!spec.empty() || out.empty()) {
    const size_t comma = spec.find(',');
    const std::string_view part = spec.substr(0, comma);
    EtcdEndpoint ep;
    if (!transport::ParseHostPort(part, &ep.host, &ep.port).ok() || ep.host.empty() ||
        ep.port == 0) {
      return Status::InvalidArgument("bad etcd endpoint '" + std::string(part) +
                                     "': want etcd://HOST:PORT[,HOST:PORT...]");
    }
    out.push_back(std::move(ep));
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
    if (spec.empty()) return Status::InvalidArgument("etcd endpoint list ends with ','");
  }
  return out;
}

// The unary-call half: POST a JSON body, fail over between endpoints within one deadline.
class EtcdClient::Http {
 public:
  static Result<json> Call(EtcdClient& c, std::string_view path, const json& request) {
    const auto deadline = Clock::now() + c.options_.request_timeout;
    const std::string body = request.dump();
    const size_t n = c.endpoints_.size();
    const size_t start = c.preferred_.load(std::memory_order_relaxed);
    Status last = Status::Unavailable("no etcd endpoint tried");
    for (size_t i = 0; i < n && Clock::now() < deadline; ++i) {
      const size_t idx = (start + i) % n;
      const EtcdEndpoint& ep = c.endpoints_[idx];
      auto reply = PostOnce(ep, path, body, deadline, c.options_);
      if (!reply.ok()) {
        last = reply.status();
        if (last.code() != StatusCode::kUnavailable) return last;
        continue;
      }
      auto j = ParseReplyBody(reply->body);
      if (!j.ok()) {
        return j.status().WithContext("etcd " + ep.ToString() + std::string(path) + " (HTTP " +
                                      std::to_string(reply->status) + ")");
      }
      if (reply->status != 200) {
        Status st = ErrorOfReply(ep.ToString(), reply->status, *j);
        // "no leader", "leader changed", a stopping member: another endpoint may do better.
        if (st.code() == StatusCode::kUnavailable) {
          last = st;
          continue;
        }
        return st;
      }
      c.preferred_.store(idx, std::memory_order_relaxed);
      return std::move(j).value();
    }
    if (Clock::now() >= deadline && last.code() == StatusCode::kUnavailable) {
      return Status::Unavailable(std::string(path) + ": no etcd answer within " +
                                 std::to_string(c.options_.request_timeout.count()) +
                                 " ms; last: " + last.message());
    }
    return last;
  }
};

EtcdClient::EtcdClient(std::vector<EtcdEndpoint> endpoints, EtcdOptions options)
    : endpoints_(std::move(endpoints)), options_(options) {}

EtcdClient::~EtcdClient() = default;

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(std::string_view endpoints,
                                                       EtcdOptions options) {
  KVPOOL_ASSIGN_OR_RETURN(auto eps, ParseEtcdEndpoints(endpoints));
  if (options.request_timeout.count() <= 0 || options.connect_timeout.count() <= 0) {
    return Status::InvalidArgument("etcd timeouts must be positive");
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(eps), options));
}

std::string EtcdClient::PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // etcd: "\0" as range_end means "to the end of the keyspace"
}

Result<int64_t> EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  json req = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) req["lease"] = std::to_string(lease);
  KVPOOL_ASSIGN_OR_RETURN(const json j, Http::Call(*this, "/v3/kv/put", req));
  return HeaderRevision(j);
}

Result<RangeResult> EtcdClient::Get(std::string_view key) {
  KVPOOL_ASSIGN_OR_RETURN(const json j,
                          Http::Call(*this, "/v3/kv/range", RangeRequest(key, nullptr)));
  return ParseRangeReply(j);
}

Result<RangeResult> EtcdClient::GetPrefix(std::string_view prefix) {
  const std::string end = PrefixEnd(prefix);
  KVPOOL_ASSIGN_OR_RETURN(const json j,
                          Http::Call(*this, "/v3/kv/range", RangeRequest(prefix, &end)));
  return ParseRangeReply(j);
}

Result<int64_t> EtcdClient::Delete(std::string_view key) {
  KVPOOL_ASSIGN_OR_RETURN(const json j,
                          Http::Call(*this, "/v3/kv/deleterange", RangeRequest(key, nullptr)));
  return JsonInt(j, "deleted");
}

Result<int64_t> EtcdClient::DeletePrefix(std::string_view prefix) {
  const std::string end = PrefixEnd(prefix);
  KVPOOL_ASSIGN_OR_RETURN(const json j,
                          Http::Call(*this, "/v3/kv/deleterange", RangeRequest(prefix, &end)));
  return JsonInt(j, "deleted");
}

Result<PutIfAbsentResult> EtcdClient::PutIfAbsent(std::string_view key, std::string_view value,
                                                  int64_t lease) {
  const std::string k = Base64Encode(key);
  json put = {{"key", k}, {"value", Base64Encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  const json req = {
      {"compare",
       json::array(
           {{{"key", k}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}}})},
      {"success", json::array({{{"request_put", put}}})},
      {"failure", json::array({{{"request_range", {{"key", k}}}}})},
  };
  KVPOOL_ASSIGN_OR_RETURN(const json j, Http::Call(*this, "/v3/kv/txn", req));
  return ParseTxnReply(j);
}

Result<LeaseGrant> EtcdClient::GrantLease(int64_t ttl_seconds) {
  if (ttl_seconds <= 0) return Status::InvalidArgument("lease TTL must be positive");
  KVPOOL_ASSIGN_OR_RETURN(const json j, Http::Call(*this, "/v3/lease/grant",
                                                   json{{"TTL", std::to_string(ttl_seconds)}}));
  return ParseLeaseGrantReply(j);
}

Result<int64_t> EtcdClient::KeepAliveOnce(int64_t lease) {
  // A bidirectional stream in gRPC; through the gateway one request line gets one result line.
  KVPOOL_ASSIGN_OR_RETURN(
      const json j, Http::Call(*this, "/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}));
  return ParseKeepAliveReply(j, lease);
}

Status EtcdClient::RevokeLease(int64_t lease) {
  auto j = Http::Call(*this, "/v3/lease/revoke", json{{"ID", std::to_string(lease)}});
  return j.status();
}

Status EtcdClient::Compact(int64_t revision) {
  return Http::Call(*this, "/v3/kv/compaction",
                    json{{"revision", std::to_string(revision)}, {"physical", true}})
      .status();
}

// ---------------------------------------------------------------------------------------------
// Watch

class WatchImpl final : public EtcdWatch {
 public:
  WatchImpl(EtcdClient& client, std::string prefix, int64_t start_revision,
            std::function<void(const WatchUpdate&)> callback)
      : client_(client),
        prefix_(std::move(prefix)),
        next_revision_(start_revision),
        need_snapshot_(start_revision <= 0),
        callback_(std::move(callback)) {
    ep_index_ = client_.preferred_.load(std::memory_order_relaxed);
    thread_ = StartThread(kClusterThreadRole, NextClusterThreadIndex(), [this] { Run(); });
  }
  ~WatchImpl() override { Stop(); }

  void Stop() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
    }
    if (thread_.joinable()) thread_.join();
  }

  void Reconnect() override {
    absl::MutexLock lock(&mu_);
    kick_ = true;
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  }

  void Resync() override {
    absl::MutexLock lock(&mu_);
    resync_ = true;
    kick_ = true;
    if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  }

  bool connected() const override { return connected_.load(std::memory_order_acquire); }

 private:
  enum class End { kFailed, kCompacted, kClosed };

  bool stopping() const {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }

  bool Woken() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || kick_; }

  // Sleeps `d`, waking early on Stop, Reconnect or Resync.
  void Pause(std::chrono::milliseconds d) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &WatchImpl::Woken), absl::FromChrono(d));
  }

  // Consumes a Reconnect or Resync request.
  void TakeRequests() {
    absl::MutexLock lock(&mu_);
    kick_ = false;
    if (resync_) need_snapshot_ = true;
    resync_ = false;
  }

  void Run() {
    std::chrono::milliseconds backoff{100};
    while (!stopping()) {
      TakeRequests();
      if (need_snapshot_ && !Snapshot()) {
        Pause(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
        continue;
      }
      bool was_created = false;
      const End end =
          Stream(client_.endpoints_[ep_index_ % client_.endpoints_.size()], &was_created);
      connected_.store(false, std::memory_order_release);
      if (end == End::kCompacted) {
        need_snapshot_ = true;
        continue;
      }
      if (was_created) {
        backoff = std::chrono::milliseconds(100);
      } else {
        ++ep_index_;  // this endpoint did not take the watch: try the next one
      }
      if (stopping()) break;
      Pause(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
  }

  bool Snapshot() {
    auto range = client_.GetPrefix(prefix_);
    if (!range.ok()) {
      VLOG(1) << "etcd watch " << prefix_ << ": snapshot failed: " << range.status().ToString();
      return false;
    }
    WatchUpdate update;
    update.snapshot = true;
    update.revision = range->revision;
    for (auto& kv : range->kvs) {
      update.events.push_back(WatchEvent{WatchEvent::Type::kPut, std::move(kv)});
    }
    next_revision_ = range->revision + 1;
    need_snapshot_ = false;
    callback_(update);
    return true;
  }

  // One watch stream on `ep`, from next_revision_, until it breaks, is stopped or is cancelled.
  End Stream(const EtcdEndpoint& ep, bool* was_created) {
    auto addrs = Resolve(ep);
    if (!addrs.ok()) return End::kFailed;
    asio::io_context io;
    beast::tcp_stream stream(io);
    const auto& options = client_.options_;
    auto ec = Connect(io, stream, *addrs, Clock::now() + options.connect_timeout);
    if (ec) {
      VLOG(1) << "etcd watch " << prefix_ << ": connect " << ep.ToString() << ": " << ec.message();
      return End::kFailed;
    }
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return End::kClosed;
      fd_ = stream.socket().native_handle();
    }
    // Unregistered before `stream` closes the descriptor (declared after it: destroyed first).
    struct Unregister {
      WatchImpl* self;
      ~Unregister() {
        absl::MutexLock lock(&self->mu_);
        self->fd_ = -1;
      }
    } unregister{this};
    // A silently dead etcd host (no RST) is noticed within ~5 s by TCP keepalive.
    const int fd = stream.socket().native_handle();
    int on = 1, idle = 2, interval = 1, count = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));

    const std::string end = EtcdClient::PrefixEnd(prefix_);
    const json create = {{"create_request",
                          {{"key", Base64Encode(prefix_)},
                           {"range_end", Base64Encode(end)},
                           {"start_revision", std::to_string(next_revision_)},
                           {"progress_notify", true}}}};
    auto req = MakePost(ep, "/v3/watch", create.dump());
    stream.expires_after(options.request_timeout);
    ec = RunOp(io, [&](auto handler) { http::async_write(stream, req, handler); });
    if (ec) {
      VLOG(1) << "etcd watch " << prefix_ << ": send to " << ep.ToString() << ": " << ec.message();
      return End::kFailed;
    }
    beast::flat_buffer buffer;
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(boost::none);  // the stream is endless; each line is bounded below
    ec = RunOp(io, [&](auto handler) { http::async_read_header(stream, buffer, parser, handler); });
    if (ec) {
      VLOG(1) << "etcd watch " << prefix_ << ": reply from " << ep.ToString() << ": "
              << ec.message();
      return End::kFailed;
    }
    if (parser.get().result_int() != 200) {
      LOG(WARNING) << "etcd " << ep.ToString() << " refused the watch on " << prefix_ << ": HTTP "
                   << parser.get().result_int();
      return End::kFailed;
    }
    stream.expires_never();
    std::string pending;
    std::vector<char> chunk(64 * 1024);
    while (!parser.is_done()) {
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      ec = RunOp(io, [&](auto handler) { http::async_read_some(stream, buffer, parser, handler); });
      if (ec && ec != http::error::need_buffer) {
        VLOG(1) << "etcd watch " << prefix_ << " on " << ep.ToString()
                << " broke: " << ec.message();
        break;
      }
      pending.append(chunk.data(), chunk.size() - parser.get().body().size);
      size_t begin = 0;
      for (size_t nl; (nl = pending.find('\n', begin)) != std::string::npos; begin = nl + 1) {
        const End end_now =
            OnLine(std::string_view(pending).substr(begin, nl - begin), ep, was_created);
        if (end_now != End::kClosed) return end_now;  // kClosed here means "keep going"
      }
      pending.erase(0, begin);
      if (pending.size() > options.max_response_bytes) {
        LOG(WARNING) << "etcd watch " << prefix_ << ": message over " << options.max_response_bytes
                     << " bytes; reconnecting";
        return End::kFailed;
      }
    }
    return stopping() ? End::kClosed : End::kFailed;
  }

  // Handles one JSON message of the stream. kClosed: carry on reading.
  End OnLine(std::string_view line, const EtcdEndpoint& ep, bool* was_created) {
    if (line.find_first_not_of(" \r\t") == std::string_view::npos) return End::kClosed;
    WatchMessage m = ParseWatchMessage(line);
    switch (m.kind) {
      case WatchMessage::Kind::kInvalid:
        LOG(WARNING) << "etcd watch " << prefix_ << ": unparsable message from " << ep.ToString()
                     << ": " << m.reason;
        return End::kFailed;
      case WatchMessage::Kind::kError:
        LOG(WARNING) << "etcd watch " << prefix_ << " on " << ep.ToString()
                     << " ended: " << m.reason;
        return End::kFailed;
      case WatchMessage::Kind::kCompacted:
        LOG(INFO) << "etcd watch " << prefix_ << ": revision " << next_revision_
                  << " compacted (now " << m.revision << "); re-reading the prefix";
        return End::kCompacted;
      case WatchMessage::Kind::kCanceled:
        LOG(WARNING) << "etcd watch " << prefix_ << " cancelled: " << m.reason;
        return End::kFailed;
      case WatchMessage::Kind::kCreated:
        // The store's revision now; below what we already saw, etcd's data was restored from a
        // backup or replaced: the history we would resume from is not the one we saw.
        if (m.revision > 0 && m.revision + 1 < next_revision_) {
          LOG(WARNING) << "etcd " << ep.ToString() << " is at revision " << m.revision
                       << ", before the " << next_revision_ - 1
                       << " this watch saw (data restored or replaced); re-reading " << prefix_;
          return End::kCompacted;
        }
        *was_created = true;
        connected_.store(true, std::memory_order_release);
        return End::kClosed;
      case WatchMessage::Kind::kProgress:
        // A progress notification: nothing up to header.revision is left to deliver.
        if (m.revision >= next_revision_) next_revision_ = m.revision + 1;
        return End::kClosed;
      case WatchMessage::Kind::kEvents:
        break;
    }
    const WatchUpdate& update = m.update;
    if (update.revision >= next_revision_) next_revision_ = update.revision + 1;
    callback_(update);
    return End::kClosed;
  }

  EtcdClient& client_;
  const std::string prefix_;
  // Watch-thread only.
  int64_t next_revision_;
  bool need_snapshot_;
  size_t ep_index_ = 0;
  const std::function<void(const WatchUpdate&)> callback_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool kick_ ABSL_GUARDED_BY(mu_) = false;    // Reconnect or Resync asked, not yet taken
  bool resync_ ABSL_GUARDED_BY(mu_) = false;  // Resync asked, not yet taken
  int fd_ ABSL_GUARDED_BY(mu_) = -1;          // the live stream's socket, for Stop and Reconnect
  std::atomic<bool> connected_{false};        // release/acquire: a status flag for observers
  std::thread thread_;
};

std::unique_ptr<EtcdWatch> EtcdClient::Watch(std::string prefix, int64_t start_revision,
                                             std::function<void(const WatchUpdate&)> callback) {
  return std::make_unique<WatchImpl>(*this, std::move(prefix), start_revision, std::move(callback));
}

}  // namespace kvpool::daemon::cluster
