// libFuzzer target: raw byte streams into a live control server (transport/control_server.cc)
// over its Unix socket, BlockService behind it (fuzz/fuzz_world.h). Covers the frame reader as a
// client drives it: header validation, the limits before hello, body and payload reads into the
// handler's sinks, pipelined frames, and responses written back while more bytes arrive.
//
// Input: the bytes a client sends, as they are. The harness writes them, half-closes, and reads
// every answer until the server closes the connection (a server that never does is a hang
// libFuzzer reports with -timeout). Responses are read and dropped; file descriptors sent with
// them are closed by the kernel (no control buffer is given).

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include "fuzz/fuzz_world.h"
#include "transport/control_server.h"

namespace kvpool::fuzz {
namespace {

transport::ControlServer& Server() {
  static transport::ControlServer* const server = [] {
    FuzzWorld& world = FuzzWorld::Get();
    transport::ControlServerOptions so;
    so.unix_path = world.dir() + "/kvpoold.sock";
    so.io_threads = 1;
    so.worker_threads = 2;
    so.limits = world.options().limits;
    so.frame_timeout = std::chrono::milliseconds(2000);
    so.hello_timeout = std::chrono::milliseconds(2000);
    auto s = transport::ControlServer::Start(so, world.service());
    CHECK(s.ok()) << s.status().ToString();
    return s->release();  // serves until exit
  }();
  return *server;
}

int Connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  CHECK_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  CHECK_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << errno;
  return fd;
}

}  // namespace
}  // namespace kvpool::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvpool::fuzz;
  const int fd = Connect(Server().unix_path());
  size_t sent = 0;
  bool half_closed = false;
  char sink[64 * 1024];
  for (;;) {
    if (sent == size && !half_closed) {
      ::shutdown(fd, SHUT_WR);
      half_closed = true;
    }
    pollfd p{fd, static_cast<short>(POLLIN | (half_closed ? 0 : POLLOUT)), 0};
    if (::poll(&p, 1, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
      if (n == 0) break;  // the server closed the connection
      if (n < 0 && errno != EAGAIN && errno != EINTR) break;
    }
    if (!half_closed && (p.revents & POLLOUT)) {
      const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
      if (n > 0) sent += n;
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        half_closed = true;  // the server closed first (a refused frame): read what is left
      }
    }
  }
  ::close(fd);
  return 0;
}
