#pragma once
// NamespacePolicies: where each namespace's strategies come from, applied to the tier manager at
// start and again when the namespaces file is reloaded (SIGHUP), and reported by POLICIES
// (`kvpool policies show`).
//
// The layers, lowest first; a layer wins over those below it for what it names:
//   1. the built-in default composition (tiers::DefaultNamespacePolicy: lru, write-back, all,
//      chain-2);
//   2. the flags: --write_policy is the default's write policy; --namespace_policy=NS=POLICY
//      gives NS that write policy over the default;
//   3. the namespaces file (daemon/namespaces_file.h): its `default:` lies over 1-2, and a
//      namespace the file names is configured by the file alone (over the file's default), so a
//      --namespace_policy entry for it is ignored, with a warning.
// The source reported for each composition is "default", "flags" or the file's path.
//
// A reload reads and validates the whole file first and changes nothing when anything is
// wrong. When it is valid the new compositions replace the old: a namespace the file no longer
// names goes back to its flags entry or to the default. Blocks stay in every case (the tier
// manager moves a namespace's candidates to its new eviction order).
//
// Thread safety: Configure and Reload from one thread at a time (start, then the signal loop);
// Show from any thread.

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/namespace_id.h"
#include "common/status.h"
#include "daemon/access_control.h"
#include "daemon/namespace_registry.h"
#include "daemon/namespaces_file.h"
#include "tiers/tier_manager.h"

namespace kvpool::daemon {

struct NamespacePoliciesOptions {
  // The default write policy (--write_policy). Empty: the built-in default (write-back).
  std::string write_policy;
  // Per-namespace write policies, "NS=POLICY[,NS=POLICY...]" (--namespace_policy). Default: none.
  std::string namespace_policies;
  // The namespaces file. Empty: none (the flags alone).
  std::string namespaces_file;
  // Whether a missing namespaces_file is an error (given explicitly) or the defaults (the
  // default path). Default: false.
  bool namespaces_file_required = false;
};

// One composition as reported: each strategy by name, and where it came from.
struct PolicyInfo {
  std::string namespace_name;  // empty for the default
  std::string eviction;
  std::string write;
  std::string admission;
  std::string read_ahead;
  std::string encoding;           // "raw", or e.g. "int8 (32x8x128, 16 tokens, bf16)"
  std::string source;             // "default", "flags", or the namespaces file's path
  uint64_t host_quota_bytes = 0;  // 0: none
  uint64_t disk_quota_bytes = 0;
  uint64_t gpu_quota_bytes = 0;
};

class NamespacePolicies {
 public:
  // `access`, when given, gets the namespaces file's access rules (daemon/access_control.h)
  // with every configuration applied, so a reload changes both or neither.
  NamespacePolicies(NamespacePoliciesOptions options, tiers::TierManager& tiers,
                    NamespaceRegistry& namespaces, AccessControl* access = nullptr)
      : options_(std::move(options)), tiers_(tiers), namespaces_(namespaces), access_(access) {
    running_.default_policy = tiers::DefaultNamespacePolicy();
    running_.default_source = "default";
  }

  // Parses the flags and the file and applies them. InvalidArgument (every error of the file,
  // one "PATH:LINE: what" line each), NotFound for a required file that is missing,
  // ResourceExhausted past --max_namespaces. Call once, before Reload.
  Status Configure();

  // Re-reads the namespaces file and applies it; on any error keeps the running configuration
  // and returns the error (as Configure's). OK and no change without a namespaces file.
  Status Reload();

  // The default composition and every configured namespace's, sorted by name.
  struct Snapshot {
    PolicyInfo default_policy;
    std::vector<PolicyInfo> namespaces;
  };
  Snapshot Show() const;
  // One namespace's composition, configured or not (then the default's, under its name); a
  // namespace nobody has used yet is not created. InvalidArgument for a name the registry
  // would refuse.
  Result<PolicyInfo> ShowNamespace(const std::string& name) const;

  const std::string& namespaces_file() const { return options_.namespaces_file; }

 private:
  struct Configured {
    std::string name;
    tiers::NamespacePolicy policy;
    std::string source;
  };
  struct Layers {
    tiers::NamespacePolicy default_policy;
    std::string default_source;
    absl::flat_hash_map<NamespaceId, Configured> namespaces;
    AccessRules access;
  };

  // The flags' entries, parsed once by Configure.
  struct FlagEntry {
    std::string name;
    std::string write;
  };
  Status ParseFlags();
  // Everything the flags and `file` say, namespaces resolved (created) in the registry.
  Result<Layers> Compose(const NamespacesConfig& file, bool warn);
  Result<NamespacesConfig> LoadFile() const;
  // Applies `next` over the running layers (a namespace in neither keeps nothing).
  Status Apply(Layers next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PolicyInfo InfoLocked(NamespaceId ns, const std::string& name, const tiers::NamespacePolicy& p,
                        const std::string& source) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  PolicyInfo DefaultInfoLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const NamespacePoliciesOptions options_;
  tiers::TierManager& tiers_;
  NamespaceRegistry& namespaces_;
  AccessControl* const access_;
  std::vector<FlagEntry> flag_entries_;  // set by Configure, then read-only
  PolicyNames flag_base_;                // the flags' default names (write only)

  mutable absl::Mutex mu_;
  Layers running_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::daemon
