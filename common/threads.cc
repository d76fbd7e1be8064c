#include "common/threads.h"

#include <pthread.h>

namespace kvpool {

std::string ThreadName(ThreadRole role, int index) {
  const char* base = "kvp";
  switch (role) {
    case ThreadRole::kControlIo:
      base = "kvp-io";
      break;
    case ThreadRole::kRequestWorker:
      base = "kvp-req";
      break;
    case ThreadRole::kTierFlusher:
      base = "kvp-flush";
      break;
    case ThreadRole::kPrefetcher:
      base = "kvp-prefetch";
      break;
    case ThreadRole::kMetricsHttp:
      base = "kvp-metrics";
      break;
    case ThreadRole::kUcxProgress:
      base = "kvp-ucx";
      break;
    case ThreadRole::kGpuCopy:
      base = "kvp-gpu";
      break;
    case ThreadRole::kCluster:
      base = "kvp-cluster";
      break;
    case ThreadRole::kGpuLink:
      base = "kvp-link";
      break;
  }
  std::string name = std::string(base) + "-" + std::to_string(index);
  if (name.size() > 15) name.resize(15);
  return name;
}

std::thread StartThread(ThreadRole role, int index, std::function<void()> fn) {
  std::string name = ThreadName(role, index);
  return std::thread([name = std::move(name), fn = std::move(fn)] {
    pthread_setname_np(pthread_self(), name.c_str());
    fn();
  });
}

}  // namespace kvpool
