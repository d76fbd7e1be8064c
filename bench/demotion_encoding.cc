// kvpool-demotion-encoding: what encoding on demotion (tiers/demotion_encoding.h) gains on disk
// and costs in accuracy, through a real TierManager and RocksDB.
//
// For each encoding it puts `--blocks` blocks of one model's layout (default: a Llama-3-8B-like
// shard, 32 layers x 8 KV heads x 128, 16 tokens, bf16 = 2 MiB a block) filled with realistic KV
// values (kernels' testutil: normal values with the outlier channels real caches have), demotes
// them all to disk, and reads every one back. It reports the disk bytes the tier manager counts
// per block against the raw size (the capacity gained), and the relative error of what is read
// back (||read - put|| / ||put||, worst block) beside the bound the kernels' own tests hold each
// encoding to (kernels/quantize_test.cc, "outliers"). Exits 1 when a read fails, a raw block is
// not bit-exact, or an error passes its bound: the CTest demotion_encoding_smoke runs it so. No
// timing is measured.

#include <gflags/gflags.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "kernels/block_layout.h"
#include "kernels/test_util.h"
#include "tiers/demotion_encoding.h"
#include "tiers/tier_manager.h"

DEFINE_int32(blocks, 16, "Blocks per encoding.");
DEFINE_int32(layers, 32, "Layers of the model shard.");
DEFINE_int32(kv_heads, 8, "KV heads of the shard.");
DEFINE_int32(head_dim, 128, "Elements per head.");
DEFINE_int32(tokens, 16, "Tokens per block.");
DEFINE_string(dtype, "bf16", "fp16, bf16 or fp32.");

namespace kvpool {
namespace {

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "kvpool-demotion-encoding: %s\n", why.c_str());
  std::exit(1);
}

// kernels/quantize_test.cc's bounds for realistic data ("outliers"); raw must be exact.
double KernelBound(const std::string& encoding) {
  if (encoding == "int8") return 0.03;
  if (encoding == "fp8-e4m3") return 0.045;
  if (encoding == "int4-g32") return 0.17;
  if (encoding == "int4-g64") return 0.24;
  return 0.0;
}

BlockKey KeyOf(uint64_t n) {
  BlockKey k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(n * 131 + i * 7);
  std::memcpy(k.bytes.data(), &n, sizeof(n));
  return k;
}

struct Row {
  std::string encoding;
  double disk_bytes_per_block = 0;
  double worst_error = 0;
};

Row Measure(const std::string& name, const kernels::BlockLayout& layout) {
  char tmpl[] = "/tmp/kvpool-demotion-encoding.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Fail("mkdtemp failed");
  const std::string dir = tmpl;
  const uint64_t raw_bytes = kernels::RawBytes(layout);
  Row row{name};
  {
    tiers::RocksStoreOptions ro;
    ro.path = dir + "/rocksdb";
    Result<std::unique_ptr<tiers::RocksStore>> store = tiers::RocksStore::Open(ro);
    if (!store.ok()) Fail("RocksDB: " + store.status().ToString());
    tiers::DiskTier disk(**store);
    tiers::HostTierOptions ho;
    ho.segment_bytes = 16ull << 20;
    while (ho.segment_bytes < raw_bytes) ho.segment_bytes *= 2;
    ho.capacity_bytes = ho.segment_bytes * (2 + FLAGS_blocks * raw_bytes / ho.segment_bytes);
    ho.lock_memory = false;
    Result<std::unique_ptr<tiers::HostTier>> host = tiers::HostTier::Create(ho);
    if (!host.ok()) Fail("host tier: " + host.status().ToString());
    tiers::TierManagerOptions mo;
    mo.flush_on_shutdown = false;
    Result<tiers::TierStack> stack = tiers::TierStack::Create({host->get(), &disk});
    if (!stack.ok()) Fail("tier stack: " + stack.status().ToString());
    tiers::TierManager manager(mo, std::move(*stack));
    if (Status st = manager.Recover(); !st.ok()) Fail(st.ToString());
    manager.Start();
    Result<tiers::NamespacePolicy> policy = tiers::ComposePolicy("", "", "", "none");
    Result<std::shared_ptr<const tiers::DemotionEncoding>> enc =
        tiers::CreateDemotionEncoding(name, layout);
    if (!policy.ok() || !enc.ok()) Fail(name + ": " + enc.status().ToString());
    policy->encoding = *enc;
    if (Status st = manager.SetDefaultPolicy(*policy); !st.ok()) Fail(st.ToString());

    constexpr NamespaceId kNs = 1;
    const size_t elements = kernels::BlockElements(layout);
    std::vector<std::vector<uint16_t>> put(FLAGS_blocks);
    std::vector<BlockKey> keys;
    for (int i = 0; i < FLAGS_blocks; ++i) {
      put[i] = kernels::testutil::Buffer(elements, layout.dtype);
      kernels::testutil::FillRealistic(put[i].data(), elements, layout.head_dim, layout.dtype,
                                       1000 + i);
      const auto* bytes = reinterpret_cast<const uint8_t*>(put[i].data());
      tiers::PutRequestItem item;
      item.key = KeyOf(i);
      item.size = raw_bytes;
      item.checksum = BlockChecksum(bytes, raw_bytes);
      std::vector<tiers::ReserveOutcome> r = manager.Reserve(kNs, 1, {&item, 1});
      if (r[0].state != tiers::ReserveState::kReserved) Fail("reserve: " + r[0].status.ToString());
      Result<tiers::ReservationTarget> t = manager.TargetOf(1, r[0].reservation_id);
      if (!t.ok()) Fail(t.status().ToString());
      std::memcpy(t->data, bytes, raw_bytes);
      if (Status st = manager.Commit(1, r[0].reservation_id); !st.ok()) Fail(st.ToString());
      keys.push_back(item.key);
    }
    const tiers::EvictOutcome o = manager.Evict(kNs, Tier::kHost, keys);
    manager.WaitIdleForTest();
    if (o.evicted != keys.size()) Fail("not every block was demoted");
    const tiers::TierManagerStats s = manager.GetStats();
    row.disk_bytes_per_block = static_cast<double>(s.disk_used_bytes) / FLAGS_blocks;
    for (int i = 0; i < FLAGS_blocks; ++i) {
      std::vector<tiers::BlockRead> reads = manager.Acquire(kNs, {&keys[i], 1});
      if (!reads[0].status.ok()) Fail("read back: " + reads[0].status.ToString());
      if (reads[0].size != raw_bytes) Fail("read back a block of the wrong size");
      const double err =
          kernels::testutil::RelativeError(reads[0].data, put[i].data(), elements, layout.dtype);
      row.worst_error = std::max(row.worst_error, err);
      manager.Release(reads[0]);
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return row;
}

int Main() {
  kernels::BlockLayout layout;
  layout.num_layers = FLAGS_layers;
  layout.num_kv_heads = FLAGS_kv_heads;
  layout.head_dim = FLAGS_head_dim;
  layout.tokens = FLAGS_tokens;
  if (FLAGS_dtype == "fp16") {
    layout.dtype = kernels::DType::kFloat16;
  } else if (FLAGS_dtype == "bf16") {
    layout.dtype = kernels::DType::kBFloat16;
  } else if (FLAGS_dtype == "fp32") {
    layout.dtype = kernels::DType::kFloat32;
  } else {
    Fail("--dtype: fp16, bf16 or fp32");
  }
  if (Status st = kernels::ValidateBlockLayout(layout); !st.ok()) Fail(st.ToString());
  const double raw = static_cast<double>(kernels::RawBytes(layout));
  std::printf(
      "layout: %d layers x %d kv heads x %d, %d tokens, %s: %.0f KiB raw per block, %d "
      "blocks per encoding\n",
      layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.tokens, FLAGS_dtype.c_str(),
      raw / 1024, FLAGS_blocks);
  std::printf("%-10s %16s %10s %12s %14s\n", "encoding", "disk KiB/block", "of raw", "worst error",
              "kernels bound");
  bool ok = true;
  for (const char* name : {"raw", "int8", "fp8-e4m3", "int4-g32", "int4-g64"}) {
    const Row r = Measure(name, layout);
    const double bound = KernelBound(name);
    std::printf("%-10s %16.1f %10.3f %12.5f %14.3f\n", name, r.disk_bytes_per_block / 1024,
                r.disk_bytes_per_block / raw, r.worst_error, bound);
    ok = ok && (bound == 0.0 ? r.worst_error == 0.0 : r.worst_error < bound);
    ok = ok && (bound == 0.0 || r.disk_bytes_per_block < raw);
  }
  if (!ok) Fail("an encoding passed its error bound, stored more than raw, or raw was not exact");
  return 0;
}

}  // namespace
}  // namespace kvpool

int main(int argc, char** argv) {
  gflags::SetUsageMessage("kvpool-demotion-encoding [--blocks=16] [--dtype=bf16] ...");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return kvpool::Main();
}
