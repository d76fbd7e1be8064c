"""kvpool.hf.compress on a real (tiny, random-weight) Llama: StreamingLLM, H2O, SnapKV and
PyramidKV applied to the prefill cache with kvpool's kernels, generation continuing from the
compressed cache.

- Every method keeps, per layer and KV head, the token set an independent reference computes
  here from the method's definition and the model's OWN attention weights (eager attention,
  output_attentions=True), not from kvpool's recomputed queries.
- generate() continues from the compressed cache and produces the requested tokens; with a
  budget >= the prompt length nothing is dropped and the output equals the uncompressed run
  token for token.
- The continuation runs at the original positions (prompt length), not at the compressed
  cache's length.
"""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from models import random_tokens, tiny_llama  # noqa: E402

import kvpool  # noqa: E402
from kvpool.hf import compress  # noqa: E402

CP = compress.CompressionParams

# Small enough for 2 cores: 4 layers, GQA 4 query / 2 KV heads, head_dim 32.
MODEL_KW = dict(layers=4, hidden=128, heads=4, kv_heads=2, vocab=512, max_pos=2048)
N = 192      # prompt tokens
W = 16       # window
NEW = 12     # generated tokens


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0, **MODEL_KW)


@pytest.fixture(scope="module")
def prompt():
    return torch.tensor([random_tokens(N, seed=5, vocab=MODEL_KW["vocab"])])


@pytest.fixture(scope="module")
def attentions(model, prompt):
    with torch.no_grad():
        out = model(input_ids=prompt, output_attentions=True)
    return [a[0].double() for a in out.attentions]  # per layer [q_heads, n, n]


def params(method: str, capacity: int) -> CP:
    return CP(method, max_capacity_prompt=capacity, window_size=W, kernel_size=5,
              pooling="avg", sink_size=4, beta=20)


# ---- independent references: kept token sets per (layer, kv head) from the definitions ----

def group_mean(per_q_head: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[q_heads, m] -> [kv_heads, m], mean over each KV head's query heads."""
    hq = per_q_head.shape[0]
    return per_q_head.view(kv_heads, hq // kv_heads, -1).mean(1)


def topk_set(scores: torch.Tensor, k: int) -> list[set[int]]:
    return [set(torch.topk(s, k).indices.tolist()) for s in scores]


def snapkv_reference(att: torch.Tensor, capacity: int, kv_heads: int) -> list[set[int]]:
    n = att.shape[-1]
    prefix = n - W
    obs = att[:, -W:, :prefix].sum(1)                                  # [q_heads, prefix]
    pooled = F.avg_pool1d(obs[:, None], 5, stride=1, padding=2)[:, 0]  # zero padding counted
    s = group_mean(pooled, kv_heads)
    window = set(range(prefix, n))
    return [t | window for t in topk_set(s, capacity - W)]


def h2o_reference(att: torch.Tensor, capacity: int, kv_heads: int) -> list[set[int]]:
    n = att.shape[-1]
    prefix = n - W
    acc = att[:, :, :prefix].sum(1)        # every query (the causal mask zeroes the future)
    s = group_mean(acc, kv_heads)
    window = set(range(prefix, n))
    return [t | window for t in topk_set(s, capacity - W)]


def pyramid_budgets(capacity: int, n: int, layers: int, beta: int = 20) -> list[int]:
    """KVCache-Factory's PyramidKVCluster schedule, in prefix tokens (window excluded)."""
    c = capacity - W
    min_num = c // beta
    max_num = 2 * c - min_num
    if max_num >= n - W:
        max_num = n - W
        min_num = 2 * c - max_num
    steps = (max_num - min_num) // (layers - 1)
    return [max_num - l * steps for l in range(layers)]


def agreement(got: list[torch.Tensor], want: list[list[set[int]]]) -> float:
    """Mean Jaccard over (layer, kv head) of kvpool's kept set and the reference's."""
    vals = []
    for l, heads in enumerate(want):
        for h, ref in enumerate(heads):
            mine = set(got[l][h].tolist())
            vals.append(len(mine & ref) / len(mine | ref))
    return sum(vals) / len(vals)


# ---- kept indices ----

def test_streamingllm_keeps_sinks_and_recent(model, prompt):
    c = compress.compress_prefill(model, prompt, params("streamingllm", 64))
    want = list(range(4)) + list(range(N - 60, N))
    assert c.keep_counts == [64] * 4
    for l in range(4):
        for h in range(2):
            assert c.indices[l][h].tolist() == want
        assert c.cache.layers[l].keys.shape == (1, 2, 64, 32)


@pytest.mark.parametrize("method", ["snapkv", "h2o"])
def test_attention_methods_match_reference_from_model_attention(model, prompt, attentions, method):
    capacity = 64
    c = compress.compress_prefill(model, prompt, params(method, capacity))
    ref = snapkv_reference if method == "snapkv" else h2o_reference
    want = [ref(att, capacity, 2) for att in attentions]
    a = agreement(c.indices, want)
    print(f"[compress] {method} vs reference from the model's attention: Jaccard {a:.4f}")
    # kvpool recomputes the attention from RoPE'd queries and keys in f32; the reference uses
    # the model's eager softmax in f32: only near-ties may differ.
    assert a >= 0.99, a
    for l in range(4):
        assert c.indices[l].shape == (2, capacity)
        assert bool((c.indices[l][:, 1:] > c.indices[l][:, :-1]).all())  # ascending


def test_pyramidkv_budgets_and_selection_match_reference(model, prompt, attentions):
    capacity = 64
    c = compress.compress_prefill(model, prompt, params("pyramidkv", capacity))
    budgets = pyramid_budgets(capacity, N, 4)
    assert c.keep_counts == [b + W for b in budgets]
    assert c.keep_counts[0] > c.keep_counts[-1]
    want = [snapkv_reference(att, b + W, 2) for att, b in zip(attentions, budgets)]
    a = agreement(c.indices, want)
    print(f"[compress] pyramidkv vs reference: Jaccard {a:.4f}, keep {c.keep_counts}")
    assert a >= 0.99, a
    for l in range(4):
        assert c.cache.layers[l].keys.shape[2] == c.keep_counts[l]


def test_compacted_cache_holds_the_kept_tokens(model, prompt):
    from transformers import DynamicCache

    full = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=full, use_cache=True)
    c = compress.compress_prefill(model, prompt, params("snapkv", 48))
    for l in range(4):
        idx = c.indices[l]  # [kv_heads, keep]
        for h in range(2):
            assert torch.equal(c.cache.layers[l].keys[0, h], full.layers[l].keys[0, h, idx[h]])
            assert torch.equal(c.cache.layers[l].values[0, h], full.layers[l].values[0, h, idx[h]])


# ---- generation from the compressed cache ----

def uncompressed_continuation(model, prompt) -> torch.Tensor:
    """Prefill of the first n - 1 tokens, then generate from the last: the compressed path's
    recipe without compression."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompt[:, :-1], past_key_values=cache, use_cache=True)
        out = model.generate(prompt[:, -1:], attention_mask=torch.ones(1, N, dtype=torch.long),
                             past_key_values=cache, max_new_tokens=NEW)
    return out[:, 1:]


@pytest.mark.parametrize("method", ["streamingllm", "h2o", "snapkv", "pyramidkv"])
def test_generation_continues_and_full_budget_is_exact(model, prompt, method):
    with torch.no_grad():
        plain = model.generate(prompt, max_new_tokens=NEW)[:, N:]
    base = uncompressed_continuation(model, prompt)
    assert torch.equal(base, plain)  # the recipe itself is the ordinary generation
    full = compress.generate_compressed(model, prompt, params(method, N + 8), max_new_tokens=NEW)
    assert torch.equal(full, plain), (method, full, plain)
    small = compress.generate_compressed(model, prompt, params(method, 48), max_new_tokens=NEW)
    assert small.shape == (1, NEW)
    assert bool(((small >= 0) & (small < MODEL_KW["vocab"])).all())
    same = int((small == plain).sum())
    print(f"[compress] {method} at 48/{N - 1} tokens: {same}/{NEW} generated tokens as uncompressed")


def test_continuation_runs_at_the_original_positions(model, prompt):
    import copy

    c = compress.compress_prefill(model, prompt[:, :-1], params("streamingllm", 40))
    assert c.cache.get_seq_length() == 40
    with torch.no_grad():
        g = model.generate(prompt[:, -1:], attention_mask=c.attention_mask(1),
                           past_key_values=copy.deepcopy(c.cache), max_new_tokens=1,
                           output_scores=True, return_dict_in_generate=True)
        first = g.scores[0][0]
        right = model(input_ids=prompt[:, -1:], past_key_values=copy.deepcopy(c.cache),
                      position_ids=torch.tensor([[N - 1]])).logits[0, -1]
        wrong = model(input_ids=prompt[:, -1:], past_key_values=copy.deepcopy(c.cache),
                      position_ids=torch.tensor([[40]])).logits[0, -1]
    torch.testing.assert_close(first, right, rtol=1e-5, atol=1e-5)
    assert (first - wrong).abs().max() > 1e-3  # position 40 would be a different model input


def test_rejects_batches_and_unknown_methods(model, prompt):
    with pytest.raises(ValueError):
        compress.compress_prefill(model, prompt.repeat(2, 1), params("snapkv", 48))
    with pytest.raises(kvpool.InvalidArgument):
        compress.compress_prefill(model, prompt, params("tova", 48))
