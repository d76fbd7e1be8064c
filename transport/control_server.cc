#include "transport/control_server.h"

// Boost 1.74's Asio needs <utility> before it under C++20 (std::exchange).
#include <utility>

#include <glog/logging.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>

#include "common/threads.h"
#include "transport/address.h"
#include "transport/tls.h"

namespace kvpool::transport {
namespace asio = boost::asio;
using boost::system::error_code;

namespace {

class ServerImpl;

using UnixSocket = asio::local::stream_protocol::socket;
using TcpSocket = asio::ip::tcp::socket;
using TlsStream = asio::ssl::stream<TcpSocket>;

// One client connection over a stream: a Unix socket, a TCP socket, or TLS over TCP.
template <typename Stream>
class Connection : public std::enable_shared_from_this<Connection<Stream>> {
 public:
  // File descriptors travel only on the Unix socket; a TLS stream shakes hands first.
  static constexpr bool kLocal = std::is_same_v<Stream, UnixSocket>;
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

  // `io`: the I/O context `socket` belongs to, which runs every handler of this connection.
  Connection(ServerImpl& server, asio::io_context& io, Stream socket, ConnectionInfo info,
             std::string peer_key);
  void Start();
  void Close(const std::string& reason);

 private:
  void Handshake();  // strand, TLS only: then ReadHeader
  // Reads arrive through `in_`: one read takes what the socket holds, up to kReadAhead bytes,
  // so a short frame (header and body) costs one read, and frames a client sent back to back
  // (a RELEASE, then the next GET) come in together. A longer body is read straight into
  // body_, a payload straight into its sinks, after what `in_` already holds of them.
  void ReadHeader();
  // Reads more into `in_`, then ReadHeader again; a failure closes the connection, quietly
  // when the peer hung up between frames.
  void ReadMore();
  void ReadBody();
  void OnBody();  // the body is whole: the payload, or Dispatch
  void ReadPayload(size_t sink_index, uint64_t done);
  void Dispatch();
  // Whether the handler admitted this connection, asking it until it has (strand only).
  bool Admitted();
  void Write(Response response);
  // `counted`: entered again once the socket had room, the descriptors already counted.
  void SendWithFds(std::shared_ptr<Response> held, std::vector<asio::const_buffer> bufs,
                   bool counted = false);
  void ArmTimer(const char* what);
  // Strand: closes the connection `after` from now unless the handler admitted it by then.
  void ArmHelloTimer(std::chrono::milliseconds after);
  void DisarmTimer();
  void EndHandling();  // strand: a handler finished; runs a deferred Finish
  void Finish();       // once: OnDisconnect, then Linger
  // Strand: waits (polling) while a closed connection's client has descriptors unread, then
  // closes the socket and lets the server forget the connection.
  void Linger();
  // Bytes sent on this Unix socket that the client has not read (SIOCOUTQ); -1 where unknown.
  int UnreadBytes();

  ServerImpl& server_;
  Stream socket_;
  asio::strand<asio::io_context::executor_type> strand_;
  asio::steady_timer timer_;
  asio::steady_timer hello_timer_;  // closes a connection not admitted in time
  ConnectionInfo info_;
  const std::string peer_key_;  // what max_connections_per_peer counts by
  bool admitted_ = false;       // strand: the handler admitted it (cached once true)
  bool handshaking_ = false;    // strand: a TLS handshake is under way
  std::unique_ptr<ConnectionState> state_;
  static constexpr size_t kReadAhead = 16 * 1024;
  static constexpr size_t kHelloReadAhead = 1024;  // before the hello admits the connection
  size_t Buffered() const { return in_end_ - in_pos_; }
  // Copies up to `n` buffered bytes to `dst` (null: drops them); how many.
  size_t TakeBuffered(uint8_t* dst, size_t n);

  std::vector<uint8_t> in_;  // kHelloReadAhead bytes at the first read, kReadAhead once admitted
  size_t in_pos_ = 0;        // in_[in_pos_, in_end_) is received and not yet taken
  size_t in_end_ = 0;
  uint8_t header_bytes_[kFrameHeaderBytes];
  FrameHeader header_;
  std::string body_;
  std::vector<PayloadSink> sinks_;
  std::vector<uint8_t> scratch_;
  uint8_t out_header_[kFrameHeaderBytes];
  // Descriptors sent since this connection last had nothing unread (strand only). Those in
  // answers the client has not read are in flight, counted against kvpoold's own open-file
  // limit: a client that asks for them and does not read is closed past kMaxUnreadFds, or past
  // ServerImpl::kMaxUnreadFdsPerPeer over all the connections of its user.
  size_t unread_fds_ = 0;
  static constexpr size_t kMaxUnreadFds = 1024;
  bool lingering_ = false;  // strand: closed with descriptors unread (Linger)
  bool closed_ = false;
  // A request (or its PayloadSinks) runs on a worker: OnDisconnect waits for it (strand only).
  bool handling_ = false;
  bool finish_deferred_ = false;
  // Bumped by each ArmTimer and DisarmTimer: a timer that fires for an old frame is ignored
  // (cancel cannot withdraw a handler that was already queued).
  uint64_t timer_seq_ = 0;
  std::atomic<bool> finished_{false};
};

class ServerImpl final : public ControlServer {
 public:
  ServerImpl(const ControlServerOptions& options, RequestHandler& handler)
      : options_(options),
        handler_(handler),
        ios_(MakeIoContexts(options.io_threads)),
        workers_(std::max(1, options.worker_threads)),
        workers_guard_(asio::make_work_guard(workers_)),
        unix_acceptor_(io()),
        tcp_acceptor_(io()) {
    for (auto& io : ios_) io_guards_.push_back(asio::make_work_guard(*io));
  }

  ~ServerImpl() override { Stop(); }

  Status Listen();
  void Run();

  void Stop() override;
  std::string unix_path() const override { return options_.unix_path; }
  std::string tcp_address() const override { return tcp_address_; }
  uint64_t connections() const override { return live_.load(std::memory_order_relaxed); }

  const ControlServerOptions& options() const { return options_; }
  RequestHandler& handler() { return handler_; }
  // The acceptors' I/O context (the first).
  asio::io_context& io() { return *ios_.front(); }
  asio::io_context& workers() { return workers_; }

  void Register(const std::shared_ptr<void>& conn, std::function<void()> closer) {
    std::lock_guard<std::mutex> lock(mu_);
    closers_[conn.get()] = std::move(closer);
  }
  // Descriptors sent to a peer's (a Unix user's) connections and not yet read by them, all
  // connections together: false, counting nothing, when `more` would take them past the limit.
  bool AddUnreadFds(const std::string& peer_key, size_t more) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t& n = unread_fds_[peer_key];
    if (n + more > kMaxUnreadFdsPerPeer) return false;
    n += more;
    return true;
  }
  void DropUnreadFds(const std::string& peer_key, size_t fewer) {
    if (fewer == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = unread_fds_.find(peer_key);
    if (it == unread_fds_.end()) return;
    it->second -= std::min(it->second, fewer);
    if (it->second == 0) unread_fds_.erase(it);
  }
  static constexpr size_t kMaxUnreadFdsPerPeer = 8192;
  bool stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopped_;
  }

  void Unregister(void* conn, const std::string& peer_key) {
    std::lock_guard<std::mutex> lock(mu_);
    closers_.erase(conn);
    if (auto it = per_peer_.find(peer_key); it != per_peer_.end() && --it->second == 0) {
      per_peer_.erase(it);
    }
    live_.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  void AcceptUnix();
  void AcceptTcp();
  // Runs `again` on the I/O context 100 ms from now (after an accept error).
  void AfterBackoff(std::function<void()> again) {
    auto timer = std::make_shared<asio::steady_timer>(io(), std::chrono::milliseconds(100));
    timer->async_wait([timer, again = std::move(again)](error_code ec) {
      if (!ec) again();
    });
  }
  template <typename Stream>
  void Adopt(asio::io_context& io, Stream socket, std::string peer, std::string peer_key);
  // One I/O context per I/O thread: a connection's handlers all run on the thread of the
  // context it was accepted onto (round robin), so a request and its reply never hop between
  // I/O threads, and no I/O thread wakes another to run a handler.
  // Runs `io` until it is stopped. With a busy-poll window, after each handler it keeps
  // polling (epoll without a timeout) for that long before it sleeps, so a request arriving
  // meanwhile does not have to wake it.
  static void RunIo(asio::io_context& io, std::chrono::microseconds busy_poll) {
    if (busy_poll.count() <= 0) {
      io.run();
      return;
    }
    auto last = std::chrono::steady_clock::now();
    while (!io.stopped()) {
      if (io.poll() > 0) {
        last = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - last >= busy_poll) {
        io.run_one();  // sleeps until the next handler
        last = std::chrono::steady_clock::now();
      }
    }
  }

  static std::vector<std::unique_ptr<asio::io_context>> MakeIoContexts(int threads) {
    std::vector<std::unique_ptr<asio::io_context>> ios;
    for (int i = 0; i < std::max(1, threads); ++i) {
      ios.push_back(std::make_unique<asio::io_context>(1));
    }
    return ios;
  }
  // The context the next accepted connection goes to.
  asio::io_context& NextIo() {
    return *ios_[next_io_.fetch_add(1, std::memory_order_relaxed) % ios_.size()];
  }

  const ControlServerOptions options_;
  RequestHandler& handler_;
  std::vector<std::unique_ptr<asio::io_context>> ios_;  // one per I/O thread
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> io_guards_;
  std::atomic<size_t> next_io_{0};
  asio::io_context workers_;  // request handling, run by kRequestWorker threads
  asio::executor_work_guard<asio::io_context::executor_type> workers_guard_;
  asio::local::stream_protocol::acceptor unix_acceptor_;
  asio::ip::tcp::acceptor tcp_acceptor_;
  std::unique_ptr<asio::ssl::context> tls_;  // set: the TCP listener speaks TLS
  std::string tcp_address_;
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> next_id_{1};
  // Relaxed: a gauge for stats and the connection limit, not used to order memory.
  std::atomic<uint64_t> live_{0};
  std::mutex mu_;
  std::map<void*, std::function<void()>> closers_;  // guarded by mu_
  std::map<std::string, uint32_t> per_peer_;        // guarded by mu_: connections per peer
  std::map<std::string, size_t> unread_fds_;        // guarded by mu_: AddUnreadFds
  bool stopped_ = false;
};

// ---------------------------------------------------------------------------------------------

template <typename Stream>
Connection<Stream>::Connection(ServerImpl& server, asio::io_context& io, Stream socket,
                               ConnectionInfo info, std::string peer_key)
    : server_(server),
      socket_(std::move(socket)),
      strand_(asio::make_strand(io)),
      timer_(io),
      hello_timer_(io),
      info_(std::move(info)),
      peer_key_(std::move(peer_key)) {}

template <typename Stream>
void Connection<Stream>::Start() {
  state_ = server_.handler().OnConnect(info_);
  auto self = this->shared_from_this();
  server_.Register(
      self, [self] { asio::post(self->strand_, [self] { self->Close("server stopping"); }); });
  asio::post(strand_, [self] {
    // The hello timeout bounds a TLS handshake too, admitted or not.
    self->ArmHelloTimer(self->server_.options().hello_timeout);
    if constexpr (kTls) {
      self->Handshake();
    } else {
      self->ReadHeader();
    }
  });
}

template <typename Stream>
void Connection<Stream>::Handshake() {
  handshaking_ = true;
  auto self = this->shared_from_this();
  auto done = [self](error_code ec) {
    self->handshaking_ = false;
    if (ec) {
      self->Close("TLS handshake: " + ec.message());
      return;
    }
    self->ReadHeader();
  };
  socket_.async_handshake(asio::ssl::stream_base::server, asio::bind_executor(strand_, done));
}

template <typename Stream>
void Connection<Stream>::ArmHelloTimer(std::chrono::milliseconds after) {
  auto self = this->shared_from_this();
  hello_timer_.expires_after(after);
  hello_timer_.async_wait(asio::bind_executor(strand_, [self](error_code ec) {
    if (ec || self->closed_) return;
    if (self->handshaking_) {
      self->Close("TLS handshake not completed within the hello timeout");
      return;
    }
    if (self->admitted_) return;
    if (self->handling_) {
      // Its hello may be the request a worker runs now: look again once it is answered.
      self->ArmHelloTimer(std::chrono::milliseconds(100));
      return;
    }
    if (!self->Admitted()) self->Close("not admitted within the hello timeout");
  }));
}

template <typename Stream>
void Connection<Stream>::Close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  if (!reason.empty())
    LOG(INFO) << "closing connection " << info_.id << " (" << info_.peer << "): " << reason;
  error_code ec;
  DisarmTimer();
  hello_timer_.cancel();
  if constexpr (kLocal) {
    // Descriptors in answers the client has not read stay in flight, counted against kvpoold,
    // as long as its end is open: so does this socket (Linger), and they go on counting against
    // its user's budget and connections.
    lingering_ = unread_fds_ > 0 && UnreadBytes() > 0;
  }
  if (lingering_) {
    // Nothing more is read or written (what is pending is aborted now, its handlers run on the
    // strand with an error), but the descriptor stays open: the queued answers stay the
    // client's to read, and SIOCOUTQ says when they are gone.
    socket_.lowest_layer().shutdown(asio::socket_base::shutdown_both, ec);
    socket_.lowest_layer().cancel(ec);
  } else {
    // A TLS stream is closed without a close_notify: nothing more is read from or written to it.
    socket_.lowest_layer().shutdown(asio::socket_base::shutdown_both, ec);
    socket_.lowest_layer().close(ec);
  }
  if (handling_) {
    finish_deferred_ = true;  // OnDisconnect must not run beside Handle for this connection
  } else {
    Finish();
  }
}

template <typename Stream>
void Connection<Stream>::EndHandling() {
  handling_ = false;
  if (finish_deferred_) {
    finish_deferred_ = false;
    Finish();
  }
}

template <typename Stream>
void Connection<Stream>::Finish() {
  if (finished_.exchange(true)) return;
  auto self = this->shared_from_this();
  // The handler may block (it frees reservations): run it on a worker, not the I/O thread.
  asio::post(server_.workers(), [self] {
    self->server_.handler().OnDisconnect(*self->state_);
    asio::post(self->strand_, [self] { self->Linger(); });
  });
}

template <typename Stream>
void Connection<Stream>::Linger() {
  if (lingering_ && UnreadBytes() > 0 && !server_.stopping()) {
    timer_.expires_after(std::chrono::milliseconds(500));
    auto self = this->shared_from_this();
    timer_.async_wait(asio::bind_executor(strand_, [self](error_code) { self->Linger(); }));
    return;
  }
  error_code ec;
  if (lingering_) socket_.lowest_layer().close(ec);  // read, or its end closed: none in flight
  server_.DropUnreadFds(peer_key_, std::exchange(unread_fds_, 0));
  server_.Unregister(this, peer_key_);
}

template <typename Stream>
int Connection<Stream>::UnreadBytes() {
  int n = -1;
  if constexpr (kLocal) {
    if (::ioctl(socket_.native_handle(), SIOCOUTQ, &n) != 0) n = -1;
  }
  return n;
}

template <typename Stream>
void Connection<Stream>::ArmTimer(const char* what) {
  const uint64_t seq = ++timer_seq_;
  timer_.expires_after(server_.options().frame_timeout);
  auto self = this->shared_from_this();
  timer_.async_wait(asio::bind_executor(strand_, [self, seq, what](error_code ec) {
    if (!ec && self->timer_seq_ == seq) self->Close(what);
  }));
}

template <typename Stream>
void Connection<Stream>::DisarmTimer() {
  ++timer_seq_;
  timer_.cancel();
}

template <typename Stream>
size_t Connection<Stream>::TakeBuffered(uint8_t* dst, size_t n) {
  n = std::min(n, Buffered());
  if (dst != nullptr && n > 0) std::memcpy(dst, in_.data() + in_pos_, n);
  in_pos_ += n;
  if (in_pos_ == in_end_) in_pos_ = in_end_ = 0;
  return n;
}

template <typename Stream>
void Connection<Stream>::ReadMore() {
  if (in_pos_ > 0) {  // keep the partial header at the front
    std::memmove(in_.data(), in_.data() + in_pos_, Buffered());
    in_end_ -= in_pos_;
    in_pos_ = 0;
  }
  // A connection not admitted yet holds a small buffer (its hello may take a few reads).
  const size_t want = Admitted() ? kReadAhead : kHelloReadAhead;
  if (in_.size() < want) in_.resize(want);
  auto self = this->shared_from_this();
  socket_.async_read_some(asio::buffer(in_.data() + in_end_, in_.size() - in_end_),
                          asio::bind_executor(strand_, [self](error_code ec, size_t n) {
                            if (ec) {
                              // A client that hangs up between frames (a TLS one without a
                              // close_notify) is an orderly close.
                              const bool hung_up = ec == asio::error::eof ||
                                                   ec == asio::ssl::error::stream_truncated;
                              self->Close(hung_up ? "" : "read: " + ec.message());
                              return;
                            }
                            self->in_end_ += n;
                            self->ReadHeader();
                          }));
}

template <typename Stream>
void Connection<Stream>::ReadHeader() {
  if (closed_) return;
  if (Buffered() < kFrameHeaderBytes) {
    ReadMore();
    return;
  }
  TakeBuffered(header_bytes_, kFrameHeaderBytes);
  Result<FrameHeader> h = DecodeFrameHeader(header_bytes_, server_.options().limits);
  if (!h.ok()) {
    Close("protocol error: " + h.status().message());
    return;
  }
  if (h->is_response()) {
    Close("protocol error: a client sent a response frame");
    return;
  }
  const uint32_t hello_max = server_.options().max_hello_body_bytes;
  if (!Admitted() && (h->body_bytes > hello_max || h->payload_bytes > 0)) {
    Close("protocol error: before its hello a connection may send " + std::to_string(hello_max) +
          " body bytes and no payload in a frame");
    return;
  }
  header_ = *h;
  ArmTimer("frame not completed within the frame timeout");
  body_.resize(header_.body_bytes);
  ReadBody();
}

template <typename Stream>
void Connection<Stream>::ReadBody() {
  const size_t got = TakeBuffered(reinterpret_cast<uint8_t*>(body_.data()), body_.size());
  if (got == body_.size()) {
    OnBody();
    return;
  }
  auto self = this->shared_from_this();  // nothing is buffered now: the rest straight into body_
  asio::async_read(socket_, asio::buffer(body_.data() + got, body_.size() - got),
                   asio::bind_executor(strand_, [self](error_code ec, size_t) {
                     if (ec) {
                       self->Close("truncated frame body: " + ec.message());
                       return;
                     }
                     self->OnBody();
                   }));
}

template <typename Stream>
void Connection<Stream>::OnBody() {
  if (header_.payload_bytes == 0) {
    DisarmTimer();
    Dispatch();
    return;
  }
  // Ask the handler where the payload goes (it may take a lock: worker).
  handling_ = true;
  auto self = this->shared_from_this();
  asio::post(server_.workers(), [self] {
    self->sinks_.clear();
    Status st = self->server_.handler().PayloadSinks(*self->state_, self->header_, self->body_,
                                                     &self->sinks_);
    uint64_t total = 0;
    for (const PayloadSink& s : self->sinks_) total += s.size;
    if (st.ok() && total != self->header_.payload_bytes) {
      st = Status::InvalidArgument("payload of " + std::to_string(self->header_.payload_bytes) +
                                   " bytes does not match the " + std::to_string(total) +
                                   " bytes the request describes");
    }
    asio::post(self->strand_, [self, st] {
      self->EndHandling();
      if (self->closed_) return;
      if (!st.ok()) {
        self->Close("protocol error: " + st.message());
        return;
      }
      self->ReadPayload(0, 0);
    });
  });
}

template <typename Stream>
void Connection<Stream>::ReadPayload(size_t sink_index, uint64_t done) {
  if (closed_) return;
  for (;;) {
    while (sink_index < sinks_.size() && done == sinks_[sink_index].size) {
      ++sink_index;
      done = 0;
    }
    if (sink_index == sinks_.size() || Buffered() == 0) break;
    const PayloadSink& sink = sinks_[sink_index];  // what came with the header and body first
    done += TakeBuffered(sink.data != nullptr ? sink.data + done : nullptr, sink.size - done);
  }
  if (sink_index == sinks_.size()) {
    DisarmTimer();
    Dispatch();
    return;
  }
  const PayloadSink& sink = sinks_[sink_index];
  asio::mutable_buffer buf;
  if (sink.data != nullptr) {
    buf = asio::buffer(sink.data + done, sink.size - done);
  } else {
    scratch_.resize(1u << 20);
    buf = asio::buffer(scratch_.data(), std::min<uint64_t>(scratch_.size(), sink.size - done));
  }
  auto self = this->shared_from_this();
  socket_.async_read_some(
      buf, asio::bind_executor(strand_, [self, sink_index, done](error_code ec, size_t n) {
        if (ec) {
          self->Close("truncated payload: " + ec.message());
          return;
        }
        self->ReadPayload(sink_index, done + n);
      }));
}

template <typename Stream>
void Connection<Stream>::Dispatch() {
  auto self = this->shared_from_this();
  if (server_.handler().RunsInline(header_.type)) {
    // A short request that never waits: answer on this I/O thread, saving two thread hops.
    Write(server_.handler().Handle(*state_, header_, body_));
    return;
  }
  if (std::optional<Response> r = server_.handler().TryInline(*state_, header_, body_)) {
    Write(std::move(*r));  // it did not have to wait: answered here too
    return;
  }
  handling_ = true;  // until Write, on the strand
  asio::post(server_.workers(), [self] {
    Response r = self->server_.handler().Handle(*self->state_, self->header_, self->body_);
    asio::post(self->strand_, [self, r = std::move(r)]() mutable { self->Write(std::move(r)); });
  });
}

template <typename Stream>
bool Connection<Stream>::Admitted() {
  if (!admitted_) admitted_ = server_.handler().Admitted(*state_);
  return admitted_;
}

template <typename Stream>
void Connection<Stream>::Write(Response response) {
  EndHandling();
  if (closed_ || response.no_reply) {
    if (response.release) response.release();
    for (int fd : response.fds) ::close(fd);
    if (closed_) return;
    if (Buffered() > 0) {
      // The next frame is here already: read it from a fresh handler, so a run of frames with
      // no reply (RELEASEs sent back to back) does not nest one call per frame.
      auto self = this->shared_from_this();
      asio::post(strand_, [self] { self->ReadHeader(); });
    } else {
      ReadHeader();
    }
    return;
  }
  FrameHeader h;
  h.flags = kFlagResponse;
  h.type = response.type;
  h.request_id = header_.request_id;
  h.body_bytes = static_cast<uint32_t>(response.body.size());
  uint64_t payload = 0;
  for (const auto& [p, n] : response.payload) payload += n;
  h.payload_bytes = static_cast<uint32_t>(payload);
  EncodeFrameHeader(h, out_header_);
  // Buffers point into `held`, which lives until the write completes (a short body lives
  // inside the string object itself, so take its address only after the move).
  auto held = std::make_shared<Response>(std::move(response));
  std::vector<asio::const_buffer> bufs;
  bufs.reserve(2 + held->payload.size());
  bufs.emplace_back(out_header_, kFrameHeaderBytes);
  bufs.emplace_back(held->body.data(), held->body.size());
  for (const auto& [p, n] : held->payload) bufs.emplace_back(p, n);
  auto self = this->shared_from_this();
  if (!held->fds.empty()) {
    SendWithFds(held, std::move(bufs));
    return;
  }
  // A client that stops reading its answer holds leases: it gets the frame timeout too.
  ArmTimer("response not read within the frame timeout");
  asio::async_write(socket_, bufs,
                    asio::bind_executor(strand_, [self, held](error_code ec, size_t) {
                      self->DisarmTimer();
                      if (held->release) held->release();
                      if (ec) {
                        self->Close("write: " + ec.message());
                        return;
                      }
                      if (held->close_after) {
                        self->Close("closed after the response, as the handler asked");
                        return;
                      }
                      self->ReadHeader();
                    }));
}

template <typename Stream>
void Connection<Stream>::SendWithFds(std::shared_ptr<Response> held,
                                     std::vector<asio::const_buffer> bufs, bool counted) {
  // The descriptors ride on the first byte (SCM_RIGHTS); the rest of the frame follows as usual.
  auto self = this->shared_from_this();
  auto finish = [self, held](error_code ec) {
    self->DisarmTimer();
    for (int fd : held->fds) ::close(fd);
    held->fds.clear();
    if (held->release) held->release();
    if (ec) {
      self->Close("write: " + ec.message());
      return;
    }
    self->ReadHeader();
  };
  if constexpr (!kLocal) {
    finish(asio::error::operation_not_supported);
    return;
  } else {
    const int unread_bytes = counted ? -1 : UnreadBytes();
    if (unread_bytes >= 0) {
      // The client has read every answer so far: nothing of this connection is in flight.
      if (unread_bytes == 0) server_.DropUnreadFds(peer_key_, std::exchange(unread_fds_, 0));
      if (unread_fds_ + held->fds.size() > kMaxUnreadFds ||
          !server_.AddUnreadFds(peer_key_, held->fds.size())) {
        for (int fd : held->fds) ::close(fd);
        held->fds.clear();
        if (held->release) held->release();
        Close("the client does not read its answers: " + std::to_string(unread_fds_) +
              " file descriptors sent to this connection (and maybe more to others of its "
              "user) are unread");
        return;
      }
      unread_fds_ += held->fds.size();  // (given back once read, or at Linger)
    }
    // A client that reads nothing cannot hold this answer's descriptors here for long.
    if (!counted) ArmTimer("response not read within the frame timeout");
    const auto* first = static_cast<const uint8_t*>(bufs[0].data());
    iovec iov{const_cast<uint8_t*>(first), 1};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * held->fds.size()));
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * held->fds.size());
    std::memcpy(CMSG_DATA(cmsg), held->fds.data(), sizeof(int) * held->fds.size());
    const ssize_t n = ::sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      socket_.async_wait(Stream::wait_write,
                         asio::bind_executor(strand_, [self, held, bufs](error_code ec) {
                           if (ec || self->closed_) {
                             for (int fd : held->fds) ::close(fd);
                             held->fds.clear();
                             if (held->release) held->release();
                             self->Close("write: " + (ec ? ec.message() : "closed"));
                             return;
                           }
                           self->SendWithFds(held, bufs, /*counted=*/true);
                         }));
      return;
    }
    if (n != 1) {
      finish(error_code(errno, boost::system::system_category()));
      return;
    }
    bufs[0] = asio::const_buffer(first + 1, bufs[0].size() - 1);
    asio::async_write(socket_, bufs, asio::bind_executor(strand_, [finish](error_code ec, size_t) {
                        finish(ec);
                      }));
  }
}

// ---------------------------------------------------------------------------------------------

Status ServerImpl::Listen() {
  // Unix socket.
  const std::filesystem::path path(options_.unix_path);
  std::error_code fs_ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), fs_ec);
  if (std::filesystem::exists(path, fs_ec)) {
    asio::local::stream_protocol::socket probe(io());
    error_code ec;
    probe.connect(asio::local::stream_protocol::endpoint(options_.unix_path), ec);
    if (!ec) {
      return Status::FailedPrecondition("another daemon is listening on " + options_.unix_path);
    }
    ::unlink(options_.unix_path.c_str());
  }
  error_code ec;
  unix_acceptor_.open(asio::local::stream_protocol(), ec);
  if (!ec) unix_acceptor_.bind(asio::local::stream_protocol::endpoint(options_.unix_path), ec);
  if (!ec) unix_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::IoError("cannot listen on unix socket " + options_.unix_path + ": " +
                           ec.message());
  }
  ::chmod(options_.unix_path.c_str(), 0660);

  if (!options_.tls.cert_file.empty() && options_.tcp_listen.empty()) {
    return Status::InvalidArgument("TLS is for the TCP listener: a certificate needs --listen");
  }
  if (!options_.tcp_listen.empty()) {
    if (!options_.tls.cert_file.empty() || !options_.tls.key_file.empty()) {
      tls_ = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
      KVPOOL_RETURN_IF_ERROR(ConfigureTlsServer(tls_->native_handle(), options_.tls));
    }
    std::string host;
    uint16_t port = 0;
    KVPOOL_RETURN_IF_ERROR(ParseHostPort(options_.tcp_listen, &host, &port));
    const auto addr = asio::ip::make_address(host, ec);
    if (ec) return Status::InvalidArgument("bad TCP listen host '" + host + "': " + ec.message());
    const asio::ip::tcp::endpoint ep(addr, port);
    tcp_acceptor_.open(ep.protocol(), ec);
    if (!ec) tcp_acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) tcp_acceptor_.bind(ep, ec);
    if (!ec) tcp_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return Status::IoError("cannot listen on tcp " + options_.tcp_listen + ": " + ec.message());
    }
    const auto bound = tcp_acceptor_.local_endpoint(ec);
    tcp_address_ =
        (addr.is_v6() ? "[" + bound.address().to_string() + "]" : bound.address().to_string()) +
        ":" + std::to_string(bound.port());
  }
  return Status::OK();
}

template <typename Stream>
void ServerImpl::Adopt(asio::io_context& io, Stream socket, std::string peer,
                       std::string peer_key) {
  if (live_.load(std::memory_order_relaxed) >= options_.max_connections) {
    LOG(WARNING) << "refusing connection from " << peer << ": " << options_.max_connections
                 << " connections open (the limit)";
    error_code ec;
    socket.lowest_layer().close(ec);
    return;
  }
  live_.fetch_add(1, std::memory_order_relaxed);
  ConnectionInfo info{next_id_.fetch_add(1, std::memory_order_relaxed), std::move(peer),
                      Connection<Stream>::kLocal, std::nullopt};
  const int fd = socket.lowest_layer().native_handle();
  if (info.local) {
    struct ucred cred {};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && len == sizeof(cred)) {
      info.credentials = PeerCredentials{cred.pid, cred.uid, cred.gid, {}};
      // The process's own supplementary groups (not the group database's view of its user).
      std::vector<gid_t> groups(64);
      socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
      int rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen);
      if (rc != 0 && errno == ERANGE) {
        groups.resize(glen / sizeof(gid_t));
        rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen);
      }
      if (rc == 0) {
        groups.resize(glen / sizeof(gid_t));
        info.credentials->groups.assign(groups.begin(), groups.end());
      }
      info.peer = "unix:pid=" + std::to_string(cred.pid) + ",uid=" + std::to_string(cred.uid);
      peer_key = "uid:" + std::to_string(cred.uid);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint32_t& n = per_peer_[peer_key];
    if (n >= options_.max_connections_per_peer) {
      LOG_EVERY_N(WARNING, 100) << "refusing connection from " << info.peer << ": "
                                << options_.max_connections_per_peer
                                << " connections open from it (the per-peer limit)";
      live_.fetch_sub(1, std::memory_order_relaxed);
      error_code ec;
      socket.lowest_layer().close(ec);
      return;
    }
    ++n;
  }
  std::make_shared<Connection<Stream>>(*this, io, std::move(socket), std::move(info),
                                       std::move(peer_key))
      ->Start();
}

void ServerImpl::AcceptUnix() {
  asio::io_context& io = NextIo();
  unix_acceptor_.async_accept(
      asio::any_io_executor(io.get_executor()), [this, &io](error_code ec, UnixSocket s) {
        if (ec == asio::error::operation_aborted || !unix_acceptor_.is_open()) return;
        if (!ec) {
          Adopt(io, std::move(s), "unix", "unix");
        } else {
          // E.g. out of file descriptors: back off instead of spinning on the error.
          LOG_EVERY_N(WARNING, 100) << "accept on unix socket: " << ec.message();
          AfterBackoff([this] { AcceptUnix(); });
          return;
        }
        AcceptUnix();
      });
}

void ServerImpl::AcceptTcp() {
  asio::io_context& io = NextIo();
  tcp_acceptor_.async_accept(
      asio::any_io_executor(io.get_executor()), [this, &io](error_code ec, TcpSocket s) {
        if (ec == asio::error::operation_aborted || !tcp_acceptor_.is_open()) return;
        if (!ec) {
          error_code ignored;
          s.set_option(asio::ip::tcp::no_delay(true), ignored);
          std::string peer = "tcp";
          std::string peer_key = "tcp";
          const auto ep = s.remote_endpoint(ignored);
          if (!ignored) {
            peer += ":" + ep.address().to_string() + ":" + std::to_string(ep.port());
            peer_key += ":" + ep.address().to_string();
          }
          if (tls_ != nullptr) {
            Adopt(io, TlsStream(std::move(s), *tls_), std::move(peer), std::move(peer_key));
          } else {
            Adopt(io, std::move(s), std::move(peer), std::move(peer_key));
          }
        } else {
          LOG_EVERY_N(WARNING, 100) << "accept on tcp: " << ec.message();
          AfterBackoff([this] { AcceptTcp(); });
          return;
        }
        AcceptTcp();
      });
}

void ServerImpl::Run() {
  AcceptUnix();
  if (tcp_acceptor_.is_open()) AcceptTcp();
  for (size_t i = 0; i < ios_.size(); ++i) {
    asio::io_context& io = *ios_[i];
    threads_.push_back(StartThread(ThreadRole::kControlIo, static_cast<int>(i),
                                   [&io, poll = options_.io_busy_poll] { RunIo(io, poll); }));
  }
  for (int i = 0; i < std::max(1, options_.worker_threads); ++i) {
    threads_.push_back(StartThread(ThreadRole::kRequestWorker, i, [this] { workers_.run(); }));
  }
}

void ServerImpl::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  asio::post(io(), [this] {
    error_code ec;
    unix_acceptor_.close(ec);
    tcp_acceptor_.close(ec);
  });
  std::vector<std::function<void()>> closers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [p, c] : closers_) closers.push_back(c);
  }
  for (auto& c : closers) c();
  // Let the closes and disconnect callbacks run, then stop.
  for (int i = 0; i < 500 && live_.load(std::memory_order_relaxed) > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& guard : io_guards_) guard.reset();
  workers_guard_.reset();
  for (auto& io : ios_) io->stop();
  workers_.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
  ::unlink(options_.unix_path.c_str());
}

}  // namespace

Result<std::unique_ptr<ControlServer>> ControlServer::Start(const ControlServerOptions& options,
                                                            RequestHandler& handler) {
  if (options.unix_path.empty()) return Status::InvalidArgument("no unix socket path given");
  auto server = std::make_unique<ServerImpl>(options, handler);
  KVPOOL_RETURN_IF_ERROR(server->Listen());
  server->Run();
  return std::unique_ptr<ControlServer>(std::move(server));
}

}  // namespace kvpool::transport
