#include "daemon/cluster/membership.h"

#include <glog/logging.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "common/clock.h"
#include "common/hello_auth.h"
#include "daemon/cluster/base64.h"
#include "daemon/cluster/cluster_threads.h"

namespace kvpool::daemon::cluster {
namespace {

using json = nlohmann::json;

constexpr int kRecordVersion = 1;
constexpr std::chrono::milliseconds kClaimRetry{250};

std::string Hex(const unsigned char* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[data[i] >> 4]);
    out.push_back(kDigits[data[i] & 15]);
  }
  return out;
}

std::string RandomInstanceId() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    AbortWithStatus(Status::Internal("RAND_bytes failed"), __FILE__, __LINE__);
  }
  return Hex(bytes, sizeof(bytes));
}

// Appends a field as 8-byte little-endian length + bytes: no two field lists encode alike.
void AppendField(std::string* out, std::string_view field) {
  uint64_t n = field.size();
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out->append(field);
}

}  // namespace

std::string MembersPrefix(std::string_view cluster) {
  return "/kvpool/" + std::string(cluster) + "/nodes/";
}

std::string MemberKey(std::string_view cluster, std::string_view node_id) {
  return MembersPrefix(cluster) + std::string(node_id);
}

Status ValidateClusterName(std::string_view name, std::string_view what) {
  const bool ok =
      !name.empty() && name.size() <= 128 && std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == '-';
      });
  if (ok) return Status::OK();
  return Status::InvalidArgument(std::string(what) + " '" + std::string(name) +
                                 "' must be 1-128 characters of [A-Za-z0-9._-]");
}

const char* MemberStateName(MemberState state) {
  switch (state) {
    case MemberState::kAlive:
      return "alive";
    case MemberState::kStale:
      return "stale";
    case MemberState::kDegraded:
      return "degraded";
  }
  return "?";
}

const char* ClusterStateName(ClusterState state) {
  switch (state) {
    case ClusterState::kJoined:
      return "joined";
    case ClusterState::kDegraded:
      return "degraded";
    case ClusterState::kStopped:
      return "stopped";
  }
  return "?";
}

std::string MemberRecordAuth(const MemberRecord& r, std::string_view secret) {
  std::string msg = "kvpool-member-v1";
  AppendField(&msg, r.cluster);
  AppendField(&msg, r.node_id);
  AppendField(&msg, r.instance);
  AppendField(&msg, r.control_address);
  AppendField(&msg, r.ucx_worker_address);
  AppendField(&msg, std::to_string(r.capacity_bytes));
  AppendField(&msg, std::to_string(r.used_bytes));
  AppendField(&msg, std::to_string(r.started_at_ms));
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac,
           &mac_len) == nullptr) {
    AbortWithStatus(Status::Internal("HMAC-SHA256 failed"), __FILE__, __LINE__);
  }
  return Hex(mac, mac_len);
}

bool VerifyMemberRecord(const MemberRecord& record, std::string_view secret) {
  const std::string expected = MemberRecordAuth(record, secret);
  return record.auth.size() == expected.size() &&
         CRYPTO_memcmp(record.auth.data(), expected.data(), expected.size()) == 0;
}

std::string EncodeMemberRecord(const MemberRecord& r) {
  const json j = {{"version", kRecordVersion},
                  {"cluster", r.cluster},
                  {"node_id", r.node_id},
                  {"instance", r.instance},
                  {"control_address", r.control_address},
                  {"ucx_worker_address", Base64Encode(r.ucx_worker_address)},
                  {"capacity_bytes", r.capacity_bytes},
                  {"used_bytes", r.used_bytes},
                  {"started_at_ms", r.started_at_ms},
                  {"auth", r.auth}};
  return j.dump();
}

Result<MemberRecord> DecodeMemberRecord(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption("member record is not JSON");
  // nlohmann converts a float to an integer type without a range check (undefined behaviour for
  // 1e47, found by fuzz_etcd_replies): integer fields must be JSON integers.
  const auto integer = [&j](const char* name, bool is_unsigned) -> const json& {
    const json& v = j.at(name);
    if (is_unsigned ? !v.is_number_unsigned() : !v.is_number_integer()) {
      throw std::invalid_argument(std::string(name) + " is not " +
                                  (is_unsigned ? "an unsigned integer" : "an integer"));
    }
    return v;
  };
  try {  // nlohmann's typed getters throw on a wrong type: the third-party boundary
    if (integer("version", false) != kRecordVersion) {
      return Status::Corruption("member record version " + j.at("version").dump());
    }
    MemberRecord r;
    r.cluster = j.at("cluster").get<std::string>();
    r.node_id = j.at("node_id").get<std::string>();
    r.instance = j.at("instance").get<std::string>();
    r.control_address = j.at("control_address").get<std::string>();
    KVPOOL_ASSIGN_OR_RETURN(r.ucx_worker_address,
                            Base64Decode(j.at("ucx_worker_address").get<std::string>()));
    r.capacity_bytes = integer("capacity_bytes", true).get<uint64_t>();
    r.used_bytes = integer("used_bytes", true).get<uint64_t>();
    r.started_at_ms = integer("started_at_ms", false).get<int64_t>();
    r.auth = j.at("auth").get<std::string>();
    return r;
  } catch (const json::exception& e) {
    return Status::Corruption(std::string("member record: ") + e.what());
  } catch (const std::invalid_argument& e) {
    return Status::Corruption(std::string("member record: ") + e.what());
  }
}

Result<std::string> ReadClusterSecretFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "cluster secret " + path);
  if ((st.st_mode & S_IROTH) != 0) {
    return Status::PermissionDenied("cluster secret file " + path +
                                    " is readable by everyone; chmod o-r it");
  }
  Result<std::string> read = ReadSecretFile(path);
  if (!read.ok()) return Status(read.status().code(), "cluster secret: " + read.status().message());
  std::string secret = std::move(*read);
  if (secret.size() < kMinSecretBytes) {
    return Status::InvalidArgument("cluster secret in " + path + " is shorter than " +
                                   std::to_string(kMinSecretBytes) + " bytes");
  }
  return secret;
}

// ---------------------------------------------------------------------------------------------

Membership::Membership(MembershipOptions options, std::unique_ptr<EtcdClient> etcd)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? *options_.clock : RealClock()),
      prefix_(MembersPrefix(options_.cluster_name)),
      key_(MemberKey(options_.cluster_name, options_.node_id)),
      etcd_(std::move(etcd)) {
  self_.cluster = options_.cluster_name;
  self_.node_id = options_.node_id;
  self_.instance = RandomInstanceId();
  self_.control_address = options_.control_address;
  self_.ucx_worker_address = options_.ucx_worker_address;
  self_.capacity_bytes = options_.capacity_bytes;
  self_.started_at_ms = UnixMillis();
  state_since_ms_ = self_.started_at_ms;
  ring_ = std::make_shared<const Ring>(std::vector<NodeId>{options_.node_id});
}

Membership::~Membership() { Leave(); }

Result<std::unique_ptr<Membership>> Membership::Join(MembershipOptions o) {
  KVPOOL_RETURN_IF_ERROR(ValidateClusterName(o.cluster_name, "cluster name"));
  KVPOOL_RETURN_IF_ERROR(ValidateClusterName(o.node_id, "node id"));
  if (o.secret.size() < kMinSecretBytes) {
    LOG(ERROR) << "refusing to join cluster " << o.cluster_name << ": no cluster secret (or one "
               << "shorter than " << kMinSecretBytes << " bytes) was given";
    return Status::PermissionDenied("a cluster secret of at least " +
                                    std::to_string(kMinSecretBytes) +
                                    " bytes is required to join a cluster");
  }
  if (o.lease_ttl.count() < 1) return Status::InvalidArgument("lease TTL must be >= 1 s");
  if (o.keepalive_interval.count() == 0) {
    o.keepalive_interval = std::chrono::duration_cast<std::chrono::milliseconds>(o.lease_ttl) / 3;
  }
  if (o.keepalive_interval <= std::chrono::milliseconds(0) || o.keepalive_interval >= o.lease_ttl) {
    return Status::InvalidArgument("keepalive interval must be positive and below the lease TTL");
  }
  if (o.claim_wait.count() == 0) {
    o.claim_wait = std::chrono::duration_cast<std::chrono::milliseconds>(o.lease_ttl) +
                   std::chrono::seconds(1);
  }
  if (o.occupancy_interval.count() <= 0) {
    return Status::InvalidArgument("occupancy interval must be positive");
  }
  EtcdOptions eo;
  eo.request_timeout = o.etcd_timeout;
  eo.connect_timeout = std::min(o.etcd_timeout, std::chrono::milliseconds(200));
  KVPOOL_ASSIGN_OR_RETURN(auto etcd, EtcdClient::Create(o.etcd, eo));

  std::unique_ptr<Membership> m(new Membership(std::move(o), std::move(etcd)));
  if (m->options_.used_bytes) {
    absl::MutexLock lock(&m->mu_);
    m->self_.used_bytes = m->options_.used_bytes();
  }
  KVPOOL_RETURN_IF_ERROR(m->Claim("join"));
  Membership* raw = m.get();
  m->watch_ = m->etcd_->Watch(m->prefix_, 0, [raw](const WatchUpdate& u) { raw->OnWatch(u); });
  {
    absl::MutexLock lock(&m->mu_);
    if (!m->mu_.AwaitWithTimeout(absl::Condition(&m->have_snapshot_),
                                 absl::FromChrono(2 * m->options_.etcd_timeout))) {
      LOG(WARNING) << "cluster " << m->options_.cluster_name
                   << ": member list not loaded yet; it will follow";
    }
  }
  m->next_occupancy_ = m->clock_.Now() + m->options_.occupancy_interval;
  m->keepalive_thread_ =
      StartThread(kClusterThreadRole, NextClusterThreadIndex(), [raw] { raw->KeepAliveLoop(); });
  LOG(INFO) << "joined cluster " << m->options_.cluster_name << " as " << m->options_.node_id
            << " (" << m->key_ << ", lease TTL " << m->options_.lease_ttl.count()
            << " s, keepalive every " << m->options_.keepalive_interval.count() << " ms); "
            << m->Members().size() << " member(s)";
  return m;
}

MemberRecord Membership::CurrentRecord() const {
  absl::MutexLock lock(&mu_);
  MemberRecord r = self_;
  r.auth = MemberRecordAuth(r, options_.secret);
  return r;
}

Status Membership::Claim(const char* why) {
  const bool at_join = std::string_view(why) == "join";
  KVPOOL_ASSIGN_OR_RETURN(const LeaseGrant grant, etcd_->GrantLease(options_.lease_ttl.count()));
  if (grant.ttl_seconds > options_.lease_ttl.count() && at_join) {
    LOG(WARNING) << "cluster " << options_.cluster_name << ": etcd raised the lease TTL from "
                 << options_.lease_ttl.count() << " s to its minimum " << grant.ttl_seconds
                 << " s (1.5 x its election timeout): a dead member takes that long to leave";
  }
  const auto revoke = [&] { etcd_->RevokeLease(grant.id).IgnoreError(); };
  const auto deadline =
      clock_.Now() + (at_join ? options_.claim_wait : std::chrono::milliseconds(0));
  while (true) {
    const MemberRecord record = CurrentRecord();
    const std::string value = EncodeMemberRecord(record);
    auto put = etcd_->PutIfAbsent(key_, value, grant.id);
    if (!put.ok()) {
      revoke();
      return put.status().WithContext("claiming " + key_);
    }
    if (put->created) break;
    auto existing = DecodeMemberRecord(put->existing->value);
    const bool valid = existing.ok() && existing->node_id == options_.node_id &&
                       VerifyMemberRecord(*existing, options_.secret);
    if (valid && existing->instance == record.instance) {
      // Our own record under a lease we lost track of: move it to the new lease.
      auto overwrite = etcd_->Put(key_, value, grant.id);
      if (!overwrite.ok()) {
        revoke();
        return overwrite.status().WithContext("re-claiming " + key_);
      }
      break;
    }
    if (clock_.Now() >= deadline) {
      revoke();
      if (!valid) {
        LOG(ERROR) << "refusing to " << why << " cluster " << options_.cluster_name << " as "
                   << options_.node_id << ": " << key_ << " is held by a live record that does "
                   << "not carry this cluster's secret (a daemon with another --cluster-secret, "
                   << "or a forged record); check the secret on both daemons";
        return Status::PermissionDenied("node id " + options_.node_id + " of cluster " +
                                        options_.cluster_name +
                                        " is held by a live member with another cluster secret");
      }
      LOG(ERROR) << "refusing to " << why << " cluster " << options_.cluster_name << " as "
                 << options_.node_id << ": another live daemon (" << existing->control_address
                 << ", instance " << existing->instance << ") holds that node id";
      return Status::AlreadyExists("node id " + options_.node_id +
                                   " is already a live member "
                                   "of cluster " +
                                   options_.cluster_name + " at " + existing->control_address);
    }
    // Perhaps this node's previous run, dead less than a lease ago: wait for its lease to end.
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      const Clock::TimePoint until = clock_.Now() + kClaimRetry;
      while (!stopping_ && !clock_.WaitUntil(stop_cv_, mu_, until)) {
      }
      stopping = stopping_;
    }
    if (stopping) {
      revoke();
      return Status::Aborted("membership is stopping");
    }
    // Our own new lease must outlive the wait.
    auto renewed = etcd_->KeepAliveOnce(grant.id);
    if (!renewed.ok()) {
      revoke();
      return renewed.status().WithContext("claiming " + key_);
    }
  }
  absl::MutexLock lock(&mu_);
  lease_ = grant.id;
  last_renewal_ = clock_.Now();
  consecutive_failures_ = 0;
  published_used_ = self_.used_bytes;
  return Status::OK();
}

Status Membership::Publish(const char* why) {
  int64_t lease;
  {
    absl::MutexLock lock(&mu_);
    lease = lease_;
  }
  const MemberRecord record = CurrentRecord();
  auto put = etcd_->Put(key_, EncodeMemberRecord(record), lease);
  if (!put.ok()) return put.status().WithContext(std::string(why) + " " + key_);
  published_used_ = record.used_bytes;
  return Status::OK();
}

void Membership::KeepAliveLoop() {
  auto next = clock_.Now() + options_.keepalive_interval;
  while (true) {
    bool paused;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && !clock_.WaitUntil(stop_cv_, mu_, next)) {
      }
      if (stopping_) return;
      paused = paused_;
    }
    next += options_.keepalive_interval;
    if (next < clock_.Now()) next = clock_.Now() + options_.keepalive_interval;
    if (!paused) Tick();
  }
}

void Membership::Tick() {
  int64_t lease;
  ClusterState state;
  {
    absl::MutexLock lock(&mu_);
    lease = lease_;
    state = state_;
  }
  const auto now = clock_.Now();
  auto renewed = etcd_->KeepAliveOnce(lease);
  if (renewed.ok()) {
    last_renewal_ = now;
    consecutive_failures_ = 0;
    if (state == ClusterState::kDegraded) {
      // etcd is back and still has our lease (etcd extends leases when it restarts).
      Status st = Publish("re-publishing");
      if (!st.ok()) {
        VLOG(1) << "cluster: " << st.ToString();
        return;
      }
      LOG(INFO) << "cluster " << options_.cluster_name << ": etcd reachable again; lease " << lease
                << " still live; rejoined as " << options_.node_id;
      watch_->Reconnect();
      SetState(ClusterState::kJoined, "");
      return;
    }
    if (now >= next_occupancy_) {
      next_occupancy_ = now + options_.occupancy_interval;
      if (options_.used_bytes) {
        const uint64_t used = options_.used_bytes();
        bool changed;
        {
          absl::MutexLock lock(&mu_);
          self_.used_bytes = used;
          changed = used != published_used_;
        }
        if (changed) {
          Status st = Publish("publishing occupancy of");
          if (!st.ok()) VLOG(1) << "cluster: " << st.ToString();
        }
      }
    }
    return;
  }
  if (renewed.status().code() == StatusCode::kNotFound) {
    // The lease ended (we stalled past the TTL, or etcd lost it): etcd deleted our record.
    LOG(WARNING) << "cluster " << options_.cluster_name << ": lease " << lease
                 << " expired; re-joining as " << options_.node_id;
    Status st = Claim("re-join");
    if (st.ok()) {
      {
        absl::MutexLock lock(&mu_);
        ++rejoins_;
      }
      LOG(INFO) << "cluster " << options_.cluster_name << ": re-joined as " << options_.node_id;
      watch_->Resync();
      SetState(ClusterState::kJoined, "");
    } else {
      SetState(ClusterState::kDegraded, "cannot re-join: " + st.ToString());
    }
    return;
  }
  ++consecutive_failures_;
  {
    absl::MutexLock lock(&mu_);
    ++keepalive_failures_;
  }
  if (state == ClusterState::kJoined &&
      (consecutive_failures_ >= 2 || now - last_renewal_ >= options_.lease_ttl / 2)) {
    LOG(WARNING) << "cluster " << options_.cluster_name << ": etcd unreachable ("
                 << renewed.status().ToString() << "); degraded: serving local tiers with the "
                 << "last known member view";
    SetState(ClusterState::kDegraded, "etcd unreachable: " + renewed.status().message());
  }
}

void Membership::SetState(ClusterState state, std::string reason) {
  {
    absl::MutexLock lock(&mu_);
    if (state_ == state && reason_ == reason) return;
    const bool changed = state_ != state;
    state_ = state;
    reason_ = std::move(reason);
    if (changed) state_since_ms_ = UnixMillis();
  }
  NotifyChange();
}

void Membership::OnWatch(const WatchUpdate& update) {
  {
    absl::MutexLock lock(&mu_);
    if (update.snapshot) {
      view_.clear();
      warned_.clear();
    }
    for (const auto& e : update.events) {
      if (e.type == WatchEvent::Type::kPut) {
        ApplyPut(e.kv);
      } else {
        view_.erase(e.kv.key.substr(prefix_.size()));
        warned_.erase(e.kv.key);
      }
    }
    have_snapshot_ = true;
    RebuildRing();
  }
  NotifyChange();
}

void Membership::ApplyPut(const KeyValue& kv) {
  if (kv.key.size() <= prefix_.size()) return;
  const std::string node = kv.key.substr(prefix_.size());
  auto record = DecodeMemberRecord(kv.value);
  std::string problem;
  if (!record.ok()) {
    problem = record.status().ToString();
  } else if (record->node_id != node || record->cluster != options_.cluster_name) {
    problem = "record names node '" + record->node_id + "' of cluster '" + record->cluster + "'";
  } else if (!VerifyMemberRecord(*record, options_.secret)) {
    problem = "its auth does not verify with this cluster's secret (control address " +
              record->control_address + ")";
  }
  if (problem.empty()) {
    view_[node] = std::move(*record);
    warned_.erase(kv.key);
    return;
  }
  view_.erase(node);
  ++ignored_records_;
  auto [it, inserted] = warned_.try_emplace(kv.key, kv.mod_revision);
  if (inserted || it->second != kv.mod_revision) {
    it->second = kv.mod_revision;
    LOG(WARNING) << "cluster " << options_.cluster_name << ": ignoring member record " << kv.key
                 << ": " << problem;
  }
}

void Membership::RebuildRing() {
  std::vector<NodeId> ids;
  ids.reserve(view_.size() + 1);
  for (const auto& [id, record] : view_) ids.push_back(id);
  ids.push_back(options_.node_id);
  ring_ = std::make_shared<const Ring>(std::move(ids));
}

void Membership::NotifyChange() {
  if (!options_.on_change) return;
  absl::MutexLock lock(&callback_mu_);
  options_.on_change();
}

ClusterState Membership::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

ClusterHealth Membership::health() const {
  absl::MutexLock lock(&mu_);
  ClusterHealth h;
  h.state = state_;
  h.reason = reason_;
  h.state_since_ms = state_since_ms_;
  h.keepalive_failures = keepalive_failures_;
  h.rejoins = rejoins_;
  h.ignored_records = ignored_records_;
  h.members = view_.size() + (view_.contains(options_.node_id) ? 0 : 1);
  return h;
}

std::vector<Member> Membership::Members() const {
  MemberRecord self = CurrentRecord();
  absl::MutexLock lock(&mu_);
  const bool joined = state_ == ClusterState::kJoined;
  std::vector<Member> out;
  out.reserve(view_.size() + 1);
  for (const auto& [id, record] : view_) {
    if (id == options_.node_id) continue;
    out.push_back(Member{record, joined ? MemberState::kAlive : MemberState::kStale, false});
  }
  out.push_back(
      Member{std::move(self), joined ? MemberState::kAlive : MemberState::kDegraded, true});
  std::sort(out.begin(), out.end(),
            [](const Member& a, const Member& b) { return a.record.node_id < b.record.node_id; });
  return out;
}

std::vector<NodeId> Membership::NodeIds() const { return ring()->members(); }

std::shared_ptr<const Ring> Membership::ring() const {
  absl::MutexLock lock(&mu_);
  return ring_;
}

void Membership::PauseKeepAliveForTesting(bool paused) {
  absl::MutexLock lock(&mu_);
  paused_ = paused;
}

void Membership::Leave() {
  if (left_) return;
  left_ = true;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stop_cv_.SignalAll();
  }
  if (keepalive_thread_.joinable()) keepalive_thread_.join();
  if (watch_) watch_->Stop();
  int64_t lease;
  bool was_paused;
  {
    absl::MutexLock lock(&mu_);
    lease = lease_;
    was_paused = paused_;
    state_ = ClusterState::kStopped;
    state_since_ms_ = UnixMillis();
  }
  // A paused member plays dead: it lets its lease expire rather than leave politely.
  if (lease != 0 && !was_paused) {
    Status st = etcd_->RevokeLease(lease);
    if (st.ok()) {
      LOG(INFO) << "left cluster " << options_.cluster_name << " (" << key_ << " removed)";
    } else if (st.code() != StatusCode::kNotFound) {
      LOG(WARNING) << "leaving cluster " << options_.cluster_name << ": could not revoke lease "
                   << lease << " (" << st.ToString() << "); " << key_ << " expires within "
                   << options_.lease_ttl.count() << " s";
    }
  }
  watch_.reset();
}

}  // namespace kvpool::daemon::cluster
