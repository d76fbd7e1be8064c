#pragma once
// TestTierStack (test-only): the small real tier stack the tier manager's tests and the daemon's
// unit tests run on: a RocksStore under a directory (on a given rocksdb::FileSystem, e.g. the
// fault-injecting one of tests/support, when set), an 8 MiB host arena of 1 MiB segments, the
// disk tier, optionally gpu tiers over arenas a test makes (the device double of
// tests/support/fake_device.h), and a TierManager over them, recovered and started. Close() takes
// it down in order (the manager first: its Shutdown flushes when configured). One test thread at a
// time.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "tiers/disk_tier.h"
#include "tiers/gpu_tier.h"
#include "tiers/host_tier.h"
#include "tiers/rocks_store.h"
#include "tiers/tier_manager.h"

namespace kvpool::tiers {

struct TestTierStack {
  std::unique_ptr<RocksStore> store;
  std::unique_ptr<DiskTier> disk;
  std::unique_ptr<HostTier> host;
  std::vector<std::unique_ptr<GpuTier>> gpus;
  std::unique_ptr<TierManager> manager;
  uint64_t host_segment_bytes = 1ull << 20;  // what the next Open uses
  // What the next Open runs gpu tiers on: one arena per entry (none by default).
  std::vector<std::function<std::unique_ptr<kernels::DeviceArena>()>> gpu_arenas;

  // Opens every part (RocksDB at `dir`/rocksdb); the first error.
  Status Open(const std::string& dir, const TierManagerOptions& options,
              std::shared_ptr<rocksdb::FileSystem> file_system = nullptr) {
    RocksStoreOptions ro;
    ro.path = dir + "/rocksdb";
    ro.block_cache_bytes = 8ull << 20;
    ro.file_system = std::move(file_system);
    KVPOOL_ASSIGN_OR_RETURN(store, RocksStore::Open(ro));
    disk = std::make_unique<DiskTier>(*store);
    HostTierOptions ho;
    ho.capacity_bytes = 8ull << 20;
    ho.segment_bytes = host_segment_bytes;
    ho.lock_memory = false;
    KVPOOL_ASSIGN_OR_RETURN(host, HostTier::Create(ho));
    std::vector<StorageTier*> tiers;
    for (auto& make_arena : gpu_arenas) {
      gpus.push_back(std::make_unique<GpuTier>(make_arena()));
      tiers.push_back(gpus.back().get());
    }
    tiers.push_back(host.get());
    tiers.push_back(disk.get());
    KVPOOL_ASSIGN_OR_RETURN(TierStack stack, TierStack::Create(tiers));
    manager = std::make_unique<TierManager>(options, std::move(stack));
    KVPOOL_RETURN_IF_ERROR(manager->Recover());
    manager->Start();
    return Status::OK();
  }

  void Close() {
    manager.reset();
    gpus.clear();
    disk.reset();
    host.reset();
    store.reset();
  }
};

}  // namespace kvpool::tiers
