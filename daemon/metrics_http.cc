#include "daemon/metrics_http.h"

#include <utility>  // before Asio (Boost 1.74 with C++20)

#include <glog/logging.h>
#include <sys/socket.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <thread>

#include "common/threads.h"
#include "transport/address.h"

namespace kvpool::daemon {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

class Impl final : public MetricsHttpServer {
 public:
  explicit Impl(std::function<std::string()> render) : render_(std::move(render)), acceptor_(io_) {}
  ~Impl() override { Stop(); }

  Status Listen(const std::string& listen) {
    std::string host;
    uint16_t port = 0;
    KVPOOL_RETURN_IF_ERROR(transport::ParseHostPort(listen, &host, &port));
    boost::system::error_code ec;
    const auto addr = asio::ip::make_address(host, ec);
    if (ec) return Status::InvalidArgument("bad metrics address '" + listen + "'");
    asio::ip::tcp::endpoint ep(addr, port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(16, ec);
    if (ec) return Status::IoError("cannot listen for /metrics on " + listen + ": " + ec.message());
    const auto bound = acceptor_.local_endpoint(ec);
    address_ = bound.address().to_string() + ":" + std::to_string(bound.port());
    thread_ = StartThread(ThreadRole::kMetricsHttp, 0, [this] { Loop(); });
    return Status::OK();
  }

  void Stop() override {
    if (stopping_.exchange(true)) return;
    // Wakes the blocking accept (it fails with EINVAL); the acceptor is closed only once the
    // loop has ended, never under its accept.
    ::shutdown(acceptor_.native_handle(), SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    boost::system::error_code ec;
    acceptor_.close(ec);
  }

  std::string address() const override { return address_; }

 private:
  void Loop() {
    while (!stopping_.load()) {
      asio::ip::tcp::socket socket(io_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (ec) {
        if (stopping_.load()) return;
        continue;
      }
      timeval tv{5, 0};
      setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      setsockopt(socket.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      Serve(socket);
    }
  }

  void Serve(asio::ip::tcp::socket& socket) {
    beast::flat_buffer buffer;
    http::request_parser<http::empty_body> parser;
    parser.header_limit(16 * 1024);
    boost::system::error_code ec;
    http::read(socket, buffer, parser, ec);
    if (ec) return;
    const auto& req = parser.get();
    http::response<http::string_body> res;
    res.version(req.version());
    res.set(http::field::server, "kvpoold");
    res.keep_alive(false);
    if (req.method() != http::verb::get) {
      res.result(http::status::method_not_allowed);
      res.body() = "only GET\n";
    } else if (req.target() == "/metrics") {
      res.result(http::status::ok);
      res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res.body() = render_();
    } else if (req.target() == "/healthz") {
      res.result(http::status::ok);
      res.body() = "ok\n";
    } else {
      res.result(http::status::not_found);
      res.body() = "try /metrics\n";
    }
    res.prepare_payload();
    http::write(socket, res, ec);
    socket.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  }

  std::function<std::string()> render_;
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  std::string address_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};  // seq_cst: read by the accept loop after Stop
};

}  // namespace

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, std::function<std::string()> render) {
  auto server = std::make_unique<Impl>(std::move(render));
  KVPOOL_RETURN_IF_ERROR(server->Listen(listen));
  return std::unique_ptr<MetricsHttpServer>(std::move(server));
}

}  // namespace kvpool::daemon
