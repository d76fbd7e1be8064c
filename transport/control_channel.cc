#include "transport/control_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "transport/address.h"

namespace kvpool::transport {
namespace {

// Rounded up: poll's timeout in whole milliseconds must not end the wait before the deadline.
int RemainingMs(Deadline deadline) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX));
}

// OpenSSL writes with write(2): a peer that hung up would raise SIGPIPE and end the process.
// While it lives, SIGPIPE is blocked on this thread, and one raised meanwhile is taken back
// (a SIGPIPE already pending before stays pending).
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~SigpipeGuard() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t old_;
  bool was_pending_ = false;
};

}  // namespace

Result<std::unique_ptr<ControlChannel>> ControlChannel::Connect(
    const std::string& address, std::chrono::milliseconds timeout,
    std::shared_ptr<const TlsClientContext> tls) {
  const Deadline deadline = std::chrono::steady_clock::now() + timeout;
  int fd = -1;
  sockaddr_storage ss{};
  socklen_t len = 0;
  const bool tcp = IsTcpAddress(address);
  std::string host;
  if (tcp) {
    uint16_t port = 0;
    KVPOOL_RETURN_IF_ERROR(ParseHostPort(address, &host, &port));
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0 || res == nullptr) {
      return Status::InvalidArgument("cannot resolve '" + host + "': " + gai_strerror(rc));
    }
    std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
    len = res->ai_addrlen;
    const int family = res->ai_family;
    freeaddrinfo(res);
    fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  } else {
    std::string path = address.rfind("unix://", 0) == 0 ? address.substr(7) : address;
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    if (path.empty() || path.size() >= sizeof(un.sun_path)) {
      return Status::InvalidArgument("unix socket path '" + path + "' is empty or too long");
    }
    std::memcpy(un.sun_path, path.c_str(), path.size() + 1);
    std::memcpy(&ss, &un, sizeof(un));
    len = sizeof(un);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  }
  if (fd < 0) return Status::FromErrno(errno, "socket");
  if (tcp) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  std::unique_ptr<ControlChannel> ch(new ControlChannel(fd, address));
  if (tcp) {
    char ip[NI_MAXHOST];
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, ip, sizeof(ip), nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      ch->peer_ip_ = ip;
    }
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    if (errno != EINPROGRESS && errno != EAGAIN) {
      const int err = errno;
      return ch->Fail(Status::Unavailable("cannot connect to kvpoold at " + address + ": " +
                                          std::strerror(err)));
    }
    KVPOOL_RETURN_IF_ERROR(ch->Wait(/*for_write=*/true, deadline));
    int err = 0;
    socklen_t elen = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
    if (err != 0) {
      return ch->Fail(Status::Unavailable("cannot connect to kvpoold at " + address + ": " +
                                          std::strerror(err)));
    }
  }
  if (IsTlsAddress(address)) {
    if (tls == nullptr) {
      KVPOOL_ASSIGN_OR_RETURN(tls, TlsClientContext::Create({}));
    }
    KVPOOL_ASSIGN_OR_RETURN(ch->ssl_, tls->NewSession(fd, host));
    SSL* ssl = ch->ssl_;
    Result<int> done = ch->RunTls([ssl] { return SSL_connect(ssl); }, "handshake", deadline);
    if (!done.ok()) {
      const long verify = SSL_get_verify_result(ssl);
      if (verify != X509_V_OK) {
        return Status::PermissionDenied("kvpoold at " + address +
                                        " presented a TLS certificate that does not verify: " +
                                        X509_verify_cert_error_string(verify));
      }
      return done.status();
    }
  }
  return ch;
}

ControlChannel::~ControlChannel() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  if (fd_ >= 0) ::close(fd_);
  for (int fd : received_fds_) ::close(fd);
}

std::vector<int> ControlChannel::TakeReceivedFds() {
  std::vector<int> out;
  out.swap(received_fds_);
  return out;
}

Status ControlChannel::Fail(Status st) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  return st;
}

Result<int> ControlChannel::RunTls(const std::function<int()>& op, const char* what,
                                   Deadline deadline) {
  const SigpipeGuard no_sigpipe;
  for (;;) {
    ERR_clear_error();
    errno = 0;
    const int rc = op();
    if (rc > 0) return rc;
    const int err = SSL_get_error(ssl_, rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      KVPOOL_RETURN_IF_ERROR(Wait(/*for_write=*/err == SSL_ERROR_WANT_WRITE, deadline));
      continue;
    }
    if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && errno == 0)) {
      return Fail(Status::Unavailable("kvpoold at " + address_ + " closed the connection"));
    }
    const std::string detail =
        err == SSL_ERROR_SYSCALL ? std::strerror(errno) : TakeOpenSslErrors();
    return Fail(Status::Unavailable(std::string("TLS ") + what + " with kvpoold at " + address_ +
                                    ": " + detail));
  }
}

Status ControlChannel::SendTls(std::span<const iovec> pieces, Deadline deadline) {
  for (const iovec& v : pieces) {
    const auto* p = static_cast<const uint8_t*>(v.iov_base);
    size_t left = v.iov_len;
    while (left > 0) {
      const int n = static_cast<int>(std::min<size_t>(left, 1u << 30));
      SSL* ssl = ssl_;
      // Without partial writes, SSL_write returns only once all n bytes are taken.
      KVPOOL_RETURN_IF_ERROR(
          RunTls([ssl, p, n] { return SSL_write(ssl, p, n); }, "write", deadline).status());
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  return Status::OK();
}

Status ControlChannel::Wait(bool for_write, Deadline deadline, bool spin) {
  if (spin && busy_poll_.count() > 0) {
    const auto until = std::min<Deadline>(deadline, std::chrono::steady_clock::now() + busy_poll_);
    do {
      pollfd p{fd_, static_cast<short>(for_write ? POLLOUT : POLLIN), 0};
      if (::poll(&p, 1, 0) > 0) return Status::OK();
    } while (std::chrono::steady_clock::now() < until);
  }
  for (;;) {
    pollfd p{fd_, static_cast<short>(for_write ? POLLOUT : POLLIN), 0};
    const int ms = RemainingMs(deadline);
    const int rc = ::poll(&p, 1, ms);
    if (rc > 0) return Status::OK();
    if (rc == 0) {
      return Fail(Status::DeadlineExceeded("kvpoold at " + address_ + " did not answer in time"));
    }
    if (errno != EINTR) return Fail(Status::FromErrno(errno, "poll"));
  }
}

Status ControlChannel::Send(const FrameHeader& header, std::string_view body,
                            std::span<const iovec> payload, Deadline deadline) {
  if (broken()) return Status::Unavailable("connection to " + address_ + " is closed");
  uint8_t hdr[kFrameHeaderBytes];
  EncodeFrameHeader(header, hdr);
  std::vector<iovec> iov;
  iov.reserve(2 + payload.size());
  iov.push_back({hdr, sizeof(hdr)});
  if (!body.empty()) iov.push_back({const_cast<char*>(body.data()), body.size()});
  if (ssl_ != nullptr) {
    // One TLS record for the header and body, then the payload straight from its buffers.
    std::string head(reinterpret_cast<const char*>(hdr), sizeof(hdr));
    head.append(body);
    const iovec first{head.data(), head.size()};
    KVPOOL_RETURN_IF_ERROR(SendTls({&first, 1}, deadline));
    return SendTls(payload, deadline);
  }
  for (const iovec& v : payload) {
    if (v.iov_len > 0) iov.push_back(v);
  }
  size_t idx = 0;
  while (idx < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + idx;
    msg.msg_iovlen = std::min<size_t>(iov.size() - idx, IOV_MAX);
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        KVPOOL_RETURN_IF_ERROR(Wait(/*for_write=*/true, deadline));
        continue;
      }
      const int err = errno;
      return Fail(
          Status::Unavailable("send to kvpoold at " + address_ + ": " + std::strerror(err)));
    }
    size_t left = static_cast<size_t>(n);
    while (left > 0 && idx < iov.size()) {
      if (left >= iov[idx].iov_len) {
        left -= iov[idx].iov_len;
        ++idx;
      } else {
        iov[idx].iov_base = static_cast<uint8_t*>(iov[idx].iov_base) + left;
        iov[idx].iov_len -= left;
        left = 0;
      }
    }
  }
  return Status::OK();
}

Status ControlChannel::ReceiveInto(void* dst, size_t n, Deadline deadline) {
  if (broken()) return Status::Unavailable("connection to " + address_ + " is closed");
  auto* p = static_cast<uint8_t*>(dst);
  if (ssl_ != nullptr) {
    SSL* ssl = ssl_;
    while (n > 0) {
      const int want = static_cast<int>(std::min<size_t>(n, 1u << 30));
      KVPOOL_ASSIGN_OR_RETURN(
          const int got,
          RunTls([ssl, p, want] { return SSL_read(ssl, p, want); }, "read", deadline));
      p += got;
      n -= static_cast<size_t>(got);
    }
    return Status::OK();
  }
  const size_t early = std::min(n, ahead_end_ - ahead_pos_);
  if (early > 0) {
    std::memcpy(p, ahead_.data() + ahead_pos_, early);
    ahead_pos_ += early;
    p += early;
    n -= early;
  }
  if (n == 0) return Status::OK();
  // Nothing is buffered now. Whatever arrives past the n bytes asked for lands in ahead_ (the
  // rest of a short frame, read with its header).
  if (ahead_.empty()) ahead_.resize(kReadAhead);
  ahead_pos_ = ahead_end_ = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 64)];
  // Busy polling spins on the receive itself: a wait that polls and then receives costs one
  // system call more than a receive that finds the bytes there.
  Deadline spin_until{};
  while (n > 0) {
    iovec iov[2] = {{p, n}, {ahead_.data(), ahead_.size()}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t got = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); got > 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const auto* fds = reinterpret_cast<const int*>(CMSG_DATA(c));
        for (size_t i = 0; i < count; ++i) received_fds_.push_back(fds[i]);
      }
    }
    if (got > 0) {
      const size_t mine = std::min(n, static_cast<size_t>(got));
      p += mine;
      n -= mine;
      ahead_end_ = static_cast<size_t>(got) - mine;
      continue;
    }
    if (got == 0) {
      return Fail(Status::Unavailable("kvpoold at " + address_ + " closed the connection"));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (busy_poll_.count() > 0) {
        const auto now = std::chrono::steady_clock::now();
        if (spin_until == Deadline{}) spin_until = std::min<Deadline>(deadline, now + busy_poll_);
        if (now < spin_until) continue;
      }
      KVPOOL_RETURN_IF_ERROR(Wait(/*for_write=*/false, deadline, /*spin=*/false));
      continue;
    }
    const int err = errno;
    return Fail(
        Status::Unavailable("receive from kvpoold at " + address_ + ": " + std::strerror(err)));
  }
  return Status::OK();
}

Status ControlChannel::Discard(size_t n, Deadline deadline) {
  uint8_t scratch[64 * 1024];
  while (n > 0) {
    const size_t chunk = std::min(n, sizeof(scratch));
    KVPOOL_RETURN_IF_ERROR(ReceiveInto(scratch, chunk, deadline));
    n -= chunk;
  }
  return Status::OK();
}

Result<FrameHeader> ControlChannel::ReceiveHeader(const FrameLimits& limits, Deadline deadline) {
  if (ssl_ == nullptr && ahead_pos_ == ahead_end_ && !broken() && busy_poll_.count() == 0) {
    // An answer is rarely there the moment its request has gone: wait for it first rather
    // than try a receive that fails.
    KVPOOL_RETURN_IF_ERROR(Wait(/*for_write=*/false, deadline));
  }
  uint8_t hdr[kFrameHeaderBytes];
  KVPOOL_RETURN_IF_ERROR(ReceiveInto(hdr, sizeof(hdr), deadline));
  Result<FrameHeader> h = DecodeFrameHeader(hdr, limits);
  if (!h.ok()) return Fail(h.status().WithContext("bad response from kvpoold"));
  if (!h->is_response()) return Fail(Status::Internal("kvpoold sent a request frame"));
  return h;
}

}  // namespace kvpool::transport
