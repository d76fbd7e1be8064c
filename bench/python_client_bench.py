#!/usr/bin/env python3
"""Cost of the Python binding: get_into of 64 blocks of 1 MiB through kvpool.Client against the
same get through the C client library (libkvpool.so's kvpool_get, via ctypes: one call for the
batch, no Python per block), both on the shared-memory data path of one local kvpoold, and
against a numpy memcpy of the same 64 MiB measured in the same run (the machine's limit: a get
is at least one copy out of the arena).

    .venv/core/bin/python bench/python_client_bench.py [--blocks 64] [--block-mib 1] [--reps 30]

Needs KVPOOL_KVPOOLD (or build/daemon/kvpoold) and build/client/libkvpool.so (or KVPOOL_LIBKVPOOL).
Prints medians and the ratios; the binding's budget is to add no copy: python/C should be ~1.
The C client runs in a child process: libkvpool.so and kvpool._native cannot share one (both
register control.proto with the system libprotobuf).
"""

import argparse
import ctypes
import json
import os
import pathlib
import statistics
import subprocess
import sys

import numpy as np

from bench_timing import median_s   # bench/ is the script's directory

REPO = pathlib.Path(__file__).resolve().parents[1]


def load_lib():
    lib = ctypes.CDLL(os.environ.get("KVPOOL_LIBKVPOOL", str(REPO / "build/client/libkvpool.so")))
    lib.kvpool_connect.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                   ctypes.POINTER(ctypes.c_void_p)]
    lib.kvpool_get.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                               ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                               ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
    lib.kvpool_close.argtypes = [ctypes.c_void_p]
    return lib


def c_child(socket, keys_hex, size, reps):
    """The C client's side, in its own process: libkvpool.so and kvpool._native each register
    the control.proto schema in the one libprotobuf, so they cannot share a process."""
    lib = load_lib()
    keys = [bytes.fromhex(k) for k in keys_hex.split(",")]
    n = len(keys)
    dst = np.zeros((n, size), np.uint8)
    cc = ctypes.c_void_p()
    assert lib.kvpool_connect(socket.encode(), b"bench", 10000, ctypes.byref(cc)) == 0
    key_bytes = b"".join(keys)
    ptrs = (ctypes.c_void_p * n)(*[dst[i].ctypes.data for i in range(n)])
    caps = (ctypes.c_size_t * n)(*([size] * n))
    sizes = (ctypes.c_size_t * n)()
    codes = (ctypes.c_int * n)()

    def c_get():
        assert lib.kvpool_get(cc, key_bytes, n, ptrs, caps, sizes, codes) == 0
        assert all(x == 0 for x in codes)

    t = median_s(c_get, reps)
    lib.kvpool_close(cc)
    print(json.dumps({"median_s": t, "checksum": int(dst[:, ::4096].sum())}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-mib", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--c-child", nargs=2, metavar=("SOCKET", "KEYS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    size = int(a.block_mib * 1024 * 1024)
    n = a.blocks
    if a.c_child:
        return c_child(a.c_child[0], a.c_child[1], size, a.reps)
    import kvpool
    from kvpool.testing import Daemon

    os.environ.setdefault("KVPOOL_KVPOOLD", str(REPO / "build/daemon/kvpoold"))
    with Daemon(["--host_capacity=1GiB", "--host_segment_size=64MiB"]) as d:
        c = kvpool.Client(d.socket, namespace="bench")
        assert c.server["shared_memory"]
        keys = kvpool.hash_chain(np.arange(n * 16, dtype=np.int32), secret="bench",
                                 layout="bench", tokens_per_block=16)
        rng = np.random.default_rng(0)
        src = [rng.integers(0, 256, size, dtype=np.uint8) for _ in range(n)]
        assert c.put(keys, src).all_ok()
        dst = np.zeros((n, size), np.uint8)
        rows = [dst[i] for i in range(n)]

        def py_get():
            res = c.get_into(keys, rows)
            assert all(r.ok for r in res)

        flat_src = np.concatenate(src)
        flat_dst = np.empty_like(flat_src)

        def memcpy():
            np.copyto(flat_dst, flat_src)

        child = [sys.executable, __file__, "--blocks", str(n), "--block-mib", str(a.block_mib),
                 "--reps", str(a.reps), "--c-child", d.socket, ",".join(k.hex() for k in keys)]
        # Interleaved rounds so drift on a shared machine hits all three alike.
        t_py, t_c, t_mc = [], [], []
        for _ in range(3):
            t_py.append(median_s(py_get, a.reps))
            out = json.loads(subprocess.run(child, check=True, capture_output=True,
                                            text=True).stdout)
            assert out["checksum"] == int(dst[:, ::4096].sum())  # same bytes in both
            t_c.append(out["median_s"])
            t_mc.append(median_s(memcpy, a.reps))
        np.testing.assert_array_equal(dst[n - 1], src[n - 1])
        c.close()
    py, cl, mc = statistics.median(t_py), statistics.median(t_c), statistics.median(t_mc)
    mib = n * size / 2**20
    print(f"get_into {n} x {size / 2**20:g} MiB ({mib:g} MiB), shared-memory path, median of "
          f"{a.reps} x 3 rounds")
    print(f"  python kvpool.Client.get_into  {py * 1e3:8.2f} ms  {mib / 1024 / py:6.2f} GiB/s")
    print(f"  C client (kvpool_get)          {cl * 1e3:8.2f} ms  {mib / 1024 / cl:6.2f} GiB/s")
    print(f"  numpy memcpy of the same bytes {mc * 1e3:8.2f} ms  {mib / 1024 / mc:6.2f} GiB/s")
    print(f"  python / C = {py / cl:.3f}   python / memcpy = {py / mc:.3f}   "
          f"C / memcpy = {cl / mc:.3f}")


if __name__ == "__main__":
    main()
