"""Client.borrow against a real kvpoold: blocks lent in place, read by numpy and by
kvpool.kernels without a copy, leases released on leaving the with block."""

import time

import numpy as np
import pytest

import kvpool
import kvpool.kernels as K

SIZE = 64 * 1024


def _blocks(n, seed, size=SIZE):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]


def _leases(client):
    return client.stats()["leases_active"]


def _wait_leases(client, n, timeout=10.0):
    end = time.monotonic() + timeout
    while _leases(client) != n and time.monotonic() < end:
        time.sleep(0.02)
    return _leases(client)


def test_borrow_lends_each_block_and_reports_misses(client, make_keys):
    keys = make_keys(5)
    blocks = _blocks(4, 11)
    assert client.put(keys[:4], blocks).all_ok()
    shm = client.server["shared_memory"]
    with client.borrow(keys) as lent:
        assert len(lent) == 5 and not lent.released
        for i in range(4):
            v = lent[i]
            assert v.ok and v.code == "OK" and v.size == SIZE and v.tier == "host"
            assert v.device == "cpu" and v.data_ptr != 0
            arr = v.numpy()
            assert arr.dtype == np.uint8 and arr.shape == (SIZE,) and not arr.flags.writeable
            np.testing.assert_array_equal(arr, blocks[i])
        miss = lent[-1]
        assert not miss.ok and miss.code == "NotFound" and miss.size == 0 and miss.tier is None
        with pytest.raises(kvpool.NotFound):
            miss.numpy()
        with pytest.raises(IndexError):
            lent[5]
        with pytest.raises(AttributeError):
            lent[0].__cuda_array_interface__
        if shm:
            # The daemon's own copies, leased: a second borrow sees the same address.
            assert _leases(client) == 4
            with client.borrow(keys[:1]) as again:
                assert again[0].data_ptr == lent[0].data_ptr
            assert lent.lease_seconds_left > 0
        lent.verify()
        kept = lent[2].numpy()
    assert lent.released
    assert _wait_leases(client, 0) == 0
    # The array keeps the memory mapped; nothing reused the slot, so the bytes are still there.
    np.testing.assert_array_equal(kept, blocks[2])
    lent.release()  # idempotent


def test_borrowed_views_scatter_into_a_paged_cache(client, make_keys):
    # The engine's in-place read: kvpool.kernels.scatter_paged straight from the lent views.
    L, H, D, T = 2, 2, 16, 8
    lay = K.BlockLayout(num_layers=L, num_kv_heads=H, head_dim=D, tokens=T, dtype="fp16")
    n, pages, page_size = 3, 6, T
    rng = np.random.default_rng(5)
    payloads = [rng.standard_normal(lay.raw_bytes // 2).astype(np.float16) for _ in range(n)]
    keys = make_keys(n)
    assert client.put(keys, payloads).all_ok()
    table = np.array([4, 0, 5], np.int32)

    def scatter(sources):
        k = [np.zeros((pages, page_size, H, D), np.float16) for _ in range(L)]
        v = [np.zeros((pages, page_size, H, D), np.float16) for _ in range(L)]
        K.scatter_paged(k, v, table, sources, lay)
        return k, v

    want = scatter(payloads)
    with client.borrow(keys) as lent:
        got = scatter([lent[i].numpy() for i in range(n)])
    for a, b in zip(want[0] + want[1], got[0] + got[1]):
        np.testing.assert_array_equal(a, b)
    assert any(a.any() for a in got[0])


def test_borrow_without_a_gpu_fails_cleanly(client, make_keys):
    keys = make_keys(1)
    client.put(keys, _blocks(1, 3))
    with pytest.raises((kvpool.Unavailable, kvpool.InvalidArgument)):
        client.borrow(keys, gpu_device=0)
    with client.borrow(keys, verify=False) as lent:
        assert lent[0].ok
    assert _wait_leases(client, 0) == 0


def test_a_borrow_outlives_its_client(daemon, make_keys):
    keys = make_keys(2)
    blocks = _blocks(2, 9)
    c = kvpool.Client(daemon.socket, namespace="test", data_path="shm")
    c.put(keys, blocks)
    lent = c.borrow(keys)
    c.close()  # the leases end with the connection; the views stay mapped
    np.testing.assert_array_equal(lent[1].numpy(), blocks[1])
    lent.release()
    del c
    arr = lent[0].numpy()
    del lent
    np.testing.assert_array_equal(arr, blocks[0])
