#pragma once
// MetricsHttpServer: serves GET /metrics (Prometheus text) and GET /healthz on a TCP address,
// with Boost.Beast, on one thread (ThreadRole::kMetricsHttp). Scrapes are rare and small; each
// connection is answered in turn with a 5 s socket timeout so a stuck scraper cannot hold it.
//
// Thread safety: Start/Stop from one thread; `render` is called on the metrics thread.

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace kvpool::daemon {

class MetricsHttpServer {
 public:
  static Result<std::unique_ptr<MetricsHttpServer>> Start(const std::string& listen,
                                                          std::function<std::string()> render);
  virtual ~MetricsHttpServer() = default;
  virtual void Stop() = 0;
  virtual std::string address() const = 0;  // "host:port" bound
};

}  // namespace kvpool::daemon
