#include "daemon/namespaces_file.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/units.h"
#include "daemon/namespace_registry.h"
#include "tiers/demotion_encoding.h"

namespace kvpool::daemon {
namespace {

constexpr const char* kKnownPolicyKeys =
    "eviction, write, admission, read_ahead, encoding, layout, lossy, host_quota, disk_quota, "
    "gpu_quota";
constexpr const char* kKnownAccessKeys = "credential_file, unix_users, unix_groups";
constexpr const char* kKnownTopKeys = "default, namespaces, access, admin";

bool IsAccessKey(const std::string& key) {
  return key == "credential_file" || key == "unix_users" || key == "unix_groups";
}

std::string TypeName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "'" + node.Scalar() + "'";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "an undefined value";
  }
}

// Keys for settings the daemon cannot configure per namespace: refused with a clear line, never
// ignored (tier capacities are the daemon's flags).
bool NotSupportedYet(const std::string& key) {
  return key.find("quota") != std::string::npos || key.find("capacit") != std::string::npos ||
         key == "max_blocks" || key == "max_bytes";
}

// Whether `name` is an encoding on demotion at all (its layout is checked with the layout).
Status CheckEncodingName(const std::string& name) {
  kernels::BlockLayout any;  // fits every encoding
  any.num_layers = any.num_kv_heads = any.tokens = 1;
  any.head_dim = 64;
  return tiers::DemotionEncodingRegistry().Create(name, any).status();
}

// Adds the encoding on demotion `n` names to `p`, checked: a lossy encoding needs the layout and
// `lossy: true`. InvalidArgument saying what is missing.
Status AddEncoding(const PolicyNames& n, tiers::NamespacePolicy* p) {
  if (n.encoding.empty() || n.encoding == "raw") return Status::OK();
  if (!n.layout.has_value()) {
    return Status::InvalidArgument("encoding '" + n.encoding +
                                   "' needs the namespace's block 'layout' (layers, kv_heads, "
                                   "head_dim, tokens, dtype)");
  }
  if (!n.lossy.value_or(false)) {
    return Status::InvalidArgument("encoding '" + n.encoding +
                                   "' is lossy: add 'lossy: true' to accept approximate blocks");
  }
  KVPOOL_ASSIGN_OR_RETURN(p->encoding, tiers::CreateDemotionEncoding(n.encoding, *n.layout));
  return Status::OK();
}

// Collects error lines "PATH:LINE: what" while walking the document.
class Parser {
 public:
  Parser(const std::string& path, const PolicyNames& base) : path_(path), base_(base) {}

  void Error(const YAML::Mark& mark, const std::string& what) {
    if (mark.is_null()) {
      errors_.push_back(path_ + ": " + what);
    } else {
      errors_.push_back(path_ + ":" + std::to_string(mark.line + 1) + ": " + what);
    }
  }

  bool failed() const { return !errors_.empty(); }

  Status ErrorStatus() const {
    std::string joined;
    for (const std::string& e : errors_) joined += (joined.empty() ? "" : "\n") + e;
    return Status::InvalidArgument(std::move(joined));
  }

  // One key of an AccessSpec (IsAccessKey(k)) into `access`.
  void ParseAccessKey(const std::string& k, const YAML::Node& key, const YAML::Node& value,
                      const std::string& what, AccessSpec* access) {
    if (k == "credential_file") {
      if (!value.IsScalar() || value.Scalar().empty() || value.Scalar()[0] != '/') {
        Error(value.IsNull() ? key.Mark() : value.Mark(),
              what + ": credential_file must be an absolute path, got " + TypeName(value));
        return;
      }
      access->credential_file = value.Scalar();
      return;
    }
    // unix_users, unix_groups: a list of names or numeric ids (one alone may go without the
    // brackets).
    std::vector<std::string>& out = k == "unix_users" ? access->unix_users : access->unix_groups;
    const char* kind = k == "unix_users" ? "user" : "group";
    std::vector<YAML::Node> items;
    if (value.IsScalar()) {
      items.push_back(value);
    } else if (value.IsSequence()) {
      for (const auto& item : value) items.push_back(item);
    }
    if (items.empty()) {
      Error(value.IsNull() ? key.Mark() : value.Mark(),
            what + ": " + k + " must be a list of " + kind + " names or ids such as [vllm], got " +
                TypeName(value));
      return;
    }
    for (const YAML::Node& item : items) {
      if (!item.IsScalar() || item.Scalar().empty()) {
        Error(item.Mark(),
              what + ": " + k + " must list " + kind + " names or ids, got " + TypeName(item));
        continue;
      }
      out.push_back(item.Scalar());
    }
  }

  // The `admin:` section: an AccessSpec alone.
  AccessSpec ParseAdmin(const YAML::Node& node) {
    AccessSpec access;
    access.line = node.Mark().line + 1;
    if (!node.IsMap() || node.size() == 0) {
      Error(node.Mark(), std::string("admin: expected a mapping of ") + kKnownAccessKeys +
                             ", got " + TypeName(node));
      return access;
    }
    std::map<std::string, int> seen;
    for (const auto& kv : node) {
      const std::string k = kv.first.IsScalar() ? kv.first.Scalar() : "";
      if (!IsAccessKey(k)) {
        Error(kv.first.Mark(),
              "admin: unknown key " + TypeName(kv.first) + " (known: " + kKnownAccessKeys + ")");
        continue;
      }
      if (auto [first, inserted] = seen.emplace(k, kv.first.Mark().line + 1); !inserted) {
        Error(kv.first.Mark(), "admin: '" + k + "' given twice (first on line " +
                                   std::to_string(first->second) + ")");
        continue;
      }
      ParseAccessKey(k, kv.first, kv.second, "admin", &access);
    }
    return access;
  }

  // One composition: `what` names it in messages ("default", "namespace 'tenant-a'"). Who may
  // act for the namespace goes to `access`; the default has none (nullptr).
  PolicyNames ParsePolicy(const YAML::Node& node, const std::string& what, AccessSpec* access) {
    PolicyNames names;
    // A namespace's keys include who may act for it; the default's do not.
    const std::string known = access == nullptr
                                  ? std::string(kKnownPolicyKeys)
                                  : std::string(kKnownPolicyKeys) + ", " + kKnownAccessKeys;
    if (node.IsNull()) return names;  // "scratch:" alone: everything from the default
    if (!node.IsMap()) {
      Error(node.Mark(), what + ": expected a mapping of " + known + ", got " + TypeName(node));
      return names;
    }
    std::map<std::string, int> seen;
    for (const auto& kv : node) {
      const YAML::Node key = kv.first;
      const YAML::Node value = kv.second;
      if (!key.IsScalar()) {
        Error(key.Mark(), what + ": expected a key (" + known + "), got " + TypeName(key));
        continue;
      }
      const std::string k = key.Scalar();
      if (auto [first, inserted] = seen.emplace(k, key.Mark().line + 1); !inserted) {
        Error(key.Mark(), what + ": '" + k + "' given twice (first on line " +
                              std::to_string(first->second) + ")");
        continue;
      }
      if (IsAccessKey(k)) {
        if (access == nullptr) {
          Error(key.Mark(), what + ": " + k +
                                " says who may act for one namespace; give it under that "
                                "namespace (or in the admin section)");
        } else {
          ParseAccessKey(k, key, value, what, access);
        }
        continue;
      }
      if (k == "lossy") {
        if (!value.IsScalar() || (value.Scalar() != "true" && value.Scalar() != "false")) {
          Error(value.IsNull() ? key.Mark() : value.Mark(),
                what + ": lossy must be true or false, got " + TypeName(value));
        } else {
          names.lossy = value.Scalar() == "true";
        }
        continue;
      }
      if (k == "layout") {
        names.layout = ParseLayout(value, what);
        continue;
      }
      if (k == "host_quota" || k == "disk_quota" || k == "gpu_quota") {
        // Under default: the quota of each namespace that gives none (each on its own).
        Result<uint64_t> bytes =
            value.IsScalar() ? ParseBytes(value.Scalar()) : Status::InvalidArgument("not a size");
        if (!bytes.ok() || *bytes == 0) {
          Error(value.IsNull() ? key.Mark() : value.Mark(),
                what + ": " + k + " must be a size above zero such as 512MiB or 20GiB, got " +
                    TypeName(value));
          continue;
        }
        (k == "host_quota"   ? names.host_quota
         : k == "disk_quota" ? names.disk_quota
                             : names.gpu_quota) = *bytes;
        continue;
      }
      std::string* field = nullptr;
      if (k == "eviction") field = &names.eviction;
      if (k == "encoding") field = &names.encoding;
      if (k == "write") field = &names.write;
      if (k == "admission") field = &names.admission;
      if (k == "read_ahead") field = &names.read_ahead;
      if (field == nullptr) {
        if (NotSupportedYet(k)) {
          Error(key.Mark(), what + ": '" + k +
                                "' is not supported (the quotas a namespace takes are host_quota, "
                                "disk_quota and gpu_quota; tier capacities are the daemon's "
                                "flags); remove it");
        } else if (k == "read-ahead" || k == "readahead") {
          Error(key.Mark(), what + ": unknown key '" + k + "' (did you mean 'read_ahead'?)");
        } else {
          Error(key.Mark(), what + ": unknown key '" + k + "' (known: " + known + ")");
        }
        continue;
      }
      if (!value.IsScalar() || value.Scalar().empty()) {
        Error(value.IsNull() ? key.Mark() : value.Mark(),
              what + ": " + k + " must be a strategy name, got " + TypeName(value));
        continue;
      }
      // Each name on its own, so that every bad one gets its line; the combination is checked
      // once all are known.
      PolicyNames one;
      std::string* one_field = k == "eviction"    ? &one.eviction
                               : k == "write"     ? &one.write
                               : k == "admission" ? &one.admission
                               : k == "encoding"  ? &one.encoding
                                                  : &one.read_ahead;
      *one_field = value.Scalar();
      Status checked = k == "encoding" ? CheckEncodingName(value.Scalar())
                                       : tiers::ComposePolicy(one.eviction, one.write,
                                                              one.admission, one.read_ahead)
                                             .status();
      if (!checked.ok()) {
        Error(value.Mark(), what + ": " + checked.message());
        continue;
      }
      *field = value.Scalar();
    }
    return names;
  }

  // layout: {layers, kv_heads, head_dim, tokens, dtype}; nullopt (with its errors) when bad.
  std::optional<kernels::BlockLayout> ParseLayout(const YAML::Node& node, const std::string& what) {
    if (!node.IsMap()) {
      Error(node.Mark(), what +
                             ": layout must be a mapping of layers, kv_heads, head_dim, "
                             "tokens, dtype, got " +
                             TypeName(node));
      return std::nullopt;
    }
    kernels::BlockLayout l;
    bool ok = true;
    bool has_dtype = false;
    std::map<std::string, int*> ints = {{"layers", &l.num_layers},
                                        {"kv_heads", &l.num_kv_heads},
                                        {"head_dim", &l.head_dim},
                                        {"tokens", &l.tokens}};
    for (const auto& kv : node) {
      const std::string k = kv.first.IsScalar() ? kv.first.Scalar() : "";
      const YAML::Node v = kv.second;
      if (k == "dtype") {
        const std::string d = v.IsScalar() ? v.Scalar() : "";
        has_dtype = true;
        if (d == "fp16" || d == "float16") {
          l.dtype = kernels::DType::kFloat16;
        } else if (d == "bf16" || d == "bfloat16") {
          l.dtype = kernels::DType::kBFloat16;
        } else if (d == "fp32" || d == "float32") {
          l.dtype = kernels::DType::kFloat32;
        } else {
          Error(v.Mark(), what + ": layout dtype must be fp16, bf16 or fp32");
          ok = false;
        }
        continue;
      }
      auto it = ints.find(k);
      if (it == ints.end()) {
        Error(kv.first.Mark(), what + ": unknown layout key '" + k +
                                   "' (known: layers, kv_heads, head_dim, tokens, dtype)");
        ok = false;
        continue;
      }
      int value = 0;
      if (!v.IsScalar() || !YAML::convert<int>::decode(v, value) || value <= 0) {
        Error(v.IsNull() ? kv.first.Mark() : v.Mark(),
              what + ": layout " + k + " must be a positive integer");
        ok = false;
        continue;
      }
      *it->second = value;
      ints.erase(it);
    }
    if (ok && (!ints.empty() || !has_dtype)) {
      std::string missing;
      for (const auto& [k, p] : ints) missing += (missing.empty() ? "" : ", ") + k;
      if (!has_dtype) missing += std::string(missing.empty() ? "" : ", ") + "dtype";
      Error(node.Mark(), what + ": layout is missing " + missing);
      ok = false;
    }
    if (ok) {
      if (Status st = kernels::ValidateBlockLayout(l); !st.ok()) {
        Error(node.Mark(), what + ": layout: " + st.message());
        ok = false;
      }
    }
    if (!ok) return std::nullopt;
    return l;
  }

  Result<NamespacesConfig> Parse(std::string_view yaml) {
    NamespacesConfig config;
    config.path = path_;
    config.exists = true;
    YAML::Node root;
    try {
      root = YAML::Load(std::string(yaml));
    } catch (const YAML::ParserException& e) {
      Error(e.mark, "YAML syntax error: " + e.msg);
      return ErrorStatus();
    } catch (const YAML::Exception& e) {
      Error(e.mark, "cannot read YAML: " + e.msg);
      return ErrorStatus();
    }
    try {
      Walk(root, &config);
    } catch (const YAML::Exception& e) {  // not expected: every access is type-checked
      Error(e.mark, "cannot read YAML: " + e.msg);
    }
    if (failed()) return ErrorStatus();
    return config;
  }

 private:
  void Walk(const YAML::Node& root, NamespacesConfig* config) {
    struct Pending {
      std::string name;
      YAML::Mark mark;
      PolicyNames names;
      AccessSpec access;
    };
    std::vector<Pending> pending;
    YAML::Mark default_mark = YAML::Mark::null_mark();
    YAML::Mark access_mark = YAML::Mark::null_mark();
    bool default_ok = true;
    if (!root.IsNull()) {
      if (!root.IsMap()) {
        Error(root.Mark(),
              "expected a mapping with 'default' and 'namespaces', got " + TypeName(root));
        return;
      }
      std::map<std::string, int> seen;
      for (const auto& kv : root) {
        const YAML::Node key = kv.first;
        const YAML::Node value = kv.second;
        const std::string k = key.IsScalar() ? key.Scalar() : "";
        if (k != "default" && k != "namespaces" && k != "access" && k != "admin") {
          if (!key.IsScalar()) {
            Error(key.Mark(),
                  std::string("expected one of ") + kKnownTopKeys + ", got " + TypeName(key));
          } else if (NotSupportedYet(k)) {
            Error(key.Mark(), "'" + k +
                                  "' is not supported: quotas are given per namespace "
                                  "(host_quota, disk_quota, gpu_quota), tier capacities by the "
                                  "daemon's "
                                  "flags; remove it");
          } else {
            Error(key.Mark(), "unknown key '" + k + "' (known: " + kKnownTopKeys + ")");
          }
          continue;
        }
        if (auto [first, inserted] = seen.emplace(k, key.Mark().line + 1); !inserted) {
          Error(key.Mark(),
                "'" + k + "' given twice (first on line " + std::to_string(first->second) + ")");
          continue;
        }
        if (k == "access") {
          if (!value.IsScalar() || (value.Scalar() != "open" && value.Scalar() != "declared")) {
            Error(value.IsNull() ? key.Mark() : value.Mark(),
                  "access must be 'open' (any namespace may be named) or 'declared' (only the "
                  "namespaces of this file), got " +
                      TypeName(value));
          } else {
            config->declared_only = value.Scalar() == "declared";
            access_mark = key.Mark();
          }
          continue;
        }
        if (k == "admin") {
          config->admin = ParseAdmin(value);
          continue;
        }
        if (k == "default") {
          const size_t before = errors_.size();
          config->has_default = true;
          default_mark = key.Mark();
          config->default_names = ParsePolicy(value, "default", nullptr);
          default_ok = errors_.size() == before;
          continue;
        }
        // namespaces
        if (value.IsNull()) continue;
        if (!value.IsMap()) {
          Error(value.Mark(),
                "namespaces: expected a mapping of namespace names to their "
                "strategies, got " +
                    TypeName(value));
          continue;
        }
        std::map<std::string, int> names_seen;
        for (const auto& ns : value) {
          const YAML::Node name_node = ns.first;
          if (!name_node.IsScalar()) {
            Error(name_node.Mark(),
                  "namespaces: expected a namespace name, got " + TypeName(name_node));
            continue;
          }
          const std::string name = name_node.Scalar();
          const std::string what = "namespace '" + name + "'";
          if (Status st = NamespaceRegistry::ValidateName(name); !st.ok()) {
            Error(name_node.Mark(), st.message().find(name) == std::string::npos || name.empty()
                                        ? what + ": " + st.message()
                                        : st.message());
            continue;
          }
          if (auto [first, inserted] = names_seen.emplace(name, name_node.Mark().line + 1);
              !inserted) {
            Error(name_node.Mark(),
                  what + " given twice (first on line " + std::to_string(first->second) + ")");
            continue;
          }
          AccessSpec access;
          access.line = name_node.Mark().line + 1;
          PolicyNames names = ParsePolicy(ns.second, what, &access);
          pending.push_back({name, name_node.Mark(), std::move(names), std::move(access)});
        }
      }
    }
    if (config->declared_only) {
      for (const Pending& p : pending) {
        if (p.access.empty()) {
          Error(p.mark, "namespace '" + p.name +
                            "' has no credential: under 'access: declared' each namespace needs "
                            "a credential_file, unix_users or unix_groups");
        }
      }
    }
    if (config->declared_only && !config->admin.has_value()) {
      Error(access_mark,
            "access: declared needs an 'admin' section (who may run admin requests), e.g. "
            "admin: {unix_users: [root]}");
    }

    // The compositions. A namespace lies over the default; its eviction order, when it names
    // none, is the default pool's (empty), so that it shares that pool.
    config->default_names = config->default_names.Over(base_);
    const PolicyNames& d = config->default_names;
    Result<tiers::NamespacePolicy> def =
        tiers::ComposePolicy(d.eviction, d.write, d.admission, d.read_ahead);
    if (!def.ok()) {
      if (default_ok) {
        Error(default_mark, std::string(config->has_default ? "default" : "the default") + ": " +
                                def.status().message());
      }
      return;  // every namespace would repeat it
    }
    if (Status st = AddEncoding(d, &*def); !st.ok()) {
      if (default_ok) Error(default_mark, "default: " + st.message());
      return;
    }
    def->host_quota_bytes = d.host_quota.value_or(0);
    def->disk_quota_bytes = d.disk_quota.value_or(0);
    def->gpu_quota_bytes = d.gpu_quota.value_or(0);
    config->default_policy = std::move(*def);
    // Named, so that what it reports is what runs (the tier manager's default order is lru).
    if (config->default_policy.eviction.empty()) config->default_policy.eviction = "lru";
    PolicyNames inherit = d;
    inherit.eviction.clear();
    for (Pending& p : pending) {
      const PolicyNames n = p.names.Over(inherit);
      Result<tiers::NamespacePolicy> policy =
          tiers::ComposePolicy(n.eviction, n.write, n.admission, n.read_ahead);
      if (!policy.ok()) {
        // Only combinations fail here: each name was checked on its own.
        Error(p.mark, "namespace '" + p.name + "': " + policy.status().message());
        continue;
      }
      if (Status st = AddEncoding(n, &*policy); !st.ok()) {
        Error(p.mark, "namespace '" + p.name + "': " + st.message());
        continue;
      }
      policy->host_quota_bytes = p.names.host_quota.value_or(d.host_quota.value_or(0));
      policy->disk_quota_bytes = p.names.disk_quota.value_or(d.disk_quota.value_or(0));
      policy->gpu_quota_bytes = p.names.gpu_quota.value_or(d.gpu_quota.value_or(0));
      config->namespaces.push_back({std::move(p.name), p.mark.line + 1, std::move(p.names),
                                    std::move(*policy), std::move(p.access)});
    }
  }

  const std::string& path_;
  const PolicyNames& base_;
  std::vector<std::string> errors_;
};

}  // namespace

PolicyNames PolicyNames::Over(const PolicyNames& under) const {
  PolicyNames n = *this;
  if (n.eviction.empty()) n.eviction = under.eviction;
  if (n.write.empty()) n.write = under.write;
  if (n.admission.empty()) n.admission = under.admission;
  if (n.read_ahead.empty()) n.read_ahead = under.read_ahead;
  if (n.encoding.empty()) n.encoding = under.encoding;
  if (!n.layout.has_value()) n.layout = under.layout;
  if (!n.lossy.has_value()) n.lossy = under.lossy;
  return n;
}

bool PolicyNames::operator==(const PolicyNames& o) const {
  auto same_layout = [](const std::optional<kernels::BlockLayout>& a,
                        const std::optional<kernels::BlockLayout>& b) {
    if (a.has_value() != b.has_value()) return false;
    return !a.has_value() ||
           (a->num_layers == b->num_layers && a->num_kv_heads == b->num_kv_heads &&
            a->head_dim == b->head_dim && a->tokens == b->tokens && a->dtype == b->dtype);
  };
  return eviction == o.eviction && write == o.write && admission == o.admission &&
         read_ahead == o.read_ahead && encoding == o.encoding && lossy == o.lossy &&
         host_quota == o.host_quota && disk_quota == o.disk_quota && gpu_quota == o.gpu_quota &&
         same_layout(layout, o.layout);
}

Result<NamespacesConfig> ParseNamespacesConfig(std::string_view yaml, const std::string& path,
                                               const PolicyNames& base) {
  return Parser(path, base).Parse(yaml);
}

Result<NamespacesConfig> LoadNamespacesFile(const std::string& path, bool must_exist,
                                            const PolicyNames& base) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status::IoError(path + ": is a directory, not a namespaces file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT && !must_exist) {
      // No file: the defaults (and the flags) alone.
      Result<NamespacesConfig> empty = ParseNamespacesConfig("", path, base);
      if (empty.ok()) empty->exists = false;
      return empty;
    }
    if (err == ENOENT) return Status::NotFound(path + ": no such namespaces file");
    return Status::IoError(path + ": cannot read the namespaces file: " + std::strerror(err));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IoError(path + ": cannot read the namespaces file");
  return ParseNamespacesConfig(text.str(), path, base);
}

}  // namespace kvpool::daemon
