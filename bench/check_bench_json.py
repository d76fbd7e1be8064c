#!/usr/bin/env python3
"""bench_smoke: runs kvpool-bench briefly with --json and checks what it printed.

Usage: check_bench_json.py KVPOOL_BENCH [bench flags...]

Passes when the bench exits 0 and every stdout line is a JSON object with the documented keys
and sane values, with a put and a get line for every kvpool path in --paths (default
socket,shm,ucx) and for each Redis path (--redis_paths, default tcp and tcp1) when --systems names it, each
kvpool put and get set beside Redis's best path (ratio_to_redis_best), a borrow and a borrow+verify line (the
in-place read) where shm is measured, with its lent bytes checked, at least one kvpool lookup
line, and one memcpy copy line per block size. Never asserts a timing: CI machines are too noisy for that.
"""
import shutil
import sys

from bench_json import Smoke

REQUIRED = {
    "system": str, "path": str, "op": str, "block_bytes": int, "concurrency": int,
    "gbps": (int, float), "ops_per_s": (int, float), "p50_us": (int, float),
    "p99_us": (int, float),
}
OPS = {"kvpool": {"put", "get", "lookup", "borrow", "borrow+verify"}, "redis": {"put", "get"}, "memcpy": {"copy"},
       "socketpair": {"stream"}, "ucx_perftest": {"tag_bw"}}
PATHS = {"kvpool": {"socket", "shm", "ucx"}, "redis": {"tcp", "tcp1"}, "memcpy": {"memory"},
         "ucx_perftest": {"tcp"},
         "socketpair": {"unix"}}


def flag(args, name, default):
    for a in args:
        for prefix in ("--%s=" % name, "--%s=" % name.replace("_", "-")):
            if a.startswith(prefix):
                return a[len(prefix):]
    return default


def main():
    smoke = Smoke("bench_smoke")
    fail = smoke.fail
    if len(sys.argv) < 2:
        fail("usage: check_bench_json.py KVPOOL_BENCH [flags...]")
    cmd = [sys.argv[1], "--json"] + sys.argv[2:]
    records = smoke.run(cmd, REQUIRED, timeout=110)
    seen = set()
    kvpool_seen = set()
    measured = set()  # (system, path, op)
    for n, rec in enumerate(records, 1):
        system, op = rec["system"], rec["op"]
        if system not in OPS or op not in OPS[system] or rec["path"] not in PATHS[system]:
            fail("line %d: unknown system/path/op: %r" % (n, rec))
        if rec["concurrency"] < 1 or rec["ops_per_s"] <= 0 or rec["p50_us"] <= 0:
            fail("line %d: a phase that did nothing: %r" % (n, rec))
        if rec["p99_us"] < rec["p50_us"]:
            fail("line %d: p99 below p50: %r" % (n, rec))
        if op in ("put", "get", "copy", "stream") and rec["gbps"] <= 0:
            fail("line %d: no bytes moved: %r" % (n, rec))
        if op in ("get", "borrow", "borrow+verify") and rec.get("verified_blocks", 0) <= 0:
            fail("line %d: no %s was verified: %r" % (n, op, rec))
        seen.add((system, op, rec["block_bytes"]))
        measured.add((system, rec["path"], op))
        if system == "kvpool":
            kvpool_seen.add((rec["path"], op))
    kvpool_sizes = {b for (s, o, b) in seen
                    if s in ("kvpool", "redis") and o in ("put", "get") and b > 0}
    args = sys.argv[2:]
    expected = [("kvpool", p) for p in flag(args, "paths", "socket,shm,ucx").split(",") if p]
    with_redis = "redis" in flag(args, "systems", "kvpool,redis").split(",")
    if with_redis:
        expected += [("redis", p) for p in flag(args, "redis_paths", "tcp,tcp1").split(",") if p]
    for system, path in expected:
        for op in ("put", "get"):
            if (system, path, op) not in measured:
                fail("no %s %s %s line" % (system, path, op), smoke.stdout)
    if with_redis:
        # Every kvpool put and get is set beside Redis's best path for the same figure.
        for n, rec in enumerate(records, 1):
            if rec["system"] == "kvpool" and rec["op"] in ("put", "get") and \
                    rec["concurrency"] == 1 and rec["block_bytes"] > 0 and "workload" not in rec:
                if rec.get("redis_best_path") not in PATHS["redis"] or \
                        rec.get("ratio_to_redis_best", 0) <= 0:
                    fail("kvpool line without ratio_to_redis_best: %r" % rec)
    if ("kvpool", "shm") in expected:
        for op in ("borrow", "borrow+verify"):
            if ("kvpool", "shm", op) not in measured:
                fail("no kvpool shm %s line" % op, smoke.stdout)
    if not any(op == "lookup" for (_, op) in kvpool_seen):
        fail("no kvpool lookup line", smoke.stdout)
    for b in kvpool_sizes:
        if ("memcpy", "copy", b) not in seen:
            fail("no memcpy line beside kvpool block size %d" % b, smoke.stdout)
        if ("socketpair", "stream", b) not in seen:
            fail("no socketpair line beside kvpool block size %d" % b, smoke.stdout)
    if ("kvpool", "ucx") in expected and shutil.which("ucx_perftest"):
        # The ucx path's limit, measured in the same run, and each ucx figure set beside it.
        for b in kvpool_sizes:
            if ("ucx_perftest", "tag_bw", b) not in seen:
                fail("no ucx_perftest line beside block size %d" % b, smoke.stdout)
        for rec in records:
            if rec["system"] == "kvpool" and rec["path"] == "ucx" and \
                    rec["op"] in ("put", "get") and rec.get("ratio_to_ucx_perftest", 0) <= 0:
                fail("ucx line without ratio_to_ucx_perftest: %r" % rec)
    print("bench_smoke: %d result lines OK" % len(records))


if __name__ == "__main__":
    main()
