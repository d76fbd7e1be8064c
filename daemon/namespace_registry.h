#pragma once
// NamespaceRegistry: namespace names (tenants) to dense NamespaceIds, persisted in RocksDB's
// default column family so an id means the same namespace after a restart.
//
// A name is 1-128 characters of [A-Za-z0-9._:-]. The number of namespaces clients may name
// into existence is bounded so a hostile client cannot grow the registry without end; the
// operator's own (configured: the namespaces file, --namespace_policy) are not held to it, so
// names clients made up can never keep a declared tenant out.
//
// Thread safety: all methods may be called concurrently.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/namespace_id.h"
#include "common/status.h"
#include "tiers/rocks_store.h"

namespace kvpool::daemon {

class NamespaceRegistry {
 public:
  // Loads every known namespace. IoError from RocksDB.
  static Result<std::unique_ptr<NamespaceRegistry>> Load(tiers::RocksStore& store,
                                                         uint32_t max_namespaces);

  // The id of `name`, created (and persisted) when new. InvalidArgument for a bad name,
  // ResourceExhausted past the limit, unless `configured` (named by the operator).
  Result<NamespaceId> Resolve(std::string_view name, bool configured = false);
  // "" when unknown.
  std::string NameOf(NamespaceId id) const;
  // Every known namespace's name, by id (a namespace's id is its index).
  std::vector<std::string> Names() const;
  size_t size() const;

  static Status ValidateName(std::string_view name);
  // Ids are below this, configured names included.
  static constexpr uint32_t kMaxIds = 1u << 24;

 private:
  NamespaceRegistry(tiers::RocksStore& store, uint32_t max) : store_(store), max_(max) {}
  tiers::RocksStore& store_;
  const uint32_t max_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, NamespaceId> ids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_);  // by id
};

// The daemon's persistent identity: returns the stored node id, or stores `preferred` (or a
// generated "<hostname>-<random>") on first start. An explicit `preferred` always wins.
Result<std::string> LoadOrCreateNodeId(tiers::RocksStore& store, const std::string& preferred);

}  // namespace kvpool::daemon
