// The README's client example, compiled and run by the test suite (tests/example_test.cc):
// hash a prompt, look it up, put the missing blocks, fetch the cached prefix, save and resume
// a session. Usage: kvpool-quickstart [SOCKET]
#include <kvpool/client.h>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  // 1. Keys for a token sequence: namespace secret + layout + tokens, 16 tokens a block.
  const std::string layout =
      "model=llama-3-8b;dtype=bf16;layers=32;kv_heads=8;head_dim=128;tokens_per_block=16;"
      "tp_rank=0;tp_size=1;encoding=raw";
  kvpool::ChainHasher hasher("tenant-a-secret", layout, /*tokens_per_block=*/16);
  std::vector<int32_t> prompt(16 * 8 + 5);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(1000 + i);
  const std::vector<kvpool::BlockKey> keys = hasher.Hash(prompt);  // 8 keys: the tail is not cached

  // 2. Connect as a namespace (tenant).
  kvpool::ClientOptions options;
  if (argc > 1) options.address = argv[1];
  options.namespace_name = "tenant-a";
  auto client = kvpool::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }

  // 3. Longest cached prefix.
  auto hit = (*client)->Lookup(keys);
  if (!hit.ok()) return 1;
  std::printf("cached prefix: %u of %zu blocks\n", hit->hit_blocks, keys.size());

  // 4. Compute the missing blocks (here: fake KV bytes) and put them; put is put-if-absent.
  const size_t block_bytes = 64 * 1024;
  std::vector<std::vector<uint8_t>> kv(keys.size(), std::vector<uint8_t>(block_bytes));
  for (size_t b = 0; b < kv.size(); ++b) {
    for (size_t i = 0; i < block_bytes; ++i) kv[b][i] = static_cast<uint8_t>(b * 31 + i);
  }
  std::vector<std::span<const uint8_t>> blocks(kv.begin(), kv.end());
  auto put = (*client)->PutChain(keys, blocks);
  if (!put.ok() || !put->all_ok()) return 1;
  std::printf("stored %u blocks, %u were already cached\n", put->stored, put->already_present);

  // 5. Fetch the cached prefix into our own buffers (checksums are verified on receipt).
  std::vector<std::vector<uint8_t>> out(keys.size(), std::vector<uint8_t>(block_bytes));
  std::vector<kvpool::MutableBuffer> buffers;
  for (auto& o : out) buffers.push_back({o.data(), o.size()});
  auto got = (*client)->Get(keys, buffers);
  if (!got.ok()) return 1;
  for (size_t b = 0; b < keys.size(); ++b) {
    if (!(*got)[b].status.ok() || out[b] != kv[b]) {
      std::fprintf(stderr, "block %zu: %s\n", b, (*got)[b].status.ToString().c_str());
      return 1;
    }
  }
  std::printf("fetched %zu blocks, byte-identical\n", keys.size());

  // 6. Save the conversation; after any restart, resume it on this node.
  kvpool::Session session;
  session.session_id = "chat-42";
  session.keys = keys;
  session.token_count = prompt.size();
  session.metadata["model"] = "llama-3-8b";
  if (!(*client)->SaveSession(session).ok()) return 1;
  auto resumed = (*client)->LoadSession("chat-42");  // also prefetches the chain to host
  if (!resumed.ok()) return 1;
  std::printf("session %s: %zu blocks, %u cached\n", resumed->session.session_id.c_str(),
              resumed->session.keys.size(), resumed->cached_blocks);
  return 0;
}
