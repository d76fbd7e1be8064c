"""kvpool.sglang.KvpoolHiCacheStorage against SGLang 0.5.23's real HiCacheStorage base class and
config, a real kvpoold, and host pools over CPU tensors (host_pools.py says why not SGLang's)."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

import kvpool.sglang
from host_pools import MHAHostPool, MLAHostPool

EXTRA = {"backend_name": "kvpool", "module_path": "kvpool.sglang",
         "class_name": "KvpoolHiCacheStorage", "interface_v1": 1}


def config(daemon, tp_rank=0, tp_size=1, mla=False, model="org/tiny", **extra):
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=True,
        is_page_first_layout=True, model_name=model,
        extra_config={**EXTRA, "socket": daemon.socket, "namespace": "sgl-test",
                      "secret": "s", **extra})


def backend(daemon, pool, **kw):
    """Made as SGLang makes it: the factory's dynamic path, then register_mem_pool_host."""
    b = StorageBackendFactory.create_backend("dynamic", config(daemon, **kw), pool)
    assert isinstance(b, kvpool.sglang.KvpoolHiCacheStorage)
    assert isinstance(b, HiCacheStorage)
    b.register_mem_pool_host(pool)
    return b


def fill(pool, *pages, seed=0):
    g = torch.Generator().manual_seed(seed)
    for p in pages:
        idx = pool.indices(p)
        if isinstance(pool, MLAHostPool):
            pool.kv_buffer[idx] = torch.randn(pool.kv_buffer[idx].shape, generator=g).to(pool.dtype)
        elif pool.layout == "page_first":
            pool.kv_buffer[:, idx] = torch.randn(pool.kv_buffer[:, idx].shape,
                                                 generator=g).to(pool.dtype)
        else:
            pool.kv_buffer[:, :, idx] = torch.randn(pool.kv_buffer[:, :, idx].shape,
                                                    generator=g).to(pool.dtype)


def hashes(tag, n):
    import hashlib
    return [hashlib.sha256(f"{tag}/{i}".encode()).hexdigest() for i in range(n)]


def same(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_round_trip_into_other_pages(daemon, layout):
    pool = MHAHostPool(layout=layout)
    fill(pool, 1, 2, 3, seed=1)
    b = backend(daemon, pool)
    keys = hashes(f"rt-{layout}", 3)
    info = HiCacheStorageExtraInfo(prefix_keys=[])
    assert b.batch_set_v1(keys, pool.indices(1, 2, 3), info) == [True] * 3
    assert b.batch_exists(keys) == 3
    assert b.batch_get_v1(keys, pool.indices(5, 6, 7), info) == [True] * 3
    for src, dst in ((1, 5), (2, 6), (3, 7)):
        assert same(pool.page(src), pool.page(dst))
    assert not same(pool.page(1), pool.page(2))  # the pages differ, so the check can fail


def test_batch_exists_counts_consecutive_hits(daemon):
    pool = MHAHostPool()
    fill(pool, 0, 1, 2)
    b = backend(daemon, pool)
    k = hashes("exists", 5)
    assert b.batch_set_v1([k[0], k[1]], pool.indices(0, 1)) == [True, True]
    assert b.batch_set_v1([k[3]], pool.indices(2),
                          HiCacheStorageExtraInfo(prefix_keys=k[:3])) == [True]
    assert b.batch_exists(k) == 2            # k[2] missing: k[3] does not count
    assert b.batch_exists([k[2], k[0]]) == 0
    assert b.batch_exists([k[3]]) == 1
    assert b.exists(k[1]) and not b.exists(k[4])
    assert b.batch_get_v1(k[:3], pool.indices(4, 5, 6)) == [True, True, False]


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_a_missing_middle_page_is_false_and_its_buffer_untouched(daemon, layout):
    # layer_first pages are staged (several buffers a page): a page that failed must not be
    # copied out of the staging buffer into the host pool.
    pool = MHAHostPool(layout=layout)
    fill(pool, 0, 1, 2, 4, 5, 6, 7, seed=9)
    b = backend(daemon, pool)
    k = hashes(f"middle-{layout}", 4)
    assert b.batch_set_v1([k[0], k[1], k[3]], pool.indices(0, 1, 2)) == [True] * 3
    before = pool.page(6).clone()
    assert b.batch_get_v1(k, pool.indices(4, 5, 6, 7)) == [True, True, False, True]
    assert same(pool.page(4), pool.page(0)) and same(pool.page(5), pool.page(1))
    assert same(pool.page(7), pool.page(2))
    assert same(pool.page(6), before)          # the missing page's buffer as it was


def test_second_worker_finds_first_workers_pages(daemon):
    p1, p2 = MHAHostPool(), MHAHostPool()
    fill(p1, 0, 1, seed=2)
    b1, b2 = backend(daemon, p1), backend(daemon, p2)
    k = hashes("shared", 2)
    assert b1.batch_set_v1(k, p1.indices(0, 1)) == [True, True]
    assert b2.batch_exists(k) == 2
    assert b2.batch_get_v1(k, p2.indices(3, 4)) == [True, True]
    assert same(p1.page(0), p2.page(3)) and same(p1.page(1), p2.page(4))


@pytest.mark.parametrize("other", [
    dict(namespace="sgl-other"), dict(secret="other"), dict(model="org/other"),
    dict(tp_rank=1, tp_size=2), dict(model_id="org/tiny@rev2")])
def test_other_namespace_or_layout_does_not_hit(daemon, other):
    p1 = MHAHostPool()
    fill(p1, 0, seed=3)
    k = hashes(f"iso-{sorted(other)}", 1)
    assert backend(daemon, p1).batch_set_v1(k, p1.indices(0)) == [True]
    tp = {key: other.pop(key) for key in ("tp_rank", "tp_size", "model") if key in other}
    b2 = backend(daemon, MHAHostPool(), **tp, **other)
    assert b2.batch_exists(k) == 0
    assert b2.batch_get_v1(k, b2.mem_pool_host.indices(1)) == [False]
    assert backend(daemon, MHAHostPool()).batch_exists(k) == 1  # the same config does hit


@pytest.mark.parametrize("geometry", [dict(heads=4), dict(dtype=torch.float16),
                                      dict(page_size=8), dict(layers=2),
                                      dict(layout="layer_first")])
def test_other_pool_geometry_does_not_hit(daemon, geometry):
    p1 = MHAHostPool()
    fill(p1, 0, seed=4)
    k = hashes(f"geo-{sorted(geometry)}", 1)
    assert backend(daemon, p1).batch_set_v1(k, p1.indices(0)) == [True]
    assert backend(daemon, MHAHostPool(**geometry)).batch_exists(k) == 0


def test_mla_single_buffer_pages_and_one_writer(daemon):
    writer_pool, reader_pool = MLAHostPool(), MLAHostPool()
    fill(writer_pool, 0, 1, seed=5)
    k = hashes("mla", 2)
    # A non-writer TP rank reports success without storing (rank 0 writes MLA's replicas).
    other = backend(daemon, writer_pool, mla=True, tp_rank=1, tp_size=2)
    assert other.batch_set_v1(k, writer_pool.indices(0, 1)) == [True, True]
    assert other.batch_exists(k) == 0
    writer = backend(daemon, writer_pool, mla=True, tp_rank=0, tp_size=2)
    assert writer.batch_set_v1(k, writer_pool.indices(0, 1)) == [True, True]
    # Every TP rank reads the same blocks.
    reader = backend(daemon, reader_pool, mla=True, tp_rank=1, tp_size=2)
    assert reader.batch_exists(k) == 2
    assert reader.batch_get_v1(k, reader_pool.indices(2, 3)) == [True, True]
    assert same(writer_pool.page(0), reader_pool.page(2))
    assert same(writer_pool.page(1), reader_pool.page(3))


def test_legacy_get_set_and_stats(daemon):
    pool = MHAHostPool()
    fill(pool, 0, 1, seed=6)
    b = backend(daemon, pool)
    k = hashes("legacy", 2)
    pages = [pool.get_data_page(i * pool.page_size) for i in range(2)]
    assert b.batch_set(k, pages)
    out = [pool.get_dummy_flat_data_page() for _ in k]
    got = b.batch_get(k, out)
    assert got[0] is out[0] and same(out[0], pages[0]) and same(out[1], pages[1])
    assert b.set(hashes("legacy1", 1)[0], pages[1])
    one = pool.get_dummy_flat_data_page()
    assert b.get(hashes("legacy1", 1)[0], one) is one and same(one, pages[1])
    assert b.get(hashes("legacy-miss", 1)[0], pool.get_dummy_flat_data_page()) is None
    # The flat data page and the v1 page buffers are different byte orders: different keys.
    assert b.batch_exists(k) == 0
    b.batch_set_v1(k, pool.indices(0, 1))
    stats = b.get_stats()
    assert stats.backup_pgs == [2] and len(stats.backup_bandwidth) == 1
    assert b.get_stats().backup_pgs == []


def test_without_interface_v1_exists_asks_for_the_flat_pages_it_stores(daemon):
    # SGLang moves flat data pages (batch_get / batch_set) when the extra config has no
    # interface_v1, and prefetches what batch_exists reports: it must find those pages.
    pool = MHAHostPool()
    fill(pool, 0, 1, seed=8)
    b = backend(daemon, pool, interface_v1=0)
    k = hashes("legacy-only", 2)
    pages = [pool.get_data_page(i * pool.page_size) for i in range(2)]
    assert b.batch_exists(k) == 0
    assert b.batch_set(k, pages)
    assert b.batch_exists(k) == 2
    out = [pool.get_dummy_flat_data_page() for _ in k]
    assert b.batch_get(k, out) == out and same(out[0], pages[0]) and same(out[1], pages[1])


def test_daemon_killed_is_a_miss_and_recovers(own_daemon, caplog):
    pool = MHAHostPool(pages=16)
    fill(pool, *range(8), seed=7)
    b = backend(own_daemon, pool)
    k = hashes("outage", 4)
    assert b.batch_set_v1(k, pool.indices(0, 1, 2, 3)) == [True] * 4
    own_daemon.kill()
    with caplog.at_level(logging.WARNING, logger="kvpool.sglang"):
        assert b.batch_exists(k) == 0
        assert b.exists(k[0]) is False
        assert b.batch_get_v1(k, pool.indices(8, 9, 10, 11)) == [False] * 4
        assert b.batch_set_v1(k, pool.indices(0, 1, 2, 3)) == [False] * 4
        assert b.get(k[0], pool.get_dummy_flat_data_page()) is None
        assert b.set(k[0], pool.get_data_page(0)) is False
    assert any(r.name == "kvpool.sglang" and r.levelno == logging.WARNING
               for r in caplog.records)
    own_daemon.start()
    k2 = hashes("outage-after", 4)
    assert b.batch_set_v1(k2, pool.indices(4, 5, 6, 7)) == [True] * 4
    assert b.batch_exists(k2) == 4
    assert b.batch_get_v1(k2, pool.indices(12, 13, 14, 15)) == [True] * 4
    assert same(pool.page(4), pool.page(12)) and same(pool.page(7), pool.page(15))


def test_daemon_killed_during_concurrent_batches(own_daemon):
    """SGLang's prefetch and backup threads keep calling while the daemon dies: every call
    returns its bools (no exception escapes), and both threads work again after a restart."""
    pool = MHAHostPool(pages=16)
    fill(pool, *range(16), seed=8)
    b = backend(own_daemon, pool)
    errors, stop = [], threading.Event()

    def worker(tag, src, dst):
        n = 0
        while not stop.is_set():
            k = hashes(f"{tag}-{n}", len(src))
            try:
                r = b.batch_set_v1(k, pool.indices(*src))
                g = b.batch_get_v1(k, pool.indices(*dst))
                e = b.batch_exists(k)
                assert len(r) == len(g) == len(src) and 0 <= e <= len(src)
            except BaseException as exc:  # noqa: BLE001 - the test's point
                errors.append(exc)
                return
            n += 1

    threads = [threading.Thread(target=worker, args=("a", (0, 1, 2), (8, 9, 10))),
               threading.Thread(target=worker, args=("b", (3, 4), (11, 12)))]
    for t in threads:
        t.start()
    try:
        assert b.batch_set_v1(hashes("probe", 1), pool.indices(5)) == [True]
        own_daemon.kill()
        assert b.batch_exists(hashes("probe", 1)) == 0
        own_daemon.start()
        probe = hashes("probe2", 1)
        assert b.batch_set_v1(probe, pool.indices(5)) == [True]
        assert b.batch_get_v1(probe, pool.indices(13)) == [True]
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert same(pool.page(5), pool.page(13))


def test_an_unexpected_exception_is_a_miss_not_raised(daemon, caplog, monkeypatch):
    """Page meta the backend did not expect (here one buffer too few) fails inside it: SGLang's
    threads get misses, never the exception, and a working call after it is served."""
    pool = MHAHostPool(pages=8)
    fill(pool, 0, 1, seed=11)
    b = backend(daemon, pool)
    k = hashes("unexpected", 2)
    assert b.batch_set_v1(k, pool.indices(0, 1)) == [True] * 2
    real = pool.get_page_buffer_meta

    def short_meta(indices):
        ptrs, sizes = real(indices)
        return ptrs[:-1], sizes[:-1]

    monkeypatch.setattr(pool, "get_page_buffer_meta", short_meta)
    with caplog.at_level(logging.ERROR, logger="kvpool.sglang"):
        assert b.batch_get_v1(k, pool.indices(2, 3)) == [False] * 2
        assert b.batch_set_v1(hashes("unexpected-set", 2), pool.indices(0, 1)) == [False] * 2
    assert any("answered as a miss" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(pool, "get_page_buffer_meta", real)
    assert b.batch_get_v1(k, pool.indices(2, 3)) == [True] * 2
    assert same(pool.page(0), pool.page(2)) and same(pool.page(1), pool.page(3))
