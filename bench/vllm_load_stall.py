#!/usr/bin/env python3
"""What a kvpool hit, and a store, cost the other requests of a vLLM batch: kvpool.vllm's
synchronous loads and saves against its asynchronous ones (vLLM 0.33's load_kv_async; saves on
a background thread), with vLLM's real Scheduler and KV views on the CPU and a real kvpoold.

A prompt of --blocks blocks of an 8B-shaped model (32 layers, 8 KV heads, head dim 128, 16
tokens a block: 2 MiB a block) is stored through one vLLM instance; a second instance then
asks for it. Measured per load, median of --reps:

- step stall: how long the worker's start_load_kv holds up the step's forward, i.e. every
  other request of the batch (synchronous: the whole load; asynchronous: handing it to the
  loader thread);
- load done: from start_load_kv until the blocks are in the paged KV (asynchronous: until
  get_finished reports the request);
- the same for a store of such a prompt: the stall is wait_for_save (synchronous: gathering
  and putting the blocks), done is until they are in kvpool;

beside, in the same run, a bare kvpool get_into of the same blocks (the data path alone) and a
torch copy of the same bytes (the machine's limit for moving them once).

    KVPOOL_KVPOOLD=build/daemon/kvpoold .venv/vllm/bin/python bench/vllm_load_stall.py \\
        [--blocks 64] [--reps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Callable

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, compute_layout_strides,
                                        create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

import kvpool
import kvpool.vllm
from bench_timing import median_s   # bench/ is the script's directory
from kvpool.testing import Daemon
from vllm_bench_model import (BLOCK, HEAD_DIM, KV_HEADS, LAYERS, SECRET,  # bench/
                              model_dir, vllm_config)


class Instance:
    """One vLLM instance: its Scheduler (with the scheduler-side connector) and the worker-side
    connector over per-layer KV views of `num_blocks` blocks."""

    def __init__(self, model: str, socket: str, num_blocks: int, background: bool, seed: int):
        tokens = (num_blocks + 1) * BLOCK
        cfg = vllm_config(model, socket, tokens, timeout=30.0, load_async=background,
                          save_async=background)
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_DIM,
                                 dtype=torch.bfloat16)
        names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        layout = KVCacheLayout.LBHNC
        strides = compute_layout_strides(spec, num_blocks, LAYERS, layout)
        size = spec.page_size_bytes * num_blocks * LAYERS
        tensor = KVCacheTensor(size=size, layers=names, layer_stride=strides[0],
                               block_stride=strides[1])
        raw = torch.randint(-128, 127, (size,), dtype=torch.int8,
                            generator=torch.Generator().manual_seed(seed))
        views = create_kv_cache_views(raw, spec, num_blocks, layout, tensor)
        kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[tensor],
                            kv_cache_groups=[KVCacheGroupSpec(names, spec)])
        cfg.cache_config.num_gpu_blocks = num_blocks
        self.sched = Scheduler(vllm_config=cfg, kv_cache_config=kvc,
                               structured_output_manager=StructuredOutputManager(cfg),
                               block_size=BLOCK, log_stats=False)
        self.worker = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.WORKER, kvc)
        self.worker.register_kv_caches(dict(zip(names, views)))

    def schedule(self, prompt: list[int], rid: str):
        self.sched.add_request(Request(request_id=rid, prompt_token_ids=prompt,
                                       sampling_params=SamplingParams(max_tokens=1),
                                       pooling_params=None))
        return self.sched.schedule()

    def forward(self, out) -> tuple[float, float]:
        """The worker connector's part of the step; returns the seconds start_load_kv and
        wait_for_save took."""
        w = self.worker
        w.bind_connector_metadata(out.kv_connector_metadata)
        t0 = time.perf_counter()
        w.start_load_kv(None)
        t1 = time.perf_counter()
        w.wait_for_save()
        t2 = time.perf_counter()
        w.clear_connector_metadata()
        return t1 - t0, t2 - t1

    def await_loaded(self, rid: str) -> None:
        while rid not in (self.worker.get_finished(set())[1] or ()):
            time.sleep(0.0002)
        if self.worker.get_block_ids_with_load_errors():
            raise RuntimeError("kvpool.vllm reported load errors")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    # One torch thread everywhere: on a 2-vCPU VM torch's two-thread strided copies (the
    # gather and scatter between kvpool's block layout and vLLM's views) ran 10-45x slower than
    # one thread, while the background threads ran one; that would compare thread counts.
    torch.set_num_threads(1)
    n = args.blocks
    block_bytes = LAYERS * 2 * BLOCK * KV_HEADS * HEAD_DIM * 2
    # Every store puts a prompt of its own (kvpool skips blocks it holds); twice their bytes,
    # so the host tier stays below its high watermark and no demotion to disk runs meanwhile.
    capacity_mib = max(512, 2 * (2 * args.reps + 4) * n * block_bytes >> 20)
    figures: dict[str, float] = {"blocks": n, "block_bytes": block_bytes}
    with tempfile.TemporaryDirectory() as tmp, \
            Daemon([f"--host_capacity={capacity_mib}MiB", "--host_segment_size=64MiB",
                    "--lock_memory=true"]) as d:   # the arena faulted in at start, as by default
        model = model_dir(pathlib.Path(tmp))
        prompts = iter(prompt_of(n, i) for i in range(1 << 20))
        # One instance per path, as a vLLM worker lives on: its threads and staging buffers
        # are made in the warm-up run. Each run's request is aborted after it; its blocks may
        # stay taken (nothing reports the background work to the scheduler here), so the
        # instance has blocks for every run.
        blocks = (n + 2) * (args.reps + 1)
        for mode in ("sync", "async"):
            inst = Instance(model, d.socket, blocks, mode == "async", seed=1)

            def store(rep: int) -> tuple[float, float]:
                out = inst.schedule(next(prompts), f"store-{mode}-{rep}")
                t0 = time.perf_counter()
                stall = inst.forward(out)[1]
                inst.worker.wait_for_background()
                done = time.perf_counter() - t0
                inst.sched.finish_requests(f"store-{mode}-{rep}", RequestStatus.FINISHED_ABORTED)
                return stall, done

            figures[f"save_{mode}_stall_s"], figures[f"save_{mode}_done_s"] = medians(
                store, args.reps)
            inst.worker.shutdown()
            del inst
            gc.collect()   # vLLM's objects hold reference cycles
        prompt = next(prompts)
        src = Instance(model, d.socket, n + 2, False, seed=1)
        src.forward(src.schedule(prompt, "store"))
        keys = kvpool.hash_chain(prompt[:n * BLOCK], secret=SECRET, layout=src.worker.layout,
                                 tokens_per_block=BLOCK)
        with kvpool.Client(d.socket, namespace="bench") as c:
            if c.lookup(keys).hit_blocks != n:
                raise RuntimeError("the stored prompt is not all in kvpool")
            staging = torch.empty((n, block_bytes), dtype=torch.uint8)
            bufs = [staging[i].numpy() for i in range(n)]

            def bare_get() -> None:
                if not all(c.get_into(keys, bufs)):
                    raise RuntimeError("bare get missed")

            dst = torch.empty_like(staging)
            figures["bare_get_s"] = median_s(bare_get, args.reps)
            figures["copy_s"] = median_s(lambda: dst.copy_(staging), args.reps)
        for mode in ("sync", "async"):
            inst = Instance(model, d.socket, blocks, mode == "async", seed=2)

            def load(rep: int) -> tuple[float, float]:
                rid = f"{mode}-{rep}"
                out = inst.schedule(prompt, rid)
                t0 = time.perf_counter()
                stall = inst.forward(out)[0]
                if mode == "async":
                    inst.await_loaded(rid)
                done = time.perf_counter() - t0
                inst.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
                return stall, done

            figures[f"load_{mode}_stall_s"], figures[f"load_{mode}_done_s"] = medians(
                load, args.reps)
            inst.worker.shutdown()
            del inst
            gc.collect()
    print(f"kvpool.vllm, a prompt of {n} blocks x {block_bytes >> 20} MiB "
          f"({n * block_bytes / 2**20:.0f} MiB), median of {args.reps}:")
    for op in ("load", "save"):
        for mode in ("sync", "async"):
            print(f"  {op} {mode:5s}  step stall {figures[f'{op}_{mode}_stall_s'] * 1e3:8.2f} ms"
                  f"   done {figures[f'{op}_{mode}_done_s'] * 1e3:8.2f} ms")
    print(f"  bare kvpool get_into      {figures['bare_get_s'] * 1e3:8.2f} ms")
    print(f"  torch copy of the bytes   {figures['copy_s'] * 1e3:8.2f} ms")
    print(f"  async / sync step stall: load "
          f"{figures['load_async_stall_s'] / figures['load_sync_stall_s']:.4f}, save "
          f"{figures['save_async_stall_s'] / figures['save_sync_stall_s']:.4f}; "
          f"sync load / bare get {figures['load_sync_done_s'] / figures['bare_get_s']:.2f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


def medians(run: Callable[[int], tuple[float, float]], reps: int) -> tuple[float, float]:
    """Medians of run(rep)'s two figures over reps runs, after one to warm up."""
    figures = [run(rep) for rep in range(reps + 1)][1:]
    return (statistics.median(f[0] for f in figures), statistics.median(f[1] for f in figures))


def prompt_of(n: int, i: int) -> list[int]:
    """A prompt of n full blocks and one token, its own for each i."""
    return [(t * 7919 + 13 + i * 104729) % 32000 + 3 for t in range(n * BLOCK + 1)]


if __name__ == "__main__":
    sys.exit(main())
