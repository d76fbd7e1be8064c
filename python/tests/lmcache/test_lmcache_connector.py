"""kvpool.lmcache against LMCache 0.5.6's real pieces and a real kvpoold.

What is real here: LMCache's `RemoteConnector` base class, its `LMCacheEngineConfig`,
`LMCacheMetadata`, `LocalCPUBackend` with its own CPU memory allocator (the MemoryObjs a get
returns come from it), its plugin loader (`CreateConnector("plugin://kvpool", ...)` reading
`remote_storage_plugins` / `extra_config`) and its `RemoteBackend`; the daemon is kvpoold
(kvpool.testing.Daemon). Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import subprocess
import sys
import threading
import types

import pytest
import torch

import kvpool
import kvpool._outage
import kvpool.testing
from kvpool.lmcache import KvpoolConnector
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.protocol import RemoteMetadata
from lmcache.v1.storage_backend.connector import CreateConnector
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.remote_backend import RemoteBackend

MODEL = "org/tiny@rev1"
CHUNK = 16
KV_SHAPE = (2, 2, CHUNK, 4, 8)   # layers, k|v, chunk tokens, kv heads, head dim


@pytest.fixture(scope="module")
def daemon():
    with kvpool.testing.Daemon() as d:
        yield d


@pytest.fixture(scope="module")
def loop():
    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(5)


def make_config(socket: str, namespace: str = "lmc-test") -> LMCacheEngineConfig:
    return LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=False, max_local_cpu_size=0.05,
        remote_storage_plugins=["kvpool"],
        extra_config={
            "remote_storage_plugin.kvpool.module_path": "kvpool.lmcache",
            "remote_storage_plugin.kvpool.class_name": "KvpoolConnector",
            "remote_storage_plugin.kvpool.socket": socket,
            "remote_storage_plugin.kvpool.namespace": namespace,
            "remote_storage_plugin.kvpool.timeout": 2.0,
        })


def make_metadata(model: str = MODEL, dtype: torch.dtype = torch.float16) -> LMCacheMetadata:
    return LMCacheMetadata(model_name=model, world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=dtype, kv_shape=KV_SHAPE,
                           chunk_size=CHUNK)


class Side:
    """One LMCache instance's view: config, metadata, its LocalCPUBackend and our connector."""

    def __init__(self, socket: str, loop, namespace: str = "lmc-test", model: str = MODEL):
        self.config = make_config(socket, namespace)
        self.metadata = make_metadata(model)
        self.lcb = LocalCPUBackend(self.config, self.metadata, dst_device="cpu")
        self.loop = loop
        self.conn = KvpoolConnector(loop=loop, local_cpu_backend=self.lcb, config=self.config)

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def key(self, chunk_hash: int, model: str = MODEL, world_size: int = 1, worker_id: int = 0,
            dtype: torch.dtype = torch.float16) -> CacheEngineKey:
        return CacheEngineKey(model, world_size, worker_id, chunk_hash, dtype)

    def chunk(self, seed: int, tokens: int = CHUNK):
        shapes = self.metadata.get_shapes(tokens)
        obj = self.lcb.allocate(shapes, self.metadata.get_dtypes(), MemoryFormat.KV_2LTD)
        assert obj is not None
        g = torch.Generator().manual_seed(seed)
        obj.tensor.copy_(torch.randn(obj.tensor.shape, generator=g).to(obj.tensor.dtype))
        return obj

    def close(self):
        self.run(self.conn.close())


def digest(obj) -> str:
    return hashlib.sha256(bytes(obj.byte_array)).hexdigest()


def test_plugin_loads_from_lmcache_config(daemon, loop):
    """LMCache's own loader finds the class from remote_storage_plugins + extra_config."""
    side = Side(daemon.socket, loop)
    conn = CreateConnector("plugin://kvpool", loop, side.lcb, side.config, side.metadata,
                           plugin_name="kvpool")
    inner = conn._connector   # CreateConnector wraps it in InstrumentedRemoteConnector
    assert isinstance(inner, KvpoolConnector), type(inner)
    key = side.key(101)
    obj = side.chunk(1)
    want = digest(obj)
    side.run(conn.put(key, obj))
    got = side.run(conn.get(key))
    assert got is not None and digest(got) == want
    release(obj, got)
    side.run(conn.close())


def test_lmcache_remote_backend_round_trip(daemon, loop):
    """LMCache's RemoteBackend (what its storage manager drives) over the plugin: put task,
    contains, get_blocking and batched_get_blocking."""
    side = Side(daemon.socket, loop)
    backend = RemoteBackend(side.config, side.metadata, loop, side.lcb, "cpu",
                            plugin_name="kvpool")
    assert isinstance(backend.connection._connector, KvpoolConnector)
    keys = [side.key(150 + i) for i in range(3)]
    objs = [side.chunk(15 + i) for i in range(3)]
    want = [digest(o) for o in objs]
    assert backend.contains(keys[0]) is False
    for k, o in zip(keys, objs):
        backend.submit_put_task(k, o).result(30)
    assert all(backend.contains(k) for k in keys)
    got = backend.get_blocking(keys[0])
    assert got is not None and digest(got) == want[0]
    many = backend.batched_get_blocking(keys)
    assert [digest(g) for g in many] == want
    release(*objs, got, *many)
    backend.close()


def release(*objs) -> None:
    """Gives MemoryObjs back to LMCache's allocator (LMCache warns about leaked ones)."""
    for o in objs:
        if o is not None:
            o.ref_count_down()


def test_put_get_exists_byte_identical(daemon, loop):
    side = Side(daemon.socket, loop)
    key = side.key(202)
    assert side.run(side.conn.exists(key)) is False
    assert side.conn.exists_sync(key) is False
    assert side.run(side.conn.get(key)) is None
    obj = side.chunk(2)
    want = digest(obj)
    side.run(side.conn.put(key, obj))
    assert side.run(side.conn.exists(key)) is True
    assert side.conn.exists_sync(key) is True
    got = side.run(side.conn.get(key))
    assert got is not None
    assert got.get_shapes() == obj.get_shapes() and got.get_dtypes() == obj.get_dtypes()
    assert got.get_memory_format() == MemoryFormat.KV_2LTD
    assert digest(got) == want
    assert torch.equal(got.tensor, obj.tensor)
    # The data block is the MemoryObj's bytes verbatim, read through kvpool directly.
    with kvpool.Client(daemon.socket, namespace="lmc-test") as c:
        hk, dk = side.conn.kvpool_keys(key)
        raw_hdr, raw = c.get([hk, dk])
        assert hashlib.sha256(raw).hexdigest() == want
        assert raw_hdr[:8] == b"KVPLMC01"
    release(obj, got)
    side.close()


def test_batched_put_get_contains(daemon, loop):
    side = Side(daemon.socket, loop)
    keys = [side.key(300 + i) for i in range(4)]
    objs = [side.chunk(30 + i) for i in range(4)]
    want = [digest(o) for o in objs]
    assert side.conn.support_batched_put() and side.conn.support_batched_get()
    side.run(side.conn.batched_put(keys[:3], objs[:3]))
    assert side.conn.batched_contains(keys) == 3
    assert side.run(side.conn.batched_async_contains("l1", keys)) == 3
    got = side.run(side.conn.batched_get(keys))
    assert [digest(g) for g in got[:3]] == want[:3] and got[3] is None
    assert side.run(side.conn.list()) == []
    release(*objs, *got)
    side.close()


def test_partial_chunk_round_trip(daemon, loop):
    """LMCache's unfull last chunk (fewer tokens) comes back with its own shape."""
    side = Side(daemon.socket, loop)
    key = side.key(404)
    obj = side.chunk(4, tokens=5)
    want = digest(obj)
    side.run(side.conn.put(key, obj))
    got = side.run(side.conn.get(key))
    assert got is not None
    # LMCache's reshape_partial_chunk sets the token count in get_shape() and get_size()
    # (its meta.shapes keeps the full chunk's, as with LMCache's own FS connector).
    assert list(got.get_shape()) == [2, 2, 5, 32] and got.get_size() == obj.get_size()
    assert digest(got) == want
    release(obj, got)
    side.close()


def test_second_instance_and_process_find_it(daemon, loop):
    a = Side(daemon.socket, loop)
    key = a.key(505)
    obj = a.chunk(5)
    want = digest(obj)
    a.run(a.conn.put(key, obj))
    a.close()
    b = Side(daemon.socket, loop)   # its own LocalCPUBackend, allocator and kvpool Client
    got = b.run(b.conn.get(key))
    assert got is not None and digest(got) == want
    release(obj, got)
    b.close()
    child = f"""
import asyncio, hashlib, sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
import test_lmcache_connector as t
lp = asyncio.new_event_loop()
import threading; threading.Thread(target=lp.run_forever, daemon=True).start()
s = t.Side({daemon.socket!r}, lp)
g = s.run(s.conn.get(s.key(505)))
print("DIGEST", None if g is None else t.digest(g))
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"DIGEST {want}" in out.stdout, out.stdout + out.stderr


def test_other_model_worker_dtype_namespace_miss(daemon, loop):
    side = Side(daemon.socket, loop)
    key = side.key(606)
    side.run(side.conn.put(key, side.chunk(6)))
    assert side.conn.exists_sync(key)
    for other in (side.key(606, model="org/other@rev1"), side.key(606, world_size=2),
                  side.key(606, worker_id=1), side.key(606, dtype=torch.bfloat16),
                  side.key(607)):
        assert side.conn.exists_sync(other) is False
        assert side.run(side.conn.get(other)) is None
    other_ns = Side(daemon.socket, loop, namespace="lmc-other")
    assert other_ns.conn.exists_sync(key) is False
    assert other_ns.run(other_ns.conn.get(key)) is None
    # The same engine key under another model's chunk layout (here: dtype) is another key.
    other_layout = Side(daemon.socket, loop)
    other_layout_meta = make_metadata(dtype=torch.float32)
    lcb = LocalCPUBackend(other_layout.config, other_layout_meta, dst_device="cpu")
    conn32 = KvpoolConnector(loop=loop, local_cpu_backend=lcb, config=other_layout.config)
    assert conn32.kvpool_keys(key) != side.conn.kvpool_keys(key)
    assert conn32.exists_sync(key) is False
    for s in (side, other_ns, other_layout):
        s.close()


def _raw_put(daemon, conn, key, header: bytes, data: bytes) -> None:
    hk, dk = conn.kvpool_keys(key)
    with kvpool.Client(daemon.socket, namespace="lmc-test") as c:
        assert c.put([dk, hk], [data, header]).all_ok()


def test_mismatched_or_corrupt_header_is_a_miss(daemon, loop, caplog):
    side = Side(daemon.socket, loop)
    good = side.chunk(7)
    data = bytes(good.byte_array)
    shapes, dtypes = good.get_shapes(), good.get_dtypes()
    fmt = MemoryFormat.KV_2LTD
    bad_shape = [torch.Size([2, 2, CHUNK, 64])]   # another model's hidden size
    cases = {
        701: b"XXXXXXXX" + RemoteMetadata(len(data), shapes, dtypes, fmt).serialize(),
        702: b"KVPLMC01" + RemoteMetadata(len(data), bad_shape, dtypes, fmt).serialize(),
        703: b"KVPLMC01" + RemoteMetadata(len(data), shapes, [torch.bfloat16], fmt).serialize(),
        704: b"KVPLMC01" + RemoteMetadata(len(data) - 2, shapes, dtypes, fmt).serialize(),
        705: b"KVPLMC01",                                   # truncated header
    }
    caplog.set_level(logging.WARNING, logger="kvpool.lmcache")
    for h, header in cases.items():
        _raw_put(daemon, side.conn, side.key(h), header, data)
        assert side.conn.exists_sync(side.key(h))       # present in kvpool ...
        assert side.run(side.conn.get(side.key(h))) is None, h   # ... but refused
    assert sum("header does not match" in r.getMessage() for r in caplog.records) == len(cases)
    # A right header over a data block of another size is refused too.
    _raw_put(daemon, side.conn, side.key(706),
             b"KVPLMC01" + RemoteMetadata(len(data), shapes, dtypes, fmt).serialize(),
             data[:-64])
    assert side.run(side.conn.get(side.key(706))) is None
    # The refused gets gave their buffers back: a good chunk still allocates and round trips.
    _raw_put(daemon, side.conn, side.key(707),
             b"KVPLMC01" + RemoteMetadata(len(data), shapes, dtypes, fmt).serialize(), data)
    got = side.run(side.conn.get(side.key(707)))
    assert got is not None and bytes(got.byte_array) == data
    release(good, got)
    side.close()


def test_daemon_killed_is_a_miss_and_recovers(loop, caplog):
    caplog.set_level(logging.WARNING, logger="kvpool.lmcache")
    with kvpool.testing.Daemon() as d:
        side = Side(d.socket, loop)
        key = side.key(808)
        side.run(side.conn.put(key, side.chunk(8)))
        assert side.conn.exists_sync(key)
        # Kill it while a batch of puts and gets is in flight: each call must finish as a
        # stored chunk, a skipped put or a miss, never an exception.
        keys = [side.key(900 + i) for i in range(24)]
        objs = [side.chunk(90 + i) for i in range(24)]
        fut_put = asyncio.run_coroutine_threadsafe(side.conn.batched_put(keys, objs), loop)
        fut_get = asyncio.run_coroutine_threadsafe(side.conn.batched_get(keys + [key]), loop)
        d.kill()
        assert fut_put.result(60) is None
        inflight = fut_get.result(60)
        assert all(g is None or g.get_size() == 4096 for g in inflight)
        release(*inflight)
        # Down: misses and skipped puts, no exceptions.
        assert side.conn.exists_sync(key) is False
        assert side.run(side.conn.exists(key)) is False
        assert side.run(side.conn.get(key)) is None
        assert side.conn.batched_contains([key]) == 0
        side.run(side.conn.put(side.key(809), side.chunk(9)))
        assert any("failed" in r.getMessage() for r in caplog.records
                   if r.name == "kvpool.lmcache" and r.levelno == logging.WARNING)
        # Back: the same connector works again without being rebuilt.
        d.start()
        key2 = side.key(810)
        obj = side.chunk(10)
        want = digest(obj)
        side.run(side.conn.put(key2, obj))
        got = side.run(side.conn.get(key2))
        assert got is not None and digest(got) == want
        assert side.conn.exists_sync(key2) is True
        release(*objs, obj, got)
        side.close()


def stall_clock(monkeypatch) -> list:
    """The adapters' StallGuard clock, made the test's: [now] in seconds, moved by the test."""
    now = [1000.0]
    monkeypatch.setattr(kvpool._outage, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    return now


class CountingClient:
    """A kvpool client that counts its lookups."""

    def __init__(self, client):
        self.client, self.lookups = client, 0

    def lookup(self, *args, **kwargs):
        self.lookups += 1
        return self.client.lookup(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_a_stalled_daemon_costs_one_timeout_then_lookups_miss_without_asking(loop, monkeypatch):
    # LMCache asks from vLLM's scheduling loop: a stopped daemon must not cost each ask its
    # timeout. (The guard's clock is the test's.)
    now = stall_clock(monkeypatch)
    with kvpool.testing.Daemon() as d:
        side = Side(d.socket, loop)
        side.conn.timeout = 0.3
        key = side.key(811)
        obj = side.chunk(11)
        side.run(side.conn.put(key, obj))
        counting = CountingClient(side.conn._get_client())
        side.conn._client = counting
        assert side.conn.batched_contains([key]) == 1
        d.pause()
        try:
            assert side.conn.batched_contains([key]) == 0      # by its deadline
            assert counting.lookups == 2
            for _ in range(50):                                # held back: kvpool not asked
                assert side.conn.batched_contains([key]) == 0
                assert side.conn.exists_sync(key) is False
            assert counting.lookups == 2
            now[0] += 0.6                                      # one try after 0.5 s
            assert side.conn.batched_contains([key]) == 0
            assert counting.lookups == 3
        finally:
            d.resume()
        now[0] += 1.1                                          # past the doubled window
        assert side.conn.batched_contains([key]) == 1
        assert counting.lookups == 4
        release(obj)
        side.close()


def test_a_get_past_its_deadline_is_a_miss(loop, monkeypatch):
    # A stopped daemon (alive, answering nothing): gets end in DeadlineExceeded inside the
    # connector and reach LMCache as misses; puts are skipped; nothing raises.
    now = stall_clock(monkeypatch)
    with kvpool.testing.Daemon() as d:
        side = Side(d.socket, loop)
        side.conn.timeout = 0.3
        keys = [side.key(820 + i) for i in range(3)]
        objs = [side.chunk(20 + i) for i in range(3)]
        side.run(side.conn.batched_put(keys, objs))
        d.pause()
        try:
            assert side.run(side.conn.get(keys[0])) is None          # by its deadline
            now[0] += 1.0
            assert side.run(side.conn.batched_get(keys)) == [None] * 3
            now[0] += 5.0
            side.run(side.conn.put(side.key(830), side.chunk(30)))   # skipped, no exception
        finally:
            d.resume()
        now[0] += 60.0
        got = side.run(side.conn.get(keys[1]))
        assert got is not None and digest(got) == digest(objs[1])
        release(*objs, got)
        side.close()
