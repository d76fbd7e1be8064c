#pragma once
// ucx_perftest (Debian's ucx-utils) as the ucx path's limit, measured in the same run: UCX's own
// tagged-message bandwidth between two processes over the transport and device the bench's ucx
// path uses (tcp on lo), one message of the block size at a time (`-t tag_bw`). A kvpool ucx get
// is set beside it (ratio_to_ucx_perftest), as a get is set beside memcpy.
//
// Thread safety: one call at a time (it runs two child processes on a loopback port).

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpool::bench {

struct UcxPerftestResult {
  double gbps = 0;        // overall bandwidth, 1e9 B/s
  double message_us = 0;  // overall time per message
  uint64_t messages = 0;  // measured (after the warm-up)
  std::string command;    // the client's command line, for the record
};

// NotFound when ucx_perftest is not on PATH; Internal, with its output, when it fails. Sends
// about `seconds` worth of messages (assuming 2 GB/s; at least 50). The server runs on
// `server_cpus` and the client on `client_cpus` (as kvpoold and the bench's threads under --pin);
// an empty list: any CPU (not the calling thread's pinning, which children would inherit).
Result<UcxPerftestResult> RunUcxPerftest(uint64_t message_bytes, double seconds,
                                         const std::vector<int>& server_cpus,
                                         const std::vector<int>& client_cpus);

}  // namespace kvpool::bench
