"""kvpool.vllm: a vLLM 0.33 KV connector (`KVConnectorBase_V1`) over kvpool.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvpoolConnector",
        "kv_connector_module_path": "kvpool.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": "/run/kvpool/kvpool.sock",
            "namespace": "default", "secret": "tenant salt", "model_id": "org/name@rev"}}'

(A namespace with a credential, or a daemon behind TLS: the extra config's `credential_file`,
`tls_ca`, `tls_cert`, `tls_key`, as every kvpool connector reads them: kvpool/_options.py.)

Design (the why; the templates are vLLM's v1/example_connector.py and v1/mooncake/store/):
- Keys are kvpool's own (spec/block-keys.md): kvpool.hash_chain over the request's token ids
  with the layout string of the model config (model id, KV dtype, layers, kv heads per rank,
  head dim, tokens per block = vLLM's block size, tp rank and size, encoding raw). vLLM's own
  block hashes are never used, so a prefix stored here is found by kvpool.hf of the same
  layout (SGLang and LMCache key by their own page hashes: they do not find it). `model_id`
  (extra config; default: the model path and revision, and the quantization method and a hash
  of hf_overrides when set) must name the weights.
- A block's bytes are kvpool's raw payload [layer][k|v][token][kv_head][head_dim] in the
  model's dtype, so other engines read the same bytes.
- vLLM's per-layer KV is a 4-D view [num_blocks, kv_heads, block_size, head_size + head_size_v]
  over one byte buffer in one of six physical orders (v1/kv_cache_layout.py). It is read and
  written only through torch indexing on that view, i.e. by its strides; contiguity is never
  assumed. Slot s (= block_id * block_size + offset) is view block s // N, offset s % N, with
  N the view's tokens per block (smaller than block_size when vLLM splits kernel blocks).
- Scheduler side: get_num_new_matched_tokens looks the prompt's full blocks up in kvpool (for
  every tp rank's layout; the shortest hit wins) and offers whole blocks, fewer than the
  prompt (vLLM must compute at least one token). build_connector_meta hands the workers the
  token ids and vLLM block ids of the blocks to load, and of the prompt's newly computed full
  blocks to save.
- Loads are asynchronous by default (extra config "load_async": true): the scheduler side
  answers (tokens, True), vLLM allocates the request's blocks and parks it in
  WAITING_FOR_REMOTE_KVS, update_state_after_alloc records those blocks and the next
  build_connector_meta hands them to the workers. Each worker loads them on one background
  thread with a kvpool client of its own (on a GPU: on a CUDA stream of its own that first
  waits for what vLLM queued before start_load_kv, e.g. the blocks' zeroing) while the batch's
  other requests go on computing; get_finished reports the request once every copy into the
  paged KV is done, together with any block that failed (get_block_ids_with_load_errors, the
  same pass), and vLLM schedules it from there. Every load handed to a worker is reported
  finished exactly once, also for a request aborted meanwhile (vLLM keeps its blocks until
  then). With "load_async": false, start_load_kv loads before the forward instead.
- Saves are asynchronous too by default ("save_async"): wait_for_save hands the step's newly
  computed full prompt blocks to a second background thread (its own client; on a GPU its own
  stream, after an event recorded behind the forward), which gathers them from the paged KV and
  puts the ones kvpool lacks (put-if-absent, lookup first). A request that had saves handed out
  keeps its blocks past its end (request_finished answers True) until every worker reports it in
  finished_sending; a preempted request's saves are waited for in handle_preemptions (and in
  bind_connector_metadata, whichever a model runner calls first) before the forward can write
  its freed blocks. With "save_async": false, wait_for_save stores before it returns.
- On a GPU whose kvpoold runs a gpu tier there (`kvpoold --gpu_devices`), saves are copied
  device to device into that tier ("save_to_gpu": true, the default; the daemon makes the host
  copy behind the put), so a later load on the node reads them device to device; elsewhere, or
  with "save_to_gpu": false, they are copied from the staging buffer straight into the daemon's
  host memory. Loads into the KV cache read device to device wherever a block is in the gpu
  tier of the same GPU, and otherwise by one host-to-device copy from the daemon's memory.
- A load reads every block (verified: OK and exactly the layout's size) and scatters the good
  prefix. Each kvpool call moves at most 32 MiB through a staging buffer that each thread keeps.
  save_kv_layer and wait_for_layer_load have nothing to do.
- kvpool failures never reach vLLM: kvpool.Error, OSError and TimeoutError are a miss
  (0 matched tokens), a skipped store, or a failed load whose vLLM block ids are reported by
  get_block_ids_with_load_errors (vLLM recomputes them: the connector sets vLLM's
  kv_load_failure_policy from "fail", its default, which would fail the request, to
  "recompute", with a warning). Each outage is one warning on the
  "kvpool.vllm" logger. Each client uses a short timeout (2 s) and is made again after a
  failure, so a restarted daemon is found.
- Only one KV cache group of full attention (uniform models), fp16/bf16/fp32 KV and no
  pipeline or context parallelism (a stage's layers are not in the layout string; a context-
  parallel rank's block interleaves tokens); for anything else (hybrid or sliding-window models,
  fp8 KV, MLA, pipeline stages, decode or prefill context parallelism) the connector disables
  itself with a warning and every request is a miss.
- A synchronous load ("load_async": false) that fails in a step skips every save of that step
  (its forward attended to the blocks not loaded); with tensor parallelism loads are always
  asynchronous (a rank's failed load reaches every rank through the forward).
- A request whose KV depends on more than its token ids gets keys that say so, as vLLM's own
  prefix-cache hashes do (v1/core/kv_cache_utils.py, generate_block_hash_extra_keys): a block's
  layout string gains ";extra=" and the hex SHA-256 of what it depends on: the LoRA adapter
  (name and path) in every block, each multimodal input (its content hash and its offset in
  the block) in every block it overlaps, the cache salt in the first block, and for a request
  with prompt embeddings, each block's own rows of them (the SHA-256 of their bytes, and which
  of its positions are token ids in a prompt that mixes both; vLLM's token ids are 0 where an
  embedding stands). Every key chains its parent, so a block's key commits to all of that up to
  it: blocks before a request's first image are shared with the same text without it, nothing
  after. (spec/block-keys.md lets a layout's owner add properties; these are this connector's.)
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

import kvpool
from kvpool._options import client_kwargs
from kvpool._outage import KVPOOL_FAILURES, OutageLog
from kvpool._transfer import Link, TransferThread, gpu_tier_device
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (KVConnectorPromMetrics,
                                                                  KVConnectorStats)
from vllm.v1.metrics.utils import create_metric_per_engine
from vllm.v1.kv_cache_interface import FullAttentionSpec

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["KvpoolConnector", "KvpoolConnectorMetadata", "KvpoolConnectorStats",
           "KvpoolPromMetrics", "BlockSpan", "layout_for"]

log = logging.getLogger("kvpool.vllm")

_KVPOOL_FAILURES = KVPOOL_FAILURES
_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_CHUNK_BYTES = 32 << 20   # per kvpool call of a load or save


@dataclasses.dataclass
class BlockSpan:
    """Blocks [first, end) of a request: `token_ids` are its first end * block_size tokens
    (what the keys are computed from), `block_ids` the vLLM blocks of [first, end)."""

    req_id: str
    token_ids: list[int]
    first: int
    end: int
    block_ids: list[int]
    # The request's key context (_key_context): runs of (first block, layout suffix).
    context: tuple[tuple[int, str], ...] = ()


@dataclasses.dataclass
class KvpoolConnectorMetadata(KVConnectorMetadata):
    loads: list[BlockSpan] = dataclasses.field(default_factory=list)         # before the forward
    async_loads: list[BlockSpan] = dataclasses.field(default_factory=list)   # in the background
    saves: list[BlockSpan] = dataclasses.field(default_factory=list)
    # Requests preempted (their blocks freed) since the last step: a save of theirs still
    # reading those blocks is waited for before the forward writes them again.
    preempted: set[str] = dataclasses.field(default_factory=set)


# Counters of KvpoolConnectorStats: the scheduler side's lookups, the workers' loads and stores
# (what each counts, also the help text of its Prometheus counter vllm:kvpool_<key>_total).
_STAT_DOCS = {
    "lookups": "Prompts looked up in kvpool by vLLM's scheduler.",
    "lookup_errors": "Lookups that failed (kvpool unreachable or erring): misses.",
    "hit_tokens": "Prompt tokens found in kvpool beyond vLLM's own prefix cache.",
    "loads": "Loads of a request's blocks from kvpool into the paged KV cache (per worker).",
    "blocks_loaded": "Blocks loaded from kvpool into the paged KV cache.",
    "blocks_load_failed": "Blocks a load could not bring (vLLM recomputes them).",
    "blocks_loaded_lossy": "Blocks loaded that kvpool decoded from a lossy copy (a namespace "
                           "whose policy keeps int8/fp8/int4 copies): approximate KV.",
    "bytes_loaded": "Bytes loaded from kvpool.",
    "load_seconds": "Seconds spent loading from kvpool (in the background or before a forward).",
    "stores": "Stores of a request's new prompt blocks into kvpool (per worker).",
    "blocks_stored": "Blocks stored into kvpool (those it lacked).",
    "bytes_stored": "Bytes stored into kvpool.",
    "store_seconds": "Seconds spent storing into kvpool.",
}
_STAT_KEYS = tuple(_STAT_DOCS)


class KvpoolConnectorStats(KVConnectorStats):
    """What kvpool.vllm did in one interval, as counters (`_STAT_KEYS`). vLLM gathers them
    from the scheduler and every worker each step (aggregate: sums) and logs reduce() with its
    other statistics; an operator sees failed loads there (each one recomputed) beside
    kvpoold's own metrics."""

    def __post_init__(self) -> None:
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data = dict.fromkeys(_STAT_KEYS, 0)

    def record(self, **counts: float) -> None:
        for key, value in counts.items():
            self.data[key] = self.data.get(key, 0) + value

    def aggregate(self, other: KVConnectorStats) -> "KvpoolConnectorStats":
        self.record(**other.data)
        return self

    def reduce(self) -> dict[str, int | float]:
        out = dict(self.data)
        for op, moved in (("load", "bytes_loaded"), ("store", "bytes_stored")):
            seconds = self.data.get(f"{op}_seconds", 0)
            out[f"{op}_GBps"] = round(self.data.get(moved, 0) / seconds / 1e9, 3) if seconds else 0
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KvpoolPromMetrics(KVConnectorPromMetrics):
    """KvpoolConnectorStats as Prometheus counters on vLLM's /metrics endpoint, one
    vllm:kvpool_<key>_total per counter and engine (vLLM calls observe with each interval's
    sums)."""

    def __init__(self, vllm_config: "VllmConfig", metric_types: dict[type, type],
                 labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {
            key: create_metric_per_engine(
                self._counter_cls(name=f"vllm:kvpool_{key}", documentation=doc,
                                  labelnames=labelnames),
                self.per_engine_labelvalues)
            for key, doc in _STAT_DOCS.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, per_engine in self._counters.items():
            value = transfer_stats_data.get(key, 0)
            if value:
                per_engine[engine_idx].inc(value)


@dataclasses.dataclass
class _Tracker:
    """Scheduler-side state of one running request."""

    prompt: list[int]
    block_ids: list[int]
    saved_blocks: int   # prompt blocks known to be in kvpool or already handed to a save
    context: tuple[tuple[int, str], ...] = ()   # _key_context


def layout_for(model_id: str, dtype: torch.dtype, layers: int, kv_heads: int, head_dim: int,
               block_size: int, tp_rank: int = 0, tp_size: int = 1) -> str:
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"kvpool.vllm: unsupported KV dtype {dtype}")
    return kvpool.layout_string(model=model_id, dtype=_DTYPE_NAMES[dtype], layers=layers,
                                kv_heads=kv_heads, head_dim=head_dim,
                                tokens_per_block=block_size, tp_rank=tp_rank, tp_size=tp_size,
                                encoding="raw")


def _default_model_id(mc: Any, load_format: Any = None) -> str | None:
    """The model path and revision, and what else changes the KV of the same weights files: the
    quantization method, overrides of the model's config (hf_overrides, as their SHA-256), and
    weights that are not the files' (load_format "dummy": random weights, for benchmarks).
    None where overrides are a function: the extra config's model_id must then name the weights."""
    model_id = f"{mc.model}@{mc.revision}" if getattr(mc, "revision", None) else str(mc.model)
    quantization = getattr(mc, "quantization", None)
    if quantization:
        model_id += f"+quantization={quantization}"
    if str(getattr(load_format, "value", load_format)).lower() == "dummy":
        model_id += "+load_format=dummy"
    overrides = getattr(mc, "hf_overrides", None)
    if overrides and not callable(overrides):
        digest = hashlib.sha256(json.dumps(overrides, sort_keys=True, default=str).encode())
        model_id += f"+hf_overrides={digest.hexdigest()[:16]}"
    elif callable(overrides):
        return None   # a function: nothing stable names what it changes
    return model_id


def _layer_index(name: str) -> int:
    nums = re.findall(r"\.(\d+)(?:\.|$)", name)
    return int(nums[0]) if nums else -1


class KvpoolConnector(KVConnectorBase_V1):
    """vLLM KV connector over kvpoold. Extra config keys: socket (default: kvpool's default
    socket), namespace ("default"), secret (the namespace secret salting every key; required),
    model_id (default: the model path, "@revision" when set, "+quantization=...",
    "+hf_overrides=..." and "+load_format=dummy" when set), timeout (seconds, 2.0),
    load_async and save_async (true: load, and store, in the background while the batch
    computes), save_to_gpu (see the module docstring), credential_file and tls_ca, tls_cert,
    tls_key (kvpool/_options.py), client_factory (tests: a callable returning a
    kvpool.Client)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
        self._block_size = int(cc.block_size)
        self._tp_size = int(pc.tensor_parallel_size)
        own_rank = self._own_tp_rank() if role == KVConnectorRole.WORKER else 0
        self._tp_rank = own_rank if own_rank is not None else 0
        self._secret = extra.get("secret")
        if not self._secret:
            raise ValueError("kvpool.vllm: kv_connector_extra_config needs 'secret' (the "
                             "namespace secret salting kvpool keys)")
        load_config = getattr(vllm_config, "load_config", None)
        model_id = extra.get("model_id") or _default_model_id(
            mc, getattr(load_config, "load_format", None))
        self._disabled: str | None = None
        if getattr(self._kv_transfer_config, "kv_load_failure_policy", None) == "fail":
            # vLLM's default fails a request whose load failed: a block evicted between lookup
            # and load would fail the user's request. kvpool is a cache, so recompute instead.
            try:
                self._kv_transfer_config.kv_load_failure_policy = "recompute"
                log.warning("kvpool.vllm: kv_load_failure_policy 'fail' set to 'recompute': a "
                            "failed kvpool load is recomputed, never a failed request")
            except Exception:  # noqa: BLE001 - a frozen config: say what to set
                log.warning("kvpool.vllm: kv_load_failure_policy is 'fail': a failed kvpool "
                            "load fails its request; set \"kv_load_failure_policy\": "
                            "\"recompute\" in --kv-transfer-config")
        self._dtype = self._kv_dtype(vllm_config)
        self._layers = int(mc.get_num_layers(pc))
        self._kv_heads = int(mc.get_num_kv_heads(pc))
        self._head_dim = int(mc.get_head_size())
        if self._dtype is None:
            self._disabled = f"KV cache dtype {cc.cache_dtype!r} (kvpool.vllm: fp16/bf16/fp32)"
        elif getattr(mc, "use_mla", False):
            self._disabled = "MLA models"
        elif kv_cache_config is not None and len(kv_cache_config.kv_cache_groups) != 1:
            self._disabled = "more than one KV cache group (hybrid models)"
        elif kv_cache_config is not None and (
                type(kv_cache_config.kv_cache_groups[0].kv_cache_spec) is not FullAttentionSpec):
            # Sliding-window or chunked-local attention frees a running request's blocks that
            # left the window: a queued save could read them after their reuse.
            spec = type(kv_cache_config.kv_cache_groups[0].kv_cache_spec).__name__
            self._disabled = f"{spec} KV (kvpool.vllm: full attention only)"
        elif kv_cache_config is not None and (
                len(kv_cache_config.kv_cache_groups[0].layer_names) != self._layers):
            # The worker would turn itself off when its KV layers are registered (e.g. a draft
            # model's layers beside the model's), and every hit the scheduler offered would
            # then fail to load: both sides turn off.
            self._disabled = (f"{len(kv_cache_config.kv_cache_groups[0].layer_names)} KV layers, "
                              f"the model config has {self._layers}")
        elif int(getattr(pc, "pipeline_parallel_size", 1)) > 1:
            # A stage holds some layers, and the layout string does not say which: two stages
            # would store different KV under one key.
            self._disabled = "pipeline parallelism"
        elif (int(getattr(pc, "decode_context_parallel_size", 1) or 1)
              * int(getattr(pc, "prefill_context_parallel_size", 1) or 1)) > 1:
            # The scheduler's block is then block_size x the context-parallel ranks, its tokens
            # interleaved across them: a rank's block is not the tokens its key names.
            self._disabled = "context parallelism (decode or prefill)"
        if self._disabled is None and model_id is None:
            self._disabled = "hf_overrides given as a function (name the weights: 'model_id')"
        if self._disabled is None and own_rank is None and self._tp_size > 1:
            # Keyed as rank 0, this rank would store its heads under rank 0's keys, and load
            # rank 0's heads into its own. (The scheduler side cannot tell; its offers then fail
            # to load and are recomputed once each. vLLM 0.33 always gives workers a TP group.)
            self._disabled = "a tensor-parallel worker whose rank vLLM does not tell"
        self._layouts: list[str] = []
        if self._disabled is None:
            self._layouts = [layout_for(model_id, self._dtype, self._layers, self._kv_heads,
                                        self._head_dim, self._block_size, r, self._tp_size)
                             for r in range(self._tp_size)]
            self.layout = self._layouts[self._tp_rank]
        else:
            log.warning("kvpool.vllm: disabled for %s; every request is a miss", self._disabled)
            self.layout = ""
        self._elem = torch.empty((), dtype=self._dtype or torch.float16).element_size()
        self.block_bytes = (self._layers * 2 * self._block_size * self._kv_heads
                            * self._head_dim * self._elem)
        # Blocks moved per kvpool call: bounds each thread's staging buffer.
        self._chunk_blocks = max(1, _CHUNK_BYTES // self.block_bytes)
        factory = extra.get("client_factory")
        if factory is None:
            address = extra.get("socket")
            namespace = str(extra.get("namespace", "default"))
            timeout = float(extra.get("timeout", 2.0))
            reach = client_kwargs(extra)
            factory = lambda: kvpool.Client(address, namespace=namespace,  # noqa: E731
                                            timeout=timeout, connect_timeout=timeout, **reach)
        self._link = Link(factory, OutageLog(log, "kvpool.vllm", "misses"))
        self._load_async = _flag(extra.get("load_async", True))
        if not self._load_async and self._tp_size > 1:
            # A rank whose synchronous load fails leaves stale KV in its heads, and the forward
            # spreads that to every rank (all-reduce) before any of them could hold its saves
            # back: asynchronous loads let vLLM cut failed blocks off before the forward.
            log.warning("kvpool.vllm: load_async false is not safe with tensor parallelism; "
                        "loading asynchronously")
            self._load_async = True
        self._save_async = _flag(extra.get("save_async", True))
        self._save_to_gpu = _flag(extra.get("save_to_gpu", True))
        # scheduler side
        self._trackers: dict[str, _Tracker] = {}
        self._pending_load: dict[str, tuple[int, int]] = {}   # req_id -> (first, end) blocks
        self._async_loads: list[BlockSpan] = []   # allocated, for the next build_connector_meta
        self._loaded_end: dict[str, int] = {}     # req_id -> end of its asynchronous load
        # req_id -> its key context (_key_context), from get_num_new_matched_tokens; a request
        # never seen there, or one that cannot be keyed (a multimodal input without a content
        # hash), is not stored.
        self._contexts: dict[str, tuple[tuple[int, str], ...]] = {}
        # req_id -> request.num_preemptions when its asynchronous load was handed out: asked
        # again in that admission, the load failed from its first block (vLLM re-admits it).
        self._load_admission: dict[str, int] = {}
        self._saving_reqs: set[str] = set()   # asynchronous saves handed out since admission
        # worker side
        self._kv_caches: list[torch.Tensor] = []
        self._load_errors: set[int] = set()
        self._step_load_failed = False   # a synchronous load of this step failed (wait_for_save)
        self._loader = TransferThread("kvpool-vllm-load", factory,
                                   OutageLog(log, "kvpool.vllm", "misses (loads)"))
        # -> its span; each gives ((loaded, lossy), seconds)
        self._loading: dict[concurrent.futures.Future[tuple[tuple[int, int], float]],
                            BlockSpan] = {}
        self._saver = TransferThread("kvpool-vllm-save", factory,
                                  OutageLog(log, "kvpool.vllm", "stores skipped"))
        self._saves: dict[concurrent.futures.Future[tuple[int, float]], str] = {}   # -> req_id
        self._save_reqs: set[str] = set()       # requests with saves handed to the saver
        # req_id -> keys of its prompt blocks hashed by its saves so far (_chain); the saver
        # thread adds, get_finished drops a finished request's once none of its saves is queued.
        self._chains: dict[str, list[bytes]] = {}
        self._chains_lock = threading.Lock()
        self._finished_saving: set[str] = set()   # of those, finished in vLLM: report when done
        self._stats = KvpoolConnectorStats()   # since the last get_kv_connector_stats
        self._lossy_said = False   # blocks decoded from lossy copies were logged once

    @property
    def requires_kv_delivery(self) -> bool:
        """False: kvpool is a best-effort cache (a save that does not happen is a later miss),
        so vLLM keeps a preempted request's output rather than recomputing it (its default, for
        kv_both, is True). A preempted request's queued saves still read its blocks before the
        next forward writes them (KvpoolConnectorMetadata.preempted)."""
        return False

    # ---- config ----

    @staticmethod
    def _own_tp_rank() -> int | None:
        """This worker's tensor-parallel rank; None where vLLM has no TP group to ask (a single
        rank is then rank 0; several turn the connector off)."""
        try:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            return int(get_tensor_model_parallel_rank())
        except (AssertionError, ImportError, AttributeError):
            return None

    @staticmethod
    def _kv_dtype(vllm_config: "VllmConfig") -> torch.dtype | None:
        cache_dtype = str(vllm_config.cache_config.cache_dtype)
        if cache_dtype == "auto":
            dt = vllm_config.model_config.dtype
        else:
            dt = {"float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
                  "float32": torch.float32, "float": torch.float32}.get(cache_dtype)
        return dt if dt in _DTYPE_NAMES else None

    def _keys(self, tokens: Sequence[int], layout: str | None = None,
              context: tuple[tuple[int, str], ...] = (), first: int = 0,
              parent: bytes | None = None) -> list[bytes]:
        """kvpool's keys of the full blocks [first, ...) of `tokens`: one chain, each run of
        `context` hashed with its suffix on the layout string, continuing from the key before
        it; `parent` is the key of block first - 1 (None for block 0)."""
        layout = layout or self.layout
        tokens, B = list(tokens), self._block_size
        blocks = len(tokens) // B
        runs = ([(0, "")] if not context or context[0][0] > 0 else []) + list(context)
        keys: list[bytes] = []
        for i, (start, suffix) in enumerate(runs):
            stop = min(runs[i + 1][0] if i + 1 < len(runs) else blocks, blocks)
            start = max(start, first)
            if start >= stop:
                continue
            keys += kvpool.hash_chain(tokens[start * B:stop * B], secret=self._secret,
                                      layout=layout + suffix, tokens_per_block=B,
                                      parent=keys[-1] if keys else parent)
        return keys

    # ==== scheduler side ====

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        if self._disabled:
            return 0, False
        prompt = _prompt_tokens(request)
        B = self._block_size
        context = self._contexts.get(request.request_id)   # asked again while it waits
        if context is None:
            context = _key_context(request, len(prompt) // B, B)
        if context is None:
            return 0, False
        self._contexts[request.request_id] = context
        if self._load_admission.get(request.request_id) == request.num_preemptions:
            # Its load failed from the first block: computed, not offered again (a load that
            # fails every time, e.g. a worker that turned itself off, would loop forever).
            return 0, False
        usable = max(len(prompt) - 1, 0) // B   # vLLM must compute at least one token
        if usable * B <= num_computed_tokens:
            return 0, False
        tokens = prompt[:usable * B]
        try:
            client = self._link.client()
            hit = usable
            for layout in self._layouts:   # every tp rank must find its blocks
                hit = min(hit, client.lookup(self._keys(tokens, layout, context)).hit_blocks)
                if hit == 0:
                    break
        except Exception as e:  # noqa: BLE001 - any failure is a miss
            self._link.failed("lookup", e)
            self._stats.record(lookups=1, lookup_errors=1)
            return 0, False
        self._link.answered()
        matched = hit * B
        self._stats.record(lookups=1, hit_tokens=max(matched - num_computed_tokens, 0))
        if matched <= num_computed_tokens:
            return 0, False
        self._pending_load[request.request_id] = (num_computed_tokens // B, hit)
        return matched - num_computed_tokens, self._load_async

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        req_id = request.request_id
        if num_external_tokens == 0:   # nothing to load (also: the call after an async load)
            self._pending_load.pop(req_id, None)
            return
        pending = self._pending_load.get(req_id)
        if pending is None:
            return
        # vLLM may take fewer tokens than offered: load the blocks that hold what it took.
        first, end = pending
        end = min(end, first + -(-num_external_tokens // self._block_size))
        if not self._load_async:
            self._pending_load[req_id] = (first, end)
            return
        del self._pending_load[req_id]
        # The request waits in WAITING_FOR_REMOTE_KVS and is not in this step's scheduled
        # requests: its blocks are known only here.
        block_ids = list(blocks.get_block_ids()[0])
        prompt = _prompt_tokens(request)
        context = self._contexts.get(req_id)
        if context is None:   # (cannot happen: the lookup that offered the load recorded it)
            log.error("kvpool.vllm: request %s has no key context; its load fails", req_id)
            prompt = []       # no keys: every block is a load error, recomputed
        self._async_loads.append(BlockSpan(req_id, prompt[:end * self._block_size], first, end,
                                           block_ids[first:end], context or ()))
        self._loaded_end[req_id] = end
        self._load_admission[req_id] = request.num_preemptions

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = KvpoolConnectorMetadata()
        # Every recorded load goes out, also for a request finished since: vLLM frees the
        # blocks of an aborted load only when a worker reports it finished.
        meta.async_loads, self._async_loads = self._async_loads, []
        for req_id in scheduler_output.finished_req_ids:
            self._forget(req_id)
        # A preempted request's saves are finished (the workers wait for them before the
        # blocks are written again): from here on it holds no blocks a save reads.
        meta.preempted = set(scheduler_output.preempted_req_ids or ())
        self._saving_reqs -= meta.preempted
        if self._disabled:
            return meta
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id not in self._contexts:
                continue
            prompt = _prompt_tokens(new)
            tr = _Tracker(prompt=prompt, block_ids=list(new.block_ids[0]),
                          saved_blocks=self._loaded_blocks(new.req_id, new.num_computed_tokens),
                          context=self._contexts[new.req_id])
            self._trackers[new.req_id] = tr
            self._add_load(meta, new.req_id, tr)
            self._add_save(meta, new.req_id, tr, new.num_computed_tokens
                           + scheduler_output.num_scheduled_tokens[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tr = self._trackers.get(req_id)
            if tr is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:   # preempted: new_block_ids are all of them
                tr.block_ids = list(new_ids[0]) if new_ids else []
                tr.saved_blocks = self._loaded_blocks(req_id, cached.num_computed_tokens[i])
                self._add_load(meta, req_id, tr)
            elif new_ids:
                tr.block_ids.extend(new_ids[0])
            self._add_save(meta, req_id, tr, cached.num_computed_tokens[i]
                           + scheduler_output.num_scheduled_tokens[req_id])
        return meta

    def _add_load(self, meta: KvpoolConnectorMetadata, req_id: str, tr: _Tracker) -> None:
        """The synchronous load get_num_new_matched_tokens offered the request, if any, now that
        it is scheduled and its blocks are known."""
        load = self._pending_load.pop(req_id, None)
        if load is not None:
            first, end = load
            meta.loads.append(BlockSpan(req_id, tr.prompt[:end * self._block_size], first, end,
                                        tr.block_ids[first:end], tr.context))
            tr.saved_blocks = end

    def _loaded_blocks(self, req_id: str, num_computed_tokens: int) -> int:
        """Blocks of a request scheduled after its asynchronous load that came from kvpool (so
        are not stored again): the load's, less any vLLM cut off after a failed block."""
        end = self._loaded_end.pop(req_id, 0)
        return min(end, num_computed_tokens // self._block_size)

    def _forget(self, req_id: str) -> None:
        self._trackers.pop(req_id, None)
        self._pending_load.pop(req_id, None)
        self._loaded_end.pop(req_id, None)
        self._load_admission.pop(req_id, None)
        self._contexts.pop(req_id, None)

    def _add_save(self, meta: KvpoolConnectorMetadata, req_id: str, tr: _Tracker,
                  computed_after_step: int) -> None:
        """The prompt's full blocks that this step completes (decode KV is not stored)."""
        end = min(computed_after_step, len(tr.prompt)) // self._block_size
        end = min(end, len(tr.block_ids))
        if end > tr.saved_blocks:
            meta.saves.append(BlockSpan(req_id, tr.prompt[:end * self._block_size],
                                        tr.saved_blocks, end, tr.block_ids[tr.saved_blocks:end],
                                        tr.context))
            tr.saved_blocks = end
            if self._save_async:
                self._saving_reqs.add(req_id)

    def request_finished(self, request: "Request",
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._forget(request.request_id)
        had_saves = request.request_id in self._saving_reqs
        self._saving_reqs.discard(request.request_id)
        # With asynchronous saves handed out since its admission, the blocks stay until the
        # workers report the request in finished_sending (its saves done). Not a request
        # preempted since (no computed tokens, blocks already freed): the workers drop it when
        # the preemption reaches them, in the same metadata as its end.
        return had_saves and request.num_computed_tokens > 0, None

    # ==== worker side ====

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = sorted(kv_caches, key=_layer_index)
        caches = [kv_caches[n] for n in names]
        if self._disabled:
            return
        bad = None
        if len(caches) != self._layers:
            bad = f"{len(caches)} KV layers, the model config has {self._layers}"
        for n, t in zip(names, caches):
            if bad:
                break
            if (t.dim() != 4 or t.shape[1] != self._kv_heads or t.shape[3] != 2 * self._head_dim
                    or t.dtype != self._dtype or self._block_size % t.shape[2]):
                bad = (f"layer {n}: view {tuple(t.shape)} {t.dtype}, want [blocks, "
                       f"{self._kv_heads}, N | {self._block_size}, {2 * self._head_dim}] "
                       f"{self._dtype}")
        if bad:
            self._disabled = bad
            log.warning("kvpool.vllm: disabled (%s); every request is a miss", bad)
            return
        self._kv_caches = caches

    def _slots(self, block_ids: Sequence[int], view_tokens: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor(list(block_ids), dtype=torch.int64)
        slots = (ids[:, None] * self._block_size
                 + torch.arange(self._block_size, dtype=torch.int64)[None, :]).flatten()
        return (slots // view_tokens).to(device), (slots % view_tokens).to(device)

    def _staging(self, link: Link, n: int) -> torch.Tensor:
        """Room for n blocks [n, layers, 2, B, H, D] (kvpool's payload layout) in `link`'s
        staging buffer, where the KV cache is: on a GPU the blocks move between it and
        kvpool's shared memory by one copy each, with no host buffer."""
        return link.staging((n, self._layers, 2, self._block_size, self._kv_heads,
                             self._head_dim), self._dtype, self._kv_caches[0].device)

    @staticmethod
    def _block_buffers(staging: torch.Tensor) -> list[Any]:
        """Each staged block's bytes, as kvpool takes them (CUDA tensors by DLPack)."""
        if staging.is_cuda:
            return [staging[i].view(torch.uint8) for i in range(staging.shape[0])]
        return [staging[i].view(torch.uint8).numpy() for i in range(staging.shape[0])]

    def _gather(self, block_ids: Sequence[int], out: torch.Tensor) -> None:
        """Paged KV of block_ids -> out [n, layers, 2, B, H, D] (on out's device)."""
        n, B, H, D = len(block_ids), self._block_size, self._kv_heads, self._head_dim
        for li, kv in enumerate(self._kv_caches):
            if kv.shape[2] == B:   # one view block per vLLM block: whole blocks at once
                x = kv.index_select(0, self._ids(block_ids, kv.device))   # [n, H, B, 2D]
                out[:, li, 0].copy_(x[..., :D].transpose(1, 2))
                out[:, li, 1].copy_(x[..., D:].transpose(1, 2))
                continue
            vb, off = self._slots(block_ids, kv.shape[2], kv.device)
            x = kv[vb, :, off].to(out.device)            # [n*B, H, 2D], by the view's strides
            out[:, li, 0].copy_(x[..., :D].reshape(n, B, H, D))
            out[:, li, 1].copy_(x[..., D:].reshape(n, B, H, D))

    def _scatter(self, block_ids: Sequence[int], src: torch.Tensor) -> None:
        """src [n, layers, 2, B, H, D] -> the paged KV of block_ids."""
        n, B, H, D = len(block_ids), self._block_size, self._kv_heads, self._head_dim
        for li, kv in enumerate(self._kv_caches):
            if kv.shape[2] == B:   # whole blocks: K and V halves in place, no intermediate
                ids = self._ids(block_ids, kv.device)
                kv[..., :D].index_copy_(0, ids, src[:, li, 0].to(kv.device).transpose(1, 2))
                kv[..., D:].index_copy_(0, ids, src[:, li, 1].to(kv.device).transpose(1, 2))
                continue
            vb, off = self._slots(block_ids, kv.shape[2], kv.device)
            x = torch.cat([src[:, li, 0], src[:, li, 1]], dim=-1).reshape(n * B, H, 2 * D)
            kv[vb, :, off] = x.to(kv.device)

    @staticmethod
    def _ids(block_ids: Sequence[int], device: torch.device) -> torch.Tensor:
        return torch.tensor(list(block_ids), dtype=torch.int64).to(device)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvpoolConnectorMetadata)
        self._step_load_failed = False
        for span in meta.loads:
            t0 = time.perf_counter()
            try:
                good, lossy = self._load_span(span, self._link)
            except Exception:  # noqa: BLE001 - a bug in the load: its blocks are recomputed
                log.exception("kvpool.vllm: loading request %s failed; recomputed", span.req_id)
                good, lossy = 0, 0
            if good < len(span.block_ids):
                # This step's forward attends to the blocks not loaded (whatever they held) and
                # writes KV computed from them: none of this step's saves may be stored (vLLM
                # discards the step's output for the request and recomputes from the failed
                # block; another request may share those blocks through vLLM's prefix cache).
                self._step_load_failed = True
            self._loaded(span, good, lossy, time.perf_counter() - t0)
        if not meta.async_loads:
            return
        queued = self._queued_event()
        device = self._kv_caches[0].device if self._kv_caches else torch.device("cpu")
        for span in meta.async_loads:
            self._loading[self._loader.submit(self._load_span, span, device, queued)] = span

    def _queued_event(self) -> Any:
        """On a GPU, an event after everything vLLM queued so far on its stream (the zeroing
        of freshly allocated blocks, the forward that computed the KV to save): the
        background copies wait for it."""
        if not self._kv_caches or not self._kv_caches[0].is_cuda:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self._kv_caches[0].device))
        return event

    def _load_span(self, span: BlockSpan, link: Link) -> tuple[int, int]:
        """Loads the span's blocks through `link` (the calling thread's), a chunk at a time
        through its staging buffer; returns how many from the span's start were loaded, and how
        many of those kvpool decoded from a lossy copy."""
        if self._disabled or not self._kv_caches or span.end <= span.first:
            return 0, 0
        keys = self._keys(span.token_ids, context=span.context)[span.first:span.end]
        good = lossy = 0
        while good < len(keys):
            n = min(self._chunk_blocks, len(keys) - good)
            staging = self._staging(link, n)
            try:
                results = link.client().get_into(keys[good:good + n],
                                                 self._block_buffers(staging))
            except Exception as e:  # noqa: BLE001 - a failed load is recomputed by vLLM
                link.failed("load", e)
                return good, lossy
            link.answered()
            ok = 0
            for r in results:
                if not r.ok or r.size != self.block_bytes:
                    log.warning("kvpool.vllm: request %s block %d: %s (%d bytes, want %d); "
                                "recomputed from there", span.req_id, span.first + good + ok,
                                r.code if not r.ok else "SizeMismatch", r.size,
                                self.block_bytes)
                    break
                ok += 1
            lossy += sum(1 for r in results[:ok] if r.lossy)
            if ok:
                self._scatter(span.block_ids[good:good + ok], staging[:ok])
            good += ok
            if ok < n:
                break
        return good, lossy

    def wait_for_layer_load(self, layer_name: str) -> None:
        return   # a step's synchronous loads are done when start_load_kv returns

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        return   # wait_for_save gathers every layer of a block at once (one kvpool block)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """Before the forward: a save still reading a preempted request's blocks finishes
        before the forward writes them for another request."""
        assert isinstance(kv_connector_metadata, KvpoolConnectorMetadata)
        self._await_saves(kv_connector_metadata.preempted)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        # Also here, whichever hook a model runner calls first (vLLM 0.33's calls
        # handle_preemptions first, also for a step without a forward).
        assert isinstance(connector_metadata, KvpoolConnectorMetadata)
        self._await_saves(connector_metadata.preempted)
        super().bind_connector_metadata(connector_metadata)

    def _await_saves(self, req_ids: set[str]) -> None:
        """Waits for the saves of requests just preempted, then forgets them: the scheduler side
        did too, so neither reports them when they end (only saves handed out after this)."""
        if not req_ids:
            return
        concurrent.futures.wait([f for f, r in self._saves.items() if r in req_ids])
        self._save_reqs -= req_ids
        self._finished_saving -= req_ids

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvpoolConnectorMetadata)
        if not meta.saves:
            return
        skip = self._disabled or not self._kv_caches or self._step_load_failed
        if self._step_load_failed:
            self._step_load_failed = False
            log.warning("kvpool.vllm: a load failed in this step; its saves are skipped "
                        "(%d requests' blocks)", len(meta.saves))
        if not self._save_async:
            if skip:
                return
            for span in meta.saves:
                t0 = time.perf_counter()
                try:
                    stored = self._save_span(span, self._link)
                except Exception:  # noqa: BLE001 - a bug in the save: those blocks are not stored
                    log.exception("kvpool.vllm: storing request %s failed; skipped", span.req_id)
                    continue
                self._stored(stored, time.perf_counter() - t0)
            return
        queued = self._queued_event()
        for span in meta.saves:
            # Reported in finished_sending when it finishes, whatever happens to the save:
            # vLLM holds its blocks until then.
            self._save_reqs.add(span.req_id)
            if not skip:
                self._saves[self._saver.submit(self._save_span, span, self._kv_caches[0].device,
                                               queued)] = span.req_id

    def _save_span(self, span: BlockSpan, link: Link) -> int:
        """Stores the span's blocks kvpool lacks through `link` (the calling thread's);
        returns how many were stored."""
        keys = self._chain(span)
        try:
            client = link.client()
            have = client.lookup(keys[span.first:span.end], prefetch=False).hit_blocks
            stored = 0
            i = span.first + have
            while i < span.end:
                n = min(self._chunk_blocks, span.end - i)
                staging = self._staging(link, n)
                self._gather(span.block_ids[i - span.first:i - span.first + n], staging)
                gpu = gpu_tier_device(client, staging) if self._save_to_gpu else None
                r = client.put(keys[i:i + n], self._block_buffers(staging),
                               parent=keys[i - 1] if i else None, gpu_device=gpu)
                stored += r.stored
                if not r.all_ok():
                    link.answered()   # kvpool answered, with an error for some blocks
                    first = next((e for e in r.errors if e is not None), None)
                    log.warning("kvpool.vllm: put of %d blocks of request %s: error %s", n,
                                span.req_id, first)
                    return stored
                i += n
        except Exception as e:  # noqa: BLE001 - a failed store is skipped, never raised
            link.failed("store", e)
            return 0
        link.answered()
        return stored

    def _chain(self, span: BlockSpan) -> list[bytes]:
        """Keys of the first span.end blocks of the span's request, hashing only blocks no
        earlier save of it hashed (a chunked prefill saves chunk by chunk: without this, each
        chunk would hash the whole prompt so far again)."""
        with self._chains_lock:
            known = self._chains.get(span.req_id, [])
        if len(known) < span.end:
            known = known + self._keys(span.token_ids[:span.end * self._block_size],
                                       context=span.context, first=len(known),
                                       parent=known[-1] if known else None)
            with self._chains_lock:
                self._chains[span.req_id] = known
        return known[:span.end]

    def _forget_chains(self, req_ids: set[str]) -> None:
        with self._chains_lock:
            for req_id in req_ids:
                self._chains.pop(req_id, None)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None,
                                                                set[str] | None]:
        """(requests finished in vLLM whose asynchronous saves are all done, requests whose
        asynchronous loads are done). A load's failed blocks go to the load errors first, so
        vLLM sees them in this pass."""
        saved = self._finished_saves(finished_req_ids)
        # A finished request's chain goes once no save of it is queued (its saves' end, here).
        self._forget_chains(saved | (set(finished_req_ids) - set(self._saves.values())))
        return saved or None, self._finished_loads() or None

    def _finished_saves(self, finished_req_ids: set[str]) -> set[str]:
        for future in [f for f in self._saves if f.done()]:
            req_id = self._saves.pop(future)
            try:
                self._stored(*future.result())
            except Exception:  # noqa: BLE001 - a bug in the save: those blocks are not stored
                log.exception("kvpool.vllm: storing request %s failed; skipped", req_id)
        self._finished_saving |= set(finished_req_ids) & self._save_reqs
        done = self._finished_saving - set(self._saves.values())
        self._finished_saving -= done
        self._save_reqs -= done
        return done

    def _stored(self, blocks: int, seconds: float) -> None:
        self._stats.record(stores=1, blocks_stored=blocks, bytes_stored=blocks * self.block_bytes,
                           store_seconds=seconds)

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """This side's counters since the last call (None when nothing happened)."""
        if self._stats.is_empty():
            return None
        stats, self._stats = self._stats, KvpoolConnectorStats()
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> KVConnectorStats | None:
        return KvpoolConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: dict[type, type],
                           labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]
                           ) -> KVConnectorPromMetrics | None:
        return KvpoolPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def _finished_loads(self) -> set[str]:
        done: set[str] = set()
        for future in [f for f in self._loading if f.done()]:
            span = self._loading.pop(future)
            try:
                (good, lossy), seconds = future.result()
            except Exception:  # noqa: BLE001 - a bug in the load: its blocks are recomputed
                log.exception("kvpool.vllm: loading request %s failed; recomputed",
                              span.req_id)
                good, lossy, seconds = 0, 0, 0.0
            self._loaded(span, good, lossy, seconds)
            done.add(span.req_id)
        return done

    def _loaded(self, span: BlockSpan, good: int, lossy: int, seconds: float) -> None:
        """A load of `span` ended with its first `good` blocks in the paged KV, `lossy` of them
        decoded from lossy copies."""
        if good < len(span.block_ids):
            self._load_errors.update(span.block_ids[good:])
        if lossy and not self._lossy_said:
            # The namespace's policy keeps lossy copies: approximate KV, as it allows.
            self._lossy_said = True
            log.info("kvpool.vllm: loading blocks kvpool decoded from lossy copies (the "
                     "namespace's policy): approximate KV, counted in blocks_loaded_lossy")
        self._stats.record(loads=1, blocks_loaded=good, bytes_loaded=good * self.block_bytes,
                           blocks_load_failed=len(span.block_ids) - good,
                           blocks_loaded_lossy=lossy, load_seconds=seconds)

    def wait_for_background(self, timeout: float | None = None) -> bool:
        """Blocks until every load and save handed to the background threads so far is done
        (tests, benchmarks; vLLM never needs it). False when `timeout` ran out first."""
        pending = list(self._loading) + list(self._saves)
        return not concurrent.futures.wait(pending, timeout=timeout).not_done

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        self._loader.shutdown()
        self._saver.shutdown()
        self._loading.clear()
        self._saves.clear()
        self._link.close()


def _prompt_tokens(request: Any) -> list[int]:
    """The token ids a request's keys hash, as vLLM's Request.all_token_ids begins: its prompt's,
    with 0 where a prompt embedding stands. `request`: a vLLM Request or NewRequestData."""
    ids = getattr(request, "prompt_token_ids", None)
    embeds = getattr(request, "prompt_embeds", None)
    if ids is None:
        return [0] * (len(embeds) if embeds is not None else 0)
    is_token = getattr(request, "prompt_is_token_ids", None)
    if embeds is None or is_token is None:
        return list(ids)
    return [t if k else 0 for t, k in zip(ids, is_token)]


def _embeds_digest(rows: Any) -> str:
    """Hex SHA-256 of a tensor's bytes (row-major, its own dtype), as vLLM hashes a block's prompt
    embeddings for its prefix cache."""
    return hashlib.sha256(rows.detach().flatten().cpu().contiguous().view(torch.uint8)
                          .numpy()).hexdigest()


def _key_context(request: Any, blocks: int,
                 block_size: int) -> tuple[tuple[int, str], ...] | None:
    """What the KV of a request's first `blocks` blocks depends on besides its token ids, as
    runs of (first block, layout suffix) in block order; blocks before the first run have none.
    () for a plain request; None when it cannot be keyed (a multimodal input without a content
    hash). `request`: a vLLM Request. See the module docstring."""
    lora = getattr(request, "lora_request", None)
    salt = getattr(request, "cache_salt", None)
    mm = list(getattr(request, "mm_features", None) or ())
    embeds = getattr(request, "prompt_embeds", None)
    if not (lora or salt or mm or embeds is not None):
        return ()
    if any(getattr(f, "identifier", None) is None for f in mm):
        return None
    every: list[list[Any]] = [["lora", lora.lora_name, lora.lora_path]] if lora else []
    own: dict[int, list[list[Any]]] = {}   # block -> what only it depends on
    if salt and blocks > 0:
        own.setdefault(0, []).append(["salt", salt])
    for f in mm:
        offset, length = f.mm_position.offset, f.mm_position.length
        for b in range(offset // block_size,
                       min(-(-(offset + length) // block_size), blocks)):
            own.setdefault(b, []).append(["mm", f.identifier, offset - b * block_size])
    if embeds is not None:
        is_token = getattr(request, "prompt_is_token_ids", None)
        for b in range(min(blocks, len(embeds) // block_size)):
            first, end = b * block_size, (b + 1) * block_size
            part = ["embeds", _embeds_digest(embeds[first:end])]
            if is_token is not None:   # which rows stand for token ids, not embeddings
                part.append("".join("t" if k else "e" for k in is_token[first:end]))
            own.setdefault(b, []).append(part)

    def suffix(parts: list[list[Any]]) -> str:
        if not parts:   # JSON: one string per list of parts, whatever the names hold
            return ""
        return ";extra=" + hashlib.sha256(json.dumps(parts).encode()).hexdigest()

    # Only a block in `own` and the one after it can differ from the block before.
    runs: list[tuple[int, str]] = []
    last = ""
    for b in sorted({0, *own, *(b + 1 for b in own)}):
        if b >= blocks:
            break
        this = suffix(every + own.get(b, []))
        if this != last:
            runs.append((b, this))
            last = this
    return tuple(runs)


def _flag(value: Any) -> bool:
    """A boolean of the extra config, which may arrive as JSON true/false or a string."""
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(value)
