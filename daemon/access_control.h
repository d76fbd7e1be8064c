#pragma once
// AccessControl: who may act for which namespace, and who may run admin requests; decided once
// per connection, at hello.
//
// The rules come from the namespaces file (daemon/namespaces_file.h): a namespace may have a
// credential (a secret, read from a file only the daemon's user may read) and Unix users or
// groups; `admin:` says the same of admin rights; `access: declared` admits no namespace the file
// does not name. A hello is admitted when:
//   - the namespace has a credential: the peer is on the Unix socket as one of its users or in
//     one of its groups (SO_PEERCRED and SO_PEERGROUPS: the process's own groups), or it proves
//     the secret
//     (HMAC over this connection's challenge, common/hello_auth.h), or it proves the admin's or
//     (a peer daemon) the cluster secret;
//   - the namespace has none: `access: declared` and the file does not name it refuses it
//     unless the admin or the cluster secret is proven; otherwise it is open, except that in
//     cluster mode a TCP connection proves the cluster secret (or the admin's), as before.
// Admin rights are asked for at hello. Without an `admin:` section they go to every connection
// where nothing is guarded, and otherwise to root and kvpoold's own user on the Unix socket and to
// holders of the cluster secret (peers, and cluster-mode TCP clients, which may act for any
// namespace already), never to a tenant for proving its namespace (the start log says which). A
// client that holds a secret sends a challenge of its own and is admitted only through a proof,
// which the daemon then answers under the same secret (mutual authentication; common/hello_auth.h).
// Secrets are compared in constant time; a wrong proof closes the connection. The cluster secret
// marks its holder as a peer daemon, which may act for any namespace.
//
// Thread safety: Replace from one thread at a time (start, then SIGHUP); Admit from any thread.

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "daemon/namespaces_file.h"
#include "transport/control_server.h"

namespace kvpool::daemon {

// One credential, resolved: the secret read from its file, the users and groups as ids.
struct Credential {
  std::string secret;  // empty: none (only the Unix binding)
  std::vector<uint32_t> uids;
  std::vector<uint32_t> gids;
};

// Everything AccessControl decides with.
struct AccessRules {
  bool declared_only = false;
  std::optional<Credential> admin;  // nullopt: every connection has admin rights
  // Namespaces the file names; those with a credential have it here.
  absl::flat_hash_map<std::string, std::optional<Credential>> namespaces;
  std::string source;  // the namespaces file, for messages

  // Whether anything is guarded at all (a daemon without is open to every local process).
  bool guarded() const;
};

// Resolves what `config` says: reads every credential file (which must exist, hold at least 16
// bytes, and be readable by no one but its owner and group, writable by no one but its owner)
// and looks up users and groups. InvalidArgument
// listing every problem, one "PATH:LINE: what" line each.
Result<AccessRules> ResolveAccess(const NamespacesConfig& config);

// What a hello asks for.
struct HelloClaim {
  std::string_view namespace_name;
  bool admin = false;                 // asks for admin rights
  std::string_view challenge;         // this connection's (empty before one was issued)
  std::string_view proof;             // HMAC over the challenge (empty: none given)
  std::string_view client_challenge;  // the client's, for the daemon to answer
  bool local = false;                 // a Unix socket
  const transport::PeerCredentials* credentials = nullptr;  // its peer (Unix sockets)
};

// What the daemon answers.
struct HelloVerdict {
  enum class Outcome {
    kAdmitted,
    kProve,    // a proof would decide: issue a challenge and let the client answer it
    kRefused,  // PermissionDenied; close the connection
  };
  Outcome outcome = Outcome::kRefused;
  bool admin = false;  // admitted with admin rights
  bool peer = false;   // proved the cluster secret: another kvpoold
  std::string reason;  // for kProve and kRefused, shown to the client
  // For kvpoold's log: `reason` in full. The client's `reason` does not say whether a namespace
  // it was refused is declared with a credential or not declared at all (else anyone could list
  // the declared tenants by trying names); this does.
  std::string detail;
  // kAdmitted by a proof, with a client challenge: the daemon's answer to it under the secret
  // that was proven (common/hello_auth.h).
  std::string server_proof;
};

class AccessControl {
 public:
  // `cluster_secret`: the secret peers and (for open namespaces) TCP clients prove in cluster
  // mode; empty outside it.
  // `daemon_uid`: kvpoold's own user, admin where rules guard namespaces but name no admin.
  explicit AccessControl(std::string cluster_secret, uint32_t daemon_uid = ::geteuid())
      : cluster_secret_(std::move(cluster_secret)), daemon_uid_(daemon_uid) {}

  void Replace(AccessRules rules);
  HelloVerdict Admit(const HelloClaim& claim) const;
  // Whether the running rules guard anything (AccessRules::guarded).
  bool guarded() const;
  // For the start log: what is guarded, in one line.
  std::string Describe() const;

 private:
  const std::string cluster_secret_;
  const uint32_t daemon_uid_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const AccessRules> rules_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<const AccessRules>();
};

}  // namespace kvpool::daemon
