#include "tiers/eviction_order.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>

#include "absl/container/flat_hash_set.h"

namespace kvpool::tiers {

// ---------------------------------------------------------------------------------------------
// CandidateList

void CandidateList::PushFront(EntryId id) {
  OrderLinks& e = index_->Order(id, tier_);
  e.prev = kNoEntry;
  e.next = head_;
  if (head_ != kNoEntry) index_->Order(head_, tier_).prev = id;
  head_ = id;
  if (tail_ == kNoEntry) tail_ = id;
  ++size_;
}

void CandidateList::PushBack(EntryId id) {
  OrderLinks& e = index_->Order(id, tier_);
  e.next = kNoEntry;
  e.prev = tail_;
  if (tail_ != kNoEntry) index_->Order(tail_, tier_).next = id;
  tail_ = id;
  if (head_ == kNoEntry) head_ = id;
  ++size_;
}

void CandidateList::Remove(EntryId id) {
  OrderLinks& e = index_->Order(id, tier_);
  if (e.prev != kNoEntry) {
    index_->Order(e.prev, tier_).next = e.next;
  } else {
    head_ = e.next;
  }
  if (e.next != kNoEntry) {
    index_->Order(e.next, tier_).prev = e.prev;
  } else {
    tail_ = e.prev;
  }
  e.prev = e.next = kNoEntry;
  CHECK_GT(size_, 0u);
  --size_;
}

namespace {

// Walks `list` from the front, appending what `evictable` accepts until `bytes` are gathered.
void TakeFromFront(CandidateList& list, uint64_t bytes, const VictimFilter& evictable,
                   uint64_t* gathered, std::vector<EntryId>* out) {
  for (EntryId id = list.front(); id != kNoEntry && *gathered < bytes; id = list.Next(id)) {
    if (!evictable(id)) continue;
    out->push_back(id);
    *gathered += list.index().at(id).size;
  }
}

// ---------------------------------------------------------------------------------------------
// lru

class LruOrder final : public EvictionOrder {
 public:
  explicit LruOrder(const EvictionContext& c) : list_(*c.index, c.tier) {}
  std::string name() const override { return "lru"; }
  void Add(EntryId id, bool after_child) override {
    after_child ? list_.PushFront(id) : list_.PushBack(id);
  }
  void Remove(EntryId id) override { list_.Remove(id); }
  void Use(EntryId id) override {
    list_.Remove(id);
    list_.PushBack(id);
  }
  void Victims(uint64_t bytes, const VictimFilter& evictable, std::vector<EntryId>* out) override {
    uint64_t gathered = 0;
    TakeFromFront(list_, bytes, evictable, &gathered, out);
  }

 private:
  CandidateList list_;  // front: least recently used
};

// ---------------------------------------------------------------------------------------------
// s3fifo

class S3FifoOrder final : public EvictionOrder {
 public:
  explicit S3FifoOrder(const EvictionContext& c)
      : index_(*c.index), small_(*c.index, c.tier), main_(*c.index, c.tier) {}
  std::string name() const override { return "s3fifo"; }

  void Add(EntryId id, bool after_child) override {
    const Entry& e = index_.at(id);
    const uint64_t h = GhostKey(e);
    uint32_t& w = small_.word(id);
    // A block already read more than once is not a one-hit wonder.
    w = std::min<uint32_t>(e.hits, kMaxFreq);
    if (ghost_set_.erase(h) > 0) {
      w |= kInMain;
      main_.PushBack(id);
    } else if (after_child) {
      small_.PushFront(id);
    } else {
      small_.PushBack(id);
    }
  }
  void Remove(EntryId id) override {
    (small_.word(id) & kInMain) ? main_.Remove(id) : small_.Remove(id);
  }
  void Use(EntryId id) override {
    uint32_t& w = small_.word(id);
    if ((w & kFreqMask) < kMaxFreq) ++w;
  }

  void Victims(uint64_t bytes, const VictimFilter& evictable, std::vector<EntryId>* out) override {
    uint64_t gathered = 0;
    auto take = [&](EntryId id) {
      if (!evictable(id)) return;
      out->push_back(id);
      gathered += index_.at(id).size;
      RememberGhost(GhostKey(index_.at(id)));
    };
    const size_t total = small_.size() + main_.size();
    // The small queue gives up its unused entries while it holds more than its 10% share (or
    // main has nothing); a used one moves on to main instead.
    const bool walk_small = small_.size() * 10 >= total || main_.empty();
    if (walk_small) {
      for (EntryId id = small_.front(); id != kNoEntry && gathered < bytes;) {
        const EntryId next = small_.Next(id);
        uint32_t& w = small_.word(id);
        if ((w & kFreqMask) > 0) {
          small_.Remove(id);
          w = kInMain;
          main_.PushBack(id);
        } else {
          take(id);
        }
        id = next;
      }
    }
    // Main: a used entry is reinserted at the back with one use less; bounded by the uses.
    size_t steps = (kMaxFreq + 1) * main_.size() + 1;
    for (EntryId id = main_.front(); id != kNoEntry && gathered < bytes && steps > 0; --steps) {
      const EntryId next = main_.Next(id);
      uint32_t& w = main_.word(id);
      if ((w & kFreqMask) > 0 && main_.size() > 1) {
        --w;
        main_.Remove(id);
        main_.PushBack(id);
        if (next == kNoEntry) {  // it was the last one: it is also the next to look at
          id = main_.back();
          continue;
        }
      } else {
        take(id);
      }
      id = next;
    }
    // Still short, small not walked yet: its entries, used or not.
    if (gathered < bytes && !walk_small) TakeFromFront(small_, bytes, evictable, &gathered, out);
  }

 private:
  static constexpr uint32_t kFreqMask = 3;
  static constexpr uint32_t kMaxFreq = 3;
  static constexpr uint32_t kInMain = 4;

  static uint64_t GhostKey(const Entry& e) {
    uint64_t h;
    std::memcpy(&h, e.key.bytes.data(), sizeof(h));
    return h ^ (static_cast<uint64_t>(e.ns) * 0x9E3779B97F4A7C15ull);
  }
  void RememberGhost(uint64_t h) {
    if (!ghost_set_.insert(h).second) return;
    ghost_fifo_.push_back(h);
    // As many ghosts as main holds entries (at least a few), as the paper does.
    const size_t limit = std::max<size_t>(main_.size() + small_.size(), 64);
    while (ghost_fifo_.size() > limit) {
      ghost_set_.erase(ghost_fifo_.front());
      ghost_fifo_.pop_front();
    }
  }

  BlockIndex& index_;
  CandidateList small_;
  CandidateList main_;
  absl::flat_hash_set<uint64_t> ghost_set_;
  std::deque<uint64_t> ghost_fifo_;
};

// ---------------------------------------------------------------------------------------------
// lfu

class LfuOrder final : public EvictionOrder {
 public:
  explicit LfuOrder(const EvictionContext& c) : index_(*c.index), tier_(c.tier) {}
  std::string name() const override { return "lfu"; }

  void Add(EntryId id, bool /*after_child*/) override {
    const uint32_t hits = index_.at(id).hits;
    // Lifetime hits, capped at the highest count a candidate has now: a block with a long past
    // starts among the hottest, not above them for ever (aging halves only current counts).
    const uint32_t top = buckets_.empty() ? 1 : std::max<uint32_t>(buckets_.rbegin()->first, 1);
    const uint32_t seed = std::min(hits, top);
    Insert(id, seed);
    ++count_;
  }
  void Remove(EntryId id) override {
    Erase(id);
    --count_;
  }
  void Use(EntryId id) override {
    const uint32_t f = Word(id);
    Erase(id);
    Insert(id, f == UINT32_MAX ? f : f + 1);
    if (++uses_since_aging_ > std::max<uint64_t>(count_, 64)) Age();
  }
  void Victims(uint64_t bytes, const VictimFilter& evictable, std::vector<EntryId>* out) override {
    uint64_t gathered = 0;
    for (auto& [freq, list] : buckets_) {
      if (gathered >= bytes) break;
      TakeFromFront(list, bytes, evictable, &gathered, out);
    }
  }

 private:
  uint32_t& Word(EntryId id) { return index_.Order(id, tier_).word; }
  void Insert(EntryId id, uint32_t freq) {
    Word(id) = freq;
    auto it = buckets_.try_emplace(freq, index_, tier_).first;
    it->second.PushBack(id);
  }
  void Erase(EntryId id) {
    auto it = buckets_.find(Word(id));
    CHECK(it != buckets_.end());
    it->second.Remove(id);
    if (it->second.empty()) buckets_.erase(it);
  }
  // Halves every count, keeping each bucket's recency order.
  void Age() {
    uses_since_aging_ = 0;
    std::vector<EntryId> order;
    order.reserve(count_);
    for (auto& [freq, list] : buckets_) {
      for (EntryId id = list.front(); id != kNoEntry; id = list.Next(id)) order.push_back(id);
    }
    buckets_.clear();
    for (EntryId id : order) Insert(id, Word(id) / 2);
  }

  BlockIndex& index_;
  const Tier tier_;
  std::map<uint32_t, CandidateList> buckets_;  // by use count; each front: least recent
  size_t count_ = 0;
  uint64_t uses_since_aging_ = 0;
};

template <typename T>
EvictionOrderFactory Make() {
  return [](std::string_view, const EvictionContext& c) -> Result<std::unique_ptr<EvictionOrder>> {
    return std::unique_ptr<EvictionOrder>(new T(c));
  };
}

}  // namespace

StrategyRegistry<EvictionOrder, EvictionContext>& EvictionOrderRegistry() {
  static auto* registry = [] {
    auto* r = new StrategyRegistry<EvictionOrder, EvictionContext>("eviction order");
    r->Register("lru", Make<LruOrder>());
    r->Register("s3fifo", Make<S3FifoOrder>());
    r->Register("lfu", Make<LfuOrder>());
    return r;
  }();
  return *registry;
}

}  // namespace kvpool::tiers
