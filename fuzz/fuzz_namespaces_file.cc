// libFuzzer target: the namespaces file parser (daemon/namespaces_file.h), YAML from yaml-cpp
// up to the composed policies and access rules. Operators write the file, but a reload must
// never take the daemon down whatever it holds: an error names PATH:LINE, nothing throws.
//
// Input: the file's bytes.

#include <cstdint>
#include <string_view>

#include "daemon/namespaces_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvpool;
  const std::string_view yaml(reinterpret_cast<const char*>(data), size);
  auto config = daemon::ParseNamespacesConfig(yaml, "fuzz.yaml");
  if (!config.ok()) {
    // Every error names the file.
    if (config.status().message().rfind("fuzz.yaml", 0) != 0) __builtin_trap();
    return 0;
  }
  // Names are unique, as the parser promises.
  for (size_t i = 0; i < config->namespaces.size(); ++i) {
    for (size_t k = i + 1; k < config->namespaces.size(); ++k) {
      if (config->namespaces[i].name == config->namespaces[k].name) __builtin_trap();
    }
  }
  return 0;
}
