#include "tiers/policy.h"

#include <charconv>

#include "common/units.h"
#include "tiers/eviction_order.h"

namespace kvpool::tiers {

Result<uint32_t> ParseStrategyCount(std::string_view kind, std::string_view name,
                                    std::string_view prefix, std::string_view suffix) {
  std::string_view digits = name;
  const bool framed = digits.size() > prefix.size() + suffix.size() &&
                      digits.substr(0, prefix.size()) == prefix &&
                      digits.substr(digits.size() - suffix.size()) == suffix;
  uint32_t n = 0;
  if (framed) {
    digits = digits.substr(prefix.size(), digits.size() - prefix.size() - suffix.size());
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec == std::errc() && ptr == digits.data() + digits.size() && n >= 1) return n;
  }
  return Status::InvalidArgument(std::string(kind) + " '" + std::string(name) + "': expected " +
                                 std::string(prefix) + "N" + std::string(suffix) + " with N >= 1");
}

namespace {

// --- write policies ---------------------------------------------------------------------------

class WriteBack final : public WritePolicy {
 public:
  std::string name() const override { return "write-back"; }
  bool WriteOnCommit() const override { return false; }
  bool WriteAfterHits(uint32_t) const override { return false; }
};

class WriteThrough final : public WritePolicy {
 public:
  std::string name() const override { return "write-through"; }
  bool WriteOnCommit() const override { return true; }
  bool WriteAfterHits(uint32_t) const override { return true; }
};

class WriteThroughAfterHits final : public WritePolicy {
 public:
  explicit WriteThroughAfterHits(uint32_t n) : n_(n) {}
  std::string name() const override { return "write-through-after-" + std::to_string(n_); }
  bool WriteOnCommit() const override { return false; }
  bool WriteAfterHits(uint32_t hits) const override { return hits >= n_; }

 private:
  uint32_t n_;
};

// --- admission --------------------------------------------------------------------------------

class AdmitAll final : public AdmissionPolicy {
 public:
  std::string name() const override { return "all"; }
  bool Admit(uint32_t) const override { return true; }
  bool AdmitsAny() const override { return true; }
};

class AdmitNone final : public AdmissionPolicy {
 public:
  std::string name() const override { return "none"; }
  bool Admit(uint32_t) const override { return false; }
  bool AdmitsAny() const override { return false; }
};

class AdmitAfterHits final : public AdmissionPolicy {
 public:
  explicit AdmitAfterHits(uint32_t n) : n_(n) {}
  std::string name() const override { return "after-" + std::to_string(n_) + "-hits"; }
  bool Admit(uint32_t hits) const override { return hits >= n_; }
  bool AdmitsAny() const override { return true; }

 private:
  uint32_t n_;
};

// --- read-ahead -------------------------------------------------------------------------------

class ReadAhead final : public ReadAheadPolicy {
 public:
  explicit ReadAhead(uint32_t depth) : depth_(depth) {}
  std::string name() const override {
    return depth_ == 0 ? "none" : "chain-" + std::to_string(depth_);
  }
  uint32_t depth() const override { return depth_; }

 private:
  uint32_t depth_;
};

template <typename Base, typename T, typename... Args>
typename StrategyRegistry<Base>::Factory Fixed(Args... args) {
  return [=](std::string_view, const NoContext&) -> Result<std::unique_ptr<Base>> {
    return std::unique_ptr<Base>(new T(args...));
  };
}

template <typename Base, typename T>
typename StrategyRegistry<Base>::Factory Counted(std::string kind, std::string prefix,
                                                 std::string suffix = "") {
  return [=](std::string_view name, const NoContext&) -> Result<std::unique_ptr<Base>> {
    KVPOOL_ASSIGN_OR_RETURN(uint32_t n, ParseStrategyCount(kind, name, prefix, suffix));
    // Every counted strategy compares N with a block's hits, which stop counting at kMaxHits.
    if (n > kMaxHits) {
      return Status::InvalidArgument(kind + " '" + std::string(name) +
                                     "': N counts hits, at most " + std::to_string(kMaxHits));
    }
    return std::unique_ptr<Base>(new T(n));
  };
}

template <typename T>
Result<std::shared_ptr<const T>> Shared(Result<std::unique_ptr<T>> made) {
  if (!made.ok()) return made.status();
  return std::shared_ptr<const T>(std::move(*made));
}

}  // namespace

StrategyRegistry<WritePolicy>& WritePolicyRegistry() {
  static auto* r = [] {
    auto* r = new StrategyRegistry<WritePolicy>("write policy");
    r->Register("write-back", Fixed<WritePolicy, WriteBack>());
    r->Register("write-through", Fixed<WritePolicy, WriteThrough>());
    r->Register("write-through-after-", Counted<WritePolicy, WriteThroughAfterHits>(
                                            "write policy", "write-through-after-"));
    return r;
  }();
  return *r;
}

StrategyRegistry<AdmissionPolicy>& AdmissionRegistry() {
  static auto* r = [] {
    auto* r = new StrategyRegistry<AdmissionPolicy>("disk admission");
    r->Register("all", Fixed<AdmissionPolicy, AdmitAll>());
    r->Register("none", Fixed<AdmissionPolicy, AdmitNone>());
    r->Register("after-",
                Counted<AdmissionPolicy, AdmitAfterHits>("disk admission", "after-", "-hits"));
    return r;
  }();
  return *r;
}

StrategyRegistry<ReadAheadPolicy>& ReadAheadRegistry() {
  static auto* r = [] {
    auto* r = new StrategyRegistry<ReadAheadPolicy>("read-ahead");
    r->Register("none", Fixed<ReadAheadPolicy, ReadAhead>(0u));
    r->Register("chain-", Counted<ReadAheadPolicy, ReadAhead>("read-ahead", "chain-"));
    return r;
  }();
  return *r;
}

Result<std::shared_ptr<const WritePolicy>> CreateWritePolicy(std::string_view name) {
  return Shared(WritePolicyRegistry().Create(name));
}
Result<std::shared_ptr<const AdmissionPolicy>> CreateAdmission(std::string_view name) {
  return Shared(AdmissionRegistry().Create(name));
}
Result<std::shared_ptr<const ReadAheadPolicy>> CreateReadAhead(std::string_view name) {
  return Shared(ReadAheadRegistry().Create(name));
}

NamespacePolicy DefaultNamespacePolicy() {
  static const NamespacePolicy policy = [] {
    NamespacePolicy p;
    p.write = std::make_shared<WriteBack>();
    p.admission = std::make_shared<AdmitAll>();
    p.read_ahead = std::make_shared<ReadAhead>(2);
    return p;
  }();
  return policy;
}

Result<NamespacePolicy> ComposePolicy(std::string_view eviction, std::string_view write,
                                      std::string_view admission, std::string_view read_ahead) {
  NamespacePolicy p = DefaultNamespacePolicy();
  if (!eviction.empty()) {
    // Checked here, instantiated per tier by the tier manager.
    BlockIndex probe;
    KVPOOL_RETURN_IF_ERROR(
        EvictionOrderRegistry().Create(eviction, EvictionContext{&probe, Tier::kHost}).status());
    p.eviction = std::string(eviction);
  }
  if (!write.empty()) {
    KVPOOL_ASSIGN_OR_RETURN(p.write, CreateWritePolicy(write));
  }
  if (!admission.empty()) {
    KVPOOL_ASSIGN_OR_RETURN(p.admission, CreateAdmission(admission));
  }
  if (!read_ahead.empty()) {
    KVPOOL_ASSIGN_OR_RETURN(p.read_ahead, CreateReadAhead(read_ahead));
  }
  if ((p.write->WriteOnCommit() && !p.admission->Admit(0)) ||
      (p.write->name() != "write-back" && !p.admission->AdmitsAny())) {
    return Status::InvalidArgument("write policy '" + p.write->name() +
                                   "' writes blocks to disk that admission '" +
                                   p.admission->name() + "' does not take");
  }
  return p;
}

std::string DescribePolicy(const NamespacePolicy& policy) {
  return "eviction=" + (policy.eviction.empty() ? std::string("default") : policy.eviction) +
         " write=" + policy.write->name() + " admission=" + policy.admission->name() +
         " read-ahead=" + policy.read_ahead->name() +
         " encoding=" + (policy.encoding ? policy.encoding->name() : std::string("raw")) +
         (policy.host_quota_bytes ? " host-quota=" + FormatBytes(policy.host_quota_bytes) : "") +
         (policy.disk_quota_bytes ? " disk-quota=" + FormatBytes(policy.disk_quota_bytes) : "") +
         (policy.gpu_quota_bytes ? " gpu-quota=" + FormatBytes(policy.gpu_quota_bytes) : "");
}

}  // namespace kvpool::tiers
