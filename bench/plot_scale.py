#!/usr/bin/python3
"""Turns `kvpool-bench --scale --json` output into docs/scale_curves.svg.

Usage:
  kvpool-bench --scale --pin --json > scale.json
  bench/plot_scale.py scale.json [more.json ...]     # writes docs/scale_curves.svg
  bench/plot_scale.py --out chart.svg scale.json

Several files may be given (e.g. a default run and a separate 10^7-block run): their points are
drawn together, each curve sorted by its x value. Four panels:
  1. lookup (a whole chain) and get (16 blocks) latency, p50 and p99, against blocks indexed;
  2. the index rebuild rate at start (blocks/s, the 10^6/s target dashed) and the daemon's
     resident memory, against blocks indexed;
  3. lookups per second and p50 / p99 latency against connections;
  4. lookup and get p50 / p99 and resident memory against namespaces.

Needs Debian's python3-matplotlib (run with /usr/bin/python3); the Agg backend, no display.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "docs", "scale_curves.svg")


def load(paths):
    figures = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    fig = json.loads(line)
                    if "curve" in fig:
                        figures.append(fig)
    return figures


def series(figures, curve, op, key):
    points = sorted((f[f["x"]], f[key]) for f in figures if f["curve"] == curve and f["op"] == op)
    return [p[0] for p in points], [p[1] for p in points]


def latency_panel(ax, figures, curve, ops, xlabel):
    for op, colour in ops:
        for key, style in (("p50_us", "-"), ("p99_us", "--")):
            x, y = series(figures, curve, op, key)
            if x:
                ax.plot(x, y, style, marker="o", color=colour,
                        label="%s %s" % (op, key.split("_")[0]))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("latency per call (us)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+")
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()
    figures = load(args.files)
    if not figures:
        raise SystemExit("plot_scale: no --scale figures in %s" % ", ".join(args.files))

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    latency_panel(axes[0][0], figures, "blocks", [("lookup", "tab:blue"), ("get", "tab:red")],
                  "blocks indexed")
    axes[0][0].set_title("lookup (whole chain) and get (16 blocks) vs cache size", fontsize=9)

    ax = axes[0][1]
    x, y = series(figures, "blocks", "rebuild", "ops_per_s")
    if x:
        ax.plot(x, y, marker="o", color="tab:green", label="index rebuild (blocks/s)")
        ax.axhline(1e6, color="tab:green", linestyle=":", label="target 10^6 blocks/s")
    ax.set_xscale("log")
    ax.set_xlabel("blocks indexed")
    ax.set_ylabel("blocks/s")
    ax.grid(True, which="both", alpha=0.3)
    rss = ax.twinx()
    x, y = series(figures, "blocks", "lookup", "daemon_rss_bytes")
    if x:
        rss.plot(x, [v / 2**20 for v in y], marker="s", color="tab:grey", label="daemon RSS (MiB)")
    rss.set_ylabel("MiB")
    lines = ax.get_legend_handles_labels()
    more = rss.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
    ax.set_title("index rebuild at start, and resident memory", fontsize=9)

    ax = axes[1][0]
    x, y = series(figures, "connections", "lookup", "ops_per_s")
    if x:
        ax.plot(x, y, marker="o", color="tab:blue", label="lookups/s (all clients)")
    ax.set_xscale("log")
    ax.set_xlabel("connections (each looking up back to back)")
    ax.set_ylabel("lookups/s")
    ax.grid(True, which="both", alpha=0.3)
    lat = ax.twinx()
    for key, style in (("p50_us", "-"), ("p99_us", "--")):
        x, y = series(figures, "connections", "lookup", key)
        if x:
            lat.plot(x, y, style, marker=".", color="tab:orange", label="lookup " + key.split("_")[0])
    lat.set_yscale("log")
    lat.set_ylabel("us")
    lines = ax.get_legend_handles_labels()
    more = lat.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
    ax.set_title("connections, on the largest cache", fontsize=9)

    latency_panel(axes[1][1], figures, "namespaces",
                  [("lookup", "tab:blue"), ("get", "tab:red")], "namespaces (one chain each)")
    rss = axes[1][1].twinx()
    x, y = series(figures, "namespaces", "lookup", "daemon_rss_bytes")
    if x:
        rss.plot(x, [v / 2**20 for v in y], marker="s", color="tab:grey", label="RSS (MiB)")
        rss.set_ylabel("daemon RSS (MiB)")
    axes[1][1].set_title("namespaces", fontsize=9)

    fig.suptitle("kvpool-bench --scale: how cost grows (docs/BENCHMARKS.md)", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out)
    print("wrote %s (%d figures)" % (args.out, len(figures)))


if __name__ == "__main__":
    main()
