#include "tiers/policy.h"

#include <charconv>
#include <mutex>

namespace kvpool::tiers {
namespace {

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

struct Registry {
  std::mutex mu;
  std::vector<std::pair<std::string, WritePolicyFactory>> factories;
};

Registry& GetRegistry() {
  static Registry* registry = [] {
    auto* r = new Registry();
    r->factories.emplace_back("write-back",
                              [](std::string_view) -> Result<std::unique_ptr<WritePolicy>> {
                                return std::unique_ptr<WritePolicy>(new WriteBack());
                              });
    r->factories.emplace_back("write-through",
                              [](std::string_view) -> Result<std::unique_ptr<WritePolicy>> {
                                return std::unique_ptr<WritePolicy>(new WriteThrough());
                              });
    r->factories.emplace_back(
        "write-through-after-", [](std::string_view name) -> Result<std::unique_ptr<WritePolicy>> {
          std::string_view digits = name.substr(std::string_view("write-through-after-").size());
          uint32_t n = 0;
          auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
          if (ec != std::errc() || ptr != digits.data() + digits.size() || n == 0) {
            return Status::InvalidArgument("write policy '" + std::string(name) +
                                           "': expected write-through-after-N with N >= 1");
          }
          return std::unique_ptr<WritePolicy>(new WriteThroughAfterHits(n));
        });
    return r;
  }();
  return *registry;
}

}  // namespace

void RegisterWritePolicy(std::string prefix, WritePolicyFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories.emplace_back(std::move(prefix), std::move(factory));
}

Result<std::shared_ptr<const WritePolicy>> CreateWritePolicy(std::string_view name) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string known;
  for (auto it = r.factories.rbegin(); it != r.factories.rend(); ++it) {
    const std::string& prefix = it->first;
    const bool match =
        prefix.back() == '-' ? name.substr(0, prefix.size()) == prefix : name == prefix;
    if (match) {
      KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<WritePolicy> p, it->second(name));
      return std::shared_ptr<const WritePolicy>(std::move(p));
    }
    known += (known.empty() ? "" : ", ") + prefix + (prefix.back() == '-' ? "N" : "");
  }
  return Status::InvalidArgument("unknown write policy '" + std::string(name) +
                                 "' (known: " + known + ")");
}

NamespacePolicy DefaultNamespacePolicy() {
  static const std::shared_ptr<const WritePolicy> write_back = std::make_shared<WriteBack>();
  return NamespacePolicy{write_back};
}

}  // namespace kvpool::tiers
