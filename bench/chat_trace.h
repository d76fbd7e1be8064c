#pragma once
// ChatTrace: a synthetic multi-tenant chat workload of block requests, deterministic from a seed,
// for replaying through the tier manager (bench/hit_ratio.cc).
//
// Shape (the multi-round-qa / bench_multiturn shape, several tenants at once):
//   - Tenants are namespaces. Each has a few system prompts (chains of blocks) shared by its
//     conversations; which prompt a conversation uses is Zipf distributed (prompt 0 the most).
//   - Conversations live in slots, `conversations_per_tenant` per tenant. Slot popularity is
//     Zipf over all slots (ranks shuffled across tenants): a request picks an awake slot with
//     probability proportional to its weight, so popular conversations come back often.
//   - Round k's prompt is system prompt + rounds 1..k-1 + the new blocks of round k, so its
//     chain extends round k-1's. After a round the slot sleeps for a think time (exponential, in
//     requests of the whole trace), which interleaves conversations. A conversation that has had
//     its rounds (geometric) ends; its slot starts a fresh one (new blocks) at the same weight.
//   - With probability `one_off_fraction` a request is a one-off document instead: a random
//     tenant's system prompt followed by blocks never requested again.
//
// Blocks are the real chain keys (kvpool::ChainHasher over synthetic tokens, one namespace
// secret per tenant), numbered densely in order of first appearance; a request is a prefix of a
// stored chain. A replay does what an engine does per request: look the chain up, get the cached
// prefix, put the missing tail.
//
// Thread safety: a built trace is immutable; MakeChatTrace is a pure function of its options.

#include <cstdint>
#include <vector>

#include <kvpool/block_key.h>

#include "common/namespace_id.h"

namespace kvpool::bench {

struct ChatTraceOptions {
  // Seed of every random choice. Default: 1.
  uint64_t seed = 1;
  // Tenants (namespaces 1..tenants). Default: 4.
  uint32_t tenants = 4;
  // System prompts per tenant. Default: 3.
  uint32_t system_prompts_per_tenant = 3;
  // Length of a system prompt in blocks, uniform in [min, max]. Default: 16-96 (256-1536 tokens
  // at 16 tokens a block).
  uint32_t system_prompt_min_blocks = 16;
  uint32_t system_prompt_max_blocks = 96;
  // Conversation slots per tenant (conversations live at once). Default: 64.
  uint32_t conversations_per_tenant = 64;
  // Zipf exponent of slot popularity. Default: 0.8.
  double conversation_zipf = 0.8;
  // Zipf exponent of which system prompt a conversation uses. Default: 1.0.
  double system_prompt_zipf = 1.0;
  // Mean rounds of a conversation (geometric, at least 1), capped. Default: 6, cap 24.
  double mean_rounds = 6;
  uint32_t max_rounds = 24;
  // New blocks per round (the previous answer and the new question), uniform. Default: 2-12.
  uint32_t round_min_blocks = 2;
  uint32_t round_max_blocks = 12;
  // Mean think time between a conversation's rounds, in requests of the whole trace
  // (exponential). Default: 32.
  double mean_think_requests = 32;
  // Share of requests that are one-off documents. Default: 0.1.
  double one_off_fraction = 0.1;
  // Length of a one-off document after its system prompt, uniform. Default: 16-64 blocks.
  uint32_t one_off_min_blocks = 16;
  uint32_t one_off_max_blocks = 64;
  // Requests in the trace. Default: 20000.
  uint32_t requests = 20000;
  // Tokens per block (for the chain keys only). Default: 16.
  uint32_t tokens_per_block = 16;
};

struct ChatRequest {
  NamespaceId ns = 0;
  uint32_t chain = 0;   // index into ChatTrace::chains
  uint32_t length = 0;  // the request is the first `length` blocks of that chain
  bool one_off = false;
};

struct ChatTrace {
  std::vector<BlockKey> keys;    // by block id
  std::vector<uint32_t> parent;  // by block id; kNoParent for a chain's first block
  std::vector<std::vector<uint32_t>>
      chains;  // block ids, each the longest prompt of a conversation
  std::vector<ChatRequest> requests;
  uint64_t requested_blocks = 0;  // sum of the requests' lengths

  static constexpr uint32_t kNoParent = UINT32_MAX;
  // Distinct blocks the trace requests (every block id is requested at least once).
  uint64_t working_set_blocks() const { return keys.size(); }
};

ChatTrace MakeChatTrace(const ChatTraceOptions& options);

}  // namespace kvpool::bench
