// kvpool: the command line for a running kvpoold.
//
//   kvpool status
//   kvpool stats [--json] [--watch=SECONDS]
//   kvpool sessions ls [--prefix=P] | show ID | rm ID
//   kvpool lookup --tokens-file=F --layout=L [--secret=S] [--tokens-per-block=N] [--json]
//   kvpool locate --tokens-file=F --layout=L [...]   (each cluster node's cached prefix)
//   kvpool evict [--tier=gpu|host|disk]
//   kvpool policies show [--namespace=NS] [--json]   (the strategies each namespace runs with)
//
// Every command takes --socket (a Unix socket path or tcp://HOST:PORT) and --namespace.
// Exit status: 0 on success, 1 when the daemon answered with an error or cannot be reached,
// 2 on a usage error.

#include <gflags/gflags.h>
#include <kvpool/client.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "build_info.h"  // generated: cmake/build_info.h.in
#include "client/stats_json.h"
#include "common/hello_auth.h"
#include "common/units.h"
#include "transport/address.h"

DEFINE_string(socket, "",
              "kvpoold address: a Unix socket path, tcp://HOST:PORT or tls://HOST:PORT. Default: "
              "$KVPOOL_SOCKET, "
              "else the daemon's default socket.");
DEFINE_string(namespace_name, "default", "Namespace (tenant) to act for.");
DEFINE_int32(timeout_ms, 5000, "Deadline of each request.");
DEFINE_bool(json, false, "Print JSON.");
DEFINE_int32(watch, 0, "stats: print again every N seconds until interrupted.");
DEFINE_string(prefix, "", "sessions ls: only ids starting with this.");
DEFINE_string(tokens_file, "",
              "lookup: file of token ids (integers separated by spaces, commas "
              "or newlines; a JSON array works too).");
DEFINE_string(secret, "",
              "lookup: namespace secret the keys are salted with. Default: the "
              "namespace name.");
DEFINE_string(layout, "", "lookup: canonical layout string, e.g. model=llama-3-8b;dtype=bf16;...");
DEFINE_uint32(tokens_per_block, 16, "lookup: tokens per block.");
DEFINE_string(tier, "host",
              "evict: gpu (drop the gpu tier's copies), host (demote to disk) or disk (drop from "
              "the cache).");
DEFINE_string(cluster_secret_file, "",
              "File holding the cluster secret, for tcp:// daemons in cluster mode.");
DEFINE_string(credential_file, "",
              "File holding the namespace's credential (or, with --admin, the admin's), for a "
              "daemon whose namespaces file gives one.");
DEFINE_string(tls_ca, "",
              "tls:// daemons: PEM CA file their certificate must chain to. Default: the "
              "system's trust store.");
DEFINE_string(tls_cert, "", "tls:// daemons that ask for one: this client's PEM certificate.");
DEFINE_string(tls_key, "", "The PEM private key of --tls_cert.");
DEFINE_bool(admin, false,
            "Ask for admin rights: daemon-wide stats, cluster members, every namespace's "
            "policies. Without them stats show the namespace's own use.");

namespace {

constexpr const char* kUsage =
    "kvpool <command> [flags]\n"
    "  status                         one-screen summary of the daemon\n"
    "  stats [--json] [--watch=N]     counters, occupancy, hit rates\n"
    "  sessions ls [--prefix=P]       persisted sessions of the namespace\n"
    "  sessions show ID               one session's chain and metadata\n"
    "  sessions rm ID                 delete a session (unpins its blocks)\n"
    "  lookup --tokens-file=F --layout=L [--secret=S] [--tokens-per-block=N] [--json]\n"
    "                                 longest cached prefix of a token sequence\n"
    "  locate --tokens-file=F --layout=L [--secret=S] [--tokens-per-block=N] [--json]\n"
    "                                 for routers: each node's cached prefix of it\n"
    "  evict [--tier=gpu|host|disk]   evict the namespace's blocks\n"
    "  cluster members [--json]       the cluster as this daemon sees it\n"
    "  policies show [--namespace=NS] [--json]\n"
    "                                 strategies of every configured namespace (admin), or of NS\n"
    "common flags: --socket=PATH|tcp://HOST:PORT|tls://HOST:PORT --namespace=NS --timeout_ms=MS\n"
    "              --credential_file=F --admin --cluster_secret_file=F\n"
    "              --tls_ca=F --tls_cert=F --tls_key=F";

int Usage(const std::string& why) {
  std::fprintf(stderr, "kvpool: %s\n\n%s\n", why.c_str(), kUsage);
  return 2;
}

int Error(const kvpool::Status& st) {
  std::fprintf(stderr, "kvpool: %s\n", st.ToString().c_str());
  return 1;
}

// As --namespace, or as `ns` (e.g. to ask about a namespace without creating it by saying hello).
kvpool::Result<std::unique_ptr<kvpool::Client>> Connect(const std::string& ns = "") {
  kvpool::ClientOptions o;
  o.address = FLAGS_socket;
  o.tls_ca_file = FLAGS_tls_ca;
  o.tls_cert_file = FLAGS_tls_cert;
  o.tls_key_file = FLAGS_tls_key;
  o.namespace_name = ns.empty() ? FLAGS_namespace_name : ns;
  o.client_name = "kvpool-cli";
  o.timeout = std::chrono::milliseconds(FLAGS_timeout_ms);
  o.admin = FLAGS_admin;
  if (!FLAGS_cluster_secret_file.empty()) {
    KVPOOL_ASSIGN_OR_RETURN(o.cluster_secret, kvpool::ReadSecretFile(FLAGS_cluster_secret_file));
  }
  if (!FLAGS_credential_file.empty()) {
    KVPOOL_ASSIGN_OR_RETURN(o.credential, kvpool::ReadSecretFile(FLAGS_credential_file));
  }
  auto c = kvpool::Client::Connect(o);
  if (!c.ok()) {
    const std::string where =
        o.address.empty() ? kvpool::transport::DefaultSocketPath() : o.address;
    return c.status().WithContext("cannot reach kvpoold at " + where);
  }
  return c;
}

std::string Percent(uint64_t part, uint64_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", whole == 0 ? 0.0 : 100.0 * part / whole);
  return buf;
}

std::string Time(int64_t unix_ms) {
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  char buf[64];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// Stats without admin rights: the namespace's own use.
void PrintNamespaceStats(const kvpool::DaemonStats& s) {
  std::cout << "kvpoold " << s.node_id << " (version " << s.version << "), up " << s.uptime_s
            << " s\nnamespace " << FLAGS_namespace_name << ": " << s.sessions << " sessions";
  for (const kvpool::TierStats& t : s.tiers) {
    std::cout << ", " << t.name << " " << kvpool::FormatBytes(t.used_bytes);
  }
  std::cout << "\n(daemon-wide figures need admin rights: --admin)\n";
}

int Status() {
  auto c = Connect();
  if (!c.ok()) return Error(c.status());
  auto s = (*c)->Stats();
  if (!s.ok()) return Error(s.status());
  if (FLAGS_json) {
    std::cout << kvpool::client::StatsToJson(*s, 2) << "\n";
    return 0;
  }
  if (s->namespace_only) {
    PrintNamespaceStats(*s);
    return 0;
  }
  std::cout << "kvpoold " << s->node_id << " (version " << s->version << "), up " << s->uptime_s
            << " s, " << s->connections << " connections, " << s->sessions << " sessions\n";
  for (const kvpool::TierStats& t : s->tiers) {
    std::cout << "  " << t.name << ": " << kvpool::FormatBytes(t.used_bytes) << " of "
              << kvpool::FormatBytes(t.capacity_bytes) << " ("
              << Percent(t.used_bytes, t.capacity_bytes) << "), " << t.blocks << " blocks\n";
  }
  std::cout << "  cluster: " << s->cluster_state;
  if (s->cluster_state != "standalone") std::cout << ", " << s->cluster_members << " members";
  if (!s->cluster_reason.empty()) std::cout << " (" << s->cluster_reason << ")";
  std::cout << "\n";
  std::cout << "  lookups: " << s->lookups << ", prefix hit rate "
            << Percent(s->lookup_hit_blocks, s->lookup_blocks) << "; dedup ratio " << s->dedup_ratio
            << "\n";
  return 0;
}

void PrintStats(const kvpool::DaemonStats& s) {
  if (s.namespace_only) {
    PrintNamespaceStats(s);
    return;
  }
  std::cout << "node " << s.node_id << "  version " << s.version << "  uptime " << s.uptime_s
            << " s\n";
  std::printf("%-6s %12s %12s %10s %10s %10s %10s %10s %8s\n", "tier", "used", "capacity", "blocks",
              "hits", "promoted", "demoted", "evicted", "frag");
  for (const kvpool::TierStats& t : s.tiers) {
    std::printf(
        "%-6s %12s %12s %10llu %10llu %10llu %10llu %10llu %7.1f%%\n", t.name.c_str(),
        kvpool::FormatBytes(t.used_bytes).c_str(), kvpool::FormatBytes(t.capacity_bytes).c_str(),
        static_cast<unsigned long long>(t.blocks), static_cast<unsigned long long>(t.hits),
        static_cast<unsigned long long>(t.promotions), static_cast<unsigned long long>(t.demotions),
        static_cast<unsigned long long>(t.evictions), 100 * t.fragmentation);
  }
  std::printf("lookups %llu (blocks asked %llu, in cached prefix %llu = %s)\n",
              static_cast<unsigned long long>(s.lookups),
              static_cast<unsigned long long>(s.lookup_blocks),
              static_cast<unsigned long long>(s.lookup_hit_blocks),
              Percent(s.lookup_hit_blocks, s.lookup_blocks).c_str());
  std::printf("gets %llu (blocks served %llu, misses %llu)\n",
              static_cast<unsigned long long>(s.gets),
              static_cast<unsigned long long>(s.get_blocks_served),
              static_cast<unsigned long long>(s.get_misses));
  std::printf("puts: blocks offered %llu, already cached %llu, stored %llu (dedup ratio %.2f)\n",
              static_cast<unsigned long long>(s.puts_offered),
              static_cast<unsigned long long>(s.puts_deduplicated),
              static_cast<unsigned long long>(s.puts_committed), s.dedup_ratio);
  std::printf("bytes in %s, out %s; prefetches %llu (useful %llu); checksum failures %llu\n",
              kvpool::FormatBytes(s.bytes_in).c_str(), kvpool::FormatBytes(s.bytes_out).c_str(),
              static_cast<unsigned long long>(s.prefetches_issued),
              static_cast<unsigned long long>(s.prefetches_useful),
              static_cast<unsigned long long>(s.checksum_failures));
  std::printf(
      "index %llu entries (%s); leases %llu; reservations %llu; sessions %llu; "
      "connections %llu\n",
      static_cast<unsigned long long>(s.index_entries), kvpool::FormatBytes(s.index_bytes).c_str(),
      static_cast<unsigned long long>(s.leases_active),
      static_cast<unsigned long long>(s.reservations_active),
      static_cast<unsigned long long>(s.sessions), static_cast<unsigned long long>(s.connections));
  std::printf("rocksdb memory %s; index rebuilt at start from %llu disk blocks in %.2f s\n",
              kvpool::FormatBytes(s.rocksdb_memory_bytes).c_str(),
              static_cast<unsigned long long>(s.index_rebuild_blocks), s.index_rebuild_seconds);
}

int Stats() {
  auto c = Connect();
  if (!c.ok()) return Error(c.status());
  for (;;) {
    auto s = (*c)->Stats();
    if (!s.ok()) return Error(s.status());
    if (FLAGS_json) {
      std::cout << kvpool::client::StatsToJson(*s, FLAGS_watch > 0 ? -1 : 2) << std::endl;
    } else {
      PrintStats(*s);
    }
    if (FLAGS_watch <= 0) return 0;
    std::this_thread::sleep_for(std::chrono::seconds(FLAGS_watch));
    if (!FLAGS_json) std::cout << "\n";
  }
}

int Sessions(int argc, char** argv) {
  if (argc < 3) return Usage("sessions needs ls, show ID or rm ID");
  const std::string sub = argv[2];
  auto c = Connect();
  if (!c.ok()) return Error(c.status());
  if (sub == "ls") {
    auto list = (*c)->ListSessions(FLAGS_prefix);
    if (!list.ok()) return Error(list.status());
    if (FLAGS_json) {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& s : *list) {
        j.push_back({{"session_id", s.session_id},
                     {"blocks", s.blocks},
                     {"token_count", s.token_count},
                     {"total_bytes", s.total_bytes},
                     {"updated_unix_ms", s.updated_unix_ms}});
      }
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::printf("%-40s %8s %10s %12s  %s\n", "session", "blocks", "tokens", "bytes", "updated");
    for (const auto& s : *list) {
      std::printf("%-40s %8u %10llu %12s  %s\n", s.session_id.c_str(), s.blocks,
                  static_cast<unsigned long long>(s.token_count),
                  kvpool::FormatBytes(s.total_bytes).c_str(), Time(s.updated_unix_ms).c_str());
    }
    return 0;
  }
  if (argc < 4) return Usage("sessions " + sub + " needs a session id");
  const std::string id = argv[3];
  if (sub == "show") {
    auto s = (*c)->LoadSession(id, /*prefetch=*/false);
    if (!s.ok()) return Error(s.status());
    if (FLAGS_json) {
      nlohmann::json keys = nlohmann::json::array();
      for (const auto& k : s->session.keys) keys.push_back(k.ToHex());
      nlohmann::json j = {{"session_id", s->session.session_id},
                          {"token_count", s->session.token_count},
                          {"metadata", s->session.metadata},
                          {"keys", keys},
                          {"cached_blocks", s->cached_blocks},
                          {"total_bytes", s->session.total_bytes},
                          {"created_unix_ms", s->session.created_unix_ms},
                          {"updated_unix_ms", s->session.updated_unix_ms}};
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::cout << "session " << s->session.session_id << "\n  tokens " << s->session.token_count
              << ", blocks " << s->session.keys.size() << " (" << s->cached_blocks
              << " cached now), " << kvpool::FormatBytes(s->session.total_bytes) << "\n  created "
              << Time(s->session.created_unix_ms) << ", updated "
              << Time(s->session.updated_unix_ms) << "\n";
    for (const auto& [k, v] : s->session.metadata) std::cout << "  " << k << " = " << v << "\n";
    for (size_t i = 0; i < s->session.keys.size(); ++i) {
      std::cout << "  [" << i << "] " << s->session.keys[i].ToHex() << "\n";
    }
    return 0;
  }
  if (sub == "rm") {
    kvpool::Status st = (*c)->DeleteSession(id);
    if (!st.ok()) return Error(st);
    std::cout << "deleted session " << id << "\n";
    return 0;
  }
  return Usage("unknown sessions command '" + sub + "'");
}

kvpool::Result<std::vector<int32_t>> ReadTokens(const std::string& path) {
  std::ifstream in(path);
  if (!in) return kvpool::Status::NotFound("cannot open tokens file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  std::vector<int32_t> tokens;
  size_t i = 0;
  while (i < text.size()) {
    const char ch = text[i];
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
      size_t end = i + 1;
      while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
      const std::string num = text.substr(i, end - i);
      if (num == "-") return kvpool::Status::InvalidArgument("stray '-' in " + path);
      const long long v = std::stoll(num);
      if (v < INT32_MIN || v > INT32_MAX) {
        return kvpool::Status::InvalidArgument("token " + num + " is not a 32-bit integer");
      }
      tokens.push_back(static_cast<int32_t>(v));
      i = end;
    } else if (ch == ' ' || ch == ',' || ch == '\n' || ch == '\r' || ch == '\t' || ch == '[' ||
               ch == ']') {
      ++i;
    } else {
      return kvpool::Status::InvalidArgument(std::string("unexpected character '") + ch +
                                             "' in tokens file " + path);
    }
  }
  return tokens;
}

// The chain of --tokens-file for `cmd` (lookup, locate): its tokens and keys, hashed with
// --secret, --layout and --tokens-per-block. Returns 0, or the exit status of a usage error.
int ChainFromFlags(const std::string& cmd, std::vector<int32_t>* tokens,
                   std::vector<kvpool::BlockKey>* keys) {
  if (FLAGS_tokens_file.empty()) return Usage(cmd + " needs --tokens-file");
  if (FLAGS_layout.empty()) {
    return Usage(cmd + " needs --layout (the canonical layout string the keys were made with)");
  }
  if (FLAGS_tokens_per_block == 0) return Usage("--tokens-per-block must be positive");
  auto read = ReadTokens(FLAGS_tokens_file);
  if (!read.ok()) return Error(read.status());
  *tokens = std::move(*read);
  const std::string secret = FLAGS_secret.empty() ? FLAGS_namespace_name : FLAGS_secret;
  *keys = kvpool::ChainHasher(secret, FLAGS_layout, FLAGS_tokens_per_block).Hash(*tokens);
  return 0;
}

int Lookup() {
  std::vector<int32_t> tokens;
  std::vector<kvpool::BlockKey> keys;
  if (int rc = ChainFromFlags("lookup", &tokens, &keys); rc != 0) return rc;
  auto c = Connect();
  if (!c.ok()) return Error(c.status());
  auto r = (*c)->Lookup(keys, /*prefetch=*/false);
  if (!r.ok()) return Error(r.status());
  const uint64_t hit_tokens = static_cast<uint64_t>(r->hit_blocks) * FLAGS_tokens_per_block;
  if (FLAGS_json) {
    nlohmann::json blocks = nlohmann::json::array();
    for (size_t i = 0; i < r->tiers.size(); ++i) {
      blocks.push_back(
          {{"index", i}, {"key", keys[i].ToHex()}, {"tier", kvpool::TierName(r->tiers[i])}});
    }
    nlohmann::json j = {{"tokens", tokens.size()},
                        {"blocks", keys.size()},
                        {"hit_blocks", r->hit_blocks},
                        {"hit_tokens", hit_tokens},
                        {"cached", blocks}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "cached prefix: " << r->hit_blocks << " of " << keys.size() << " blocks, "
            << hit_tokens << " of " << tokens.size() << " tokens";
  if (tokens.size() % FLAGS_tokens_per_block != 0) {
    std::cout << " (the last " << tokens.size() % FLAGS_tokens_per_block
              << " tokens fill no block and are never cached)";
  }
  std::cout << "\n";
  for (size_t i = 0; i < r->tiers.size(); ++i) {
    std::printf("  block %-6zu %s  %s\n", i, keys[i].ShortHex().c_str(),
                kvpool::TierName(r->tiers[i]));
  }
  return 0;
}

int Locate() {
  std::vector<int32_t> tokens;
  std::vector<kvpool::BlockKey> keys;
  if (int rc = ChainFromFlags("locate", &tokens, &keys); rc != 0) return rc;
  auto c = Connect();
  if (!c.ok()) return Error(c.status());
  auto r = (*c)->Locate(keys);
  if (!r.ok()) return Error(r.status());
  if (FLAGS_json) {
    nlohmann::json nodes = nlohmann::json::array();
    for (const kvpool::NodeLocation& n : *r) {
      nlohmann::json tiers = nlohmann::json::array();
      for (kvpool::Tier t : n.tiers) tiers.push_back(kvpool::TierName(t));
      nodes.push_back({{"node_id", n.node_id},
                       {"control_address", n.control_address},
                       {"self", n.self},
                       {"ok", n.status.ok()},
                       {"error", n.status.ok() ? "" : n.status.ToString()},
                       {"hit_blocks", n.hit_blocks},
                       {"hit_tokens", uint64_t{n.hit_blocks} * FLAGS_tokens_per_block},
                       {"tiers", tiers}});
    }
    std::cout << nlohmann::json(
                     {{"tokens", tokens.size()}, {"blocks", keys.size()}, {"nodes", nodes}})
                     .dump(2)
              << "\n";
    return 0;
  }
  std::cout << keys.size() << " blocks (" << tokens.size() << " tokens); cached prefix by node:\n";
  for (const kvpool::NodeLocation& n : *r) {
    size_t host = 0, disk = 0, gpu = 0;
    for (kvpool::Tier t : n.tiers) {
      gpu += t == kvpool::Tier::kGpu;
      host += t == kvpool::Tier::kHost;
      disk += t == kvpool::Tier::kDisk;
    }
    std::printf("  %-24s %-26s ", (n.node_id + (n.self ? " (this)" : "")).c_str(),
                n.control_address.empty() ? "-" : n.control_address.c_str());
    if (!n.status.ok()) {
      std::printf("no answer: %s\n", n.status.ToString().c_str());
    } else {
      std::printf("%u blocks (gpu %zu, host %zu, disk %zu)\n", n.hit_blocks, gpu, host, disk);
    }
  }
  return 0;
}

int Cluster(int argc, char** argv) {
  if (argc < 3 || std::string(argv[2]) != "members") return Usage("cluster needs 'members'");
  auto c = Connect();
  if (!c.ok()) return Error(c.status());
  auto v = (*c)->Cluster();
  if (!v.ok()) return Error(v.status());
  if (FLAGS_json) {
    nlohmann::json members = nlohmann::json::array();
    for (const kvpool::ClusterMember& m : v->members) {
      members.push_back({{"node_id", m.node_id},
                         {"control_address", m.control_address},
                         {"state", m.state},
                         {"capacity_bytes", m.capacity_bytes},
                         {"used_bytes", m.used_bytes},
                         {"self", m.self},
                         {"started_unix_ms", m.started_unix_ms}});
    }
    nlohmann::json j = {{"state", v->state}, {"reason", v->reason}, {"members", members}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "cluster: " << v->state;
  if (!v->reason.empty()) std::cout << " (" << v->reason << ")";
  std::cout << "\n";
  std::printf("%-28s %-28s %-9s %12s %12s %6s\n", "node", "address", "state", "capacity", "used",
              "used%");
  for (const kvpool::ClusterMember& m : v->members) {
    std::printf("%-28s %-28s %-9s %12s %12s %6s%s\n", m.node_id.c_str(), m.control_address.c_str(),
                m.state.c_str(), kvpool::FormatBytes(m.capacity_bytes).c_str(),
                kvpool::FormatBytes(m.used_bytes).c_str(),
                Percent(m.used_bytes, m.capacity_bytes).c_str(), m.self ? "  (this daemon)" : "");
  }
  return 0;
}

int Evict() {
  kvpool::Tier tier;
  if (FLAGS_tier == "gpu") {
    tier = kvpool::Tier::kGpu;
  } else if (FLAGS_tier == "host") {
    tier = kvpool::Tier::kHost;
  } else if (FLAGS_tier == "disk") {
    tier = kvpool::Tier::kDisk;
  } else {
    return Usage("--tier must be gpu, host or disk");
  }
  auto c = Connect();
  if (!c.ok()) return Error(c.status());
  auto r = (*c)->Evict(tier);
  if (!r.ok()) return Error(r.status());
  std::cout << "evicted " << r->evicted << " blocks, skipped " << r->skipped
            << " (leased, pinned by a session, or with cached descendants)\n";
  return 0;
}

nlohmann::json PolicyJson(const kvpool::PolicyInfo& p) {
  return {{"namespace", p.namespace_name},
          {"eviction", p.eviction},
          {"write", p.write},
          {"admission", p.admission},
          {"read_ahead", p.read_ahead},
          {"encoding", p.encoding},
          {"host_quota_bytes", p.host_quota_bytes},
          {"disk_quota_bytes", p.disk_quota_bytes},
          {"gpu_quota_bytes", p.gpu_quota_bytes},
          {"source", p.source}};
}

int Policies(int argc, char** argv) {
  if (argc < 3 || std::string(argv[2]) != "show") return Usage("policies needs 'show'");
  // --namespace names the one to show; without it, every configured one. Asked through the
  // default namespace, so that looking at a namespace does not create it (a hello registers its
  // name). Where the daemon refuses that connection (a tenant's credential is not default's, or
  // only declared namespaces are served), a tenant asks for its own namespace's through that
  // namespace: one the daemon knows already.
  const bool one = !gflags::GetCommandLineFlagInfoOrDie("namespace_name").is_default;
  auto c = Connect("default");
  if (!c.ok() && c.status().code() == kvpool::StatusCode::kPermissionDenied && one &&
      !FLAGS_admin && FLAGS_namespace_name != "default") {
    c = Connect();
  }
  if (!c.ok()) return Error(c.status());
  auto v = (*c)->Policies(one ? FLAGS_namespace_name : "");
  if (!v.ok()) return Error(v.status());
  if (FLAGS_json) {
    nlohmann::json namespaces = nlohmann::json::array();
    for (const kvpool::PolicyInfo& p : v->namespaces) namespaces.push_back(PolicyJson(p));
    nlohmann::json j = {{"default", PolicyJson(v->default_policy)}, {"namespaces", namespaces}};
    j["default"].erase("namespace");
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::vector<kvpool::PolicyInfo> rows;
  if (!one) {
    rows.push_back(v->default_policy);
    rows.back().namespace_name = "(default)";
  }
  rows.insert(rows.end(), v->namespaces.begin(), v->namespaces.end());
  size_t width = std::string("namespace").size();
  for (const kvpool::PolicyInfo& p : rows) width = std::max(width, p.namespace_name.size());
  const int w = static_cast<int>(width);
  auto quota = [](uint64_t bytes) {
    return bytes == 0 ? std::string("-") : kvpool::FormatBytes(bytes);
  };
  std::printf("%-*s  %-8s  %-22s  %-14s  %-10s  %-8s  %-10s  %-10s  %-10s  %s\n", w, "namespace",
              "eviction", "write", "admission", "read_ahead", "encoding", "host_quota",
              "disk_quota", "gpu_quota", "source");
  for (const kvpool::PolicyInfo& p : rows) {
    std::printf("%-*s  %-8s  %-22s  %-14s  %-10s  %-8s  %-10s  %-10s  %-10s  %s\n", w,
                p.namespace_name.c_str(), p.eviction.c_str(), p.write.c_str(), p.admission.c_str(),
                p.read_ahead.c_str(), p.encoding.c_str(), quota(p.host_quota_bytes).c_str(),
                quota(p.disk_quota_bytes).c_str(), quota(p.gpu_quota_bytes).c_str(),
                p.source.c_str());
  }
  if (!one && v->namespaces.empty()) std::cout << "(no namespace has its own strategies)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // `namespace` is a C++ keyword, so the flag is namespace_name; accept the documented
  // --namespace spelling too.
  std::vector<std::string> renamed;
  renamed.reserve(static_cast<size_t>(argc));  // argv keeps pointers into it
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--namespace" || a.rfind("--namespace=", 0) == 0) {
      renamed.push_back("--namespace_name" + a.substr(std::string("--namespace").size()));
      argv[i] = renamed.back().data();
    }
  }
  gflags::SetUsageMessage(kUsage);
  gflags::SetVersionString(kvpool::kBuildVersionLine);
  gflags::ParseCommandLineFlags(&argc, &argv, /*remove_flags=*/true);
  if (argc < 2) return Usage("no command given");
  const std::string cmd = argv[1];
  if (cmd == "status") return Status();
  if (cmd == "stats") return Stats();
  if (cmd == "sessions") return Sessions(argc, argv);
  if (cmd == "lookup") return Lookup();
  if (cmd == "locate") return Locate();
  if (cmd == "evict") return Evict();
  if (cmd == "cluster") return Cluster(argc, argv);
  if (cmd == "policies") return Policies(argc, argv);
  if (cmd == "bench") {
    std::fprintf(stderr, "kvpool: the benchmark is its own tool: run kvpool-bench --help\n");
    return 2;
  }
  if (cmd == "help") {
    std::printf("%s\n", kUsage);
    return 0;
  }
  return Usage("unknown command '" + cmd + "'");
}
