"""kvpool.sglang: a kvpool `HiCacheStorage` backend for SGLang 0.5.x (written against 0.5.23).

    python -m sglang.launch_server --model-path org/name --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name": "kvpool",
        "module_path": "kvpool.sglang", "class_name": "KvpoolHiCacheStorage",
        "interface_v1": 1, "socket": "/run/kvpool/kvpool.sock", "namespace": "default"}'

SGLang constructs it as `KvpoolHiCacheStorage(storage_config, kwargs)`, then calls
`register_mem_pool_host(host_pool)`; with `"interface_v1": 1` its cache controller moves pages
with `batch_exists` / `batch_get_v1` / `batch_set_v1` over the host pool's page buffers
(`get_page_buffer_meta(indices) -> (ptr_list, size_list)`); without it, flat data pages with
`batch_get` / `batch_set` (a copy each way), and `batch_exists` then answers for those. Further
extra-config keys: `socket` (kvpoold's address; default $KVPOOL_SOCKET or the daemon's
default), `namespace` (default "default"), `secret` (the namespace secret salted into every
key; default ""), `model_id` (names the weights: set it where deployments of one model name
differ in revision, quantization or config overrides, which SGLang does not tell a storage
backend; default SGLang's model name, with a warning), `timeout` (seconds, default 2), and for
a namespace with a credential or a daemon behind TLS `credential_file`, `tls_ca`, `tls_cert`,
`tls_key` (kvpool/_options.py).

Design (the why):
- Keys. SGLang hands the backend only its own page hashes (64-hex SHA-256 chained over the
  page's token ids; `HiCacheStorageExtraInfo.prefix_keys` holds the earlier pages' hashes, no
  token ids), so kvpool's own key (spec/block-keys.md, over token ids) cannot be derived here.
  Each SGLang hash is mapped deterministically to a 32-byte kvpool key:
      key = SHA-256("kvpool.sglang/1\\0" || SHA-256(secret) || SHA-256(layout) || hash, UTF-8)
  so two namespaces, secrets or layouts never share a key, and every SGLang worker with the
  same model and layout finds the others' pages. LIMIT: these blocks are not shared with
  other engines (vLLM, kvpool.hf, LMCache) yet, because those key by kvpool's chain over the
  token ids and this backend never sees the token ids; sharing needs SGLang to pass them (or
  kvpool to accept SGLang's hash scheme as a key scheme).
- Layout: the key's layout string is kvpool.layout_string(model, dtype, layers, heads, head
  dim, page size, tp rank/size) plus SGLang-specific properties: kv=mha|mla (MLA's latent
  width), the host pool's layout (page_first, layer_first, ...), pp and attention-cp shards,
  the bytes of one page, and which byte order the block holds (`bytes=meta`: the page's
  buffers from get_page_buffer_meta in order, written by the v1 calls; `bytes=flat`: the
  legacy get/set data page). MLA KV is replicated over TP ranks: its layout says tp 0/1 and
  only the storage writer rank (storage_config.is_storage_writer) stores.
- One kvpool block per page (and per TP rank). A page whose meta is one buffer (MLA
  page_first) is read and written in place, no copy. A page of several buffers (MHA: K and V,
  or per-layer K/V for layer_first) is staged through one host buffer per call (a memmove per
  buffer), because a kvpool block is one contiguous byte range.
- Failures: every kvpool.Error, OSError and TimeoutError is a miss (exists -> 0 / False,
  get -> False / None, set -> False), logged as a warning on the "kvpool.sglang" logger, never
  an exception into SGLang: SGLang recomputes. Any other exception (a bug, page meta not as
  expected) is logged with its traceback and answered the same way. The client timeout is
  short (2 s), and a thread's client is dropped after a failure so the next call reconnects (a
  restarted daemon is found); after a call kvpool did not answer in time, that thread's calls
  are misses at once for a while (kvpool._outage.StallGuard).
- Threads: SGLang's prefetch and backup threads call concurrently; each thread gets its own
  kvpool.Client (a Client serializes calls).
- Reads are verified: a block must come back OK with exactly the page's size, else that page is
  a miss.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import threading
import time
import types
from typing import Any, Callable, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

import kvpool
from kvpool._options import client_kwargs
from kvpool._outage import LossyLoads, OutageLog
from kvpool._transfer import Link

__all__ = ["KvpoolHiCacheStorage"]

log = logging.getLogger("kvpool.sglang")

_FAILURES = (kvpool.Error, OSError, TimeoutError)


def _miss_on_error(miss: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Whatever else a method lets out (a bug, page meta it did not expect) is logged and
    answered as `miss(keys)`: SGLang's prefetch and backup threads never see an exception."""
    def wrap(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def guarded(self: Any, keys: List[str], *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, keys, *args, **kwargs)
            except Exception:  # noqa: BLE001 - any failure is a miss
                log.exception("kvpool.sglang: %s failed; answered as a miss", method.__name__)
                return miss(keys)
        return guarded
    return wrap
_KEY_PREFIX = b"kvpool.sglang/1\0"
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# A put is split into calls of about this many payload bytes (as kvpool.hf does).
_PUT_CHUNK_BYTES = 32 << 20


def _dtype_name(dtype: Any) -> str:
    return _DTYPE_NAMES.get(dtype) or str(dtype).replace("torch.", "")


def _view(ptr: int, size: int):
    """A writable buffer over host memory at `ptr` (no copy)."""
    return (ctypes.c_ubyte * size).from_address(ptr)


class KvpoolHiCacheStorage(HiCacheStorage):
    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        extra = dict(storage_config.extra_config or {})
        self.address: Optional[str] = extra.get("socket")
        self.namespace: str = extra.get("namespace", "default")
        secret = extra.get("secret", "")
        self.model_id: str = extra.get("model_id") or storage_config.model_name or ""
        if not extra.get("model_id"):
            # SGLang tells a storage backend only the model's name (its path or served name), not
            # its revision, quantization or config overrides, which change the KV of the same
            # tokens: two deployments of one name that differ in those must not share keys.
            log.warning("kvpool.sglang: no 'model_id' in the extra config; keys name the model "
                        "as %r only. Deployments sharing this namespace with another revision, "
                        "quantization or config overrides of it must set 'model_id' (e.g. "
                        "'org/name@rev+fp8') or they would load each other's KV", self.model_id)
        self.timeout = float(extra.get("timeout", 2.0))
        # Which pages SGLang moves (as its cache controller decides it): the page buffers through
        # batch_get_v1 / batch_set_v1, or else flat data pages through batch_get / batch_set.
        # batch_exists must ask for the keys of the ones it stores.
        self._v1 = bool(extra.get("interface_v1", 0))
        self._reach = client_kwargs(extra)
        self._salt = kvpool.namespace_salt(secret)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._outage = OutageLog(log, "kvpool.sglang", "treated as a miss")
        self.lossy = LossyLoads(log, "kvpool.sglang")  # .blocks: pages decoded from lossy copies
        self.mem_pool_host = None
        self.layout: Optional[str] = None  # the v1 (page buffer) layout, set by registration
        self.flat_layout: Optional[str] = None
        self._page_bytes = 0
        self.prefetch_pgs: List[int] = []
        self.backup_pgs: List[int] = []
        self.prefetch_bandwidth: List[float] = []
        self.backup_bandwidth: List[float] = []

    # --- SGLang lifecycle -------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        pool = mem_pool_host
        cfg = self.storage_config
        mla = bool(cfg.is_mla_model)
        page_size = int(pool.page_size)
        _, sizes = pool.get_page_buffer_meta(torch.arange(page_size, dtype=torch.int64))
        self._page_bytes = int(sum(sizes))
        layers = int(getattr(pool, "layer_num", 0))
        if mla:
            heads = 1
            head_dim = int(pool.kv_lora_rank) + int(pool.qk_rope_head_dim)
            kv = f"mla:{int(pool.kv_lora_rank)}+{int(pool.qk_rope_head_dim)}"
            tp_rank, tp_size = 0, 1  # MLA KV is the same on every TP rank
        else:
            heads = int(pool.head_num)
            head_dim = int(pool.head_dim)
            kv = "mha"
            tp_rank, tp_size = int(cfg.tp_rank), int(cfg.tp_size)
        base = kvpool.layout_string(
            self.model_id, _dtype_name(pool.dtype), layers, heads, head_dim,
            tokens_per_block=page_size, tp_rank=tp_rank, tp_size=tp_size, encoding="raw")
        extra = (f";engine=sglang;kv={kv};host_layout={getattr(pool, 'layout', '')}"
                 f";pp={cfg.pp_rank}/{cfg.pp_size};attn_cp={cfg.attn_cp_rank}/{cfg.attn_cp_size}"
                 f";dcp={cfg.dcp_rank}/{cfg.dcp_size};dp={cfg.dp_rank if not mla else 0}"
                 f";page_bytes={self._page_bytes}")
        self.layout = base + extra + ";bytes=meta"
        self.flat_layout = base + extra + ";bytes=flat"
        self._fp = kvpool.layout_fingerprint(self.layout)
        self._flat_fp = kvpool.layout_fingerprint(self.flat_layout)
        log.info("kvpool.sglang: layout %s, %d bytes per page, namespace %r", self.layout,
                 self._page_bytes, self.namespace)

    def clear(self) -> None:
        """Drops what this process holds (its clients). kvpool's blocks are shared by every
        worker of the namespace, so one worker's clear does not delete them."""
        self.close()

    def close(self) -> None:
        """Closes this thread's client (the next call connects again)."""
        link = getattr(self._local, "link", None)
        if link is not None:
            link.close()

    def get_stats(self):
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except ImportError:  # sglang without its serving deps: the same fields, by name
            StorageMetrics = types.SimpleNamespace
        with self._lock:
            data = dict(prefetch_pgs=self.prefetch_pgs, backup_pgs=self.backup_pgs,
                        prefetch_bandwidth=self.prefetch_bandwidth,
                        backup_bandwidth=self.backup_bandwidth)
            self.prefetch_pgs, self.backup_pgs = [], []
            self.prefetch_bandwidth, self.backup_bandwidth = [], []
        return StorageMetrics(**data)

    # --- keys and the client ----------------------------------------------------------------
    def _keys(self, hashes: List[str], flat: bool = False) -> List[bytes]:
        fp = self._flat_fp if flat else self._fp
        head = _KEY_PREFIX + self._salt + fp
        return [hashlib.sha256(head + h.encode()).digest() for h in hashes]

    def _parent(self, extra_info: Optional[HiCacheStorageExtraInfo]) -> Optional[bytes]:
        if extra_info is not None and extra_info.prefix_keys:
            return self._keys([extra_info.prefix_keys[-1]])[0]
        return None

    def _link(self) -> Link:
        """This thread's client (SGLang calls from its prefetch and backup threads)."""
        link = getattr(self._local, "link", None)
        if link is None:
            link = Link(self._connect, self._outage)
            self._local.link = link
        return link

    def _connect(self) -> kvpool.Client:
        return kvpool.Client(self.address, namespace=self.namespace, timeout=self.timeout,
                             connect_timeout=self.timeout, client_name="kvpool.sglang",
                             **self._reach)

    def _client(self) -> kvpool.Client:
        return self._link().client()

    def _failed(self, what: str, err: BaseException) -> None:
        self._link().failed(what, err)  # closes the client: the next call makes a new one

    def _answered(self) -> None:
        self._link().answered()

    def _ready(self) -> bool:
        return self.layout is not None

    # --- existence --------------------------------------------------------------------------
    @_miss_on_error(lambda keys: 0)
    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        if not keys or not self._ready():
            return 0
        try:
            hit = self._client().lookup(self._keys(keys, flat=not self._v1),
                                        prefetch=True).hit_blocks
        except _FAILURES as e:
            self._failed("lookup", e)
            return 0
        self._answered()
        return min(int(hit), len(keys))

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # --- zero-copy page I/O (interface_v1) --------------------------------------------------
    def _pages(self, keys: List[str], host_indices: torch.Tensor):
        """[(ptrs, sizes)] per page, from the host pool's page buffer meta."""
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        per = len(ptrs) // len(keys)
        if per * len(keys) != len(ptrs) or per == 0:
            raise ValueError(f"{len(ptrs)} page buffers for {len(keys)} keys")
        return [(ptrs[i * per:(i + 1) * per], sizes[i * per:(i + 1) * per])
                for i in range(len(keys))]

    @_miss_on_error(lambda keys: [False] * len(keys))
    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not keys or not self._ready():
            return [False] * len(keys)
        pages = self._pages(keys, host_indices)
        staging = None
        bufs = []
        if all(len(p) == 1 for p, _ in pages):
            bufs = [_view(p[0], s[0]) for p, s in pages]
        else:
            staging = (ctypes.c_ubyte * (self._page_bytes * len(keys)))()
            base = ctypes.addressof(staging)
            bufs = [_view(base + i * self._page_bytes, self._page_bytes) for i in range(len(keys))]
        t0 = time.perf_counter()
        try:
            results = self._client().get_into(self._keys(keys), bufs)
        except _FAILURES as e:
            self._failed("get", e)
            return [False] * len(keys)
        self._answered()
        ok = [bool(r.ok) and r.size == self._page_bytes for r in results]
        # SGLang uses the pages up to the first that failed.
        used = next((i for i, good in enumerate(ok) if not good), len(ok))
        self.lossy.add(results[:used])
        if staging is not None:
            base = ctypes.addressof(staging)
            for i, (ptrs, sizes) in enumerate(pages):
                if not ok[i]:
                    continue
                off = base + i * self._page_bytes
                for p, s in zip(ptrs, sizes):
                    ctypes.memmove(p, off, s)
                    off += s
        self._record(self.prefetch_pgs, self.prefetch_bandwidth, sum(ok), t0)
        return ok

    @_miss_on_error(lambda keys: [False] * len(keys))
    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not keys:
            return []
        if not self._ready():
            return [False] * len(keys)
        if not self.storage_config.is_storage_writer:
            return [True] * len(keys)  # MLA: one writer rank stores the replicated pages
        pages = self._pages(keys, host_indices)
        if all(len(p) == 1 for p, _ in pages):
            blocks = [_view(p[0], s[0]) for p, s in pages]
        else:
            staging = (ctypes.c_ubyte * (self._page_bytes * len(keys)))()
            base = ctypes.addressof(staging)
            blocks = []
            for i, (ptrs, sizes) in enumerate(pages):
                off = base + i * self._page_bytes
                for p, s in zip(ptrs, sizes):
                    ctypes.memmove(off, p, s)
                    off += s
                blocks.append(_view(base + i * self._page_bytes, self._page_bytes))
        t0 = time.perf_counter()
        ok = self._put(self._keys(keys), blocks, self._parent(extra_info))
        self._record(self.backup_pgs, self.backup_bandwidth, sum(ok), t0)
        return ok

    def _put(self, keys: List[bytes], blocks: list, parent: Optional[bytes]) -> List[bool]:
        ok: List[bool] = []
        errs: set = set()
        step = max(1, _PUT_CHUNK_BYTES // max(1, self._page_bytes))
        try:
            client = self._client()
            for i in range(0, len(keys), step):
                res = client.put(keys[i:i + step], blocks[i:i + step],
                                 parent=parent if i == 0 else keys[i - 1])
                ok.extend(err is None for err in res.errors)
                errs.update(type(err).__name__ for err in res.errors if err is not None)
        except _FAILURES as e:
            self._failed("put", e)
            return ok + [False] * (len(keys) - len(ok))
        self._answered()
        if not all(ok):
            log.warning("kvpool.sglang: %d of %d pages not stored (%s)", ok.count(False),
                        len(ok), ", ".join(sorted(errs)))
        return ok

    def _record(self, pgs: List[int], bandwidth: List[float], pages: int, t0: float) -> None:
        if not self.storage_config.enable_storage_metrics or pages == 0:
            return
        dt = max(time.perf_counter() - t0, 1e-9)
        with self._lock:
            pgs.append(pages)
            bandwidth.append(pages * self._page_bytes / dt / (1 << 30))

    # --- the legacy (copying) interface: whole flat data pages as tensors -------------------
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    @_miss_on_error(lambda keys: [None] * len(keys))
    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[torch.Tensor | None]:
        if not keys or not self._ready() or target_locations is None:
            return [None] * len(keys)
        bufs = [t.view(torch.uint8).reshape(-1) for t in target_locations]
        try:
            results = self._client().get_into(self._keys(keys, flat=True), bufs)
        except _FAILURES as e:
            self._failed("get", e)
            return [None] * len(keys)
        self._answered()
        out = [t if r.ok and r.size == b.numel() else None
               for t, b, r in zip(target_locations, bufs, results)]
        used = next((i for i, t in enumerate(out) if t is None), len(out))
        self.lossy.add(results[:used])  # SGLang uses the pages up to the first that failed
        return out

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    @_miss_on_error(lambda keys: False)
    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        if not keys or not self._ready() or values is None:
            return False
        if not self.storage_config.is_storage_writer:
            return True
        blocks = [v.contiguous().view(torch.uint8).reshape(-1) for v in values]
        return all(self._put(self._keys(keys, flat=True), blocks, None))
