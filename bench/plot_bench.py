#!/usr/bin/python3
"""Turns `kvpool-bench --json` output into docs/bench_throughput.svg and the issue's targets.

Usage:
  kvpool-bench --pin --json > run.json
  bench/plot_bench.py run.json                 # writes docs/bench_throughput.svg
  bench/plot_bench.py --targets run.json       # also prints the targets table (Markdown)
  bench/plot_bench.py --table run.json         # also prints every put/get line (Markdown)
  kvpool-bench --json | bench/plot_bench.py -  # from stdin

The chart: GB/s against block size (log2 axis), one panel for get and one for put, a line for
each kvpool path and Redis (solid: one bench thread; dashed: the largest concurrency measured),
beside single-thread memcpy of the same run (grey) and, for get, the bare Unix socketpair.

Needs Debian's python3-matplotlib (run with /usr/bin/python3); the Agg backend, no display.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "docs", "bench_throughput.svg")

# (system, path) -> label and colour.
SERIES = [
    (("kvpool", "shm"), "kvpool shm (same node)", "tab:blue"),
    (("kvpool", "socket"), "kvpool socket (Unix)", "tab:orange"),
    (("kvpool", "ucx"), "kvpool ucx (UCX tcp, loopback)", "tab:green"),
    (("redis", "tcp"), "Redis SET/GET (hiredis, loopback)", "tab:red"),
]

# The targets at 1 MiB: (name, numerator, denominator or None, bound, "ge"/"le").
# A term is (system, path, op); every ratio is at one bench thread, as memcpy and Redis are.
TARGETS = [
    ("same-node get / memcpy", ("kvpool", "shm", "get"), ("memcpy", "memory", "copy"), 0.8),
    ("same-node get / Redis GET", ("kvpool", "shm", "get"), ("redis", "tcp", "get"), 4.0),
    ("same-node put / memcpy", ("kvpool", "shm", "put"), ("memcpy", "memory", "copy"), 0.6),
    ("same-node put / Redis SET", ("kvpool", "shm", "put"), ("redis", "tcp", "put"), 3.0),
    ("UCX-over-tcp get / Redis GET", ("kvpool", "ucx", "get"), ("redis", "tcp", "get"), 2.0),
]


def read_lines(paths):
    recs = []
    for p in paths:
        f = sys.stdin if p == "-" else open(p)
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue  # tolerate progress lines mixed in
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit("%s:%d: not JSON (%s)" % (p, n, e))
        if f is not sys.stdin:
            f.close()
    if not recs:
        sys.exit("no kvpool-bench JSON lines in %s" % ", ".join(paths))
    return recs


def size_name(b):
    if b >= 1 << 20 and b % (1 << 20) == 0:
        return "%d MiB" % (b >> 20)
    return "%d KiB" % (b >> 10)


def find(recs, system, path, op, block, conc=1):
    for r in recs:
        if (r["system"], r["path"], r["op"], r["block_bytes"], r["concurrency"]) == (
                system, path, op, block, conc):
            return r
    return None


def plot(recs, out):
    sizes = sorted({r["block_bytes"] for r in recs if r["op"] in ("put", "get") and r["block_bytes"]})
    concs = sorted({r["concurrency"] for r in recs if r["op"] in ("put", "get")})
    high = concs[-1] if len(concs) > 1 else None
    plt.rcParams["svg.hashsalt"] = "kvpool-bench"  # stable ids: the SVG diffs cleanly
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    for ax, op in zip(axes, ("get", "put")):
        mem = [(b, find(recs, "memcpy", "memory", "copy", b)) for b in sizes]
        mem = [(b, r["gbps"]) for b, r in mem if r]
        if mem:
            ax.plot([b for b, _ in mem], [g for _, g in mem], color="0.45", lw=2.2, marker="s",
                    label="memcpy, one thread (the limit)")
        if op == "get":
            sp = [(b, find(recs, "socketpair", "unix", "stream", b)) for b in sizes]
            sp = [(b, r["gbps"]) for b, r in sp if r]
            if sp:
                ax.plot([b for b, _ in sp], [g for _, g in sp], color="0.6", ls=":", marker=".",
                        label="bare Unix socketpair get")
        for (system, path), label, colour in SERIES:
            for conc, style in ((1, "-"), (high, "--")):
                if conc is None:
                    continue
                pts = [(b, find(recs, system, path, op, b, conc)) for b in sizes]
                pts = [(b, r["gbps"]) for b, r in pts if r]
                if not pts:
                    continue
                ax.plot([b for b, _ in pts], [g for _, g in pts], color=colour, ls=style,
                        marker="o" if conc == 1 else "^", ms=4,
                        label="%s%s" % (label, "" if conc == 1 else ", x%d threads" % conc))
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([size_name(b) for b in sizes])
        ax.set_xlabel("block size (16 blocks per call)")
        ax.set_title("get" if op == "get" else "put (Redis: SET)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("GB/s (1e9 B/s)")
    axes[0].set_ylim(bottom=0)
    handles, labels = [], []
    for ax in axes:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    pins = sorted({r.get("pin", "?") for r in recs})
    load = [r["loadavg_1m"] for r in recs if "loadavg_1m" in r]
    fig.suptitle("kvpool-bench: throughput by block size (pinning: %s; load %.1f-%.1f)" %
                 ("; ".join(pins), min(load) if load else -1, max(load) if load else -1),
                 fontsize=9)
    fig.tight_layout(rect=(0, 0.17, 1, 0.95))
    fig.savefig(out, format="svg", metadata={"Date": None})
    print("wrote %s" % out, file=sys.stderr)


def gbps(recs, term, block, conc=1):
    r = find(recs, term[0], term[1], term[2], block, conc)
    return r["gbps"] if r else None


def targets(recs, block, with_bound):
    concs = sorted({r["concurrency"] for r in recs if r["op"] in ("put", "get")})
    high = concs[-1] if len(concs) > 1 else None
    rows = []
    head = "| at %s | measured (x1) | %s | target | %s |" % (
        size_name(block), "x%d threads" % high if high else "-", "met?" if with_bound else "")
    rows.append(head)
    rows.append("| --- | --- | --- | --- | --- |")
    for name, num, den, bound in TARGETS:
        a, b = gbps(recs, num, block), gbps(recs, den, block)
        if a is None or b is None or b == 0:
            rows.append("| %s | not measured | | >= %.1f | |" % (name, bound))
            continue
        ratio = a / b
        hi = gbps(recs, num, block, high) if high else None
        hi_s = "%.2f (%.2f / %.2f)" % (hi / b, hi, b) if hi else "-"
        met = ("met" if ratio >= bound else "**NOT met**") if with_bound else "(no target)"
        rows.append("| %s | %.2f (%.2f / %.2f GB/s) | %s | >= %.1f | %s |" % (
            name, ratio, a, b, hi_s, bound, met))
    if with_bound:
        lk = [r for r in recs if r["op"] == "lookup" and r["path"] == "socket"]
        for r in sorted(lk, key=lambda r: r["concurrency"]):
            met = "met" if r["p99_us"] <= 200 else "**NOT met**"
            rows.append("| lookup, %d-block chain, Unix socket, x%d: p99 | %.0f us (p50 %.0f us) "
                        "| | <= 200 us | %s |" % (r.get("chain_blocks", 0), r["concurrency"],
                                                  r["p99_us"], r["p50_us"], met))
    return "\n".join(rows)


def table(recs):
    rows = ["| system | path | op | threads | block | GB/s | p50 us | p99 us | / memcpy |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in recs:
        if r["op"] not in ("put", "get", "copy", "stream", "lookup") or not r["block_bytes"]:
            continue
        block = size_name(r["block_bytes"])
        if r["op"] == "lookup":
            block = "%d x %s" % (r.get("chain_blocks", 0), block)
        ratio = r.get("ratio_to_memcpy")
        rows.append("| %s | %s | %s | %d | %s | %s | %.0f | %.0f | %s |" % (
            r["system"], r["path"], r["op"], r["concurrency"], block,
            "-" if r["op"] == "lookup" else "%.2f" % r["gbps"], r["p50_us"], r["p99_us"],
            "%.2f" % ratio if ratio is not None else "-"))
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="*", default=["-"], help="JSON-lines files; - for stdin")
    ap.add_argument("--out", default=DEFAULT_OUT, help="SVG to write (default: %(default)s)")
    ap.add_argument("--targets", action="store_true", help="print the targets table (Markdown)")
    ap.add_argument("--table", action="store_true", help="print every line as a Markdown table")
    ap.add_argument("--no_plot", action="store_true", help="write no SVG")
    args = ap.parse_args()
    recs = read_lines(args.inputs)
    if not args.no_plot:
        plot(recs, args.out)
    if args.targets:
        print(targets(recs, 1 << 20, True))
        print()
        print(targets(recs, 64 << 10, False))
    if args.table:
        print(table(recs))


if __name__ == "__main__":
    main()
