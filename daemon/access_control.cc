#include "daemon/access_control.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "common/hello_auth.h"

namespace kvpool::daemon {
namespace {

// A secret shorter than this is refused: it could be guessed offline from one proof.
constexpr size_t kMinSecretBytes = 16;

std::optional<uint32_t> ParseId(const std::string& s) {
  uint32_t id = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), id);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return id;
}

// getpwnam_r / getgrnam_r need a buffer of a size sysconf suggests (or more).
std::vector<char> LookupBuffer(int which) {
  const long hint = sysconf(which);
  return std::vector<char>(hint > 0 ? static_cast<size_t>(hint) : 16384);
}

std::optional<uint32_t> UserId(const std::string& name) {
  if (std::optional<uint32_t> id = ParseId(name)) return id;
  std::vector<char> buf = LookupBuffer(_SC_GETPW_R_SIZE_MAX);
  passwd pw{};
  passwd* found = nullptr;
  while (getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found) == ERANGE) {
    buf.resize(buf.size() * 2);
  }
  if (found == nullptr) return std::nullopt;
  return found->pw_uid;
}

std::optional<uint32_t> GroupId(const std::string& name) {
  if (std::optional<uint32_t> id = ParseId(name)) return id;
  std::vector<char> buf = LookupBuffer(_SC_GETGR_R_SIZE_MAX);
  group gr{};
  group* found = nullptr;
  while (getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found) == ERANGE) {
    buf.resize(buf.size() * 2);
  }
  if (found == nullptr) return std::nullopt;
  return found->gr_gid;
}

// Collects "PATH:LINE: what" lines.
class Resolver {
 public:
  explicit Resolver(const std::string& path) : path_(path) {}

  Credential Resolve(const AccessSpec& spec, const std::string& what) {
    Credential c;
    if (!spec.credential_file.empty()) c.secret = ReadSecret(spec, what);
    for (const std::string& u : spec.unix_users) {
      if (std::optional<uint32_t> id = UserId(u)) {
        c.uids.push_back(*id);
      } else {
        Error(spec.line, what + ": unix_users: no user '" + u + "' on this machine");
      }
    }
    for (const std::string& g : spec.unix_groups) {
      if (std::optional<uint32_t> id = GroupId(g)) {
        c.gids.push_back(*id);
      } else {
        Error(spec.line, what + ": unix_groups: no group '" + g + "' on this machine");
      }
    }
    return c;
  }

  Status status() const {
    if (errors_.empty()) return Status::OK();
    std::string joined;
    for (const std::string& e : errors_) joined += (joined.empty() ? "" : "\n") + e;
    return Status::InvalidArgument(std::move(joined));
  }

 private:
  void Error(int line, const std::string& what) {
    errors_.push_back(path_ + ":" + std::to_string(line) + ": " + what);
  }

  std::string ReadSecret(const AccessSpec& spec, const std::string& what) {
    const std::string& file = spec.credential_file;
    struct stat st {};
    if (stat(file.c_str(), &st) != 0) {
      Error(spec.line, what + ": credential_file " + file + ": " + std::strerror(errno));
      return "";
    }
    if (!S_ISREG(st.st_mode)) {
      Error(spec.line, what + ": credential_file " + file + " is not a regular file");
      return "";
    }
    if ((st.st_mode & (S_IRWXO | S_IWGRP)) != 0) {
      Error(spec.line, what + ": credential_file " + file +
                           " may be read or written by other users, or written by its group "
                           "(chmod 600 or 640 " +
                           file + ")");
      return "";
    }
    Result<std::string> read = ReadSecretFile(file);  // a trailing newline is not part of it
    if (!read.ok()) {
      Error(spec.line, what + ": credential_file: " + read.status().message());
      return "";
    }
    std::string secret = std::move(*read);
    if (secret.size() < kMinSecretBytes) {
      Error(spec.line, what + ": credential_file " + file + " holds " +
                           std::to_string(secret.size()) + " bytes; a credential needs at least " +
                           std::to_string(kMinSecretBytes) +
                           " (e.g. head -c 32 /dev/urandom | base64)");
      return "";
    }
    return secret;
  }

  const std::string& path_;
  std::vector<std::string> errors_;
};

}  // namespace

bool AccessControl::guarded() const {
  absl::MutexLock lock(&mu_);
  return rules_->guarded();
}

bool AccessRules::guarded() const {
  if (declared_only || admin.has_value()) return true;
  return std::any_of(namespaces.begin(), namespaces.end(),
                     [](const auto& n) { return n.second.has_value(); });
}

Result<AccessRules> ResolveAccess(const NamespacesConfig& config) {
  AccessRules rules;
  rules.declared_only = config.declared_only;
  rules.source = config.path;
  Resolver r(config.path);
  if (config.admin.has_value()) rules.admin = r.Resolve(*config.admin, "admin");
  for (const NamespacesConfig::Namespace& n : config.namespaces) {
    std::optional<Credential>& slot = rules.namespaces[n.name];
    if (!n.access.empty()) slot = r.Resolve(n.access, "namespace '" + n.name + "'");
  }
  KVPOOL_RETURN_IF_ERROR(r.status());
  return rules;
}

void AccessControl::Replace(AccessRules rules) {
  auto next = std::make_shared<const AccessRules>(std::move(rules));
  absl::MutexLock lock(&mu_);
  rules_ = std::move(next);
}

HelloVerdict AccessControl::Admit(const HelloClaim& claim) const {
  std::shared_ptr<const AccessRules> rules;
  {
    absl::MutexLock lock(&mu_);
    rules = rules_;
  }
  const std::string ns(claim.namespace_name);
  const bool has_proof = !claim.proof.empty() && !claim.challenge.empty();
  const std::string* proven = nullptr;  // the secret the proof was made with
  auto proves = [&](const std::string& secret) {
    if (!has_proof || secret.empty() ||
        !VerifyHelloProof(secret, claim.challenge, claim.namespace_name, claim.proof)) {
      return false;
    }
    proven = &secret;
    return true;
  };
  auto bound = [&](const Credential& c) {
    if (!claim.local || claim.credentials == nullptr) return false;
    const transport::PeerCredentials& who = *claim.credentials;
    auto listed = [&](uint32_t gid) {
      return std::find(c.gids.begin(), c.gids.end(), gid) != c.gids.end();
    };
    return std::find(c.uids.begin(), c.uids.end(), who.uid) != c.uids.end() || listed(who.gid) ||
           std::any_of(who.groups.begin(), who.groups.end(), listed);
  };

  HelloVerdict v;
  v.peer = proves(cluster_secret_);
  const bool admin_proven =
      rules->admin.has_value() && (bound(*rules->admin) || proves(rules->admin->secret));
  // Secrets a proof could be checked against here: with none, a challenge cannot help.
  bool provable = !cluster_secret_.empty() || (rules->admin && !rules->admin->secret.empty());

  bool ns_ok = false;
  // A guarded namespace and one not declared answer alike (the same words, a challenge where
  // any namespace could be proven), so that trying names does not list the declared tenants.
  const std::string guarded_or_undeclared =
      "namespace '" + ns + "' is not declared on this daemon or needs its credential (" +
      rules->source + "; kvpoold logs which, at --v=1 for a challenge)";
  bool any_secret = false;
  for (const auto& [name, c] : rules->namespaces) any_secret |= c && !c->secret.empty();
  auto it = rules->namespaces.find(ns);
  if (it != rules->namespaces.end() && it->second.has_value()) {
    const Credential& c = *it->second;
    ns_ok = bound(c) || proves(c.secret) || v.peer || admin_proven;
    provable = provable || any_secret;
    v.reason = guarded_or_undeclared;
    v.detail = "namespace '" + ns + "' needs its credential" +
               (c.uids.empty() && c.gids.empty() ? "" : " (or a Unix user or group it admits)");
  } else if (it == rules->namespaces.end() && rules->declared_only) {
    ns_ok = v.peer || admin_proven;
    provable = provable || any_secret;
    v.reason = guarded_or_undeclared;
    v.detail = "namespace '" + ns + "' is not declared on this daemon (" + rules->source + ")";
  } else {
    ns_ok = claim.local || cluster_secret_.empty() || v.peer || admin_proven;
    v.reason = "this daemon requires the cluster secret on TCP connections";
  }
  if (rules->admin.has_value()) {
    v.admin = admin_proven;
  } else if (rules->guarded()) {
    // Tenants are kept apart, but no one is named admin: the daemon's own user and root on the
    // Unix socket (the operator), and peer daemons, rather than every tenant.
    const bool operator_user =
        claim.local && claim.credentials != nullptr &&
        (claim.credentials->uid == 0 || claim.credentials->uid == daemon_uid_);
    v.admin = operator_user || v.peer;
  } else {
    v.admin = true;  // nothing is guarded: every local process may do everything anyway
  }
  bool admin_missing = false;
  if (ns_ok && claim.admin && !v.admin) {
    ns_ok = false;
    admin_missing = true;
    v.reason = "admin requests need the admin credential";
    v.detail.clear();
  }
  // A client that sends a challenge of its own holds a secret and wants the daemon to show that
  // it holds it too: it is admitted only through a proof, whatever else would admit it.
  if (ns_ok && !claim.client_challenge.empty() && proven == nullptr) {
    ns_ok = false;
    v.reason = "the client holds a secret for namespace '" + ns + "'";
    v.detail.clear();
    if (!provable) {
      v.reason +=
          " but this daemon has none that could admit it (give the namespace a "
          "credential_file, or drop the client's credential)";
    }
  }
  if (v.detail.empty()) v.detail = v.reason;
  if (ns_ok) {
    v.outcome = HelloVerdict::Outcome::kAdmitted;
    v.reason.clear();
    v.detail.clear();
    if (proven != nullptr && !claim.client_challenge.empty()) {
      v.server_proof = HelloServerProof(*proven, claim.client_challenge, claim.namespace_name);
    }
  } else if (!has_proof && provable) {
    v.outcome = HelloVerdict::Outcome::kProve;
    v.reason += ": answer the challenge";
  } else {
    v.outcome = HelloVerdict::Outcome::kRefused;
    if (has_proof) {
      v.reason = admin_missing
                     ? "admin requests need the admin credential (the one proven is not it)"
                     : "wrong credential for namespace '" + ns + "'";
      v.detail = v.reason + " (" + v.detail + ")";
    }
  }
  return v;
}

std::string AccessControl::Describe() const {
  std::shared_ptr<const AccessRules> rules;
  {
    absl::MutexLock lock(&mu_);
    rules = rules_;
  }
  size_t with_credential = 0;
  for (const auto& [name, c] : rules->namespaces) with_credential += c.has_value() ? 1 : 0;
  std::string out = rules->declared_only ? "declared namespaces only" : "open to any namespace";
  out += ", " + std::to_string(with_credential) + " with a credential, admin requests " +
         (rules->admin.has_value() ? std::string("need the admin credential")
          : rules->guarded()
              ? "only from root and uid " + std::to_string(daemon_uid_) +
                    " (kvpoold's user) on the Unix socket, and peer daemons (no 'admin:' section)"
              : std::string("open to every client"));
  return out;
}

}  // namespace kvpool::daemon
