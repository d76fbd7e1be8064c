"""kvpool's kept token indices against kvpress 0.5.5 (an independent implementation of the same
methods) on the same tiny Llama and the same prompt, per (layer, KV head).

Runs in .venv/kvpress (python/requirements/kvpress.txt: kvpress pins transformers < 5.3).
kvpress does not expose what it kept: its presses gather the kept keys out of the cache, so
the positions are read back by matching each kept key row against the uncompressed prefill's
keys (random weights make every row distinct; layer l's keys do not depend on how earlier
layers were compressed, since kvpress compresses after each layer's attention ran in full).

Parameter mapping (exact):
  StreamingLLMPress(compression_ratio=r, n_sink=s)  == kvpool streamingllm, sink_size=s,
      max_capacity_prompt = int(n * (1 - r))
  SnapKVPress(r, window_size=W, kernel_size=K)       == kvpool snapkv, window_size=W,
      kernel_size=K, pooling avg, max_capacity_prompt = int(n * (1 - r))
  PyramidKVPress(r, W, K, beta)                      vs kvpool pyramidkv, same W, K, beta,
      max_capacity_prompt = W + n * (1 - r)
kvpress's pyramid schedule differs from KVCache-Factory's (which kvpool follows): its per-layer
count round(max_num - l * steps) (float steps) INCLUDES the window, where the seed keeps
max_num - l * steps (integer steps) prefix tokens PLUS the window. So PyramidKV is compared two
ways: the selection at kvpress's own per-layer counts (kvpool SnapKV selection with
max_capacity_prompt = that count: must agree like SnapKV), and kvpress's kept set contained in
kvpool's larger one at kvpool's own schedule.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "hf"))
from models import random_tokens, tiny_llama  # noqa: E402

kvpress = pytest.importorskip("kvpress")

import kvpool  # noqa: E402
from kvpool.hf import compress  # noqa: E402

MODEL_KW = dict(layers=4, hidden=128, heads=4, kv_heads=2, vocab=512, max_pos=2048)
N = 192
W = 16
K = 5
RATIO = 0.5      # n * (1 - r) = 96 exactly
BETA = 20
RESULTS: dict[str, dict] = {}


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0, **MODEL_KW)


@pytest.fixture(scope="module")
def prompt():
    return torch.tensor([random_tokens(N, seed=5, vocab=MODEL_KW["vocab"])])


@pytest.fixture(scope="module")
def full_keys(model, prompt):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
    return [cache.layers[l].keys[0] for l in range(MODEL_KW["layers"])]  # [kv_heads, n, dim]


def kvpress_kept(model, prompt, press, full_keys) -> list[list[set[int]]]:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad(), press(model):
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
    kept = []
    for l, fk in enumerate(full_keys):
        ck = cache.layers[l].keys[0]  # [kv_heads, keep, dim]
        heads = []
        for h in range(fk.shape[0]):
            eq = (ck[h][:, None, :] == fk[h][None, :, :]).all(-1)  # [keep, n]
            assert bool((eq.sum(1) == 1).all()), "a kept key row matches no single position"
            heads.append(set(eq.float().argmax(1).tolist()))
        kept.append(heads)
    return kept


def kvpool_kept(model, prompt, **kw) -> tuple[list[list[set[int]]], list[int]]:
    c = compress.compress_prefill(model, prompt, compress.CompressionParams(**kw))
    return [[set(row.tolist()) for row in layer] for layer in c.indices], c.keep_counts


def jaccard(a: list[list[set[int]]], b: list[list[set[int]]]) -> tuple[float, float, float]:
    """(mean Jaccard, min Jaccard, fraction of (layer, head) sets equal)."""
    vals = [len(x & y) / len(x | y) for la, lb in zip(a, b) for x, y in zip(la, lb)]
    equal = [x == y for la, lb in zip(a, b) for x, y in zip(la, lb)]
    return sum(vals) / len(vals), min(vals), sum(equal) / len(equal)


def record(name: str, **values) -> None:
    RESULTS[name] = values
    print(f"[kvpress-agreement] {name}: " + json.dumps(values))
    out = os.environ.get("KVPOOL_KVPRESS_RESULTS")
    if out:
        pathlib.Path(out).write_text(json.dumps(RESULTS, indent=1))


def test_streamingllm_is_exact(model, prompt, full_keys):
    from kvpress import StreamingLLMPress

    n_kept = int(N * (1 - RATIO))
    theirs = kvpress_kept(model, prompt, StreamingLLMPress(compression_ratio=RATIO, n_sink=4),
                          full_keys)
    ours, keep = kvpool_kept(model, prompt, method="streamingllm", max_capacity_prompt=n_kept,
                             sink_size=4)
    mean, low, eq = jaccard(ours, theirs)
    record("StreamingLLM", jaccard_mean=mean, jaccard_min=low, sets_equal=eq, keep=keep)
    assert eq == 1.0


def test_snapkv_agrees(model, prompt, full_keys):
    from kvpress import SnapKVPress

    n_kept = int(N * (1 - RATIO))
    theirs = kvpress_kept(model, prompt,
                          SnapKVPress(compression_ratio=RATIO, window_size=W, kernel_size=K),
                          full_keys)
    ours, keep = kvpool_kept(model, prompt, method="snapkv", max_capacity_prompt=n_kept,
                             window_size=W, kernel_size=K, pooling="avg")
    mean, low, eq = jaccard(ours, theirs)
    record("SnapKV", jaccard_mean=mean, jaccard_min=low, sets_equal=eq, keep=keep)
    # Same scores up to f32 rounding (kvpress: mean over queries, per-head pooling, then the
    # group mean; kvpool: sums, pooled once): only exact near-ties at the budget edge may flip.
    assert mean >= 0.99 and low >= 0.95, (mean, low)


def test_pyramidkv_selection_and_schedule(model, prompt, full_keys):
    from kvpress import PyramidKVPress

    press = PyramidKVPress(compression_ratio=RATIO, window_size=W, kernel_size=K, beta=BETA)
    theirs = kvpress_kept(model, prompt, press, full_keys)
    their_keep = [len(layer[0]) for layer in theirs]
    # (a) kvpool's SnapKV selection at kvpress's per-layer counts. A layer kvpress leaves with
    # the window alone (count <= W) has no selection to compare (kvpool needs a budget > W).
    at_their_budget, theirs_cmp, window_only = [], [], []
    for l, k in enumerate(their_keep):
        if k <= W:
            window_only.append(l)
            assert all(t == set(range(N - k, N)) for t in theirs[l])
            continue
        ours_l, _ = kvpool_kept(model, prompt, method="snapkv", max_capacity_prompt=k,
                                window_size=W, kernel_size=K, pooling="avg")
        at_their_budget.append(ours_l[l])
        theirs_cmp.append(theirs[l])
    mean_a, low_a, eq_a = jaccard(at_their_budget, theirs_cmp)
    # (b) kvpool's own PyramidKV (KVCache-Factory schedule): kvpress's set inside kvpool's.
    ours, our_keep = kvpool_kept(model, prompt, method="pyramidkv",
                                 max_capacity_prompt=W + int(N * (1 - RATIO)), window_size=W,
                                 kernel_size=K, pooling="avg", beta=BETA)
    contained = [len(t & o) / len(t) for lt, lo in zip(theirs, ours) for t, o in zip(lt, lo)]
    mean_b, low_b, _ = jaccard(ours, theirs)
    record("PyramidKV", kvpress_keep=their_keep, kvpool_keep=our_keep,
           kvpress_window_only_layers=window_only,
           same_budget_jaccard_mean=mean_a, same_budget_jaccard_min=low_a,
           same_budget_sets_equal=eq_a,
           containment_mean=sum(contained) / len(contained), containment_min=min(contained),
           own_schedule_jaccard_mean=mean_b, own_schedule_jaccard_min=low_b)
    assert [o - t for o, t in zip(our_keep, their_keep)][1:] == [W] * (len(our_keep) - 1) or \
        max(abs(o - W - t) for o, t in zip(our_keep, their_keep)) <= 1
    assert mean_a >= 0.99 and low_a >= 0.95, (mean_a, low_a)
    assert min(contained) >= 0.95, contained
