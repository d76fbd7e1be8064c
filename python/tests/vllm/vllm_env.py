"""vLLM's real classes on the CPU for kvpool.vllm's tests (the pattern of vLLM's
tests/v1/kv_connector/unit/utils.py): a VllmConfig with a CPU device and a local config.json,
vLLM's Scheduler with the connector loaded from kv_connector_module_path, vLLM Requests, and
per-layer KV views laid out by vLLM's own compute_layout_strides / create_kv_cache_views."""

from __future__ import annotations

import itertools
import time
from unittest import mock

import torch
from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, compute_layout_strides,
                                        create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

import kvpool.vllm

LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 2, 4, 2, 16, 16   # the tiny Llama of config.json
SECRET = "vllm-test-secret"
LAYER_NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
NUM_BLOCKS = 64
_ids = itertools.count()


def make_config(model_dir: str, socket: str, *, secret: str, namespace: str = "vllm-test",
                model_id: str | None = None, block_size: int = BLOCK,
                dtype: str = "bfloat16", max_batched_tokens: int = 2048,
                load_async: bool = True, save_async: bool = True, tp_size: int = 1,
                save_to_gpu: bool = True) -> VllmConfig:
    # A generous client timeout: on a loaded 2-core CI machine a call can take over a second,
    # which would turn a hit into a miss and a store into a skip. (A killed daemon refuses at once.)
    extra = {"socket": socket, "namespace": namespace, "secret": secret, "timeout": 5.0,
             "load_async": load_async, "save_async": save_async, "save_to_gpu": save_to_gpu}
    if model_id is not None:
        extra["model_id"] = model_id
    cfg = VllmConfig(
        model_config=ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                                 dtype=dtype, max_model_len=2048, seed=0),
        cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=False),
        scheduler_config=SchedulerConfig(max_num_seqs=4,
                                         max_num_batched_tokens=max_batched_tokens,
                                         enable_chunked_prefill=True, max_model_len=2048,
                                         is_encoder_decoder=False),
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=KVTransferConfig(kv_connector="KvpoolConnector",
                                            kv_connector_module_path="kvpool.vllm",
                                            kv_role="kv_both",
                                            kv_load_failure_policy="recompute",
                                            kv_connector_extra_config=extra))
    # Tensor parallelism as each rank's config says it (no process group: a test gives each
    # worker connector its rank, see worker()).
    cfg.parallel_config.tensor_parallel_size = tp_size
    return cfg


def spec(block_size: int = BLOCK, dtype: torch.dtype = torch.bfloat16,
         kv_heads: int = KV_HEADS) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=block_size, num_kv_heads=kv_heads, head_size=HEAD_DIM,
                             dtype=dtype)


def kv_views(layout: KVCacheLayout, *, block_size: int = BLOCK, seed: int = 0,
             num_blocks: int = NUM_BLOCKS, kernel_block_size: int | None = None,
             device: str = "cpu", kv_heads: int = KV_HEADS):
    """One flat int8 buffer on `device` viewed as vLLM's per-layer [B, H, N, C] caches in
    `layout` (random bf16 contents), and the KVCacheConfig describing it. kernel_block_size:
    vLLM's split of each block into smaller kernel blocks (the views then have N < block_size)."""
    s = spec(block_size, kv_heads=kv_heads)
    strides = compute_layout_strides(s, num_blocks, LAYERS, layout)  # manager-block strides
    size = s.page_size_bytes * num_blocks * LAYERS
    tensor = KVCacheTensor(size=size, layers=list(LAYER_NAMES), layer_stride=strides[0],
                           block_stride=strides[1])
    g = torch.Generator().manual_seed(seed)
    raw = torch.randn(size // 2, generator=g).to(torch.bfloat16).view(torch.int8).to(device)
    views = create_kv_cache_views(raw, s, num_blocks, layout, tensor,
                                  kernel_block_size=kernel_block_size)
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[tensor],
                        kv_cache_groups=[KVCacheGroupSpec(list(LAYER_NAMES), s)])
    return dict(zip(LAYER_NAMES, views)), cfg


def kv_config(block_size: int = BLOCK, num_blocks: int = NUM_BLOCKS) -> KVCacheConfig:
    return kv_views(KVCacheLayout.LBHNC, block_size=block_size, num_blocks=num_blocks)[1]


def scheduler(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> Scheduler:
    vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config),
                     block_size=vllm_config.cache_config.block_size, log_stats=False)


def worker(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, kv_caches: dict,
           tp_rank: int | None = 0) -> kvpool.vllm.KvpoolConnector:
    """A worker-side connector over `kv_caches`; `tp_rank`: the tensor-parallel rank vLLM's
    process group would give it (None: none, as without a TP group)."""
    with mock.patch.object(kvpool.vllm.KvpoolConnector, "_own_tp_rank",
                           staticmethod(lambda: tp_rank)):
        w = kvpool.vllm.KvpoolConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
    w.register_kv_caches(kv_caches)
    return w


def request(tokens: list[int] | None, max_tokens: int = 4, **kw) -> Request:
    """A vLLM Request for `tokens` (None: prompt embeddings alone); `kw` go to Request
    (block_hasher, cache_salt, prompt_embeds, ...)."""
    return Request(request_id=f"req-{next(_ids)}",
                   prompt_token_ids=None if tokens is None else list(tokens),
                   sampling_params=SamplingParams(max_tokens=max_tokens), pooling_params=None,
                   **kw)


def step(sched: Scheduler, w: kvpool.vllm.KvpoolConnector, settle: bool = True):
    """One scheduler step and the worker connector's part of the forward around it (`forward`).
    Returns the SchedulerOutput."""
    out = sched.schedule()
    forward(w, out, settle)
    return out


def forward(w: kvpool.vllm.KvpoolConnector, out, settle: bool = True) -> None:
    """The worker connector's part of a step's forward (the model itself does not run): bind
    metadata, load, save, unbind; then (settle) wait for the worker's background work, so what
    the step stored is in kvpool on return."""
    w.bind_connector_metadata(out.kv_connector_metadata)
    w.handle_preemptions(out.kv_connector_metadata)
    w.start_load_kv(None)
    for name in LAYER_NAMES:
        w.wait_for_layer_load(name)
    w.wait_for_save()
    w.clear_connector_metadata()
    if settle:
        assert w.wait_for_background(timeout=10.0), "background loads or saves hang"


def loading(sched: Scheduler) -> set[str]:
    """Requests parked in WAITING_FOR_REMOTE_KVS whose load no worker has reported done."""
    return {r.request_id for r in sched.requests.values()
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            and r.request_id not in sched.finished_recving_kv_req_ids}


def finish(sched: Scheduler, w: kvpool.vllm.KvpoolConnector, out, expect: set[str] = frozenset(),
           timeout: float = 10.0) -> KVConnectorOutput:
    """Ends the step `out` as vLLM's model runner does: the worker's finished loads and load
    errors go back to the scheduler with the step's output, where each scheduled request whose
    prompt is now computed samples one token (1). Waits (as later steps would) until the loads
    of every waiting request, and of `expect`, are reported done. Returns the KVConnectorOutput."""
    waiting = loading(sched) | set(expect)
    done: set[str] = set()
    sent: set[str] = set()
    deadline = time.monotonic() + timeout
    while True:
        results = w.get_transfer_results(out.finished_req_ids)
        done |= results.finished_recving
        sent |= results.finished_sending
        if waiting <= done:
            break
        assert time.monotonic() < deadline, f"loads of {waiting - done} never finished"
        time.sleep(0.005)
    kv_out = KVConnectorOutput(finished_recving=done or None, finished_sending=sent or None,
                               invalid_block_ids=w.get_block_ids_with_load_errors())
    ids = list(out.num_scheduled_tokens)
    sampled = [[1] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens
               else [] for r in ids]
    sched.update_from_output(out, ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=sampled, kv_connector_output=kv_out))
    return kv_out


def admit(sched: Scheduler, w: kvpool.vllm.KvpoolConnector) -> dict:
    """Steps (each ended by `finish`) until no request waits for a kvpool load; returns the
    NewRequestData of every request first scheduled on the way, by request id."""
    new = {}
    while True:
        out = step(sched, w)
        new.update({r.req_id: r for r in out.scheduled_new_reqs})
        finish(sched, w, out)
        if not any(r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                   for r in sched.requests.values()):
            return new


def token_kv(views: dict, block_ids: list[int], n_tokens: int) -> torch.Tensor:
    """KV of a sequence's first n_tokens read token by token from the views (reference):
    [layers, tokens, H, 2D]."""
    out = []
    for name in LAYER_NAMES:
        v = views[name]
        rows = []
        for t in range(n_tokens):
            slot = block_ids[t // BLOCK] * BLOCK + t % BLOCK
            rows.append(v[slot // v.shape[2], :, slot % v.shape[2], :])
        out.append(torch.stack(rows))
    return torch.stack(out)
