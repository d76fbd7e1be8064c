"""kvpool.hf: a transformers `DynamicCache` <-> kvpool blocks, the adapter a HF user imports.

    import kvpool, kvpool.hf
    kv = kvpool.hf.KvpoolHFCache("/run/kvpool/kvpool.sock", model, model_id="org/name@rev",
                                 secret=b"tenant salt", namespace="default")
    out = kv.generate(model, input_ids, max_new_tokens=64)      # load prefix, generate, store
    # or by hand:
    cache, cached = kv.load_prefix(input_ids)   # DynamicCache covering `cached` tokens, or None
    out = model.generate(input_ids, past_key_values=cache or DynamicCache(config=model.config))
    kv.store(out[0], cache)                     # pushes the full blocks kvpool does not have yet
    kv.save_session("chat-42", out[0], cache)   # ... and the tail, under a named session
    cache, cached = kv.load_session("chat-42", next_input_ids)

Design (the why):
- Keys are kvpool's own (spec/block-keys.md) over the token ids, with the layout string from
  the model config: model id, dtype, layers, kv heads, head dim, tokens per block, tp rank and
  size, encoding. Two models, dtypes, block sizes or namespaces never share a key, so a wrong
  hit needs a SHA-256 collision. `model_id` must name the *weights* (a revision, or
  `weights_fingerprint(model)`), not only the architecture: random or fine-tuned weights of
  the same shape give different KV.
- A block's bytes are kvpool's raw payload, `[layer][k|v][token][kv_head][head_dim]` in the
  model's dtype (kernels/block_layout.h), so another engine reading the same layout finds the
  same bytes. Only `encoding="raw"` is written here: an encoded (quantized) layout is a
  different layout string and so never mixes with these blocks.
- Reads are verified: every block must come back OK with exactly the layout's size; the
  daemon checks each block's xxh3 checksum on every disk read and reports a mismatch as a
  per-block error. The first block that fails ends the prefix there (a miss for the rest),
  so a corrupt or foreign block never reaches the model.
- The loaded cache covers FEWER tokens than the prompt (transformers generates from the
  uncached tail and needs at least one token of it): at most `len(prompt) - 1` tokens, cut to
  a block boundary for a prefix; a session's cache is cropped to `len(prompt) - 1` if needed.
- Stores are put-if-absent: a lookup first finds how much of the chain kvpool already holds,
  and only the blocks after that are packed and sent, so a shared system prompt is sent once.
- Sessions: kvpool keys only full blocks. To resume computing only the new round's tokens the
  tail (< tokens_per_block tokens) must come back too, so `save_session` stores it as one extra
  block whose key is the same construction over the shorter tail (hash_chain with
  tokens_per_block = tail length, parent = the last full key); its hashed input is shorter
  than any full block's, so it can never equal a full-block key. The session's token ids go
  into its metadata (int32 LE, zlib, base64); `load_session` checks that they are a prefix of
  the new prompt and that the session's keys are exactly the keys of those tokens under this
  layout and secret, so the metadata cannot attach KV to other tokens.
- kvpool failures never reach the model's code: every call into kvpool is guarded; kvpool.Error,
  OSError and TimeoutError become a miss (load) or a skipped store, logged once per outage as
  a warning on the "kvpool.hf" logger (and an info line when kvpool answers again). The client
  is made with a short timeout (2 s by default) so a stalled daemon costs at most that, and is
  made again after an Unavailable, so a restarted daemon is found.
- Blocks are staged where the model's KV is (`device`, by default the model's: a CUDA device
  or the CPU), and loaded caches are made there. On a GPU each block moves between device
  memory and kvpool's with one copy: into or out of the daemon's shared memory, or device to
  device where kvpoold runs a gpu tier on that GPU (stores then go into it, and loads read
  from it; kvpool._transfer.gpu_tier_device).
- One sequence at a time (batch size 1): prefixes differ per row; a batching caller calls per
  row. Not thread-safe: one adapter per thread (it reuses a staging buffer).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
import zlib
from typing import Any, Callable, Sequence

import numpy as np
import torch
from transformers import DynamicCache

import kvpool
from kvpool._options import client_kwargs
from kvpool._outage import KVPOOL_FAILURES, LossyLoads, OutageLog, close_quietly
from kvpool._transfer import gpu_tier_device

__all__ = ["KvpoolHFCache", "weights_fingerprint", "layout_for", "LoadInfo"]

log = logging.getLogger("kvpool.hf")

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# What a kvpool call can raise when the daemon is down, slow or refuses. Anything else is a
# bug in this module or the extension and is logged with its traceback (still a miss).
_KVPOOL_FAILURES = KVPOOL_FAILURES
# generate() arguments with which the KV of a prompt depends on more than its token ids.
_INPUTS_BEYOND_TOKENS = frozenset({
    "inputs_embeds", "pixel_values", "pixel_values_videos", "image_grid_thw",
    "video_grid_thw", "position_ids", "cache_position", "token_type_ids", "input_features",
    "image_sizes", "audio_values"})
_META_FORMAT = "kvpool.hf/1"
# A put is split into calls of about this many payload bytes (each within the daemon's frame
# and lease budgets; with shared memory no payload byte crosses the socket anyway).
_PUT_CHUNK_BYTES = 32 << 20


def weights_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 (first 16 hex digits) over the model's parameter names, dtypes, shapes and bytes:
    a model id for weights that have no published revision (random or locally tuned)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        t = p.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def _config_dims(config: Any) -> tuple[int, int, int]:
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return layers, kv_heads, head_dim


def layout_for(config: Any, model_id: str, dtype: torch.dtype, tokens_per_block: int = 16,
               encoding: str = "raw", tp_rank: int = 0, tp_size: int = 1) -> str:
    """kvpool's canonical layout string for a HF model config."""
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"kvpool.hf: unsupported KV dtype {dtype}")
    layers, kv_heads, head_dim = _config_dims(config)
    return kvpool.layout_string(model=model_id, dtype=_DTYPE_NAMES[dtype], layers=layers,
                                kv_heads=kv_heads, head_dim=head_dim,
                                tokens_per_block=tokens_per_block, tp_rank=tp_rank,
                                tp_size=tp_size, encoding=encoding)


class LoadInfo:
    """What the last load did: tokens served from kvpool, blocks asked and found, seconds."""

    def __init__(self) -> None:
        self.cached_tokens = 0
        self.hit_blocks = 0
        self.looked_up_blocks = 0
        self.lookup_hit = 0          # blocks kvpool's lookup reported (before reading them)
        self.block_error: str | None = None   # why the first unusable block was refused
        self.seconds = 0.0
        self.source = "none"   # "prefix" | "session" | "none"
        self.error: str | None = None

    def __repr__(self) -> str:
        return (f"LoadInfo(cached_tokens={self.cached_tokens}, hit_blocks={self.hit_blocks}/"
                f"{self.looked_up_blocks}, seconds={self.seconds:.4f}, source={self.source!r}, "
                f"error={self.error!r})")


def _as_token_list(input_ids: Any) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError("kvpool.hf handles one sequence at a time (batch size 1)")
            input_ids = input_ids[0]
        return [int(t) for t in input_ids.tolist()]
    return [int(t) for t in input_ids]


def _encode_tokens(tokens: Sequence[int]) -> str:
    raw = np.asarray(tokens, dtype="<i4").tobytes()
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def _decode_tokens(text: str) -> list[int]:
    raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    if len(raw) % 4:
        raise ValueError("token bytes not a multiple of 4")
    return np.frombuffer(raw, dtype="<i4").tolist()


def _byte_view(t: torch.Tensor) -> Any:
    """A contiguous tensor's bytes as kvpool takes them, without a copy: a uint8 numpy view on
    the CPU, the uint8 tensor itself on a GPU (by DLPack)."""
    b = t.view(torch.uint8)
    return b if b.is_cuda else b.numpy()


def _model_device(model: Any) -> torch.device:
    """Where a model's KV will be: its first parameter's device; the CPU for a config."""
    params = getattr(model, "parameters", None)
    first = next(params(), None) if callable(params) else None
    return first.device if first is not None else torch.device("cpu")


class KvpoolHFCache:
    """Maps a transformers DynamicCache to kvpool blocks and back for one model and tenant.

    client: a kvpool.Client, a callable returning one (called again after the daemon was
        unreachable), or an address string (Unix socket path, unix://, tcp://, tls://).
    model: the model (its config and parameter dtype are read) or a config; with a config,
        pass `dtype`.
    model_id: names the weights (see the module docstring); part of every key.
    secret: the namespace secret that salts the keys (str or bytes).
    namespace: the tenant the client authenticates as, when kvpool.hf makes the client.
    timeout: seconds for each kvpool call (and the connect), when kvpool.hf makes the client.
        Default: 2 s, so a stalled daemon delays a request by at most about that.
    credential_file, tls_ca, tls_cert, tls_key: as every connector reads them
        (kvpool/_options.py), when kvpool.hf makes the client from an address: a file holding
        the namespace's credential, and PEM files for a tls:// daemon. An unreadable credential
        file is a ValueError here.
    device: where blocks are staged and loaded caches are made ("cpu" or a CUDA device).
        Default: the model's device (its first parameter's; the CPU when given a config). One
        device per model: a model whose layers are spread over devices is not supported.
    """

    def __init__(self, client: "kvpool.Client | Callable[[], kvpool.Client] | str",
                 model: Any, *, model_id: str, secret: str | bytes,
                 tokens_per_block: int = 16, encoding: str = "raw",
                 dtype: torch.dtype | None = None, namespace: str = "default",
                 timeout: float = 2.0, tp_rank: int = 0, tp_size: int = 1,
                 device: torch.device | str | None = None, credential_file: str | None = None,
                 tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None) -> None:
        if encoding != "raw":
            raise ValueError("kvpool.hf writes raw blocks only (encoded layouts: kvpool.hf "
                             "compression modules)")
        if tokens_per_block <= 0:
            raise ValueError("tokens_per_block must be positive")
        config = getattr(model, "config", model)
        if dtype is None:
            dtype = getattr(model, "dtype", None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError("pass dtype= with a config")
        self.device = torch.device(device) if device is not None else _model_device(model)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"kvpool.hf stages KV on the CPU or a CUDA device, not "
                             f"{self.device}")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.config = config
        self.dtype = dtype
        self.model_id = model_id
        self.secret = secret
        self.tokens_per_block = tokens_per_block
        self.layers, self.kv_heads, self.head_dim = _config_dims(config)
        self.layout = layout_for(config, model_id, dtype, tokens_per_block, encoding, tp_rank,
                                 tp_size)
        self.elem_bytes = torch.empty((), dtype=dtype).element_size()
        # [layers][2][tokens][kv_heads][head_dim]
        self.block_bytes = (self.layers * 2 * tokens_per_block * self.kv_heads * self.head_dim
                            * self.elem_bytes)
        self.last_load = LoadInfo()
        self._owns_client = not isinstance(client, kvpool.Client)
        if isinstance(client, kvpool.Client):
            self._factory = None
            self._client: kvpool.Client | None = client
        else:
            if isinstance(client, str):
                address = client
                options = client_kwargs({"credential_file": credential_file, "tls_ca": tls_ca,
                                         "tls_cert": tls_cert, "tls_key": tls_key})
                self._factory = lambda: kvpool.Client(address, namespace=namespace,
                                                      timeout=timeout, connect_timeout=timeout,
                                                      **options)
            elif callable(client):
                self._factory = client
            else:
                raise TypeError("client: a kvpool.Client, a factory or an address")
            self._client = None
        if not isinstance(client, str) and any((credential_file, tls_ca, tls_cert, tls_key)):
            raise ValueError("credential_file and tls_* are for a client kvpool.hf makes from an "
                             "address; give them to your own kvpool.Client instead")
        self._outage = OutageLog(log, "kvpool.hf", "serving misses and skipping stores")
        self.lossy = LossyLoads(log, "kvpool.hf")  # .blocks: blocks decoded from lossy copies
        self._staging: torch.Tensor | None = None

    # ---- keys ----

    def keys(self, tokens: Any) -> list[bytes]:
        """Keys of the full blocks of `tokens` (ids, or a [1, n] / [n] tensor)."""
        return kvpool.hash_chain(_as_token_list(tokens), secret=self.secret, layout=self.layout,
                                 tokens_per_block=self.tokens_per_block)

    def _tail_key(self, tail: Sequence[int], parent: bytes | None) -> bytes:
        return kvpool.hash_chain(list(tail), secret=self.secret, layout=self.layout,
                                 tokens_per_block=len(tail), parent=parent)[0]

    # ---- failure handling ----

    def _get_client(self) -> kvpool.Client:
        if self._client is None:
            self._client = self._factory()  # may raise: the caller's guard makes it a miss
        return self._client

    def _failed(self, what: str, e: BaseException) -> None:
        if isinstance(e, kvpool.Unavailable) or isinstance(e, OSError):
            if self._owns_client:
                close_quietly(self._client)
                self._client = None
        self._outage.failed(what, e)

    def _ok(self) -> None:
        self._outage.answered()

    # ---- packing ----

    def _staging_for(self, blocks: int) -> torch.Tensor:
        shape = (blocks, self.layers, 2, self.tokens_per_block, self.kv_heads, self.head_dim)
        if self._staging is None or self._staging.shape[0] < blocks:
            self._staging = torch.empty(shape, dtype=self.dtype, device=self.device)
        return self._staging[:blocks]

    def _tail_buffer(self, tokens: int) -> torch.Tensor:
        return torch.empty((self.layers, 2, tokens, self.kv_heads, self.head_dim),
                           dtype=self.dtype, device=self.device)

    def _check_cache(self, cache: DynamicCache) -> bool:
        if len(cache.layers) != self.layers:
            log.warning("kvpool.hf: cache has %d layers, layout has %d; not stored",
                        len(cache.layers), self.layers)
            return False
        # Every layer must hold every token, by position: a sliding-window layer (transformers'
        # DynamicSlidingWindowLayer) keeps only the last window while get_seq_length() counts
        # them all, and packing it by position would store other tokens' KV under these keys.
        # (A static layer is longer than what it holds, its tokens at their positions.)
        seq = cache.get_seq_length()
        for li, layer in enumerate(cache.layers):
            for t in (layer.keys, layer.values):
                if (t is None or t.dim() != 4 or t.shape[0] != 1 or t.shape[1] != self.kv_heads
                        or t.shape[2] < seq or t.shape[3] != self.head_dim
                        or t.dtype != self.dtype):
                    log.warning("kvpool.hf: layer %d's cache tensor %s does not match the "
                                "layout %s over %d tokens (a sliding-window or trimmed cache "
                                "holds fewer); not stored", li,
                                None if t is None else (tuple(t.shape), t.dtype), self.layout,
                                seq)
                    return False
        return True

    def _pack(self, cache: DynamicCache, start: int, tokens: int, out: torch.Tensor) -> None:
        """Copies cache tokens [start, start + tokens) into out [L][2][tokens][kvh][hd] or,
        for out of rank 6, [blocks][L][2][B][kvh][hd]."""
        for li, layer in enumerate(cache.layers):
            for kv, t in ((0, layer.keys), (1, layer.values)):
                src = t[0, :, start:start + tokens, :]  # [kvh, tokens, hd]
                if out.dim() == 6:
                    n = out.shape[0]
                    src = src.reshape(self.kv_heads, n, self.tokens_per_block, self.head_dim)
                    out[:, li, kv].copy_(src.permute(1, 2, 0, 3))
                else:
                    out[li, kv].copy_(src.permute(1, 0, 2))

    def _unpack(self, blocks: torch.Tensor, tail: torch.Tensor | None,
                keep: int | None = None) -> DynamicCache:
        """A DynamicCache from staged blocks [n][L][2][B][kvh][hd] and an optional tail
        [L][2][t][kvh][hd], holding the first `keep` tokens (all when None)."""
        n = blocks.shape[0]
        data = []
        for li in range(self.layers):
            pair = []
            for kv in (0, 1):
                parts = [blocks[:, li, kv].permute(2, 0, 1, 3).reshape(
                    self.kv_heads, n * self.tokens_per_block, self.head_dim)]
                if tail is not None:
                    parts.append(tail[li, kv].permute(1, 0, 2))
                x = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
                if keep is not None:
                    x = x[:, :keep]
                pair.append(x.unsqueeze(0).contiguous())
            data.append(tuple(pair))
        return DynamicCache(data, config=self.config)

    # ---- prefix ----

    def load_prefix(self, input_ids: Any) -> tuple[DynamicCache | None, int]:
        """The longest cached prefix of the prompt as a DynamicCache, and how many tokens it
        covers (a multiple of tokens_per_block, at most len(prompt) - 1); (None, 0) on a miss
        or any kvpool failure. Never raises on a kvpool failure."""
        tokens = _as_token_list(input_ids)
        info = LoadInfo()
        t0 = time.perf_counter()
        try:
            cache, n = self._load_blocks(tokens, self.keys(tokens), info)
        finally:
            info.seconds = time.perf_counter() - t0
            self.last_load = info
        if cache is not None:
            info.source = "prefix"
        return cache, n

    def _load_blocks(self, tokens: list[int], keys: list[bytes],
                     info: LoadInfo) -> tuple[DynamicCache | None, int]:
        usable = min(len(keys), max(len(tokens) - 1, 0) // self.tokens_per_block)
        info.looked_up_blocks = usable
        if usable == 0:
            return None, 0
        keys = keys[:usable]
        try:
            client = self._get_client()
            hit = client.lookup(keys).hit_blocks
            info.lookup_hit = hit
            if hit == 0:
                self._ok()
                return None, 0
            staging = self._staging_for(hit)
            results = client.get_into(keys[:hit], [_byte_view(staging[i]) for i in range(hit)])
        except Exception as e:  # noqa: BLE001 - see _failed: any failure is a miss
            info.error = f"{type(e).__name__}: {e}"
            self._failed("load", e)
            return None, 0
        self._ok()
        good = 0
        for r in results:
            if not r.ok or r.size != self.block_bytes:
                info.block_error = "SizeMismatch" if r.ok else r.code
                if r.ok:
                    log.warning("kvpool.hf: block %d has %d bytes, layout needs %d; prefix "
                                "ends there", good, r.size, self.block_bytes)
                elif r.code != "NotFound":
                    log.warning("kvpool.hf: block %d: %s %s; prefix ends there", good, r.code,
                                r.message)
                break
            good += 1
        info.hit_blocks = good
        self.lossy.add(results[:good])
        if good == 0:
            return None, 0
        info.cached_tokens = good * self.tokens_per_block
        return self._unpack(staging[:good], None), info.cached_tokens

    def store(self, tokens: Any, cache: DynamicCache) -> int:
        """Pushes the full blocks of `tokens` that `cache` covers (the first
        cache.get_seq_length() tokens) and kvpool does not hold yet. Returns the blocks newly
        stored; 0 when kvpool failed (logged). Never raises on a kvpool failure."""
        tokens = _as_token_list(tokens)
        if cache is None or not self._check_cache(cache):
            return 0
        covered = min(len(tokens), cache.get_seq_length())
        keys = self.keys(tokens[:covered])
        stored, _ = self._store_blocks(cache, keys)
        return stored

    def _store_blocks(self, cache: DynamicCache, keys: list[bytes]) -> tuple[int, bool]:
        """Put-if-absent of keys' blocks from the cache; (newly stored, all present now)."""
        if not keys:
            return 0, True
        try:
            client = self._get_client()
            have = client.lookup(keys, prefetch=False).hit_blocks
            stored = 0
            per_call = max(1, _PUT_CHUNK_BYTES // self.block_bytes)
            i = have
            while i < len(keys):
                n = min(per_call, len(keys) - i)
                staging = self._staging_for(n)
                self._pack(cache, i * self.tokens_per_block, n * self.tokens_per_block, staging)
                r = client.put(keys[i:i + n], [_byte_view(staging[j]) for j in range(n)],
                               parent=keys[i - 1] if i else None,
                               gpu_device=gpu_tier_device(client, staging))
                stored += r.stored
                if not r.all_ok():
                    first = next((e for e in r.errors if e is not None), None)
                    log.warning("kvpool.hf: put of %d blocks: %d stored, %d present, error %s",
                                n, r.stored, r.already_present, first)
                    return stored, False
                i += n
        except Exception as e:  # noqa: BLE001 - a failed store is skipped, never raised
            self._failed("store", e)
            return 0, False
        self._ok()
        return stored, True

    # ---- sessions ----

    def save_session(self, session_id: str, tokens: Any, cache: DynamicCache) -> bool:
        """Saves the conversation so far: the full blocks, the tail as one shorter block, and a
        session record holding the token ids. True when saved. Never raises on a kvpool
        failure."""
        tokens = _as_token_list(tokens)
        if cache is None or not self._check_cache(cache):
            return False
        covered = min(len(tokens), cache.get_seq_length())
        tokens = tokens[:covered]
        B = self.tokens_per_block
        keys = self.keys(tokens)
        _, ok = self._store_blocks(cache, keys)
        if not ok:
            return False
        chain = list(keys)
        tail_len = covered - len(keys) * B
        try:
            client = self._get_client()
            if tail_len:
                parent = keys[-1] if keys else None
                tail_key = self._tail_key(tokens[len(keys) * B:], parent)
                tail = self._tail_buffer(tail_len)
                self._pack(cache, len(keys) * B, tail_len, tail)
                r = client.put([tail_key], [_byte_view(tail)], parent=parent,
                               gpu_device=gpu_tier_device(client, tail))
                if not r.all_ok():
                    log.warning("kvpool.hf: session %s: tail put failed: %s", session_id,
                                r.errors[0])
                    return False
                chain.append(tail_key)
            client.save_session(session_id, chain, covered, {
                "format": _META_FORMAT,
                "layout": self.layout,
                "tail_tokens": str(tail_len),
                "tokens": _encode_tokens(tokens),
            })
        except Exception as e:  # noqa: BLE001
            self._failed("save_session", e)
            return False
        self._ok()
        return True

    def load_session(self, session_id: str, input_ids: Any) -> tuple[DynamicCache | None, int]:
        """The cache of a saved session whose tokens are a prefix of the prompt, cropped to at
        most len(prompt) - 1 tokens, and the tokens it covers. When the session is missing, is
        of another layout or history, or its blocks are gone, falls back to load_prefix (the
        blocks may still be cached). Never raises on a kvpool failure."""
        tokens = _as_token_list(input_ids)
        info = LoadInfo()
        t0 = time.perf_counter()
        try:
            result = self._load_session(session_id, tokens, info)
        finally:
            info.seconds = time.perf_counter() - t0
            self.last_load = info
        if result is None:
            cache, n = self.load_prefix(tokens)
            self.last_load.seconds += info.seconds
            return cache, n
        info.source = "session"
        return result

    def _load_session(self, session_id: str, tokens: list[int],
                      info: LoadInfo) -> tuple[DynamicCache | None, int] | None:
        B = self.tokens_per_block
        try:
            s = self._get_client().load_session(session_id)
        except kvpool.NotFound:
            self._ok()
            return None
        except kvpool.Unavailable as e:
            # Also what a daemon in a cluster answers when a home of the session did not answer
            # (the daemon itself is up): a miss, but no reason to drop the client (one whose
            # connection died reconnects at its next call).
            info.error = f"{type(e).__name__}: {e}"
            self._outage.failed("load_session", e)
            return None
        except Exception as e:  # noqa: BLE001
            info.error = f"{type(e).__name__}: {e}"
            self._failed("load_session", e)
            return None
        self._ok()
        meta = dict(s.metadata)
        if meta.get("format") != _META_FORMAT or meta.get("layout") != self.layout:
            log.info("kvpool.hf: session %s has another layout; not used", session_id)
            return None
        try:
            stoks = _decode_tokens(meta["tokens"])
            tail_len = int(meta["tail_tokens"])
        except (KeyError, ValueError, zlib.error) as e:
            log.warning("kvpool.hf: session %s: unreadable metadata (%s); not used",
                        session_id, e)
            return None
        n_full = len(stoks) // B
        if (len(stoks) != s.token_count or tail_len != len(stoks) - n_full * B
                or tokens[:len(stoks)] != stoks):
            log.info("kvpool.hf: session %s does not match the prompt's history", session_id)
            return None
        expect = self.keys(stoks)
        if tail_len:
            expect.append(self._tail_key(stoks[n_full * B:], expect[-1] if expect else None))
        if list(s.keys) != expect:
            log.warning("kvpool.hf: session %s: keys do not match its tokens; not used",
                        session_id)
            return None
        info.looked_up_blocks = len(expect)
        staging = self._staging_for(n_full)
        bufs = [_byte_view(staging[i]) for i in range(n_full)]
        tail = None
        if tail_len:
            tail = self._tail_buffer(tail_len)
            bufs.append(_byte_view(tail))
        try:
            results = self._get_client().get_into(expect, bufs)
        except Exception as e:  # noqa: BLE001
            info.error = f"{type(e).__name__}: {e}"
            self._failed("load_session", e)
            return None
        sizes = [self.block_bytes] * n_full + ([tail.numel() * self.elem_bytes] if tail_len
                                               else [])
        good = 0
        for r, size in zip(results, sizes):
            if not r.ok or r.size != size:
                info.block_error = "SizeMismatch" if r.ok else r.code
                log.warning("kvpool.hf: session %s block %d: %s (%d bytes, want %d); falling "
                            "back to the prefix", session_id, good, r.code, r.size, size)
                return None
            good += 1
        info.hit_blocks = good
        # Crop to len(prompt) - 1 when the prompt is exactly the saved history (transformers
        # needs at least one uncached token); done on the tensors, not with Cache.crop, whose
        # argument changed meaning across transformers 5.x.
        covered = min(len(stoks), len(tokens) - 1)
        if covered <= 0:
            return None
        self.lossy.add(results)
        cache = self._unpack(staging, tail, keep=covered if covered < len(stoks) else None)
        info.cached_tokens = covered
        return cache, covered

    def delete_session(self, session_id: str) -> bool:
        """Deletes a saved session (its blocks stay cached until evicted). False on failure."""
        try:
            self._get_client().delete_session(session_id)
        except kvpool.NotFound:
            return True
        except Exception as e:  # noqa: BLE001
            self._failed("delete_session", e)
            return False
        return True

    # ---- all in one ----

    def generate(self, model: Any, input_ids: torch.Tensor, *, session_id: str | None = None,
                 **generate_kwargs: Any) -> Any:
        """model.generate with kvpool around it: loads the prompt's cached prefix (or the
        session), generates, then stores the new full blocks (or saves the session). Returns
        what model.generate returns; `last_load` says what was loaded. Inputs that make the KV
        depend on more than the token ids (inputs_embeds, pixel_values, position_ids, ...) are
        refused: kvpool's keys name the tokens only."""
        beyond = sorted(k for k, v in generate_kwargs.items()
                        if k in _INPUTS_BEYOND_TOKENS and v is not None
                        # (all-zero token type ids, as text-only processors give, change nothing)
                        and not (k == "token_type_ids" and not bool(torch.as_tensor(v).any())))
        if beyond:
            raise ValueError(f"kvpool.hf.generate: {', '.join(beyond)} change the KV of the same "
                             "tokens, and kvpool's keys name the tokens only; call "
                             "model.generate without kvpool for such inputs")
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        if session_id is not None:
            cache, _ = self.load_session(session_id, input_ids)
        else:
            cache, _ = self.load_prefix(input_ids)
        if cache is None:
            cache = DynamicCache(config=self.config)
        out = model.generate(input_ids, past_key_values=cache, **generate_kwargs)
        seq = out.sequences if hasattr(out, "sequences") else out
        if session_id is not None:
            self.save_session(session_id, seq[0], cache)
        else:
            self.store(seq[0], cache)
        return out

    def close(self) -> None:
        if self._owns_client:
            close_quietly(self._client)
            self._client = None
