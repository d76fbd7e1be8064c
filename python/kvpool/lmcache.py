"""kvpool.lmcache: kvpool as an LMCache 0.5.x remote storage plugin (a `RemoteConnector`).

LMCache config (the plugin's name is "kvpool"; the local CPU backend is its staging buffer):

    chunk_size: 256
    local_cpu: true
    max_local_cpu_size: 5
    remote_storage_plugins: ["kvpool"]
    extra_config:
      remote_storage_plugin.kvpool.module_path: kvpool.lmcache
      remote_storage_plugin.kvpool.class_name: KvpoolConnector
      remote_storage_plugin.kvpool.socket: /run/kvpool/kvpool.sock   # default: $KVPOOL_SOCKET
      remote_storage_plugin.kvpool.namespace: default
      remote_storage_plugin.kvpool.timeout: 2.0                      # seconds per call
      # a namespace with a credential, a daemon behind TLS (kvpool/_options.py):
      # remote_storage_plugin.kvpool.credential_file / .tls_ca / .tls_cert / .tls_key

LMCache builds it as `KvpoolConnector(loop=, local_cpu_backend=, config=)`.

Design (the why):
- Keys. The connector receives only LMCache's `CacheEngineKey`
  (model@world_size@worker_id@chunk_hash@dtype[@tags]); the token ids behind `chunk_hash`
  never reach a `RemoteConnector` (put/get/exists take the key alone), so kvpool's own key over
  token ids (spec/block-keys.md) cannot be computed here. The kvpool key is therefore
  SHA-256("kvpool.lmcache/1" | role | the chunk layout from LMCache's metadata: memory format,
  shapes, dtypes | key.to_string()). Different models, world sizes, workers, dtypes, tags or
  chunk layouts never share a key. The price: blocks stored through LMCache are NOT shared
  with kvpool's other engines (vLLM, SGLang, kvpool.hf) yet, because LMCache's chunk hash is
  not kvpool's hash and the tokens are not available to derive kvpool's.
- One LMCache chunk is two kvpool blocks, written in one put and read in one get_into: a
  header block (magic "KVPLMC01" + LMCache's own `RemoteMetadata`: byte length, shapes, dtypes,
  memory format) and the data block, which is the MemoryObj's bytes verbatim. A get allocates a
  full chunk with `local_cpu_backend.allocate(...)` and kvpool writes the data straight into
  its buffer (no copy in Python); the header must then match: magic, length equal to the bytes
  read, dtypes and format equal to this config's, shapes equal to this config's except a
  shorter token dimension (LMCache's unfull last chunk, rebuilt with `reshape_partial_chunk`).
  Anything else is a miss (None) and the buffer is released.
- Every kvpool failure (kvpool.Error, OSError, TimeoutError) is a miss (None / False) or a
  skipped put, logged as a warning on the "kvpool.lmcache" logger once per outage (an info
  line when kvpool answers again); nothing raises into LMCache. The client has a short timeout
  (2 s by default) and is made again after an Unavailable, so a restarted daemon is found.
- Blocking kvpool calls run in the default executor of the running event loop so LMCache's
  loop is not stalled; `exists_sync` calls directly. The kvpool Client serializes its calls.
- `list()` returns [] (kvpool does not enumerate blocks by engine key); `remove_sync` is not
  supported (kvpool blocks are evicted by the daemon, not deleted by clients).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from typing import Any, Callable, List, Optional, TypeVar

from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryObj
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector

import kvpool
from kvpool._options import client_kwargs
from kvpool._outage import (KVPOOL_FAILURES, LossyLoads, OutageLog, Stalled, StallGuard,
                             close_quietly)

__all__ = ["KvpoolConnector"]

log = logging.getLogger("kvpool.lmcache")

# What a kvpool call can raise when the daemon is down, slow or refuses.
_KVPOOL_FAILURES = KVPOOL_FAILURES
_MAGIC = b"KVPLMC01"
_KEY_DOMAIN = b"kvpool.lmcache/1"
T = TypeVar("T")


class KvpoolConnector(RemoteConnector):
    """LMCache `RemoteConnector` over a kvpoold (one Client per connector)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local_cpu_backend: Any, config: Any,
                 plugin_name: str = "kvpool", client: Optional[kvpool.Client] = None):
        super().__init__(local_cpu_backend.config, local_cpu_backend.metadata)
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        extra = (config.extra_config if config is not None else None) or {}
        prefix = f"remote_storage_plugin.{plugin_name}."
        self.socket: Optional[str] = extra.get(prefix + "socket") or None
        self.namespace: str = str(extra.get(prefix + "namespace", "default"))
        self.timeout = float(extra.get(prefix + "timeout", 2.0))
        self._reach = client_kwargs(extra, prefix)
        self._client: Optional[kvpool.Client] = client
        self._owns_client = client is None
        self._client_lock = threading.Lock()
        self._outage = OutageLog(log, "kvpool.lmcache", "serving misses and skipping puts")
        self.lossy = LossyLoads(log, "kvpool.lmcache")  # .blocks: data blocks from lossy copies
        # Held back for a while after kvpool did not answer in time: LMCache's lookups run on
        # vLLM's scheduling loop. Under _client_lock.
        self._stalls = StallGuard()
        # The chunk layout every key of this connector is salted with.
        self._layout = "|".join([
            self.meta_fmt.name,
            ";".join(f"{tuple(s)}" for s in self.meta_shapes),
            ";".join(str(d) for d in self.meta_dtypes),
        ]).encode()
        self._header_bytes = len(_MAGIC) + self.remote_metadata_bytes
        log.info("kvpool.lmcache: socket=%s namespace=%s timeout=%.1fs layout=%s",
                 self.socket or kvpool.default_socket_path(), self.namespace, self.timeout,
                 self._layout.decode())

    # ---- keys ----

    def kvpool_keys(self, key: CacheEngineKey) -> tuple[bytes, bytes]:
        """(header key, data key): the kvpool blocks holding `key`'s chunk."""
        base = b"\0".join([_KEY_DOMAIN, self._layout, key.to_string().encode()])
        return (hashlib.sha256(b"h\0" + base).digest(), hashlib.sha256(b"d\0" + base).digest())

    # ---- the client and failures ----

    def _get_client(self) -> kvpool.Client:
        with self._client_lock:
            self._stalls.check()
            if self._client is None:
                self._client = kvpool.Client(self.socket, namespace=self.namespace,
                                             timeout=self.timeout,
                                             connect_timeout=self.timeout,
                                             client_name="kvpool.lmcache", **self._reach)
            return self._client

    def _failed(self, what: str, e: BaseException) -> None:
        if isinstance(e, Stalled):
            return   # held back: the failure that began the hold was reported
        with self._client_lock:
            self._stalls.failed(e)
            if self._owns_client and isinstance(e, (kvpool.Unavailable, OSError)):
                close_quietly(self._client)
                self._client = None
        self._outage.failed(what, e)

    def _ok(self) -> None:
        with self._client_lock:
            self._stalls.answered()
        self._outage.answered()

    def _guarded(self, what: str, fn: Callable[[kvpool.Client], T], miss: T) -> T:
        try:
            out = fn(self._get_client())
        except Exception as e:  # noqa: BLE001 - any failure is a miss, see _failed
            self._failed(what, e)
            return miss
        self._ok()
        return out

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    # ---- RemoteConnector ----

    def exists_sync(self, key: CacheEngineKey) -> bool:
        keys = list(self.kvpool_keys(key))
        return self._guarded("exists",
                             lambda c: c.lookup(keys, prefetch=False).hit_blocks == 2, False)

    async def exists(self, key: CacheEngineKey) -> bool:
        return await self._run(lambda: self.exists_sync(key))

    def _contains_prefix(self, keys: List[CacheEngineKey]) -> int:
        """Chunks of `keys` held by kvpool, counted from the first until the first missing."""
        flat = [k for key in keys for k in self.kvpool_keys(key)]
        if not flat:
            return 0
        hit = self._guarded("contains", lambda c: c.lookup(flat, prefetch=True).hit_blocks, 0)
        return hit // 2

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: List[CacheEngineKey]) -> int:
        return self._contains_prefix(list(keys))

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey],
                                     pin: bool = False) -> int:
        return await self._run(lambda: self._contains_prefix(list(keys)))

    def _check_header(self, header: bytes, size: int) -> Optional[RemoteMetadata]:
        """The chunk's metadata when `header` describes `size` bytes of this config's layout."""
        if header[:len(_MAGIC)] != _MAGIC:
            return None
        try:
            meta = RemoteMetadata.deserialize(header[len(_MAGIC):])
        except (ValueError, KeyError, TypeError):
            return None
        if (meta.length != size or meta.fmt != self.meta_fmt
                or list(meta.dtypes) != list(self.meta_dtypes)
                or len(meta.shapes) != len(self.meta_shapes)):
            return None
        for got, want in zip(meta.shapes, self.meta_shapes):
            got, want = list(got), list(want)
            if len(got) != len(want):
                return None
            token_dim = 2 if len(want) == 4 else 0  # as RemoteConnector.reshape_partial_chunk
            if [g for i, g in enumerate(got) if i != token_dim] != \
                    [w for i, w in enumerate(want) if i != token_dim]:
                return None
            if not 0 < got[token_dim] <= want[token_dim]:
                return None
        return meta

    def _get_sync(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        keys = list(self.kvpool_keys(key))
        memory_obj = self.local_cpu_backend.allocate(self.meta_shapes, self.meta_dtypes,
                                                     self.meta_fmt)
        if memory_obj is None:
            log.debug("kvpool.lmcache: no local CPU memory for a get; a miss")
            return None
        header = bytearray(self._header_bytes)
        results = self._guarded("get", lambda c: c.get_into(keys, [header,
                                                                    memory_obj.byte_array]),
                                None)
        usable = None
        if results is not None:
            h, d = results
            if h.ok and d.ok:
                if h.size == self._header_bytes and \
                        self._check_header(bytes(header), d.size) is not None:
                    try:
                        usable = self.reshape_partial_chunk(memory_obj, d.size)
                    except ValueError:
                        usable = None
                    if usable is not None:
                        self.lossy.add([d])
                if usable is None:
                    log.warning("kvpool.lmcache: %s: header does not match this config's "
                                "chunk layout (%d data bytes); a miss", key.to_string(), d.size)
            else:
                bad = [r for r in (h, d) if not r.ok and r.code != "NotFound"]
                if bad:  # a missing chunk is an ordinary miss; anything else is worth a line
                    log.warning("kvpool.lmcache: %s: %s %s; a miss", key.to_string(),
                                bad[0].code, bad[0].message)
        if usable is None:
            memory_obj.ref_count_down()
        return usable

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return await self._run(lambda: self._get_sync(key))

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        return await self._run(lambda: [self._get_sync(k) for k in keys])

    def _put_sync(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]) -> None:
        flat_keys: list[bytes] = []
        blocks: list[Any] = []
        for key, obj in zip(keys, memory_objs, strict=True):
            data = obj.byte_array
            meta = RemoteMetadata(len(data), obj.get_shapes(), obj.get_dtypes(),
                                  obj.get_memory_format())
            hk, dk = self.kvpool_keys(key)
            # Data first: a chunk whose put stops half way has no header and reads as a miss.
            flat_keys += [dk, hk]
            blocks += [data, _MAGIC + meta.serialize()]
        for i in range(0, len(flat_keys), 2):
            # One chunk per put: each chunk is its own two-block chain.
            res = self._guarded("put", lambda c: c.put(flat_keys[i:i + 2], blocks[i:i + 2]),
                                None)
            if res is None:
                return  # kvpool is down: skip the rest (logged once)
            errors = [e for e in res.errors if e is not None]
            if errors:
                log.warning("kvpool.lmcache: put of %s: %s", keys[i // 2].to_string(),
                            errors[0])

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None:
        await self._run(lambda: self._put_sync([key], [memory_obj]))

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: List[CacheEngineKey],
                          memory_objs: List[MemoryObj]) -> None:
        await self._run(lambda: self._put_sync(list(keys), list(memory_objs)))

    async def list(self) -> List[str]:
        return []

    async def close(self) -> None:
        with self._client_lock:
            if self._owns_client:
                close_quietly(self._client)
            self._client = None

    def __repr__(self) -> str:
        return f"<KvpoolConnector namespace={self.namespace!r}>"
