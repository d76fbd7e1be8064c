#pragma once
// StrategyRegistry: strategies of one kind (eviction order, write policy, admission, ...),
// created by name.
//
// A name is matched exactly, or by prefix when the registered prefix ends in '-' (a strategy
// with a parameter in its name: "write-through-after-3", "after-2-hits"); the factory parses the
// rest. Later registrations win, so a user's strategy can replace a built-in one. Create's error
// names the kind and lists the known names, for the one-line errors of the namespaces file.
//
// Thread safety: Register and Create may be called from any thread.

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvpool::tiers {

// What a factory is given besides the name; strategies that need nothing use this.
struct NoContext {};

template <typename T, typename Context = NoContext>
class StrategyRegistry {
 public:
  using Factory =
      std::function<Result<std::unique_ptr<T>>(std::string_view name, const Context& context)>;

  explicit StrategyRegistry(std::string kind) : kind_(std::move(kind)) {}

  void Register(std::string name_or_prefix, Factory factory) {
    std::lock_guard<std::mutex> lock(mu_);
    factories_.emplace_back(std::move(name_or_prefix), std::move(factory));
  }

  // InvalidArgument naming the kind and the known names when none matches; or the factory's
  // error (a bad parameter).
  Result<std::unique_ptr<T>> Create(std::string_view name, const Context& context = {}) const {
    Factory factory;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = factories_.rbegin(); it != factories_.rend() && !factory; ++it) {
        if (Matches(it->first, name)) factory = it->second;
      }
    }
    if (!factory) {
      return Status::InvalidArgument("unknown " + kind_ + " '" + std::string(name) +
                                     "' (known: " + KnownNames() + ")");
    }
    return factory(name, context);
  }

  // The registered names, parameterized ones as "prefix-N", comma separated.
  std::string KnownNames() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string known;
    for (const auto& [prefix, factory] : factories_) {
      const std::string shown = prefix.back() == '-' ? prefix + "N" : prefix;
      if (known.find(shown) != std::string::npos) continue;
      known += (known.empty() ? "" : ", ") + shown;
    }
    return known;
  }

  const std::string& kind() const { return kind_; }

 private:
  static bool Matches(const std::string& prefix, std::string_view name) {
    return prefix.back() == '-'
               ? name.size() > prefix.size() && name.substr(0, prefix.size()) == prefix
               : name == prefix;
  }

  const std::string kind_;
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, Factory>> factories_;
};

// Parses the N of a parameterized name: `name` is `prefix` + digits + `suffix`, N >= 1.
// InvalidArgument saying the expected form otherwise.
Result<uint32_t> ParseStrategyCount(std::string_view kind, std::string_view name,
                                    std::string_view prefix, std::string_view suffix = "");

}  // namespace kvpool::tiers
