// The C API (include/kvpool/kvpool.h) over the C++ client. No exception crosses it: every
// entry point catches at the boundary and returns KVPOOL_INTERNAL with the reason.

#include <kvpool/client.h>
#include <kvpool/kvpool.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "client/device_buffers.h"
#include "client/stats_json.h"

struct kvpool_client {
  std::unique_ptr<kvpool::Client> client;
  std::string last_error;
};

struct kvpool_borrowed {
  kvpool::BorrowedBlocks blocks;
};

struct kvpool_pending_get {
  kvpool::PendingGet pending;
  kvpool_client* client = nullptr;  // for its last_error
  size_t n = 0;
};

namespace {

thread_local std::string g_connect_error;

int Code(const kvpool::Status& st) { return static_cast<int>(st.code()); }

int Fail(kvpool_client* c, const kvpool::Status& st) {
  if (c != nullptr) c->last_error = st.ToString();
  return Code(st);
}

int Ok(kvpool_client* c) {
  if (c != nullptr) c->last_error.clear();
  return KVPOOL_OK;
}

std::vector<kvpool::BlockKey> Keys(const kvpool_key* keys, size_t n) {
  std::vector<kvpool::BlockKey> out(n);
  for (size_t i = 0; i < n; ++i) std::memcpy(out[i].bytes.data(), keys[i].bytes, 32);
  return out;
}

template <typename F>
int Guard(kvpool_client* c, F f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return Fail(c, kvpool::Status::Internal(std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return Fail(c, kvpool::Status::Internal("unexpected exception"));
  }
}

#define KVPOOL_C_REQUIRE(cond, client, what)                                 \
  do {                                                                       \
    if (!(cond)) return Fail(client, kvpool::Status::InvalidArgument(what)); \
  } while (0)

}  // namespace

extern "C" {

const char* kvpool_code_name(int code) {
  return kvpool::StatusCodeName(static_cast<kvpool::StatusCode>(code));
}

const char* kvpool_last_error(const kvpool_client* client) {
  return client == nullptr ? g_connect_error.c_str() : client->last_error.c_str();
}

int kvpool_hash_chain(const int32_t* tokens, size_t n_tokens, uint32_t tokens_per_block,
                      const char* namespace_secret, size_t secret_len, const char* layout,
                      const kvpool_key* parent, kvpool_key* keys, size_t keys_capacity,
                      size_t* n_keys) {
  if (tokens_per_block == 0 || (n_tokens > 0 && tokens == nullptr) || layout == nullptr ||
      (secret_len > 0 && namespace_secret == nullptr) || n_keys == nullptr) {
    return KVPOOL_INVALID_ARGUMENT;
  }
  return Guard(nullptr, [&] {
    kvpool::ChainHasher hasher(
        std::string_view(namespace_secret ? namespace_secret : "", secret_len), layout,
        tokens_per_block);
    kvpool::BlockKey p;
    if (parent != nullptr) std::memcpy(p.bytes.data(), parent->bytes, 32);
    const std::vector<kvpool::BlockKey> out = hasher.Hash({tokens, n_tokens}, p);
    *n_keys = out.size();
    if (out.size() > keys_capacity) return static_cast<int>(KVPOOL_INVALID_ARGUMENT);
    for (size_t i = 0; i < out.size(); ++i) std::memcpy(keys[i].bytes, out[i].bytes.data(), 32);
    return static_cast<int>(KVPOOL_OK);
  });
}

int kvpool_connect(const char* address, const char* namespace_name, int timeout_ms,
                   kvpool_client** out) {
  kvpool_connect_options o{};
  o.address = address;
  o.namespace_name = namespace_name;
  o.timeout_ms = timeout_ms;
  return kvpool_connect_with(&o, out);
}

int kvpool_connect_with(const kvpool_connect_options* options, kvpool_client** out) {
  if (out == nullptr || options == nullptr ||
      (options->credential == nullptr && options->credential_len > 0) ||
      options->busy_poll_us < 0) {
    return KVPOOL_INVALID_ARGUMENT;
  }
  *out = nullptr;
  try {
    auto str = [](const char* s) { return s != nullptr ? std::string(s) : std::string(); };
    kvpool::ClientOptions o;
    o.address = str(options->address);
    if (options->namespace_name != nullptr) o.namespace_name = options->namespace_name;
    if (options->timeout_ms > 0) o.timeout = std::chrono::milliseconds(options->timeout_ms);
    if (options->credential_len > 0)
      o.credential.assign(options->credential, options->credential_len);
    o.admin = options->admin != 0;
    o.tls_ca_file = str(options->tls_ca_file);
    o.tls_cert_file = str(options->tls_cert_file);
    o.tls_key_file = str(options->tls_key_file);
    if (options->busy_poll_us > 0) o.busy_poll = std::chrono::microseconds(options->busy_poll_us);
    auto c = kvpool::Client::Connect(o);
    if (!c.ok()) {
      g_connect_error = c.status().ToString();
      return Code(c.status());
    }
    *out = new kvpool_client{std::move(*c), ""};
    g_connect_error.clear();
    return KVPOOL_OK;
  } catch (const std::exception& e) {
    g_connect_error = e.what();
    return KVPOOL_INTERNAL;
  }
}

void kvpool_close(kvpool_client* client) { delete client; }

int kvpool_lookup(kvpool_client* c, const kvpool_key* keys, size_t n, int prefetch,
                  uint32_t* hit_blocks, uint8_t* tiers) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  KVPOOL_C_REQUIRE(hit_blocks != nullptr && (n == 0 || keys != nullptr), c,
                   "kvpool_lookup: keys and hit_blocks are required");
  return Guard(c, [&] {
    auto r = c->client->Lookup(Keys(keys, n), prefetch != 0);
    if (!r.ok()) return Fail(c, r.status());
    *hit_blocks = r->hit_blocks;
    if (tiers != nullptr) {
      // (At most n: the caller's array; the client checks the daemon's answer too.)
      for (size_t i = 0; i < std::min(n, r->tiers.size()); ++i) {
        tiers[i] = static_cast<uint8_t>(r->tiers[i]);
      }
    }
    return Ok(c);
  });
}

int kvpool_locate(kvpool_client* c, const kvpool_key* keys, size_t n, kvpool_node_location* nodes,
                  size_t capacity, size_t* n_nodes) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  KVPOOL_C_REQUIRE(
      n_nodes != nullptr && (n == 0 || keys != nullptr) && (capacity == 0 || nodes != nullptr), c,
      "kvpool_locate: keys, nodes and n_nodes are required");
  return Guard(c, [&] {
    auto r = c->client->Locate(Keys(keys, n));
    if (!r.ok()) return Fail(c, r.status());
    *n_nodes = r->size();
    for (size_t i = 0; i < r->size() && i < capacity; ++i) {
      const kvpool::NodeLocation& l = (*r)[i];
      kvpool_node_location& out = nodes[i];
      out = {};
      std::snprintf(out.node_id, sizeof(out.node_id), "%s", l.node_id.c_str());
      std::snprintf(out.control_address, sizeof(out.control_address), "%s",
                    l.control_address.c_str());
      out.self = l.self ? 1 : 0;
      out.code = Code(l.status);
      out.hit_blocks = l.hit_blocks;
      for (kvpool::Tier t : l.tiers) {
        out.gpu_blocks += t == kvpool::Tier::kGpu;
        out.host_blocks += t == kvpool::Tier::kHost;
        out.disk_blocks += t == kvpool::Tier::kDisk;
      }
    }
    return Ok(c);
  });
}

namespace {

// kvpool_get and kvpool_get_device: every buffer in `memory`.
int GetInto(kvpool_client* c, const kvpool_key* keys, size_t n, void* const* buffers,
            const size_t* capacities, size_t* sizes, int* codes, kvpool::Memory memory,
            void* cuda_stream) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  KVPOOL_C_REQUIRE(n == 0 || (keys && buffers && capacities && sizes && codes), c,
                   "kvpool_get: every array argument is required");
  return Guard(c, [&] {
    std::vector<kvpool::MutableBuffer> bufs(n);
    for (size_t i = 0; i < n; ++i) bufs[i] = {buffers[i], capacities[i], memory};
    auto r = c->client->Get(Keys(keys, n), bufs, {.cuda_stream = cuda_stream});
    if (!r.ok()) return Fail(c, r.status());
    for (size_t i = 0; i < n; ++i) {
      // Bytes written: none for a block that failed (a buffer too small reports the block's
      // size in the C++ result, which a C caller would read past its buffer).
      sizes[i] = (*r)[i].status.ok() ? (*r)[i].size : 0;
      codes[i] = Code((*r)[i].status);
    }
    return Ok(c);
  });
}

// kvpool_put_chain, kvpool_put_chain_device and kvpool_put_chain_to_gpu: every block in
// `memory`.
int PutChainFrom(kvpool_client* c, const kvpool_key* keys, size_t n, const void* const* data,
                 const size_t* sizes, const kvpool_key* parent, uint32_t* stored, uint32_t* present,
                 kvpool::Memory memory, void* cuda_stream, int gpu_device) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  KVPOOL_C_REQUIRE(n == 0 || (keys && data && sizes), c,
                   "kvpool_put_chain: keys, data and sizes are required");
  return Guard(c, [&] {
    std::vector<kvpool::PutBlock> blocks(n);
    const std::vector<kvpool::BlockKey> k = Keys(keys, n);
    kvpool::BlockKey p;
    if (parent != nullptr) std::memcpy(p.bytes.data(), parent->bytes, 32);
    for (size_t i = 0; i < n; ++i) {
      blocks[i] = {k[i], data[i], sizes[i], i == 0 ? p : k[i - 1], std::nullopt, memory};
    }
    auto r = c->client->Put(blocks, {.cuda_stream = cuda_stream, .gpu_device = gpu_device});
    if (!r.ok()) return Fail(c, r.status());
    if (stored) *stored = r->stored;
    if (present) *present = r->already_present + r->in_progress;
    for (const kvpool::Status& st : r->errors) {
      if (!st.ok()) return Fail(c, st);
    }
    return Ok(c);
  });
}

// kvpool_session_load and kvpool_session_load_to_gpu.
int LoadSession(kvpool_client* c, const char* session_id, const kvpool::LoadSessionOptions& options,
                kvpool_key* keys, size_t keys_capacity, size_t* n_keys, uint64_t* token_count,
                uint32_t* cached_blocks) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  KVPOOL_C_REQUIRE(
      session_id != nullptr && n_keys != nullptr && (keys_capacity == 0 || keys != nullptr), c,
      "kvpool_session_load: missing argument");
  return Guard(c, [&] {
    auto r = c->client->LoadSession(session_id, options);
    if (!r.ok()) return Fail(c, r.status());
    *n_keys = r->session.keys.size();
    if (token_count) *token_count = r->session.token_count;
    if (cached_blocks) *cached_blocks = r->cached_blocks;
    const size_t n = std::min(keys_capacity, r->session.keys.size());
    for (size_t i = 0; i < n; ++i) std::memcpy(keys[i].bytes, r->session.keys[i].bytes.data(), 32);
    return Ok(c);
  });
}

}  // namespace

int kvpool_get(kvpool_client* c, const kvpool_key* keys, size_t n, void* const* buffers,
               const size_t* capacities, size_t* sizes, int* codes) {
  return GetInto(c, keys, n, buffers, capacities, sizes, codes, kvpool::Memory::kHost, nullptr);
}

int kvpool_get_device(kvpool_client* c, const kvpool_key* keys, size_t n, void* const* buffers,
                      const size_t* capacities, void* cuda_stream, size_t* sizes, int* codes) {
  return GetInto(c, keys, n, buffers, capacities, sizes, codes, kvpool::Memory::kCuda, cuda_stream);
}

int kvpool_put_chain(kvpool_client* c, const kvpool_key* keys, size_t n, const void* const* data,
                     const size_t* sizes, const kvpool_key* parent, uint32_t* stored,
                     uint32_t* present) {
  return PutChainFrom(c, keys, n, data, sizes, parent, stored, present, kvpool::Memory::kHost,
                      nullptr, -1);
}

int kvpool_put_chain_device(kvpool_client* c, const kvpool_key* keys, size_t n,
                            const void* const* data, const size_t* sizes, const kvpool_key* parent,
                            void* cuda_stream, uint32_t* stored, uint32_t* present) {
  return PutChainFrom(c, keys, n, data, sizes, parent, stored, present, kvpool::Memory::kCuda,
                      cuda_stream, -1);
}

int kvpool_put_chain_to_gpu(kvpool_client* c, const kvpool_key* keys, size_t n,
                            const void* const* data, const size_t* sizes, const kvpool_key* parent,
                            int data_on_device, void* cuda_stream, int gpu_device, uint32_t* stored,
                            uint32_t* present) {
  KVPOOL_C_REQUIRE(gpu_device >= 0, c, "kvpool_put_chain_to_gpu: gpu_device must be >= 0");
  return PutChainFrom(c, keys, n, data, sizes, parent, stored, present,
                      data_on_device != 0 ? kvpool::Memory::kCuda : kvpool::Memory::kHost,
                      cuda_stream, gpu_device);
}

int kvpool_get_device_async(kvpool_client* c, const kvpool_key* keys, size_t n,
                            void* const* buffers, const size_t* capacities, void* cuda_stream,
                            kvpool_pending_get** out) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  KVPOOL_C_REQUIRE(out != nullptr && (n == 0 || (keys && buffers && capacities)), c,
                   "kvpool_get_device_async: every array argument and out are required");
  *out = nullptr;
  return Guard(c, [&] {
    std::vector<kvpool::MutableBuffer> bufs(n);
    for (size_t i = 0; i < n; ++i) bufs[i] = {buffers[i], capacities[i], kvpool::Memory::kCuda};
    auto r = c->client->GetAsync(Keys(keys, n), bufs, {.cuda_stream = cuda_stream});
    if (!r.ok()) return Fail(c, r.status());
    *out = new kvpool_pending_get{std::move(*r), c, n};
    return Ok(c);
  });
}

int kvpool_pending_get_wait(kvpool_pending_get* p, size_t* sizes, int* codes) {
  if (p == nullptr) return KVPOOL_OK;
  std::unique_ptr<kvpool_pending_get> owned(p);
  kvpool_client* c = p->client;
  KVPOOL_C_REQUIRE(p->n == 0 || (sizes && codes), c,
                   "kvpool_pending_get_wait: sizes and codes are required");
  return Guard(c, [&] {
    auto r = p->pending.Wait();
    if (!r.ok()) return Fail(c, r.status());
    for (size_t i = 0; i < p->n; ++i) {
      sizes[i] = (*r)[i].status.ok() ? (*r)[i].size : 0;  // as kvpool_get
      codes[i] = Code((*r)[i].status);
    }
    return Ok(c);
  });
}

int kvpool_prefetch(kvpool_client* c, const kvpool_key* keys, size_t n, uint32_t* started) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  KVPOOL_C_REQUIRE(n == 0 || keys != nullptr, c, "kvpool_prefetch: keys are required");
  return Guard(c, [&] {
    auto r = c->client->Prefetch(Keys(keys, n));
    if (!r.ok()) return Fail(c, r.status());
    if (started) *started = *r;
    return Ok(c);
  });
}

int kvpool_prefetch_to_gpu(kvpool_client* c, const kvpool_key* keys, size_t n, int gpu_device,
                           uint32_t* scheduled, uint32_t* gpu_placed) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  KVPOOL_C_REQUIRE(n == 0 || keys != nullptr, c, "kvpool_prefetch_to_gpu: keys are required");
  KVPOOL_C_REQUIRE(gpu_device >= 0, c, "kvpool_prefetch_to_gpu: gpu_device must be >= 0");
  return Guard(c, [&] {
    auto r = c->client->Prefetch(Keys(keys, n), {.gpu_device = gpu_device});
    if (!r.ok()) return Fail(c, r.status());
    if (scheduled) *scheduled = r->scheduled;
    if (gpu_placed) *gpu_placed = r->gpu_placed;
    return Ok(c);
  });
}

int kvpool_gpu_tier_of(kvpool_client* c, int gpu_device, int* daemon_device) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  KVPOOL_C_REQUIRE(gpu_device >= 0, c, "kvpool_gpu_tier_of: gpu_device must be >= 0");
  return Guard(c, [&] {
    auto r = c->client->GpuTierOf(gpu_device);
    if (!r.ok()) return Fail(c, r.status());
    if (daemon_device) *daemon_device = *r;
    return Ok(c);
  });
}

int kvpool_session_save(kvpool_client* c, const char* session_id, const kvpool_key* keys,
                        size_t n_keys, uint64_t token_count, const char* const* meta_keys,
                        const char* const* meta_values, size_t n_meta) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  KVPOOL_C_REQUIRE(session_id != nullptr && (n_keys == 0 || keys != nullptr) &&
                       (n_meta == 0 || (meta_keys && meta_values)),
                   c, "kvpool_session_save: missing argument");
  return Guard(c, [&] {
    kvpool::Session s;
    s.session_id = session_id;
    s.keys = Keys(keys, n_keys);
    s.token_count = token_count;
    for (size_t i = 0; i < n_meta; ++i) {
      if (meta_keys[i] == nullptr || meta_values[i] == nullptr) {
        return Fail(c, kvpool::Status::InvalidArgument("NULL metadata entry"));
      }
      s.metadata[meta_keys[i]] = meta_values[i];
    }
    kvpool::Status st = c->client->SaveSession(s);
    return st.ok() ? Ok(c) : Fail(c, st);
  });
}

int kvpool_session_load(kvpool_client* c, const char* session_id, int prefetch, kvpool_key* keys,
                        size_t keys_capacity, size_t* n_keys, uint64_t* token_count,
                        uint32_t* cached_blocks) {
  return LoadSession(c, session_id, {.prefetch = prefetch != 0}, keys, keys_capacity, n_keys,
                     token_count, cached_blocks);
}

int kvpool_session_load_to_gpu(kvpool_client* c, const char* session_id, int gpu_device,
                               kvpool_key* keys, size_t keys_capacity, size_t* n_keys,
                               uint64_t* token_count, uint32_t* cached_blocks) {
  KVPOOL_C_REQUIRE(gpu_device >= 0, c, "kvpool_session_load_to_gpu: gpu_device must be >= 0");
  return LoadSession(c, session_id, {.prefetch = true, .gpu_device = gpu_device}, keys,
                     keys_capacity, n_keys, token_count, cached_blocks);
}

int kvpool_session_delete(kvpool_client* c, const char* session_id) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  KVPOOL_C_REQUIRE(session_id != nullptr, c, "kvpool_session_delete: session_id is required");
  return Guard(c, [&] {
    kvpool::Status st = c->client->DeleteSession(session_id);
    return st.ok() ? Ok(c) : Fail(c, st);
  });
}

int kvpool_stats_json(kvpool_client* c, char* buffer, size_t capacity, size_t* needed) {
  if (c == nullptr) return KVPOOL_INVALID_ARGUMENT;
  return Guard(c, [&] {
    auto r = c->client->Stats();
    if (!r.ok()) return Fail(c, r.status());
    const std::string json = kvpool::client::StatsToJson(*r);
    if (needed) *needed = json.size() + 1;
    if (buffer != nullptr && capacity > 0) {
      const size_t n = std::min(capacity - 1, json.size());
      std::memcpy(buffer, json.data(), n);
      buffer[n] = '\0';
    }
    if (capacity < json.size() + 1) {
      return Fail(c, kvpool::Status::ResourceExhausted("stats buffer too small"));
    }
    return Ok(c);
  });
}

int kvpool_borrow(kvpool_client* c, const kvpool_key* keys, size_t n, int gpu_device, int verify,
                  kvpool_block_view* views, kvpool_borrowed** out) {
  KVPOOL_C_REQUIRE(c != nullptr && out != nullptr, c, "NULL client or out");
  KVPOOL_C_REQUIRE(n == 0 || (keys != nullptr && views != nullptr), c, "NULL keys or views");
  return Guard(c, [&] {
    kvpool::Result<kvpool::BorrowedBlocks> r =
        c->client->Borrow(Keys(keys, n), {.gpu_device = gpu_device, .verify = verify != 0});
    if (!r.ok()) return Fail(c, r.status());
    for (size_t i = 0; i < n; ++i) {
      const kvpool::BlockView& v = (*r)[i];
      views[i] = {v.data,
                  v.status.ok() ? v.size : 0,
                  Code(v.status),
                  static_cast<int>(v.tier),
                  v.memory == kvpool::Memory::kCuda ? 1 : 0,
                  v.checksum};
    }
    *out = new kvpool_borrowed{std::move(r).value()};
    return Ok(c);
  });
}

int kvpool_borrowed_verify(kvpool_borrowed* b, int* codes) {
  if (b == nullptr) return KVPOOL_INVALID_ARGUMENT;
  const kvpool::Status st = b->blocks.Verify();
  if (codes != nullptr) {
    for (size_t i = 0; i < b->blocks.size(); ++i) codes[i] = Code(b->blocks[i].status);
  }
  return Code(st);
}

void kvpool_borrowed_release(kvpool_borrowed* b) { delete b; }

}  // extern "C"

namespace kvpool::client {

void UseCopyEngineForTest(kvpool_client* client, kernels::DeviceCopyEngine* engine) {
  UseCopyEngineForTest(*client->client, engine);
}

}  // namespace kvpool::client
