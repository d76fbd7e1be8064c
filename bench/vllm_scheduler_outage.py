#!/usr/bin/env python3
"""What a stopped kvpoold costs vLLM's scheduling loop: kvpool.vllm's scheduler-side lookups
(get_num_new_matched_tokens, which vLLM's Scheduler calls for each request it tries to admit,
on its one thread) against a daemon that answers, and against one stopped with SIGSTOP (alive,
answering nothing, as a hung daemon or a cut path), with the connector's StallGuard and, as
before it, without (every lookup then waits out the connector's timeout).

--lookups lookups of a prompt of --blocks blocks (an 8B-shaped layout, vLLM's real config
classes on the CPU), one after another as the scheduler makes them; the connector's timeout
is --timeout seconds. Printed: the total and per-lookup seconds of each case, beside the
timeout times the lookups (what they cost without the guard, by construction).

    KVPOOL_KVPOOLD=build/daemon/kvpoold .venv/vllm/bin/python bench/vllm_scheduler_outage.py \\
        [--lookups 20] [--timeout 0.5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request

import kvpool
import kvpool._outage
import kvpool.vllm
from kvpool.testing import Daemon
from vllm_bench_model import (BLOCK, HEAD_DIM, KV_HEADS, LAYERS,  # bench/
                              model_dir, vllm_config)


def connector(model: str, socket: str, timeout: float) -> kvpool.vllm.KvpoolConnector:
    cfg = vllm_config(model, socket, 4096, timeout=timeout)
    return kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, None)


def lookups(c: kvpool.vllm.KvpoolConnector, prompt: list[int], n: int) -> tuple[float, int]:
    """Seconds for n lookups one after another, and how many found the prompt's blocks."""
    hits = 0
    t0 = time.perf_counter()
    for i in range(n):
        req = Request(request_id=f"r{i}-{time.monotonic_ns()}", prompt_token_ids=prompt,
                      sampling_params=SamplingParams(max_tokens=1), pooling_params=None)
        matched, _ = c.get_num_new_matched_tokens(req, 0)
        hits += matched > 0
    return time.perf_counter() - t0, hits


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lookups", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=0.5)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    prompt = [(i * 7919 + 13) % 32000 + 3 for i in range(args.blocks * BLOCK + 1)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, Daemon() as d:
        model = model_dir(pathlib.Path(tmp))
        c = connector(model, d.socket, args.timeout)
        with kvpool.Client(d.socket, namespace="bench") as client:   # the prompt's blocks
            keys = c._keys(prompt[:args.blocks * BLOCK])
            size = LAYERS * 2 * BLOCK * KV_HEADS * HEAD_DIM * 2
            assert client.put(keys, [bytes(size)] * len(keys)).all_ok()
        lookups(c, prompt, 2)                                          # connected, warm
        rows.append(("daemon answering",) + lookups(c, prompt, args.lookups))
        d.pause()
        try:
            rows.append(("daemon stopped, StallGuard",) + lookups(c, prompt, args.lookups))
            guarded = kvpool._outage.StallGuard.check
            kvpool._outage.StallGuard.check = lambda self: None        # as before the guard
            try:
                rows.append(("daemon stopped, no guard (before)",)
                            + lookups(connector(model, d.socket, args.timeout), prompt,
                                      args.lookups))
            finally:
                kvpool._outage.StallGuard.check = guarded
        finally:
            d.resume()
    limit = args.timeout * args.lookups
    print(f"{args.lookups} scheduler lookups of a {args.blocks}-block prompt, connector timeout "
          f"{args.timeout} s (timeout x lookups: {limit:.2f} s)")
    print(f"{'case':36} {'total s':>9} {'per lookup ms':>14} {'hits':>5}")
    for name, seconds, hits in rows:
        print(f"{name:36} {seconds:9.3f} {seconds / args.lookups * 1e3:14.2f} {hits:5d}")
    if rows[0][2] != args.lookups or any(hits for _, _, hits in rows[1:]):
        print("vllm_scheduler_outage: the answering daemon's lookups must all hit, the stopped "
              "one's none", file=sys.stderr)
        return 1
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"lookups": args.lookups, "timeout_s": args.timeout, "timeout_x_lookups_s": limit,
             "cases": [{"case": n, "seconds": s, "hits": h} for n, s, h in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
