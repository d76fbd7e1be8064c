#!/usr/bin/env python3
"""bench_disk_smoke: runs `kvpool-bench --disk` briefly with --json and checks what it printed.

Usage: check_disk_json.py KVPOOL_BENCH [bench flags...]

Passes when the bench exits 0 (it fails by itself on any miss, wrong byte or error) and its lines
hold the kvpool disk get, with every block read once and from disk, and, when fio is on PATH, the
fio buffered and direct figures and the ratio to the faster. Never asserts a timing.
"""
import json
import shutil
import subprocess
import sys

COMMON = ("system", "path", "op", "block_bytes", "concurrency", "gbps", "ops_per_s", "p50_us",
          "p99_us", "loadavg_1m")


def fail(msg, out=""):
    sys.stderr.write("bench_disk_smoke: FAIL: %s\n" % msg)
    if out:
        sys.stderr.write(out[-4000:] + "\n")
    sys.exit(1)


def main():
    if len(sys.argv) < 2:
        fail("usage: check_disk_json.py KVPOOL_BENCH [flags...]")
    cmd = [sys.argv[1], "--disk", "--json"] + sys.argv[2:]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=280)
    if proc.returncode != 0:
        fail("%s exited with %d" % (" ".join(cmd), proc.returncode), proc.stderr)
    figures = {}
    for n, line in enumerate(l for l in proc.stdout.splitlines() if l.strip()):
        try:
            f = json.loads(line)
        except ValueError:
            fail("line %d is not JSON: %r" % (n + 1, line))
        missing = [k for k in COMMON if k not in f]
        if missing:
            fail("line %d lacks %s: %s" % (n + 1, missing, line))
        if f["gbps"] <= 0 or f["p50_us"] <= 0:
            fail("line %d measured nothing: %s" % (n + 1, line))
        figures[(f["system"], f["path"], f["op"])] = f
    get = figures.get(("kvpool", "disk", "get"))
    if get is None:
        fail("no kvpool disk get figure", proc.stdout)
    if get["blocks"] < 1 or get["blocks_from_disk"] != get["blocks"]:
        fail("not every block was read from disk: %s" % json.dumps(get))
    if shutil.which("fio") is None:
        sys.stderr.write("bench_disk_smoke: fio is not installed; the peer is not checked\n")
        return
    for path in ("buffered", "direct"):
        if ("fio", path, "randread") not in figures:
            fail("fio is installed but its %s figure is missing" % path, proc.stderr)
    if get.get("ratio_to_fio", 0) <= 0:
        fail("no ratio_to_fio beside fio's figures: %s" % json.dumps(get))


if __name__ == "__main__":
    main()
