/* kvpool C API: a stable, C-callable face of the client library, for Python (ctypes/cffi),
 * Rust and the inference engines' connectors.
 *
 * Every function returns a kvpool_code (0 = KVPOOL_OK). On failure the client keeps a readable
 * message: kvpool_last_error(client); a failed kvpool_connect leaves it in
 * kvpool_last_error(NULL) (per thread).
 *
 * Thread safety: a kvpool_client is used by one thread at a time; open one per thread.
 * Ownership: the caller owns every buffer it passes; the library keeps no pointer after a
 * call returns. */
#ifndef KVPOOL_KVPOOL_H_
#define KVPOOL_KVPOOL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same values as kvpool::StatusCode. */
typedef enum {
  KVPOOL_OK = 0,
  KVPOOL_NOT_FOUND = 1,
  KVPOOL_INVALID_ARGUMENT = 2,
  KVPOOL_ALREADY_EXISTS = 3,
  KVPOOL_RESOURCE_EXHAUSTED = 4,
  KVPOOL_PERMISSION_DENIED = 5,
  KVPOOL_UNAVAILABLE = 6,
  KVPOOL_DEADLINE_EXCEEDED = 7,
  KVPOOL_CORRUPTION = 8,
  KVPOOL_IO_ERROR = 9,
  KVPOOL_ABORTED = 10,
  KVPOOL_INTERNAL = 11,
  KVPOOL_UNIMPLEMENTED = 12,
  KVPOOL_FAILED_PRECONDITION = 13
} kvpool_code;

/* Tiers, as reported by lookup and get. */
enum {
  KVPOOL_TIER_NONE = 0,
  KVPOOL_TIER_GPU = 1,
  KVPOOL_TIER_HOST = 2,
  KVPOOL_TIER_DISK = 3,
  KVPOOL_TIER_REMOTE = 4
};

typedef struct kvpool_key {
  uint8_t bytes[32];
} kvpool_key;

typedef struct kvpool_client kvpool_client;

/* "NotFound", "Unavailable", ... */
const char* kvpool_code_name(int code);
/* The last error message of `client` (or of this thread's last failed kvpool_connect when
 * client is NULL). Valid until the next call on the same client. */
const char* kvpool_last_error(const kvpool_client* client);

/* Chain hashing, exactly spec/block-keys.md. Writes min(n_tokens / tokens_per_block,
 * keys_capacity) keys and sets *n_keys to the number of full blocks. `parent` may be NULL
 * (a new chain). INVALID_ARGUMENT when tokens_per_block is 0 or keys_capacity is too small. */
int kvpool_hash_chain(const int32_t* tokens, size_t n_tokens, uint32_t tokens_per_block,
                      const char* namespace_secret, size_t secret_len, const char* layout,
                      const kvpool_key* parent, kvpool_key* keys, size_t keys_capacity,
                      size_t* n_keys);

/* address: a Unix socket path, "tcp://HOST:PORT", or NULL/"" for the default socket.
 * timeout_ms: deadline of every call (0: 10 s). kvpool_connect_with for a namespace with a
 * credential or a daemon behind TLS. */
int kvpool_connect(const char* address, const char* namespace_name, int timeout_ms,
                   kvpool_client** out);

/* What kvpool_connect_with takes. Zero it (`kvpool_connect_options o = {0};`) and set what
 * applies; a NULL string or 0 means none or the default. */
typedef struct kvpool_connect_options {
  const char* address;        /* as kvpool_connect's, or "tls://HOST:PORT" */
  const char* namespace_name; /* NULL: "default" */
  int timeout_ms;             /* deadline of every call (0: 10 s) */
  /* The namespace's credential (or, with admin, the admin's): proved at hello, never sent. */
  const char* credential;
  size_t credential_len;
  int admin; /* ask for admin rights */
  /* tls:// only, PEM files: the CA the daemon's certificate must chain to (NULL: the system's
   * trust store), and this client's certificate and key for a daemon that requires one. */
  const char* tls_ca_file;
  const char* tls_cert_file;
  const char* tls_key_file;
  /* Spin up to this long for each answer before sleeping (0: sleep at once; negative:
   * KVPOOL_INVALID_ARGUMENT); the daemon's
   * counterpart is --io_busy_poll_us. Burns the calling thread's CPU while it waits, and buys
   * back the wake-up that is most of a short round trip on a virtual machine. Added after
   * tls_key_file: a caller built against an older header passes a smaller struct, so rebuild. */
  int busy_poll_us;
} kvpool_connect_options;

int kvpool_connect_with(const kvpool_connect_options* options, kvpool_client** out);
void kvpool_close(kvpool_client* client);

/* Longest cached prefix. `tiers` (optional, n entries) receives the tier of each hit block. */
int kvpool_lookup(kvpool_client* client, const kvpool_key* keys, size_t n, int prefetch,
                  uint32_t* hit_blocks, uint8_t* tiers);

/* Reads block i into buffers[i] (capacity capacities[i]). Per block: sizes[i] (bytes written; 0
 * for a block that failed, e.g. a buffer too small: its code is KVPOOL_INVALID_ARGUMENT)
 * and codes[i] (KVPOOL_OK, KVPOOL_NOT_FOUND for a miss, ...). Returns non-OK only when the
 * daemon could not be asked. */
int kvpool_get(kvpool_client* client, const kvpool_key* keys, size_t n, void* const* buffers,
               const size_t* capacities, size_t* sizes, int* codes);

/* Stores a chain of blocks, put-if-absent; block i's parent is keys[i-1] (block 0's is
 * `parent`, may be NULL). `stored` and `present` (optional) count blocks sent and skipped.
 * Returns the first per-block error, if any. */
int kvpool_put_chain(kvpool_client* client, const kvpool_key* keys, size_t n,
                     const void* const* data, const size_t* sizes, const kvpool_key* parent,
                     uint32_t* stored, uint32_t* present);

/* As kvpool_get and kvpool_put_chain with every buffer in CUDA device memory. On the same node
 * each block moves by one cudaMemcpyAsync between the device and the daemon's pinned
 * shared-memory arena, queued on `cuda_stream` (a cudaStream_t; NULL: the legacy default
 * stream) after the work already queued there; the calls return once the copies are done.
 * INVALID_ARGUMENT when a buffer is not device memory; UNAVAILABLE without a CUDA device. */
int kvpool_get_device(kvpool_client* client, const kvpool_key* keys, size_t n, void* const* buffers,
                      const size_t* capacities, void* cuda_stream, size_t* sizes, int* codes);
int kvpool_put_chain_device(kvpool_client* client, const kvpool_key* keys, size_t n,
                            const void* const* data, const size_t* sizes, const kvpool_key* parent,
                            void* cuda_stream, uint32_t* stored, uint32_t* present);

/* kvpool_get_device without waiting (kvpool::Client::GetAsync): the copies are queued on
 * `cuda_stream` and the call returns, so work the caller queues on that stream afterwards (the
 * layer's attention) runs after them while its thread goes on. *out (set on KVPOOL_OK) must be
 * ended by kvpool_pending_get_wait; the buffers must stay valid until then. */
typedef struct kvpool_pending_get kvpool_pending_get;
int kvpool_get_device_async(kvpool_client* client, const kvpool_key* keys, size_t n,
                            void* const* buffers, const size_t* capacities, void* cuda_stream,
                            kvpool_pending_get** out);
/* Waits for the copies, checks each block, ends the leases and frees `pending` (NULL:
 * nothing). sizes[i] and codes[i] (n entries each, as for kvpool_get) say what landed; a block
 * whose code is not KVPOOL_OK counts as not loaded, even if a kernel on the stream already read
 * its buffer. Call it before kvpool_close of the client it came from (its error text goes
 * there). */
int kvpool_pending_get_wait(kvpool_pending_get* pending, size_t* sizes, int* codes);

int kvpool_prefetch(kvpool_client* client, const kvpool_key* keys, size_t n, uint32_t* started);

/* Hints toward the daemon's gpu tier on CUDA device `gpu_device` (this process's ordinal, as
 * torch names it). KVPOOL_INVALID_ARGUMENT when the daemon runs no gpu tier on it;
 * KVPOOL_UNAVAILABLE when it runs gpu tiers and this process has no CUDA.
 * kvpool_prefetch_to_gpu: promotes the blocks toward host and copies them into that gpu tier,
 * returning once they are placed (`scheduled`: promotions started, `gpu_placed`: blocks placed;
 * either may be NULL).
 * kvpool_put_chain_to_gpu: kvpool_put_chain (data_on_device 0) or kvpool_put_chain_device
 * (data_on_device 1, copies on `cuda_stream`), then the stored blocks are placed in that gpu
 * tier in the background after the call returns, where there is room.
 * kvpool_session_load_to_gpu: kvpool_session_load with prefetch, and the chain placed in that
 * gpu tier in the background. */
int kvpool_prefetch_to_gpu(kvpool_client* client, const kvpool_key* keys, size_t n, int gpu_device,
                           uint32_t* scheduled, uint32_t* gpu_placed);
/* Whether the hints above pay off on CUDA device `gpu_device`: KVPOOL_OK with *daemon_device set
 * to the daemon's number for its gpu tier there (may be NULL); KVPOOL_INVALID_ARGUMENT when it
 * runs none there or this client cannot map it (then put without the hint). */
int kvpool_gpu_tier_of(kvpool_client* client, int gpu_device, int* daemon_device);
int kvpool_put_chain_to_gpu(kvpool_client* client, const kvpool_key* keys, size_t n,
                            const void* const* data, const size_t* sizes, const kvpool_key* parent,
                            int data_on_device, void* cuda_stream, int gpu_device, uint32_t* stored,
                            uint32_t* present);
int kvpool_session_load_to_gpu(kvpool_client* client, const char* session_id, int gpu_device,
                               kvpool_key* keys, size_t keys_capacity, size_t* n_keys,
                               uint64_t* token_count, uint32_t* cached_blocks);

/* Blocks lent in place (kvpool::Client::Borrow): views of the daemon's own copies under leases,
 * for a kernel of the caller's to read without a copy. */
typedef struct kvpool_borrowed kvpool_borrowed;
typedef struct kvpool_block_view {
  const void* data; /* read-only; NULL unless code is KVPOOL_OK */
  size_t size;
  int code;          /* KVPOOL_OK, KVPOOL_NOT_FOUND for a miss, ... */
  int tier;          /* KVPOOL_TIER_*: where it was lent from */
  int on_device;     /* 1: data is CUDA device memory (the daemon's gpu tier on the device asked) */
  uint64_t checksum; /* xxh3-64 of the block as put */
} kvpool_block_view;
/* Lends the n blocks: views[i] describes keys[i]. gpu_device >= 0: blocks in the daemon's gpu
 * tier on that CUDA device come as device pointers. verify: hash host views before lending them
 * (0: lend at once; call kvpool_borrowed_verify after reading). *out (set on KVPOOL_OK) must be
 * ended by kvpool_borrowed_release, before or after kvpool_close; the views stay readable
 * until then, and their contents stay as put while the leases hold (the daemon's lease
 * timeout, or until release). This is the one call after which the library keeps memory the
 * caller reads. */
int kvpool_borrow(kvpool_client* client, const kvpool_key* keys, size_t n, int gpu_device,
                  int verify, kvpool_block_view* views, kvpool_borrowed** out);
/* Hashes the host views again: KVPOOL_CORRUPTION when one changed (its lease ran out);
 * codes[i] (optional, n entries) gets each view's code. */
int kvpool_borrowed_verify(kvpool_borrowed* borrowed, int* codes);
/* Ends the leases and frees the views (NULL: nothing). While its client is open, this uses the
 * client's connection: call it from the thread using that client (or with calls on it
 * serialized), never during kvpool_close. After kvpool_close it only frees. */
void kvpool_borrowed_release(kvpool_borrowed* borrowed);

/* Sessions. Metadata is n_meta key/value pairs (may be 0). Session ids (1-256 bytes) and
 * metadata are UTF-8 text: anything else is refused (InvalidArgument). */
int kvpool_session_save(kvpool_client* client, const char* session_id, const kvpool_key* keys,
                        size_t n_keys, uint64_t token_count, const char* const* meta_keys,
                        const char* const* meta_values, size_t n_meta);
/* Writes up to keys_capacity keys; *n_keys is the chain's length (call again with a larger
 * buffer when it exceeds keys_capacity). `cached_blocks` (optional): how many are cached now. */
int kvpool_session_load(kvpool_client* client, const char* session_id, int prefetch,
                        kvpool_key* keys, size_t keys_capacity, size_t* n_keys,
                        uint64_t* token_count, uint32_t* cached_blocks);
int kvpool_session_delete(kvpool_client* client, const char* session_id);

/* One node's answer to kvpool_locate. Strings are NUL-terminated (cut at 127 bytes). */
typedef struct kvpool_node_location {
  char node_id[128];
  char control_address[128]; /* "" for a standalone daemon */
  int self;                  /* 1 for the daemon this client talks to */
  int code;                  /* KVPOOL_OK, or why the node did not answer (counts are 0 then) */
  uint32_t hit_blocks;       /* leading blocks of the chain the node holds ... */
  uint32_t gpu_blocks;       /* ... of which this many are fastest in gpu, */
  uint32_t host_blocks;      /* host */
  uint32_t disk_blocks;      /* and disk */
} kvpool_node_location;

/* For a request router: how many leading blocks of the chain each node holds, this daemon
 * first, then (cluster mode) every other member, asked in one round within the peer deadline.
 * Writes up to capacity entries; *n_nodes is the number of nodes. Nothing is promoted. */
int kvpool_locate(kvpool_client* client, const kvpool_key* keys, size_t n,
                  kvpool_node_location* nodes, size_t capacity, size_t* n_nodes);

/* The daemon's statistics as a JSON object (as `kvpool stats --json` prints). Writes at most
 * capacity bytes including the NUL; *needed is the full length + 1. */
int kvpool_stats_json(kvpool_client* client, char* buffer, size_t capacity, size_t* needed);

#ifdef __cplusplus
}
#endif

#endif /* KVPOOL_KVPOOL_H_ */
