#include "daemon/namespace_registry.h"

#include <rocksdb/db.h>
#include <unistd.h>

#include <random>

namespace kvpool::daemon {
namespace {

constexpr std::string_view kPrefix = "ns/";

}  // namespace

Status NamespaceRegistry::ValidateName(std::string_view name) {
  if (name.empty() || name.size() > 128) {
    return Status::InvalidArgument("namespace name must be 1-128 characters");
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-' || c == ':';
    if (!ok) {
      return Status::InvalidArgument("namespace name '" + std::string(name) +
                                     "' may only hold letters, digits and . _ - :");
    }
  }
  return Status::OK();
}

Result<std::unique_ptr<NamespaceRegistry>> NamespaceRegistry::Load(tiers::RocksStore& store,
                                                                   uint32_t max_namespaces) {
  std::unique_ptr<NamespaceRegistry> reg(new NamespaceRegistry(store, max_namespaces));
  std::unique_ptr<rocksdb::Iterator> it(
      store.db()->NewIterator(rocksdb::ReadOptions(), store.defaults()));
  absl::MutexLock lock(&reg->mu_);
  for (it->Seek(rocksdb::Slice(kPrefix.data(), kPrefix.size()));
       it->Valid() && it->key().starts_with(rocksdb::Slice(kPrefix.data(), kPrefix.size()));
       it->Next()) {
    const std::string name = it->key().ToString().substr(kPrefix.size());
    const rocksdb::Slice v = it->value();
    if (v.size() != 4) return Status::Corruption("namespace record for '" + name + "' is damaged");
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    const NamespaceId id = p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24;
    if (id >= kMaxIds) return Status::Corruption("namespace id out of range");
    if (reg->names_.size() <= id) reg->names_.resize(id + 1);
    reg->names_[id] = name;
    reg->ids_[name] = id;
  }
  KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(it->status()));
  return reg;
}

Result<NamespaceId> NamespaceRegistry::Resolve(std::string_view name, bool configured) {
  KVPOOL_RETURN_IF_ERROR(ValidateName(name));
  absl::MutexLock lock(&mu_);
  auto it = ids_.find(std::string(name));
  if (it != ids_.end()) return it->second;
  if (names_.size() >= kMaxIds) {  // (Load refuses larger ids as damage)
    return Status::ResourceExhausted("the daemon already has " + std::to_string(kMaxIds) +
                                     " namespaces, the most it can number");
  }
  if (ids_.size() >= max_ && !configured) {
    return Status::ResourceExhausted("the daemon already has " + std::to_string(max_) +
                                     " namespaces (--max-namespaces)");
  }
  const NamespaceId id = static_cast<NamespaceId>(names_.size());
  const uint8_t v[4] = {static_cast<uint8_t>(id), static_cast<uint8_t>(id >> 8),
                        static_cast<uint8_t>(id >> 16), static_cast<uint8_t>(id >> 24)};
  rocksdb::WriteOptions wo;
  wo.sync = true;
  KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(
      store_.db()->Put(wo, store_.defaults(), std::string(kPrefix) + std::string(name),
                       rocksdb::Slice(reinterpret_cast<const char*>(v), 4))));
  names_.emplace_back(name);
  ids_.emplace(std::string(name), id);
  return id;
}

std::string NamespaceRegistry::NameOf(NamespaceId id) const {
  absl::MutexLock lock(&mu_);
  return id < names_.size() ? names_[id] : std::string();
}

std::vector<std::string> NamespaceRegistry::Names() const {
  absl::MutexLock lock(&mu_);
  return names_;
}

size_t NamespaceRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return ids_.size();
}

Result<std::string> LoadOrCreateNodeId(tiers::RocksStore& store, const std::string& preferred) {
  const std::string key = "node_id";
  std::string stored;
  rocksdb::Status s = store.db()->Get(rocksdb::ReadOptions(), store.defaults(), key, &stored);
  if (!s.ok() && !s.IsNotFound()) return KVPOOL_ROCKS_STATUS(s);
  if (s.ok() && (preferred.empty() || preferred == stored)) return stored;
  std::string id = preferred;
  if (id.empty()) {
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    std::random_device rd;
    char suffix[9];
    std::snprintf(suffix, sizeof(suffix), "%08x", rd());
    id = std::string(host[0] ? host : "node") + "-" + suffix;
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  KVPOOL_RETURN_IF_ERROR(KVPOOL_ROCKS_STATUS(store.db()->Put(wo, store.defaults(), key, id)));
  return id;
}

}  // namespace kvpool::daemon
