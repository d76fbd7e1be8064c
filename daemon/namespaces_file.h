#pragma once
// The namespaces file (kvpoold --namespaces_file, default /etc/kvpool/namespaces.yaml): which
// strategies (tiers/policy.h) each namespace runs with, read at start and again on SIGHUP.
//
//   default: {eviction: lru, write: write-back, admission: all, read_ahead: chain-2}
//   namespaces:
//     tenant-a: {eviction: s3fifo, admission: after-2-hits}
//     scratch:  {admission: none}
//
// Both sections are optional, and so is every key: a key the default omits keeps the built-in
// default (or the --write_policy flag, see daemon/namespace_policies.h); a key a namespace omits
// takes the file's default (its eviction order: the default pool's). The keys are eviction,
// write, admission, read_ahead, and for encoding on demotion encoding, layout and lossy:
//
//     llama-8b: {encoding: int8, lossy: true,
//                layout: {layers: 32, kv_heads: 8, head_dim: 128, tokens: 16, dtype: bf16}}
//
// (a lossy encoding needs both; blocks of any other size stay raw). A namespace may have quotas,
// sizes like 512MiB (see tiers/policy.h for what they bound):
//
//     tenant-b: {host_quota: 2GiB, disk_quota: 50GiB, gpu_quota: 4GiB}
//
// A key for something the daemon cannot configure per namespace (tier capacities) is an error,
// never silently ignored.
//
// Who may act for a namespace (daemon/access_control.h): a credential, the secret a client
// proves at hello, kept in a file only the daemon's user can read; and, on the Unix socket,
// Unix users or groups (names or numbers) admitted without a proof:
//
//     tenant-a: {credential_file: /etc/kvpool/credentials/tenant-a, unix_groups: [vllm]}
//
// The top-level `admin:` section says the same of admin requests (daemon-wide stats, the
// cluster view, other namespaces' policies), and `access: declared` closes the daemon to every
// namespace the file does not name (the default, `access: open`, lets a client name any other
// namespace, as before):
//
//     access: declared
//     admin: {unix_users: [root], credential_file: /etc/kvpool/credentials/admin}
//
// `access: declared` needs the `admin:` section and a credential or Unix binding for every
// namespace. A namespace given a credential needs it in every mode.
//
// Parsing validates everything and reports every problem found, one line each as
// "PATH:LINE: what", in file order: YAML syntax, unknown keys, values of the wrong type,
// namespace names the registry would refuse (NamespaceRegistry::ValidateName), unknown strategy
// names (with the known ones), compositions that contradict themselves (write-through into a
// disk that admits nothing). yaml-cpp's exceptions stop here.
//
// Thread safety: stateless functions, callable from any thread.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/block_layout.h"
#include "tiers/policy.h"

namespace kvpool::daemon {

// Strategy names of one composition as written; empty: not given here.
struct PolicyNames {
  std::string eviction;
  std::string write;
  std::string admission;
  std::string read_ahead;
  // Encoding on demotion (tiers/demotion_encoding.h) and what it needs: the namespace's raw
  // block layout, and its consent to approximate copies.
  std::string encoding;
  std::optional<kernels::BlockLayout> layout;
  std::optional<bool> lossy;
  // Quotas in bytes (tiers/policy.h), a namespace's own: never taken from the default.
  std::optional<uint64_t> host_quota;
  std::optional<uint64_t> disk_quota;
  std::optional<uint64_t> gpu_quota;  // per GPU

  // This, with what it leaves empty taken from `under`.
  PolicyNames Over(const PolicyNames& under) const;
  bool operator==(const PolicyNames& o) const;
};

// Who may act for a namespace, or run admin requests, as written (resolved, files read and
// users looked up, by daemon/access_control.h).
struct AccessSpec {
  std::string credential_file;          // holds the secret proved at hello
  std::vector<std::string> unix_users;  // names or numeric ids
  std::vector<std::string> unix_groups;
  int line = 0;  // where it was given, for messages

  bool empty() const {
    return credential_file.empty() && unix_users.empty() && unix_groups.empty();
  }
  bool operator==(const AccessSpec& o) const {
    return credential_file == o.credential_file && unix_users == o.unix_users &&
           unix_groups == o.unix_groups;
  }
};

// A parsed and validated namespaces file.
struct NamespacesConfig {
  struct Namespace {
    std::string name;
    int line = 0;
    PolicyNames names;              // as written in the file
    tiers::NamespacePolicy policy;  // composed over the default
    AccessSpec access;              // empty: anyone may name it (unless `access: declared`)
  };

  std::string path;           // as given: the messages' prefix and the policies' source
  bool exists = false;        // false: an optional file that is not there
  bool has_default = false;   // the file has a `default:` section
  PolicyNames default_names;  // the file's default over the base it was parsed with
  tiers::NamespacePolicy default_policy;
  std::vector<Namespace> namespaces;  // in file order, names unique
  // `access: declared`: only the namespaces above exist.
  bool declared_only = false;
  // The `admin:` section: who may run admin requests. nullopt: everyone (without one).
  std::optional<AccessSpec> admin;
};

// Parses `yaml`, reporting errors under `path`. `base`: what the file's default section lies
// over (the flags' write policy, or nothing). InvalidArgument whose message is every error,
// one "PATH:LINE: what" line each, joined by '\n'.
Result<NamespacesConfig> ParseNamespacesConfig(std::string_view yaml, const std::string& path,
                                               const PolicyNames& base = {});

// Reads and parses the file at `path`. A file that does not exist is an empty configuration
// (exists = false) unless `must_exist`, then NotFound; IoError when it cannot be read; else as
// ParseNamespacesConfig.
Result<NamespacesConfig> LoadNamespacesFile(const std::string& path, bool must_exist,
                                            const PolicyNames& base = {});

}  // namespace kvpool::daemon
