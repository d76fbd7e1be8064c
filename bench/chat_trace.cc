#include "bench/chat_trace.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <utility>

namespace kvpool::bench {

namespace {

// Draws from the raw engine only: std::mt19937_64's output is fixed by the standard, the
// standard distributions are not, so the trace is the same with any standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t Next() { return engine_(); }
  // Uniform in [0, 1).
  double Unit() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  // Uniform in [lo, hi] (hi >= lo).
  uint32_t Between(uint32_t lo, uint32_t hi) {
    return lo + static_cast<uint32_t>(engine_() % (static_cast<uint64_t>(hi - lo) + 1));
  }
  double Exponential(double mean) { return -mean * std::log1p(-Unit()); }
  // Failures before the first success of a Bernoulli(p) sequence.
  uint32_t Geometric(double p) {
    if (p >= 1) return 0;
    return static_cast<uint32_t>(std::floor(std::log1p(-Unit()) / std::log1p(-p)));
  }

 private:
  std::mt19937_64 engine_;
};

// Weights over n items with draws proportional to weight; a weight can be set to 0 and back.
class Fenwick {
 public:
  explicit Fenwick(size_t n) : tree_(n + 1, 0.0), value_(n, 0.0) {}
  void Set(size_t i, double w) {
    const double delta = w - value_[i];
    value_[i] = w;
    total_ += delta;
    for (size_t j = i + 1; j < tree_.size(); j += j & (~j + 1)) tree_[j] += delta;
  }
  double total() const { return total_; }
  // The item whose cumulative weight range holds `x` (0 <= x < total()).
  size_t Find(double x) const {
    size_t pos = 0;
    size_t step = 1;
    while (step * 2 < tree_.size()) step *= 2;
    for (; step > 0; step /= 2) {
      if (pos + step < tree_.size() && tree_[pos + step] <= x) {
        pos += step;
        x -= tree_[pos];
      }
    }
    // Rounding can land on an item of weight 0: take the nearest one with weight.
    size_t i = std::min(pos, value_.size() - 1);
    while (i > 0 && value_[i] == 0) --i;
    while (i + 1 < value_.size() && value_[i] == 0) ++i;
    return i;
  }

 private:
  std::vector<double> tree_;
  std::vector<double> value_;
  double total_ = 0;
};

class Builder {
 public:
  explicit Builder(const ChatTraceOptions& o) : o_(o), rng_(o.seed) {
    for (uint32_t t = 0; t < o_.tenants; ++t) {
      hashers_.push_back(std::make_unique<ChainHasher>(
          "chat-trace-tenant-" + std::to_string(t + 1),
          "model=chat-trace;dtype=bf16;layers=1;kv_heads=1;head_dim=1;tokens_per_block=" +
              std::to_string(o_.tokens_per_block),
          o_.tokens_per_block));
    }
    prompts_.resize(static_cast<size_t>(o_.tenants) * o_.system_prompts_per_tenant);
    double sum = 0;
    for (uint32_t p = 0; p < o_.system_prompts_per_tenant; ++p) {
      sum += std::pow(p + 1.0, -o_.system_prompt_zipf);
      prompt_cdf_.push_back(sum);
    }
    for (double& c : prompt_cdf_) c /= sum;
  }

  ChatTrace Build() {
    const uint32_t slots = o_.tenants * o_.conversations_per_tenant;
    // Popularity ranks shuffled over all slots, so every tenant has hot and cold conversations.
    std::vector<uint32_t> rank(slots);
    for (uint32_t i = 0; i < slots; ++i) rank[i] = i;
    for (uint32_t i = slots; i > 1; --i) std::swap(rank[i - 1], rank[rng_.Between(0, i - 1)]);
    std::vector<double> weight(slots);
    Fenwick awake(slots);
    for (uint32_t i = 0; i < slots; ++i) {
      weight[i] = std::pow(rank[i] + 1.0, -o_.conversation_zipf);
      awake.Set(i, weight[i]);
    }
    struct Slot {
      uint32_t chain = 0;
      uint32_t rounds_left = 0;  // 0: the next request to this slot starts a new conversation
    };
    std::vector<Slot> slot(slots);
    uint32_t awake_count = slots;                // kept exactly: the Fenwick total carries rounding
    using Wake = std::pair<uint64_t, uint32_t>;  // (request index, slot)
    std::priority_queue<Wake, std::vector<Wake>, std::greater<>> sleeping;

    for (uint64_t i = 0; i < o_.requests; ++i) {
      // Wake who is due; when nobody is awake, the next to wake wakes early.
      while (!sleeping.empty() && (sleeping.top().first <= i || awake_count == 0)) {
        awake.Set(sleeping.top().second, weight[sleeping.top().second]);
        ++awake_count;
        sleeping.pop();
      }
      if (rng_.Unit() < o_.one_off_fraction) {
        const uint32_t tenant = rng_.Between(0, o_.tenants - 1);
        const uint32_t chain = NewChain(tenant);
        Extend(tenant, chain, rng_.Between(o_.one_off_min_blocks, o_.one_off_max_blocks));
        Request(tenant, chain, /*one_off=*/true);
        continue;
      }
      const uint32_t s = static_cast<uint32_t>(awake.Find(rng_.Unit() * awake.total()));
      const uint32_t tenant = s / o_.conversations_per_tenant;
      if (slot[s].rounds_left == 0) {
        slot[s].chain = NewChain(tenant);
        slot[s].rounds_left =
            std::min(o_.max_rounds, 1 + rng_.Geometric(1.0 / std::max(1.0, o_.mean_rounds)));
      }
      Extend(tenant, slot[s].chain, rng_.Between(o_.round_min_blocks, o_.round_max_blocks));
      Request(tenant, slot[s].chain, /*one_off=*/false);
      --slot[s].rounds_left;
      awake.Set(s, 0);
      --awake_count;
      sleeping.emplace(i + 1 + static_cast<uint64_t>(rng_.Exponential(o_.mean_think_requests)), s);
    }
    return std::move(trace_);
  }

 private:
  // Appends `n` fresh blocks to `chain` (the tenant's next tokens), keyed along the chain.
  void Extend(uint32_t tenant, uint32_t chain, uint32_t n) {
    std::vector<int32_t> tokens(static_cast<size_t>(n) * o_.tokens_per_block);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng_.Next() % 128000);
    std::vector<uint32_t>& ids = trace_.chains[chain];
    const BlockKey parent = ids.empty() ? BlockKey{} : trace_.keys[ids.back()];
    uint32_t parent_id = ids.empty() ? ChatTrace::kNoParent : ids.back();
    for (const BlockKey& key : hashers_[tenant]->Hash(tokens, parent)) {
      const uint32_t id = static_cast<uint32_t>(trace_.keys.size());
      trace_.keys.push_back(key);
      trace_.parent.push_back(parent_id);
      ids.push_back(id);
      parent_id = id;
    }
  }

  // A new chain that starts with one of the tenant's system prompts.
  uint32_t NewChain(uint32_t tenant) {
    const double u = rng_.Unit();
    const uint32_t p = static_cast<uint32_t>(std::min<size_t>(
        std::upper_bound(prompt_cdf_.begin(), prompt_cdf_.end(), u) - prompt_cdf_.begin(),
        prompt_cdf_.size() - 1));
    std::vector<uint32_t>& prompt = prompts_[tenant * o_.system_prompts_per_tenant + p];
    if (prompt.empty()) {  // made on first use, so every block of the trace is requested
      const uint32_t made = static_cast<uint32_t>(trace_.chains.size());
      trace_.chains.emplace_back();
      Extend(tenant, made, rng_.Between(o_.system_prompt_min_blocks, o_.system_prompt_max_blocks));
      prompt = std::move(trace_.chains[made]);
      trace_.chains.pop_back();
    }
    trace_.chains.push_back(prompt);
    return static_cast<uint32_t>(trace_.chains.size() - 1);
  }

  void Request(uint32_t tenant, uint32_t chain, bool one_off) {
    ChatRequest r;
    r.ns = tenant + 1;
    r.chain = chain;
    r.length = static_cast<uint32_t>(trace_.chains[chain].size());
    r.one_off = one_off;
    trace_.requests.push_back(r);
    trace_.requested_blocks += r.length;
  }

  const ChatTraceOptions& o_;
  Rng rng_;
  std::vector<std::unique_ptr<ChainHasher>> hashers_;
  std::vector<std::vector<uint32_t>> prompts_;  // by tenant * prompts + prompt
  std::vector<double> prompt_cdf_;
  ChatTrace trace_;
};

}  // namespace

ChatTrace MakeChatTrace(const ChatTraceOptions& options) { return Builder(options).Build(); }

}  // namespace kvpool::bench
