#!/usr/bin/env python3
"""kvpool beside Mooncake Store, same node, same run: put and get of 16 blocks a call.

    scripts/python_env.sh mooncake          # .venv/mooncake: the Mooncake wheel, numpy, kvpool
    .venv/mooncake/bin/python bench/mooncake_bench.py [--blocks-per-call 16] [--block-mib 1]
        [--working-set-mib 256] [--calls 128] [--json]

Each figure is one (system, path, op); one call of --blocks-per-call blocks is one sample.

- mooncake tcp put, get: Mooncake Store (PyPI `mooncake-transfer-engine-non-cuda`) through its
  zero-copy API, `batch_put_from` / `batch_get_into` from and into buffers the client registered
  (`register_buffer`), by a client in this process that contributes no segment: every byte lives
  in the global segment of the store process and crosses Mooncake's tcp transport over loopback,
  besides the master's PutStart/PutEnd and replica-list RPCs.
- mooncake standalone-shm put, get: the same calls by a "dummy" client (`setup_dummy`) of the
  same store process, Mooncake's own same-node mode: the caller's buffers must be allocated from
  a shared-memory pool the store process maps (`alloc_from_mem_pool`), and the store process
  copies between that pool and its segment.
- mooncake local-segment put, get: the same calls by a client that holds the data in its own
  global segment (`ReplicateConfig.preferred_segment` = itself), served with an in-process
  memcpy (its log: "TCP-only environment, memcpy enabled"): Mooncake's in-process fast path.
- kvpool shm put, get: `kvpool.Client(data_path="shm")` against kvpoold in its own process: one
  copy into / out of the daemon's shared-memory arena, control over a Unix socket.
- memcpy memory copy: one numpy copy of the same bytes a call, the machine's limit (a put or a
  get moves each byte at least once).

Put offers fresh keys only (a repeated key is free in both stores), so each round writes the
working set under new keys, reads it back in order, then removes it (untimed: Mooncake
`batch_remove(force=True)`, kvpool `evict("disk")`, which drops a block from the cache). Rounds
interleave the systems, so drift on a shared machine hits all alike. After each round's puts the
last key's replica is checked to be in the segment the path names. Every get is compared byte
for byte with what was put: each block is random, with the round and block number stamped into
every 4 KiB page, and the destination's pages are poisoned before each get.

GB/s is 1e9 bytes of a call over the median call time; p50/p99 are nearest-rank over every call.
Each line carries ratio_to_memcpy; each kvpool line ratio_to_mooncake_best (the faster Mooncake
path for the same op, named in mooncake_best_path) and ratio_to_mooncake_<path> for each path.

The processes it starts, all on 127.0.0.1 with free ports, all stopped at the end:

    mooncake_master --rpc_address=127.0.0.1 --rpc_port=R --enable_http_metadata_server=true
        --http_metadata_server_host=127.0.0.1 --http_metadata_server_port=H
        --metrics_host=127.0.0.1 --metrics_port=M --logtostderr
    mooncake_client --host=127.0.0.1 --port=C --global_segment_size=<2 x working set>MB
        --master_server_address=127.0.0.1:R --metadata_server=http://127.0.0.1:H/metadata
        --protocol=tcp                      (the store process; its segment is found through
                                             the master's GET /get_all_segments on port M)
    kvpoold (kvpool.testing.Daemon) on a temporary Unix socket, host tier 2 x working set

What is not comparable:
- tcp moves every byte through loopback TCP (a kernel copy each way); kvpool's shm path copies
  once through shared memory. The difference is each design's answer for a same-node peer,
  which is what this bench sets side by side, not a tuning gap.
- standalone-shm reads and writes only buffers inside Mooncake's pool: a caller whose data
  lives elsewhere (a tensor, a numpy array) copies it in or out itself, a copy not counted here;
  kvpool's get_into and put take any buffer.
- local-segment keeps the data in the caller's own process: nothing else on the node reads it
  without the tcp transport, and it goes when the process goes. kvpool has no such mode (the
  daemon holds the blocks); it is Mooncake's best case, not a like-for-like peer.
- kvpool hashes every block on put (the client, while it copies) and checks it on get; Mooncake
  does neither.
- Mooncake's RDMA transport is not measured: no RDMA device here.
Without the Mooncake wheel (any other venv) it says so on one line and measures kvpool and
memcpy alone. Mooncake's log goes to stderr at MC_LOG_LEVEL=ERROR; each client's setup logs
one expected "metadata not found" (its first look-up of its own segment).
"""

import argparse
import contextlib
import ctypes
import importlib.metadata
import json
import math
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"
PAGE = 4096
MOONCAKE_WHEEL = "mooncake-transfer-engine-non-cuda"
# Read by Mooncake at import and setup, here and in its processes: INFO logs off; its tcp
# transport bound to loopback (in 0.3.13.post1 its listeners still bind every interface, but
# every address it is given is 127.0.0.1, so no byte leaves the host).
MOONCAKE_ENV = {"MC_LOG_LEVEL": "ERROR", "MC_TCP_BIND_ADDRESS": LOOPBACK}


def die_with_parent():
    """preexec_fn: the child gets SIGKILL when the bench dies, even by SIGKILL."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_ports(n):
    """n distinct free loopback ports (held together while chosen)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((LOOPBACK, 0))
        return [s.getsockname()[1] for s in socks]


def read_tail(path, chars=4000):
    try:
        return pathlib.Path(path).read_text(errors="replace")[-chars:]
    except FileNotFoundError:
        return ""


def wait_until(ready, proc, what, log, timeout=30.0):
    """Polls ready() until true; raises if `proc` exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{read_tail(log)}")
        with contextlib.suppress(OSError):
            if ready():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within {timeout} s:\n{read_tail(log)}")
        time.sleep(0.05)


def listening(port):
    socket.create_connection((LOOPBACK, port), timeout=1).close()
    return True


def stop(proc, timeout=10.0):
    """SIGTERM, then SIGKILL if it does not go."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- Mooncake ---------------------------------------------------------------------------------

class MooncakeCluster:
    """mooncake_master (with its embedded HTTP metadata server) and the store process
    (mooncake_client) contributing one global segment of `segment_bytes`."""

    def __init__(self, tmp, segment_bytes):
        self.tmp = pathlib.Path(tmp)
        bin_dir = pathlib.Path(sys.executable).parent  # the venv's console scripts
        rpc, http, metrics, store = free_ports(4)
        self.ports = {"rpc": rpc, "http": http, "metrics": metrics, "store": store}
        self.master_addr = f"{LOOPBACK}:{rpc}"
        self.metadata_url = f"http://{LOOPBACK}:{http}/metadata"
        self.store_addr = f"{LOOPBACK}:{store}"
        self.master_cmd = [
            str(bin_dir / "mooncake_master"), f"--rpc_address={LOOPBACK}", f"--rpc_port={rpc}",
            "--enable_http_metadata_server=true", f"--http_metadata_server_host={LOOPBACK}",
            f"--http_metadata_server_port={http}", f"--metrics_host={LOOPBACK}",
            f"--metrics_port={metrics}", "--logtostderr"]
        self.store_cmd = [
            str(bin_dir / "mooncake_client"), f"--host={LOOPBACK}", f"--port={store}",
            f"--global_segment_size={segment_bytes // 2**20}MB",
            f"--master_server_address={self.master_addr}",
            f"--metadata_server={self.metadata_url}", "--protocol=tcp"]
        self.master = self.store = None
        self.store_segment = None  # its name, "127.0.0.1:PORT" (the transfer engine's port)

    def start(self, cmd, name, ready):
        log = self.tmp / f"{name}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=f, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **MOONCAKE_ENV},
                                    preexec_fn=die_with_parent)
        try:
            wait_until(ready, proc, name, log)
        except BaseException:
            stop(proc)
            raise
        return proc

    def segments(self):
        url = f"http://{LOOPBACK}:{self.ports['metrics']}/get_all_segments"
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode().split()

    def __enter__(self):
        p = self.ports
        try:
            self.master = self.start(self.master_cmd, "mooncake_master",
                                     lambda: listening(p["rpc"]) and listening(p["http"])
                                     and listening(p["metrics"]))
            self.store = self.start(self.store_cmd, "mooncake_client",
                                    lambda: listening(p["store"]) and len(self.segments()) == 1)
            self.store_segment = self.segments()[0]
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for proc in (self.store, self.master):
            if proc:
                stop(proc)

    def client(self, segment_bytes):
        """A client in this process on tcp, contributing `segment_bytes` (0: none)."""
        from mooncake.store import MooncakeDistributedStore
        store = MooncakeDistributedStore()
        rc = store.setup({
            "local_hostname": LOOPBACK, "metadata_server": self.metadata_url,
            "master_server_addr": self.master_addr, "protocol": "tcp", "rdma_devices": "",
            "global_segment_size": segment_bytes,
            "local_buffer_size": 0,  # the bench registers its own buffers
        })
        if rc != 0:
            raise RuntimeError(f"mooncake setup: {rc}")
        return store

    def dummy_client(self, pool_bytes):
        """A client of the store process, with a shared-memory pool of `pool_bytes`."""
        from mooncake.store import MooncakeDistributedStore
        store = MooncakeDistributedStore()
        rc = store.setup_dummy(pool_bytes, 0, self.store_addr)
        if rc != 0:
            raise RuntimeError(f"mooncake setup_dummy: {rc}")
        return store


def pool_array(store, shape):
    """A uint8 array in a dummy client's shared-memory pool."""
    nbytes = math.prod(shape)
    addr = store.alloc_from_mem_pool(nbytes)
    if not addr:
        raise RuntimeError(f"mooncake alloc_from_mem_pool({nbytes}) failed")
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr)).reshape(shape)


class MooncakeTarget:
    """One Mooncake client, the segment its puts go to, and its own src and dst buffers
    (registered with it). `checker` answers replica queries (a dummy client cannot)."""

    system = "mooncake"

    def __init__(self, path, store, segment, src, dst, checker=None):
        from mooncake.store import ReplicateConfig
        self.path, self.store, self.segment = path, store, segment
        self.src, self.dst = src, dst
        self.checker = checker or store
        self.config = ReplicateConfig()
        self.config.replica_num = 1
        self.config.preferred_segment = segment  # a preference: check_placement checks it
        for buf in (src, dst):
            if store.register_buffer(buf.ctypes.data, buf.nbytes) != 0:
                raise RuntimeError(f"mooncake {path}: register_buffer failed")

    def names(self, keys):
        return [k.hex() for k in keys]  # Mooncake keys are strings

    def call_args(self, first, n):
        """Pointers and sizes of one call, made before it is timed."""
        block = self.src.shape[1]
        return ([self.src.ctypes.data + (first + i) * block for i in range(n)],
                [self.dst.ctypes.data + i * block for i in range(n)], [block] * n)

    def put(self, keys, args):
        codes = self.store.batch_put_from(keys, args[0], args[2], self.config)
        if any(codes):
            raise RuntimeError(f"mooncake {self.path} batch_put_from: {codes}")

    def get(self, keys, args):
        sizes = self.store.batch_get_into(keys, args[1], args[2])
        if sizes != args[2]:  # bytes read, or a negative error code, per key
            raise RuntimeError(f"mooncake {self.path} batch_get_into: {sizes}")

    def check_placement(self, key):
        """The label is true: the replica is in the segment the path names."""
        where = [r.get_memory_descriptor().buffer_descriptor.transport_endpoint
                 for r in self.checker.get_replica_desc(key) if r.is_memory_replica()]
        if where != [self.segment]:
            raise RuntimeError(f"mooncake {self.path}: {key} is in {where}, not {self.segment}")

    def drop(self, keys):
        codes = self.store.batch_remove(keys, True)
        if any(codes):
            raise RuntimeError(f"mooncake {self.path} batch_remove: {codes}")


# --- kvpool -----------------------------------------------------------------------------------

class KvpoolTarget:
    system, path = "kvpool", "shm"

    def __init__(self, client, src, dst):
        self.client = client
        self.src, self.dst = src, dst
        self.src_rows, self.dst_rows = list(src), list(dst)

    def names(self, keys):
        return keys

    def call_args(self, first, n):
        return self.src_rows[first:first + n], self.dst_rows[:n]

    def put(self, keys, args):
        r = self.client.put(keys, args[0])
        if r.stored != len(keys):  # fresh keys: anything else is a failure
            raise RuntimeError(f"kvpool put: {r} {r.errors}")

    def get(self, keys, args):
        for r in self.client.get_into(keys, args[1]):
            if not r.ok or r.tier != "host":
                raise RuntimeError(f"kvpool get_into: {r}")

    def check_placement(self, key):
        pass  # every get checks that it was served from the host tier

    def drop(self, keys):
        r = self.client.evict("disk", keys)  # "disk": out of the cache, not demoted
        if r["evicted"] != len(keys):
            raise RuntimeError(f"kvpool evict: {r}")


# --- the run ----------------------------------------------------------------------------------

def stamp(src, round_no):
    """Round and block number into the first 16 bytes of every page of every block."""
    n, block = src.shape
    pages = src.reshape(n, block // PAGE, PAGE)[:, :, :16].view(np.uint64)
    pages[:, :, 0] = round_no + 1  # never 0, so a poisoned page cannot pass
    pages[:, :, 1] = np.arange(n, dtype=np.uint64)[:, None]


def poison(dst):
    dst.reshape(-1, PAGE)[:, :8] = 0


def keys_of_round(round_name, n):
    """n chained kvpool keys (32 bytes each) that no other round uses: its own secret."""
    import kvpool
    return kvpool.hash_chain(np.arange(n * 16, dtype=np.int32), secret=f"bench-{round_name}",
                             layout="mooncake_bench", tokens_per_block=16)


def measure(targets, src, bpc, calls):
    """Interleaved rounds of put, get (verified) and drop; returns {(system, path, op): [s]}."""
    per_round = src.shape[0] // bpc
    times = {}
    for t in targets:  # warm: connections, first allocations, page faults
        keys, args = t.names(keys_of_round("warm", bpc)), t.call_args(0, bpc)
        t.put(keys, args)
        t.get(keys, args)
        t.drop(keys)
    round_no = 0
    while calls > 0:
        round_calls = min(per_round, calls)
        stamp(src, round_no)
        raw_keys = keys_of_round(round_no, round_calls * bpc)
        for t in targets:
            if t.src is not src:
                np.copyto(t.src, src)  # the standalone pool's copy of the round's blocks
            keys = t.names(raw_keys)
            batches = [(keys[c * bpc:(c + 1) * bpc], t.call_args(c * bpc, bpc))
                      for c in range(round_calls)]
            put_times = times.setdefault((t.system, t.path, "put"), [])
            for call_keys, args in batches:
                t0 = time.perf_counter()
                t.put(call_keys, args)
                put_times.append(time.perf_counter() - t0)
            t.check_placement(keys[-1])
            get_times = times.setdefault((t.system, t.path, "get"), [])
            for c, (call_keys, args) in enumerate(batches):
                poison(t.dst)
                t0 = time.perf_counter()
                t.get(call_keys, args)
                get_times.append(time.perf_counter() - t0)
                if not np.array_equal(t.dst, src[c * bpc:(c + 1) * bpc]):
                    raise RuntimeError(f"{t.system} {t.path}: round {round_no} call {c} read "
                                       "back other bytes than were put")
            t.drop(keys)
        dst = targets[0].dst
        copy_times = times.setdefault(("memcpy", "memory", "copy"), [])
        for c in range(round_calls):
            t0 = time.perf_counter()
            np.copyto(dst, src[c * bpc:(c + 1) * bpc])
            copy_times.append(time.perf_counter() - t0)
        calls -= round_calls
        round_no += 1
    return times


def figure(system, path, op, times, bpc, block):
    times = sorted(times)
    p50 = statistics.median(times)
    p99 = times[max(0, math.ceil(0.99 * len(times)) - 1)]  # nearest rank
    return {"system": system, "path": path, "op": op, "block_bytes": block, "concurrency": 1,
            "gbps": bpc * block / p50 / 1e9, "ops_per_s": 1 / p50, "p50_us": p50 * 1e6,
            "p99_us": p99 * 1e6, "calls": len(times), "blocks_per_call": bpc}


def add_ratios(figures):
    memcpy = next(f["gbps"] for f in figures if f["system"] == "memcpy")
    for f in figures:
        f["ratio_to_memcpy"] = f["gbps"] / memcpy
        if f["system"] != "kvpool":
            continue
        peers = [g for g in figures if g["system"] == "mooncake" and g["op"] == f["op"]]
        best = max(peers, key=lambda g: g["gbps"], default=None)
        f["ratio_to_mooncake_best"] = f["gbps"] / best["gbps"] if best else None
        f["mooncake_best_path"] = best["path"] if best else None
        f["mooncake_best_gbps"] = best["gbps"] if best else None
        for g in peers:
            f["ratio_to_mooncake_" + g["path"].replace("-", "_")] = f["gbps"] / g["gbps"]


def print_table(figures, header):
    print(header)
    print(f"  {'system':9} {'path':15} {'op':5} {'GB/s':>6} {'p50 us':>8} {'p99 us':>8} "
          f"{'/memcpy':>8}  kvpool/mooncake")
    for f in figures:
        kv = next((k for k in figures if k["system"] == "kvpool" and k["op"] == f["op"]), None)
        vs = f"{kv['gbps'] / f['gbps']:.2f}" if f["system"] == "mooncake" else ""
        print(f"  {f['system']:9} {f['path']:15} {f['op']:5} {f['gbps']:6.2f} "
              f"{f['p50_us']:8.0f} {f['p99_us']:8.0f} {f['ratio_to_memcpy']:8.2f}  {vs}")


def mooncake_missing():
    """Why Mooncake cannot be measured from this interpreter's venv, or None."""
    try:
        import mooncake.store  # noqa: F401
    except ImportError as e:
        return str(e)
    for tool in ("mooncake_master", "mooncake_client"):
        if not (pathlib.Path(sys.executable).parent / tool).exists():
            return f"no {tool} beside {sys.executable}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks-per-call", type=int, default=16)
    ap.add_argument("--block-mib", type=float, default=1.0)
    ap.add_argument("--working-set-mib", type=int, default=256,
                    help="bytes each round puts under fresh keys and reads back")
    ap.add_argument("--calls", type=int, default=128, help="timed calls per figure")
    ap.add_argument("--json", action="store_true", help="one JSON object per figure")
    ap.add_argument("--require-mooncake", action="store_true",
                    help="fail (exit 1) instead of skipping Mooncake when its wheel is missing")
    a = ap.parse_args()
    bpc, block = a.blocks_per_call, int(a.block_mib * 2**20)
    if block <= 0 or block % PAGE:
        ap.error(f"--block-mib must be a whole number of {PAGE}-byte pages")
    os.environ.update(MOONCAKE_ENV)  # before mooncake is imported
    os.environ.setdefault("KVPOOL_KVPOOLD", str(REPO / "build/daemon/kvpoold"))
    # SIGTERM unwinds like an exception, so every process started here is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    import kvpool
    from kvpool.testing import Daemon

    n = max(bpc, a.working_set_mib * 2**20 // block // bpc * bpc)  # whole calls
    ws = n * block
    capacity = -(-2 * ws // 2**26) * 2**26  # twice the working set, in whole 64 MiB
    src = np.random.default_rng(0).integers(0, 256, (n, block), dtype=np.uint8)
    dst = np.empty((bpc, block), np.uint8)
    skipped = mooncake_missing()
    version = None if skipped else importlib.metadata.version(MOONCAKE_WHEEL)
    if skipped:
        print(f"mooncake skipped: {skipped} (its venv: scripts/python_env.sh mooncake, then "
              ".venv/mooncake/bin/python)", file=sys.stderr if a.json else sys.stdout)
        if a.require_mooncake:
            sys.exit(1)

    with contextlib.ExitStack() as stack:
        d = stack.enter_context(Daemon([f"--host_capacity={capacity}",
                                        "--host_segment_size=64MiB"]))
        client = stack.enter_context(kvpool.Client(d.socket, namespace="bench",
                                                   data_path="shm"))
        assert client.server["shared_memory"]
        targets = [KvpoolTarget(client, src, dst)]
        if not skipped:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="mooncake-bench-"))
            mc = stack.enter_context(MooncakeCluster(tmp, capacity))
            remote = mc.client(0)
            stack.callback(remote.close)
            dummy = mc.dummy_client(ws + dst.nbytes + 2**26)
            stack.callback(dummy.close)
            local = mc.client(capacity)
            stack.callback(local.close)
            targets += [
                MooncakeTarget("tcp", remote, mc.store_segment, src, dst),
                MooncakeTarget("standalone-shm", dummy, mc.store_segment,
                               pool_array(dummy, src.shape), pool_array(dummy, dst.shape),
                               checker=remote),
                MooncakeTarget("local-segment", local, local.get_hostname(), src, dst)]
        times = measure(targets, src, bpc, a.calls)

    figures = [figure(*key, t, bpc, block) for key, t in times.items()]
    add_ratios(figures)
    load = os.getloadavg()[0]
    for f in figures:
        f.update(loadavg_1m=load, mooncake_version=version)
    if a.json:
        for f in figures:
            print(json.dumps(f))
        return
    peer = f"Mooncake Store {version} ({MOONCAKE_WHEEL})" if version else "no Mooncake"
    print_table(figures, f"kvpool {kvpool.__version__} vs {peer}: {bpc} x {block / 2**20:g} MiB "
                f"a call, working set {ws / 2**20:g} MiB, {a.calls} calls a figure, load "
                f"{load:.1f}")


if __name__ == "__main__":
    main()
