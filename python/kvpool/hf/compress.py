"""KV-cache compression of a transformers model's prompt with kvpool's kernels.

    from kvpool.hf.compress import CompressionParams, compress_prefill, generate_compressed
    p = CompressionParams("snapkv", max_capacity_prompt=128, window_size=16)
    out = generate_compressed(model, input_ids, p, max_new_tokens=32)   # new tokens only
    # or by hand:
    c = compress_prefill(model, input_ids[:, :-1], p)   # DynamicCache + kept indices per layer
    with ragged_masks(model):                           # PyramidKV: layers differ in length
        out = model.generate(input_ids[:, -1:], attention_mask=c.attention_mask(1),
                             past_key_values=c.cache, max_new_tokens=32)

What it does, for StreamingLLM, H2O, SnapKV and PyramidKV (kernels/compress.h gives the
definitions and the KVCache-Factory parameter names):
- Runs the prefill with a forward pre-hook on every attention module that keeps the queries the
  method reads: q = RoPE(q_proj(hidden_states)), exactly as LlamaAttention computes them, for the
  last `window_size` positions (SnapKV, PyramidKV) or every position (H2O); none for
  StreamingLLM. Keys and values are the prefill's DynamicCache (post-RoPE keys).
- Calls kvpool's kernels (compress_sizes, compute_scores, select_tokens, compact_kv) on the CPU
  in the model's dtype (fp16, bf16 or fp32) and builds a new DynamicCache holding, per layer
  and KV head, only the kept tokens (in position order). PyramidKV's layers keep different
  counts; transformers sizes one attention mask for all layers from layer 0, so generation runs
  under ragged_masks(model), which cuts the mask to each layer's length.
- Generation continues from the compressed cache at the ORIGINAL positions: the cache holds
  fewer entries than the prompt had tokens, so its length must not be used as the next position.
  transformers 5.23's generate() derives position ids from a 2-D attention_mask when one is
  given (cumsum - 1) and feeds input_ids unsliced when they are shorter than that mask; so the
  continuation is `generate(last_token, attention_mask=ones(1, prompt_len), past_key_values=
  cache)`, which gives the last prompt token position prompt_len - 1 and RoPE-rotates the new
  queries and keys there (python/tests/hf/test_compress.py checks this).

The kernels run through kvpool.kernels (the compiled extension). Batch size 1 only.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from kvpool import kernels

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}

# The kernels' parameters (method, max_capacity_prompt, window_size, kernel_size, pooling "avg" |
# "max", sink_size, beta), named as in KVCache-Factory.
CompressionParams = kernels.CompressParams


@dataclasses.dataclass
class CompressedPrefill:
    """The compressed cache of a prefill of `seq_len` tokens and what each layer kept."""

    cache: Any                      # transformers DynamicCache, per layer [1, kv_heads, keep, dim]
    indices: list[torch.Tensor]     # per layer int64 [kv_heads, keep[l]], ascending positions
    keep_counts: list[int]
    seq_len: int

    def attention_mask(self, new_tokens: int) -> torch.Tensor:
        """The 2-D mask to pass to generate() with `new_tokens` input ids after this prefill:
        ones over the original length, so positions continue at seq_len."""
        return torch.ones(1, self.seq_len + new_tokens, dtype=torch.long)


def _attention_modules(model) -> list:
    layers = model.model.layers
    return [layer.self_attn for layer in layers]


def _capture_queries(model, keep_last: int | None):
    """Pre-hooks on every attention module that store RoPE'd queries [1, q_heads, n, dim] of the
    last `keep_last` positions (all when None). Returns (handles, store)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    store: dict[int, torch.Tensor] = {}
    handles = []

    def make_hook(idx: int, module):
        def hook(mod, args, kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            cos, sin = kwargs["position_embeddings"]
            if keep_last is not None:
                hidden = hidden[:, -keep_last:]
                cos, sin = cos[:, -keep_last:], sin[:, -keep_last:]
            shape = (*hidden.shape[:-1], -1, mod.head_dim)
            q = mod.q_proj(hidden).view(shape).transpose(1, 2)
            q, _ = apply_rotary_pos_emb(q, q, cos, sin)
            store[idx] = q.detach()
            return None

        return hook

    for i, m in enumerate(_attention_modules(model)):
        handles.append(m.register_forward_pre_hook(make_hook(i, m), with_kwargs=True))
    return handles, store


@torch.no_grad()
def compress_prefill(model, input_ids: torch.Tensor, params: CompressionParams) -> CompressedPrefill:
    """Prefills `input_ids` ([1, n]) and returns the cache compressed by `params.method`.

    A prompt shorter than max_capacity_prompt is kept whole (the kernels' rule). Raises
    ValueError for a batch other than 1 or a dtype the kernels lack; the kernels' own
    InvalidArgument for bad parameters."""
    from transformers import DynamicCache

    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError("compress_prefill takes input_ids of shape [1, n]")
    config = model.config
    n = int(input_ids.shape[1])
    layers = config.num_hidden_layers
    hq = config.num_attention_heads
    hk = config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // hq
    dtype = next(model.parameters()).dtype
    if dtype not in _DTYPES:
        raise ValueError(f"model dtype {dtype} is not fp16, bf16 or fp32")
    shape = kernels.AttentionShape(layers, n, hq, hk, dim, _DTYPES[dtype])
    sizes = kernels.compress_sizes(params, shape)
    keep, total, nq, scored = (sizes.keep_counts, sizes.total_kept, sizes.query_tokens,
                               sizes.scored_tokens)

    handles, store = ([], {})
    if nq > 0:
        handles, store = _capture_queries(model, nq if nq < n else None)
    try:
        cache = DynamicCache(config=config)
        model(input_ids=input_ids, past_key_values=cache, use_cache=True)
    finally:
        for h in handles:
            h.remove()

    # kv [layer][2][seq][kv_head][dim], q [layer][nq][q_head][dim], on the CPU.
    kv = torch.empty(layers, 2, n, hk, dim, dtype=dtype)
    for l in range(layers):
        kv[l, 0] = cache.layers[l].keys[0].transpose(0, 1).cpu()
        kv[l, 1] = cache.layers[l].values[0].transpose(0, 1).cpu()
    kv = kv.contiguous()
    scores = None
    if scored > 0:
        q = torch.stack([store[l][0, :, -nq:].transpose(0, 1).cpu() for l in range(layers)])
        q = q.to(dtype).contiguous()
        scores = torch.empty(layers, hk, scored, dtype=torch.float32)
        kernels.compute_scores(params, shape, q, kv, scores)
    idx = torch.empty(hk * total, dtype=torch.int32)
    kernels.select_tokens(params, shape, scores, idx)
    out = torch.empty(total * 2 * hk * dim, dtype=dtype)
    kernels.compact_kv(shape, list(keep), idx, kv, out)

    device = cache.layers[0].keys.device
    pairs = []
    indices = []
    off_i = 0
    off_o = 0
    for l in range(layers):
        kl = keep[l]
        indices.append(idx[off_i:off_i + hk * kl].view(hk, kl).to(torch.int64))
        off_i += hk * kl
        layer_out = out[off_o:off_o + 2 * kl * hk * dim].view(2, kl, hk, dim)
        off_o += 2 * kl * hk * dim
        keys = layer_out[0].transpose(0, 1).unsqueeze(0).contiguous().to(device)
        values = layer_out[1].transpose(0, 1).unsqueeze(0).contiguous().to(device)
        pairs.append((keys, values))
    compressed = DynamicCache(pairs, config=config)
    return CompressedPrefill(cache=compressed, indices=indices, keep_counts=list(keep), seq_len=n)


@contextlib.contextmanager
def ragged_masks(model):
    """While active, each attention module gets the attention mask cut to ITS layer's cache
    length. transformers sizes one mask for all layers from layer 0's cache; after PyramidKV the
    deeper layers hold fewer tokens. The mask's past columns are kept from the front (with no
    padding they are all visible) and the new tokens' columns from the back."""
    handles = []

    def make_hook(idx: int):
        def hook(mod, args, kwargs):
            mask = kwargs.get("attention_mask")
            cache = kwargs.get("past_key_values")
            if mask is None or cache is None or mask.dim() != 4:
                return None
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            q = hidden.shape[1]
            kl = cache.layers[idx].get_seq_length() + q
            if mask.shape[-1] == kl:
                return None
            kwargs["attention_mask"] = torch.cat([mask[..., : kl - q], mask[..., -q:]], dim=-1)
            return args, kwargs

        return hook

    try:
        for i, m in enumerate(_attention_modules(model)):
            handles.append(m.register_forward_pre_hook(make_hook(i), with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def generate_compressed(model, input_ids: torch.Tensor, params: CompressionParams,
                        max_new_tokens: int, **generate_kwargs) -> torch.Tensor:
    """Greedy (or as generate_kwargs say) continuation of `input_ids` ([1, n], n >= 2) from a
    cache of its first n - 1 tokens compressed by `params`; returns the new tokens [1, k]."""
    n = int(input_ids.shape[1])
    if n < 2:
        raise ValueError("generate_compressed needs a prompt of at least 2 tokens")
    c = compress_prefill(model, input_ids[:, :-1], params)
    with ragged_masks(model):
        out = model.generate(input_ids[:, -1:],
                             attention_mask=c.attention_mask(1).to(input_ids.device),
                             past_key_values=c.cache, max_new_tokens=max_new_tokens,
                             **generate_kwargs)
    return out[:, 1:]
