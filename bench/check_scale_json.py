#!/usr/bin/env python3
"""bench_scale_smoke: runs `kvpool-bench --scale` briefly with --json and checks what it printed.

Usage: check_scale_json.py KVPOOL_BENCH [bench flags...]

Passes when the bench exits 0 (it fails by itself on any miss, wrong byte or error, and when a
restarted daemon's rebuilt index lacks a block) and its lines hold, for every size of
--scale_blocks, a fill, rebuild, lookup and get figure; for every count of --scale_clients a
lookup; for every count of --scale_namespaces a lookup and a get; each with the daemon's CPU time
per operation, resident memory and index size. Never asserts a timing.
"""
import sys

from bench_json import Smoke

COMMON = ("system", "path", "op", "block_bytes", "concurrency", "ops_per_s", "p50_us", "p99_us",
          "curve", "x", "daemon_rss_bytes", "index_entries", "index_bytes", "loadavg_1m")


def counts(args, name, default):
    for a in args:
        if a.startswith("--%s=" % name):
            return [int(x) for x in a.split("=", 1)[1].split(",") if x]
    return default


def main():
    smoke = Smoke("bench_scale_smoke")
    fail = smoke.fail
    if len(sys.argv) < 2:
        fail("usage: check_scale_json.py KVPOOL_BENCH [flags...]")
    args = sys.argv[2:]
    cmd = [sys.argv[1], "--scale", "--json"] + args
    figures = smoke.run(cmd, COMMON, timeout=280)
    for n, f in enumerate(figures, 1):
        if f["op"] in ("lookup", "get") and (f["calls"] < 1 or f["p50_us"] <= 0 or
                                             "daemon_cpu_us_per_op" not in f):
            fail("line %d measured nothing: %s" % (n, f))
    seen = {(f["curve"], f[f["x"]], f["op"]) for f in figures}

    chain = counts(args, "scale_chain_blocks", [64])[0]
    for blocks in counts(args, "scale_blocks", [10000, 100000, 1000000]):
        indexed = max(1, blocks // chain) * chain
        for op in ("fill", "rebuild", "lookup", "get"):
            if ("blocks", indexed, op) not in seen:
                fail("no %s figure at %d indexed blocks" % (op, indexed), smoke.stdout)
    for f in figures:
        if f["op"] == "rebuild" and f["index_entries"] != f["indexed_blocks"]:
            fail("rebuilt index holds %d entries, %d blocks were put" %
                 (f["index_entries"], f["indexed_blocks"]))
    for n in counts(args, "scale_clients", [1, 4, 16, 64, 256]):
        if ("connections", n, "lookup") not in seen:
            fail("no lookup figure at %d connections" % n, smoke.stdout)
    for n in counts(args, "scale_namespaces", [1, 16, 128, 1024]):
        for op in ("lookup", "get"):
            if ("namespaces", n, op) not in seen:
                fail("no %s figure at %d namespaces" % (op, n), smoke.stdout)
    print("bench_scale_smoke: %d figures checked" % len(figures))


if __name__ == "__main__":
    main()
