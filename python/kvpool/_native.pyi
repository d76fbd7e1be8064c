# Contract of the compiled extension kvpool._native (nanobind over the C++ client and kernels).
# kvpool/__init__.py re-exports these names; users import `kvpool`, never `kvpool._native`.
# Buffers ("Buffer") are anything with the buffer protocol or DLPack (numpy arrays, torch CPU
# tensors, bytearray, memoryview; bytes for reading only), taken without a copy; C-contiguous.
# A tensor (DLPack) given to a call must not be resized or given other storage (torch's
# resize_(), set_()) by any thread until the call, or a pending get's wait(), returns: DLPack
# does not stop that, and the call would read or write memory the tensor no longer owns. (The
# buffer protocol's exporters refuse to resize while a call holds them.)
from typing import Any, Mapping, Sequence

Buffer = Any  # buffer protocol or __dlpack__ object, C-contiguous

class Error(Exception):
    code: str       # "NotFound", "Corruption", ... (kvpool::StatusCodeName)
    message: str
class NotFound(Error): ...
class InvalidArgument(Error): ...
class AlreadyExists(Error): ...
class ResourceExhausted(Error): ...
class PermissionDenied(Error): ...
class Unavailable(Error): ...
class DeadlineExceeded(Error): ...
class Corruption(Error): ...
class IoError(Error): ...
class Aborted(Error): ...
class Internal(Error): ...
class Unimplemented(Error): ...
class FailedPrecondition(Error): ...

def layout_string(model: str, dtype: str, layers: int, kv_heads: int, head_dim: int,
                  tokens_per_block: int = 16, tp_rank: int = 0, tp_size: int = 1,
                  encoding: str = "raw") -> str: ...
# Keys (32 bytes each) of the full blocks of `tokens` (ints, or an int32 buffer), per
# ../shared/spec/block-keys.md; continues from `parent` (None = new chain).
def hash_chain(tokens: Sequence[int] | Buffer, *, secret: str | bytes, layout: str,
               tokens_per_block: int, parent: bytes | None = None) -> list[bytes]: ...

# SHA-256 of a namespace secret / of a canonical layout string (the two salts of every key).
def namespace_salt(secret: str | bytes) -> bytes: ...
def layout_fingerprint(layout: str) -> bytes: ...
# The socket a Client with no address connects to ($KVPOOL_SOCKET, else the daemon's default).
def default_socket_path() -> str: ...

class LookupResult:
    hit_blocks: int          # longest cached prefix, in blocks
    tiers: list[str]         # "gpu" | "host" | "disk" | "remote", one per hit block

class GetResult:
    ok: bool
    size: int                # bytes written (0 unless ok)
    tier: str | None         # where it was served from
    lossy: str | None        # None: exactly what was put; else the encoding it was decoded from
    code: str                # "OK", "NotFound", "Corruption", "InvalidArgument" (buffer too small)
    message: str
    def __bool__(self) -> bool: ...  # ok

class PutResult:
    stored: int
    already_present: int
    in_progress: int
    errors: list[Error | None]   # one per block
    def all_ok(self) -> bool: ...

class Session:
    session_id: str
    keys: list[bytes]
    token_count: int
    metadata: dict[str, str]
    created_unix_ms: int
    updated_unix_ms: int
    total_bytes: int
    cached_blocks: int       # set by load_session

class SessionSummary:
    session_id: str
    blocks: int
    token_count: int
    updated_unix_ms: int
    total_bytes: int

class PendingGet:
    pending: bool            # copies left running on the stream, not waited for yet
    def wait(self) -> list[GetResult]: ...   # once; then FailedPrecondition

class BlockView:
    ok: bool
    code: str                # "OK", "NotFound", "Corruption", ...
    message: str
    size: int                # 0 unless ok
    tier: str | None         # where it was lent from
    device: str              # "cpu" | "cuda" (the daemon's gpu tier, on the device borrowed for)
    checksum: int            # xxh3-64 of the block as put
    device_checksum: int     # device views: the gpu copy's chunked XXH64 (0 for host views)
    data_ptr: int            # address of the bytes; raises the block's error unless ok
    # Read-only uint8 array over the host bytes, no copy (keeps the Borrowed's memory alive).
    def numpy(self) -> Any: ...
    # Device views only: torch.as_tensor(view, device="cuda"), cupy.asarray(view). Reported
    # writable (torch refuses read-only CUDA arrays) but must not be written: the daemon's copy.
    __cuda_array_interface__: dict[str, Any]

class Borrowed:
    released: bool
    lease_seconds_left: float
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> BlockView: ...
    def verify(self) -> None: ...    # Corruption when a host view changed (lease ran out)
    def release(self) -> None: ...   # ends the leases (also on __exit__ and when collected)
    def __enter__(self) -> "Borrowed": ...
    def __exit__(self, *exc: object) -> None: ...

class Client:
    # address: Unix socket path, "unix://PATH", "tcp://HOST:PORT" or "tls://HOST:PORT" (None:
    # $KVPOOL_SOCKET or the default socket). timeout / connect_timeout in seconds. data_path:
    # "auto" | "socket" | "shm" | "ucx". tls_ca / tls_cert / tls_key: PEM files for tls://.
    # busy_poll_us: spin this long for each answer before sleeping (0: sleep at once).
    # Raises Unavailable, PermissionDenied, InvalidArgument, DeadlineExceeded.
    def __init__(self, address: str | None = None, namespace: str = "default", *,
                 timeout: float = 10.0, connect_timeout: float | None = None,
                 data_path: str = "auto", client_name: str = "",
                 cluster_secret: str | None = None, auto_reconnect: bool = True,
                 credential: str | None = None, admin: bool = False,
                 tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, busy_poll_us: int = 0) -> None: ...
    @property
    def server(self) -> dict[str, Any]: ...  # node_id, daemon_version, max_block_bytes, ...
    @property
    def closed(self) -> bool: ...
    # The daemon's gpu tier on this process's CUDA device (torch's ordinal), or None where it
    # runs none or this client cannot map it: where put(..., gpu_device=device) pays off.
    def gpu_tier(self, device: int) -> int | None: ...
    def lookup(self, keys: Sequence[bytes], prefetch: bool = True) -> LookupResult: ...
    # Reads block i into buffers[i] (writable). Raises only when the daemon cannot be reached;
    # per-block misses and errors are in the results.
    # CUDA tensors too: copied host<->device straight from/to the daemon's shared memory on
    # `stream` (torch.cuda.Stream, a cudaStream_t as int; None: torch's current stream).
    def get_into(self, keys: Sequence[bytes], buffers: Sequence[Buffer],
                 stream: Any = None) -> list[GetResult]: ...
    # As get_into, returning once the copies into CUDA tensors are queued on `stream`.
    def get_into_async(self, keys: Sequence[bytes], buffers: Sequence[Buffer],
                       stream: Any = None) -> PendingGet: ...
    # Convenience: each block as new bytes, None for a miss.
    def get(self, keys: Sequence[bytes]) -> list[bytes | None]: ...
    # Put-if-absent of a chain: blocks[i] are keys[i]'s bytes; parents follow chain order.
    # gpu_device: the daemon also keeps them in its gpu tier there: CUDA tensors are copied
    # device to device straight into it where it has room, host buffers placed in the background.
    def put(self, keys: Sequence[bytes], blocks: Sequence[Buffer],
            parent: bytes | None = None, stream: Any = None,
            gpu_device: int | None = None) -> PutResult: ...
    # Lends the blocks in place (views of the daemon's copies under leases), no copy: for your
    # own kernel to read. gpu_device: blocks in the daemon's gpu tier there come as CUDA views.
    # verify=False: lend without hashing first (call Borrowed.verify() after reading).
    def borrow(self, keys: Sequence[bytes], *, gpu_device: int | None = None,
               verify: bool = True) -> Borrowed: ...
    # gpu_device: also into the daemon's gpu tier there (returns how many were placed).
    def prefetch(self, keys: Sequence[bytes], gpu_device: int | None = None) -> int: ...
    def save_session(self, session_id: str, keys: Sequence[bytes], token_count: int,
                     metadata: Mapping[str, str] | None = None) -> None: ...
    # NotFound (cluster mode: Unavailable when not found but a home of it did not answer);
    # gpu_device: the chain is also placed in the daemon's gpu tier there.
    def load_session(self, session_id: str, prefetch: bool = True,
                     gpu_device: int | None = None) -> Session: ...
    def delete_session(self, session_id: str) -> None: ...
    def list_sessions(self, prefix: str = "", limit: int = 0) -> list[SessionSummary]: ...
    def stats(self) -> dict[str, Any]: ...   # DaemonStats as a dict; "tiers" a list of dicts
    def cluster(self) -> dict[str, Any]: ...
    # For a request router: each node's cached prefix of the chain, this daemon first, then
    # (cluster mode) every other member. Dicts: node_id, control_address, self, error (None or
    # an Error), hit_blocks, tiers.
    def locate(self, keys: Sequence[bytes]) -> list[dict[str, Any]]: ...
    def evict(self, tier: str = "host", keys: Sequence[bytes] | None = None) -> dict[str, int]: ...
    def reconnect(self) -> None: ...   # also after close()
    def close(self) -> None: ...       # later calls raise FailedPrecondition until reconnect()
    def __enter__(self) -> "Client": ...
    def __exit__(self, *exc: object) -> None: ...

# Kernels: the low level of kvpool.kernels (use that module: names, dataclasses, allocation).
# layout = (num_layers, num_kv_heads, head_dim, tokens, dtype, encoding);
# shape = (num_layers, seq_len, num_q_heads, num_kv_heads, head_dim, dtype);
# params = (method, window_size, max_capacity_prompt, kernel_size, pooling, sink_size, beta);
# dtype 0 fp16, 1 bf16, 2 fp32. Buffers on the CPU or all on one CUDA device (DLPack);
# stream: a cudaStream_t as int (0: default). Raise InvalidArgument on a size, dtype, contiguity
# or device mismatch, Unimplemented for CUDA buffers in a build without CUDA.
built_with_cuda: bool
def kernel_raw_bytes(layout: Sequence[int]) -> int: ...
def kernel_encoded_bytes(layout: Sequence[int]) -> int: ...
def kernel_gather_paged(layout: Sequence[int], paged_layout: int, k_layers: Sequence[Buffer],
                        v_layers: Sequence[Buffer] | None, block_table: Buffer | Sequence[int],
                        first_token: int, payloads: Sequence[Buffer], stream: int = 0) -> None: ...
def kernel_scatter_paged(layout: Sequence[int], paged_layout: int, k_layers: Sequence[Buffer],
                         v_layers: Sequence[Buffer] | None, block_table: Buffer | Sequence[int],
                         first_token: int, payloads: Sequence[Buffer], stream: int = 0) -> None: ...
def kernel_quantize(layout: Sequence[int], raw: Sequence[Buffer], encoded: Sequence[Buffer],
                    stream: int = 0) -> None: ...
def kernel_dequantize(layout: Sequence[int], encoded: Sequence[Buffer], raw: Sequence[Buffer],
                      stream: int = 0) -> None: ...
def kernel_compress_defaults() -> tuple[int, int, int, int, int, int, int]: ...
def kernel_compress_sizes(params: Sequence[int], shape: Sequence[int]
                          ) -> tuple[list[int], int, int, int]: ...  # keep, total, nq, scored
def kernel_compute_scores(params: Sequence[int], shape: Sequence[int], q: Buffer | None,
                          kv: Buffer, scores: Buffer | None, stream: int = 0) -> None: ...
def kernel_select_tokens(params: Sequence[int], shape: Sequence[int], scores: Buffer | None,
                         indices: Buffer, stream: int = 0) -> None: ...
def kernel_compact_kv(shape: Sequence[int], keep_counts: Sequence[int], indices: Buffer,
                      kv: Buffer, kv_out: Buffer, stream: int = 0) -> None: ...
