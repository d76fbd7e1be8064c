#!/usr/bin/python3
"""Needle-in-a-haystack heatmaps for kvpool's compression methods.

Runs kvpool-needle (the real CPU kernels: scores, selection) over context lengths x needle
depths at one budget and draws one heatmap per method, as the seed (KVCache-Factory) does for
its needle test: green = the needle token was kept in every layer and KV head, red = lost.

Needs Debian's python3-matplotlib. Usage:
  bench/needle_heatmap.py --needle BUILD/kernels/kvpool-needle [--budget 0.1] [--out docs]
"""

import argparse
import json
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import LinearSegmentedColormap  # noqa: E402

TITLES = {
    "streamingllm": "StreamingLLM",
    "h2o": "H2O",
    "snapkv": "SnapKV",
    "pyramidkv": "PyramidKV",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--needle", default="build/kernels/kvpool-needle", help="kvpool-needle binary")
    ap.add_argument("--budget", type=float, default=0.1, help="kept fraction of the context")
    ap.add_argument("--lengths", default="512,1024,1536,2048,3072,4096")
    ap.add_argument("--depths", type=int, default=11)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--out", default="docs", help="directory for needle_<method>.svg")
    ap.add_argument("--json", help="also save the raw results here")
    args = ap.parse_args()

    cmd = [args.needle, "--budget", str(args.budget), "--lengths", args.lengths,
           "--depths", str(args.depths), "--layers", str(args.layers)]
    print("running:", " ".join(cmd), file=sys.stderr)
    data = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)

    cmap = LinearSegmentedColormap.from_list("needle", ["#F0496E", "#EBB839", "#0CD79F"])
    lengths, depths = data["lengths"], data["depths"]
    os.makedirs(args.out, exist_ok=True)
    for method, grid in data["methods"].items():
        # Rows: depth (0% at the top, as in the seed's plots); columns: context length.
        z = [[grid[li][di] for li in range(len(lengths))] for di in range(len(depths))]
        kept = sum(sum(r) for r in z) / (len(lengths) * len(depths))
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        im = ax.imshow(z, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:.0f}%" for d in depths])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("needle depth")
        ax.set_xticks([x - 0.5 for x in range(1, len(lengths))], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, len(depths))], minor=True)
        ax.grid(which="minor", color="white", linewidth=1)
        ax.tick_params(which="minor", length=0)
        ax.set_title(f"{TITLES.get(method, method)}: needle retained at "
                     f"{data['budget'] * 100:.0f}% budget (mean {kept:.2f})")
        cb = fig.colorbar(im, ax=ax)
        cb.set_label("share of (layer, KV head) that kept the needle")
        fig.text(0.01, 0.01, f"kvpool CPU kernels, synthetic attention, window_size "
                 f"{data['window_size']}, {data['layers']} layers", fontsize=7, color="#666")
        fig.tight_layout()
        path = os.path.join(args.out, f"needle_{method}.svg")
        fig.savefig(path, metadata={"Date": None})
        plt.close(fig)
        print(f"{path}: mean retained {kept:.3f}")


if __name__ == "__main__":
    main()
