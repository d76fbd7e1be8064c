"""Small Llama-architecture models built from a config with random weights (no download).

Shared by kvpool.hf's tests, bench/hf_multiround.py and the KV-compression tests:

    from models import tiny_llama, model_id      # with python/tests/hf on sys.path
    model = tiny_llama(seed=0)                    # 8 layers, hidden 512, fp32, eager, eval()

Why these choices:
- Random weights after `torch.manual_seed(seed)`: the machines reach no model hub. The same
  seed gives the same weights in every process (init is deterministic on the CPU), which is
  what lets one process's KV be reused by another.
- fp32 and eager attention: the reference everything else is compared with (eager is the
  implementation that returns attention weights, which the compression methods need).
- 8 layers, hidden 512: prefill of a few thousand tokens is real work on 2 cores (seconds),
  so a cache hit is measurable against recompute, while a test prompt of a few hundred tokens
  still runs in well under a second.
- kv_heads=4 by default (grouped-query attention, as in Llama 3); pass kv_heads=8 for plain
  multi-head attention.

`model_id(...)` names the weights: two models with different seeds (or shapes) must never
share a block, so the id goes into kvpool's layout string.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama_config(layers: int = 8, hidden: int = 512, heads: int = 8, kv_heads: int = 4,
                      vocab: int = 8192, max_pos: int = 8192,
                      intermediate: int | None = None) -> LlamaConfig:
    """The LlamaConfig tiny_llama builds (eager attention, fp32)."""
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or (hidden * 11 // 4),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=max_pos,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        torch_dtype="float32",
    )
    config._attn_implementation = "eager"
    return config


def tiny_llama(seed: int = 0, layers: int = 8, hidden: int = 512, heads: int = 8,
               kv_heads: int = 4, vocab: int = 8192, max_pos: int = 8192,
               intermediate: int | None = None) -> LlamaForCausalLM:
    """A LlamaForCausalLM with random weights from `seed`: fp32, eager attention, eval().

    The generation config never stops early (no EOS) so that greedy runs of the same length
    can be compared token by token."""
    config = tiny_llama_config(layers, hidden, heads, kv_heads, vocab, max_pos, intermediate)
    # Initialise under a private generator state so the caller's RNG stream is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model = model.to(torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.generation_config.do_sample = False
    return model


def model_id(seed: int = 0, layers: int = 8, hidden: int = 512, heads: int = 8,
             kv_heads: int = 4, vocab: int = 8192, max_pos: int = 8192,
             intermediate: int | None = None) -> str:
    """A stable name for the weights tiny_llama(...) builds with these arguments."""
    inter = intermediate or (hidden * 11 // 4)
    return (f"kvpool-tests/tiny-llama-L{layers}-H{hidden}-A{heads}-KV{kv_heads}-V{vocab}"
            f"-I{inter}-P{max_pos}-seed{seed}")


def random_tokens(n: int, seed: int, vocab: int = 8192) -> list[int]:
    """n token ids in [3, vocab) from `seed` (0-2 are pad/bos/eos): a stand-in for text."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()
