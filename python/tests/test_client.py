"""kvpool.Client against a real kvpoold, over the socket and shared-memory data paths."""

import numpy as np
import pytest

import kvpool
from kvpool.testing import Daemon

SIZE = 64 * 1024


def _blocks(n, seed, size=SIZE):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]


def test_server_reports_the_data_path(client):
    path = client.server
    assert path["max_block_bytes"] > 0 and path["namespace"] == "test"
    assert path["shared_memory"] in (True, False)


def test_round_trip_numpy(client, make_keys):
    keys = make_keys(4)
    blocks = _blocks(4, 1)
    r = client.put(keys, blocks)
    assert (r.stored, r.already_present, r.all_ok()) == (4, 0, True)
    assert r.errors == [None] * 4
    hit = client.lookup(keys)
    assert hit.hit_blocks == 4 and hit.tiers == ["host"] * 4
    out = [np.zeros(SIZE, np.uint8) for _ in keys]
    res = client.get_into(keys, out)
    assert [g.ok for g in res] == [True] * 4 and [g.size for g in res] == [SIZE] * 4
    assert all(g.tier == "host" and g.code == "OK" for g in res)
    for o, b in zip(out, blocks):
        np.testing.assert_array_equal(o, b)
    # Put-if-absent: a second put sends nothing.
    again = client.put(keys, blocks)
    assert (again.stored, again.already_present) == (0, 4)


def test_round_trip_bytearray_memoryview_and_typed_arrays(client, make_keys):
    keys = make_keys(3)
    payload = [bytes(range(256)) * 16, bytearray(b"\x07" * 4096),
               np.arange(1024, dtype=np.float32)]  # any dtype: the bytes are what is stored
    assert client.put(keys, [payload[0], memoryview(payload[1]), payload[2]]).stored == 3
    out = [bytearray(4096), np.empty((32, 32), np.float32), np.empty(4096, np.uint8)]
    res = client.get_into(keys, [memoryview(out[0]), out[2], out[1]])
    assert all(res)
    assert bytes(out[0]) == payload[0]
    assert out[2].tobytes() == bytes(payload[1])
    np.testing.assert_array_equal(out[1].ravel(), payload[2])
    assert client.get(keys) == [payload[0], bytes(payload[1]), payload[2].tobytes()]


def test_get_into_writes_the_callers_array_in_place(client, make_keys):
    keys = make_keys(2)
    blocks = _blocks(2, 2)
    client.put(keys, blocks)
    big = np.zeros((2, SIZE), np.uint8)  # one array, two row views: no copy may intervene
    addr = big.__array_interface__["data"][0]
    res = client.get_into(keys, [big[0], big[1]])
    assert all(res)
    assert big.__array_interface__["data"][0] == addr
    np.testing.assert_array_equal(big[0], blocks[0])
    np.testing.assert_array_equal(big[1], blocks[1])


def test_put_from_read_only_buffers(client, make_keys):
    keys = make_keys(2)
    ro = np.frombuffer(bytes(range(200)) * 10, dtype=np.uint8)  # a read-only numpy array
    assert not ro.flags.writeable
    r = client.put(keys, [ro, b"immutable bytes" * 100])
    assert r.stored == 2
    assert client.get(keys) == [ro.tobytes(), b"immutable bytes" * 100]


def test_misses_and_a_too_small_buffer_are_per_block(client, make_keys):
    keys = make_keys(3)
    client.put(keys[:2], _blocks(2, 3))
    res = client.get_into(keys, [bytearray(SIZE), bytearray(10), bytearray(SIZE)])
    assert res[0].ok
    assert not res[1].ok and res[1].code == "InvalidArgument" and res[1].size == 0
    assert not res[2].ok and res[2].code == "NotFound" and res[2].tier is None
    assert client.get(keys[2:]) == [None]
    assert client.lookup(keys).hit_blocks == 2


def test_wrong_types_and_shapes(client, make_keys):
    keys = make_keys(2)
    with pytest.raises(TypeError):
        client.lookup("not keys")
    with pytest.raises(TypeError):
        client.lookup([1, 2])
    with pytest.raises(kvpool.InvalidArgument):
        client.lookup([b"short"])
    with pytest.raises(TypeError):
        client.put(keys, [object(), b"x"])
    with pytest.raises(kvpool.InvalidArgument):  # counts differ
        client.put(keys, [b"x"])
    with pytest.raises(kvpool.InvalidArgument):  # bytes cannot be written into
        client.get_into(keys, [b"\0" * SIZE, bytearray(SIZE)])
    with pytest.raises(kvpool.InvalidArgument):  # not contiguous
        client.get_into(keys[:1], [np.zeros((SIZE, 2), np.uint8)[:, 0]])
    with pytest.raises(kvpool.InvalidArgument):
        kvpool.Client("/nonexistent", data_path="carrier-pigeon")


def test_prefetch_evict_and_stats(client, make_keys):
    keys = make_keys(3)
    client.put(keys, _blocks(3, 4))
    before = client.stats()
    ev = client.evict("host", keys)
    assert ev["evicted"] + ev["skipped"] == 3
    assert client.prefetch(keys) >= 0
    client.lookup(keys)  # counted in stats whatever ran before
    stats = client.stats()
    assert isinstance(stats, dict)
    assert stats["version"] and stats["node_id"] and stats["cluster_state"] == "standalone"
    assert {t["name"] for t in stats["tiers"]} >= {"host", "disk"}
    # The fields of `kvpool stats --json` (client/stats_json.cc), segment renewals included.
    host = next(t for t in stats["tiers"] if t["name"] == "host")
    fields = {"moves", "renewals", "renewals_from_standby", "standby_ready", "peer_hits"}
    assert fields <= host.keys()
    assert stats["puts_committed"] >= before["puts_committed"]
    assert stats["lookups"] >= 1 and isinstance(stats["dedup_ratio"], float)
    out = [bytearray(SIZE) for _ in keys]
    assert all(client.get_into(keys, out))  # from disk or promoted back: the same bytes
    assert client.cluster()["state"] == "standalone"


def test_gpu_asks_without_a_gpu_fail_cleanly(client, make_keys):
    # A daemon without a gpu tier, a process without CUDA: the gpu hint and gpu eviction are
    # errors or no-ops with a reason, never a crash, and the connection stays usable.
    keys = make_keys(2)
    client.put(keys, _blocks(2, 5))
    assert client.gpu_tier(0) is None   # what an engine asks before passing gpu_device
    with pytest.raises((kvpool.Unavailable, kvpool.InvalidArgument, kvpool.Unimplemented)):
        client.prefetch(keys, gpu_device=0)
    with pytest.raises((kvpool.Unavailable, kvpool.InvalidArgument)):
        client.put(make_keys(1), _blocks(1, 6), gpu_device=0)
    client.save_session("gpu-less", keys, token_count=32)
    with pytest.raises((kvpool.Unavailable, kvpool.InvalidArgument)):
        client.load_session("gpu-less", gpu_device=0)
    assert client.evict("gpu", keys) == {"evicted": 0, "skipped": 0}
    with pytest.raises(kvpool.InvalidArgument):
        client.evict("tpu", keys)
    assert client.server["shared_memory"] in (True, False)
    out = [bytearray(SIZE) for _ in keys]
    assert all(client.get_into(keys, out))


def test_locate_on_a_standalone_daemon(client, make_keys):
    keys = make_keys(6)
    client.put(keys[:4], _blocks(4, 5))
    (node,) = client.locate(keys)
    assert node["self"] is True and node["error"] is None and node["node_id"]
    assert node["control_address"] == ""
    assert node["hit_blocks"] == 4 and node["tiers"] == ["host"] * 4
    with pytest.raises((TypeError, kvpool.InvalidArgument)):
        client.locate([b"short"])


def test_connect_to_a_missing_socket_is_unavailable(tmp_path):
    with pytest.raises(kvpool.Unavailable) as e:
        kvpool.Client(str(tmp_path / "none.sock"), timeout=2)
    assert e.value.code == "Unavailable" and "none.sock" in e.value.message
    assert isinstance(e.value, kvpool.Error)


def test_close_and_reconnect(daemon, make_keys):
    c = kvpool.Client(daemon.socket, namespace="test")
    c.close()
    assert c.closed
    with pytest.raises(kvpool.FailedPrecondition):
        c.lookup(make_keys(1))
    c.reconnect()
    assert c.lookup(make_keys(1)).hit_blocks == 0
    c.close()


def test_get_into_async_on_host_buffers_is_done_at_once(client, make_keys):
    keys = make_keys(3)
    blocks = _blocks(3, 21)
    client.put(keys, blocks)
    out = [np.zeros(SIZE, np.uint8) for _ in keys]
    pending = client.get_into_async(keys + make_keys(1), out + [np.zeros(SIZE, np.uint8)])
    assert isinstance(pending, kvpool.PendingGet)
    assert not pending.pending  # no CUDA buffers: nothing left running
    res = pending.wait()
    assert [r.ok for r in res] == [True, True, True, False] and res[3].code == "NotFound"
    for o, b in zip(out, blocks):
        np.testing.assert_array_equal(o, b)
    with pytest.raises(kvpool.FailedPrecondition):
        pending.wait()


def test_busy_polling_client_gets_every_answer(make_keys):
    # Both ends spin for each answer instead of sleeping; answers still arrive byte for byte.
    keys = make_keys(3)
    blocks = _blocks(3, 31)
    with Daemon(["--io_busy_poll_us=50"]) as daemon, \
            kvpool.Client(daemon.socket, namespace="test", busy_poll_us=50) as c:
        assert c.put(keys, blocks).all_ok()
        for _ in range(100):
            out = [np.zeros(SIZE, np.uint8) for _ in keys]
            assert [g.ok for g in c.get_into(keys, out)] == [True] * 3
            for o, b in zip(out, blocks):
                np.testing.assert_array_equal(o, b)
            assert c.lookup(keys + make_keys(1)).hit_blocks == 3
        with pytest.raises(kvpool.InvalidArgument):
            kvpool.Client(daemon.socket, namespace="test", busy_poll_us=-1)
