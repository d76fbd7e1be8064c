#!/usr/bin/env python3
"""bench_disk_smoke: runs `kvpool-bench --disk` briefly with --json and checks what it printed.

Usage: check_disk_json.py KVPOOL_BENCH [bench flags...]

Passes when the bench exits 0 (it fails by itself on any miss, wrong byte or error) and its lines
hold the kvpool disk get, with every block read once and from disk, and, when fio is on PATH, the
fio buffered and direct figures and the ratio to the faster. Never asserts a timing.
"""
import json
import shutil
import sys

from bench_json import Smoke

COMMON = ("system", "path", "op", "block_bytes", "concurrency", "gbps", "ops_per_s", "p50_us",
          "p99_us", "loadavg_1m")


def main():
    smoke = Smoke("bench_disk_smoke")
    fail = smoke.fail
    if len(sys.argv) < 2:
        fail("usage: check_disk_json.py KVPOOL_BENCH [flags...]")
    cmd = [sys.argv[1], "--disk", "--json"] + sys.argv[2:]
    figures = {}
    for n, f in enumerate(smoke.run(cmd, COMMON, timeout=280), 1):
        if f["gbps"] <= 0 or f["p50_us"] <= 0:
            fail("line %d measured nothing: %s" % (n, json.dumps(f)))
        figures[(f["system"], f["path"], f["op"])] = f
    get = figures.get(("kvpool", "disk", "get"))
    if get is None:
        fail("no kvpool disk get figure", smoke.stdout)
    if get["blocks"] < 1 or get["blocks_from_disk"] != get["blocks"]:
        fail("not every block was read from disk: %s" % json.dumps(get))
    if shutil.which("fio") is None:
        sys.stderr.write("bench_disk_smoke: fio is not installed; the peer is not checked\n")
        return
    for path in ("buffered", "direct"):
        if ("fio", path, "randread") not in figures:
            fail("fio is installed but its %s figure is missing" % path, smoke.stderr)
    if get.get("ratio_to_fio", 0) <= 0:
        fail("no ratio_to_fio beside fio's figures: %s" % json.dumps(get))


if __name__ == "__main__":
    main()
