#pragma once
// The daemon's request handling in one fuzzing process: a real tier stack (RocksDB in a
// temporary directory removed at exit, an 8 MiB host arena of 1 MiB segments, the disk tier;
// tiers/test_tier_stack.h), the namespace registry, the session store and BlockService, built
// on first use and kept for the whole run (state carries over between inputs, as it would
// between a daemon's clients). No access rules: every namespace is open, as without a
// namespaces file, to local clients; a TCP client proves the cluster secret kFuzzClusterSecret
// (as in a cluster), and one that proves it and calls itself "kvpool-peer" is a peer daemon.
// Shared by fuzz_handlers (requests straight into the handlers) and fuzz_frame (byte streams
// into a live control server, over its Unix socket).
//
// Thread safety: Get from the fuzzing thread.

#include <glog/logging.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "daemon/block_service.h"
#include "daemon/metrics.h"
#include "daemon/namespace_registry.h"
#include "daemon/request_codec.h"
#include "daemon/session_store.h"
#include "tiers/test_tier_stack.h"

namespace kvpool::fuzz {

inline constexpr const char* kFuzzClusterSecret = "fuzz-cluster-secret-0123456789abcdef";

class FuzzWorld {
 public:
  static FuzzWorld& Get() {
    static FuzzWorld* const world = new FuzzWorld();  // lives until exit (atexit cleans up)
    return *world;
  }

  daemon::BlockService& service() { return *service_; }
  const daemon::BlockServiceOptions& options() const { return options_; }
  const std::string& dir() const { return dir_; }

 private:
  FuzzWorld() {
    FLAGS_minloglevel = 2;        // errors only: the fuzzer's output stays readable
    daemon::QuietProtobufLogs();  // as kvpoold does
    char tmpl[] = "/tmp/kvpool_fuzz.XXXXXX";
    CHECK(mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    static std::string* const dir_at_exit = new std::string(dir_);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(*dir_at_exit, ec);
    });
    tiers::TierManagerOptions to;
    to.disk_capacity_bytes = 64 << 20;
    Status st = stack_.Open(dir_, to);
    CHECK(st.ok()) << st.ToString();
    auto ns = daemon::NamespaceRegistry::Load(*stack_.store, 64);
    CHECK(ns.ok()) << ns.status().ToString();
    namespaces_ = std::move(ns).value();
    sessions_ = std::make_unique<daemon::SessionStore>(*stack_.store);
    options_.node_id = "fuzz";
    options_.tcp_secret = kFuzzClusterSecret;
    options_.limits.max_body_bytes = 1 << 20;
    options_.limits.max_payload_bytes = 16 << 20;
    service_ = std::make_unique<daemon::BlockService>(options_, *stack_.manager, *namespaces_,
                                                      *sessions_, metrics_);
    service_->SetConnectionGauge([] { return 1; });
    st = service_->LoadSessions();
    CHECK(st.ok()) << st.ToString();
  }

  std::string dir_;
  tiers::TestTierStack stack_;
  std::unique_ptr<daemon::NamespaceRegistry> namespaces_;
  std::unique_ptr<daemon::SessionStore> sessions_;
  daemon::Metrics metrics_;
  daemon::BlockServiceOptions options_;
  std::unique_ptr<daemon::BlockService> service_;
};

}  // namespace kvpool::fuzz
