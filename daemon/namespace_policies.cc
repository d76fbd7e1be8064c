#include "daemon/namespace_policies.h"

#include <glog/logging.h>

#include <algorithm>
#include <string_view>

#include "kernels/dtype.h"

namespace kvpool::daemon {
namespace {

constexpr std::string_view kBuiltinWrite = "write-back";

}  // namespace

Status NamespacePolicies::ParseFlags() {
  if (!options_.write_policy.empty()) {
    KVPOOL_RETURN_IF_ERROR(
        tiers::CreateWritePolicy(options_.write_policy).status().WithContext("--write_policy"));
    flag_base_.write = options_.write_policy;
  }
  std::string_view rest = options_.namespace_policies;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return Status::InvalidArgument("--namespace_policy item '" + std::string(item) +
                                     "' is not NS=POLICY");
    }
    FlagEntry e{std::string(item.substr(0, eq)), std::string(item.substr(eq + 1))};
    KVPOOL_RETURN_IF_ERROR(
        NamespaceRegistry::ValidateName(e.name).WithContext("--namespace_policy"));
    KVPOOL_RETURN_IF_ERROR(
        tiers::CreateWritePolicy(e.write).status().WithContext("--namespace_policy " + e.name));
    flag_entries_.push_back(std::move(e));
  }
  return Status::OK();
}

Result<NamespacesConfig> NamespacePolicies::LoadFile() const {
  if (options_.namespaces_file.empty()) {
    // No file: only the flags.
    return ParseNamespacesConfig("", "", flag_base_);
  }
  return LoadNamespacesFile(options_.namespaces_file, options_.namespaces_file_required,
                            flag_base_);
}

Result<NamespacePolicies::Layers> NamespacePolicies::Compose(const NamespacesConfig& file,
                                                             bool warn) {
  Layers layers;
  if (access_ != nullptr) {
    KVPOOL_ASSIGN_OR_RETURN(layers.access, ResolveAccess(file));
  }
  layers.default_policy = file.default_policy;
  if (file.has_default) {
    layers.default_source = file.path;
  } else if (!flag_base_.write.empty() && flag_base_.write != kBuiltinWrite) {
    layers.default_source = "flags";
  } else {
    layers.default_source = "default";
  }
  if (warn && file.has_default && !file.default_names.write.empty() &&
      !options_.write_policy.empty() && file.default_names.write != options_.write_policy) {
    // default_names is the file's over the flags': a different name came from the file.
    LOG(WARNING) << file.path << ": default write policy '" << file.default_names.write
                 << "' overrides --write_policy=" << options_.write_policy;
  }

  // The flags' namespaces lie over the file's default, like the file's own.
  PolicyNames inherit = file.default_names;
  inherit.eviction.clear();
  for (const FlagEntry& e : flag_entries_) {
    const bool in_file = std::any_of(file.namespaces.begin(), file.namespaces.end(),
                                     [&](const auto& n) { return n.name == e.name; });
    if (in_file) {
      if (warn) {
        LOG(WARNING) << "--namespace_policy " << e.name << "=" << e.write
                     << " is ignored: " << file.path << " configures namespace '" << e.name << "'";
      }
      continue;
    }
    PolicyNames names;
    names.write = e.write;
    names = names.Over(inherit);
    Result<tiers::NamespacePolicy> policy =
        tiers::ComposePolicy(names.eviction, names.write, names.admission, names.read_ahead);
    if (!policy.ok()) {
      return policy.status().WithContext("--namespace_policy " + e.name + "=" + e.write);
    }
    KVPOOL_ASSIGN_OR_RETURN(NamespaceId ns, namespaces_.Resolve(e.name, /*configured=*/true));
    layers.namespaces[ns] = Configured{e.name, std::move(*policy), "flags"};
  }
  for (const NamespacesConfig::Namespace& n : file.namespaces) {
    Result<NamespaceId> ns = namespaces_.Resolve(n.name, /*configured=*/true);
    if (!ns.ok()) {
      return ns.status().WithContext(file.path + ":" + std::to_string(n.line) + ": namespace '" +
                                     n.name + "'");
    }
    layers.namespaces[*ns] = Configured{n.name, n.policy, file.path};
  }
  return layers;
}

Status NamespacePolicies::Apply(Layers next) {
  // Everything was validated: the tier manager refuses only unknown eviction orders.
  KVPOOL_RETURN_IF_ERROR(tiers_.SetDefaultPolicy(next.default_policy));
  for (const auto& [ns, c] : next.namespaces) {
    KVPOOL_RETURN_IF_ERROR(tiers_.SetNamespacePolicy(ns, c.policy));
  }
  for (const auto& [ns, c] : running_.namespaces) {
    if (!next.namespaces.contains(ns)) tiers_.ClearNamespacePolicy(ns);
  }
  if (access_ != nullptr) {
    access_->Replace(next.access);
    LOG(INFO) << "access: " << access_->Describe();
  }
  running_ = std::move(next);
  return Status::OK();
}

Status NamespacePolicies::Configure() {
  KVPOOL_RETURN_IF_ERROR(ParseFlags());
  KVPOOL_ASSIGN_OR_RETURN(NamespacesConfig file, LoadFile());
  if (!options_.namespaces_file.empty()) {
    if (file.exists) {
      LOG(INFO) << "namespaces file " << file.path << ": " << file.namespaces.size()
                << " namespaces";
    } else {
      LOG(INFO) << "no namespaces file at " << file.path << ": default strategies";
    }
  }
  KVPOOL_ASSIGN_OR_RETURN(Layers layers, Compose(file, /*warn=*/true));
  absl::MutexLock lock(&mu_);
  return Apply(std::move(layers));
}

Status NamespacePolicies::Reload() {
  if (options_.namespaces_file.empty()) return Status::OK();
  KVPOOL_ASSIGN_OR_RETURN(NamespacesConfig file, LoadFile());
  if (!file.exists && access_ != nullptr && access_->guarded()) {
    // A file that vanished (deleted, or being rewritten) must not open a guarded daemon.
    return Status::FailedPrecondition(
        file.path +
        " is gone: the running access rules stay (a daemon that guards its "
        "namespaces opens only through a file that says so)");
  }
  KVPOOL_ASSIGN_OR_RETURN(Layers layers, Compose(file, /*warn=*/true));
  absl::MutexLock lock(&mu_);
  const size_t before = running_.namespaces.size();
  KVPOOL_RETURN_IF_ERROR(Apply(std::move(layers)));
  LOG(INFO) << "reloaded " << file.path << (file.exists ? "" : " (not there: defaults)") << ": "
            << running_.namespaces.size() << " configured namespaces (were " << before
            << "), default " << tiers::DescribePolicy(running_.default_policy);
  return Status::OK();
}

namespace {

// "raw", or the encoding with the layout it applies to: "int8 (32x8x128, 16 tokens, bf16)".
std::string EncodingName(const tiers::NamespacePolicy& p) {
  if (!p.encoding) return "raw";
  const kernels::BlockLayout& l = p.encoding->layout();
  return p.encoding->name() + " (" + std::to_string(l.num_layers) + "x" +
         std::to_string(l.num_kv_heads) + "x" + std::to_string(l.head_dim) + ", " +
         std::to_string(l.tokens) + " tokens, " + kernels::DTypeName(l.dtype) + ")";
}

}  // namespace

PolicyInfo NamespacePolicies::InfoLocked(NamespaceId ns, const std::string& name,
                                         const tiers::NamespacePolicy& p,
                                         const std::string& source) const {
  PolicyInfo info;
  info.namespace_name = name;
  // The order the tier manager runs for it (an empty name: the default pool's).
  info.eviction = tiers_.PolicyOf(ns).eviction;
  info.write = p.write->name();
  info.admission = p.admission->name();
  info.read_ahead = p.read_ahead->name();
  info.encoding = EncodingName(p);
  info.source = source;
  info.host_quota_bytes = p.host_quota_bytes;
  info.disk_quota_bytes = p.disk_quota_bytes;
  info.gpu_quota_bytes = p.gpu_quota_bytes;
  return info;
}

PolicyInfo NamespacePolicies::DefaultInfoLocked() const {
  const tiers::NamespacePolicy& d = running_.default_policy;
  PolicyInfo info;
  info.eviction = d.eviction.empty() ? "lru" : d.eviction;
  info.write = d.write->name();
  info.admission = d.admission->name();
  info.read_ahead = d.read_ahead->name();
  info.encoding = EncodingName(d);
  info.source = running_.default_source;
  return info;
}

NamespacePolicies::Snapshot NamespacePolicies::Show() const {
  absl::ReaderMutexLock lock(&mu_);
  Snapshot s;
  s.default_policy = DefaultInfoLocked();
  for (const auto& [ns, c] : running_.namespaces) {
    s.namespaces.push_back(InfoLocked(ns, c.name, c.policy, c.source));
  }
  std::sort(s.namespaces.begin(), s.namespaces.end(), [](const PolicyInfo& a, const PolicyInfo& b) {
    return a.namespace_name < b.namespace_name;
  });
  return s;
}

Result<PolicyInfo> NamespacePolicies::ShowNamespace(const std::string& name) const {
  KVPOOL_RETURN_IF_ERROR(NamespaceRegistry::ValidateName(name));
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [ns, c] : running_.namespaces) {
    if (c.name == name) return InfoLocked(ns, name, c.policy, c.source);
  }
  // Not configured: the default composition, in the default pool.
  PolicyInfo info = DefaultInfoLocked();
  info.namespace_name = name;
  return info;
}

}  // namespace kvpool::daemon
