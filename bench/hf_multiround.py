#!/usr/bin/env python3
"""Multi-round chat through kvpool.hf against recompute: time to first token and prefix hit
rate per round, in the shape of LMCache's multi-round-qa and SGLang's bench_multiturn.

    .venv/hf/bin/python bench/hf_multiround.py                 # 4096-token system prompt,
                                                               # 8 users, 5 rounds
    .venv/hf/bin/python bench/hf_multiround.py --quick         # smoke run (CTest: bench;python)

Every user shares one system prompt; in round r each user sends its history (all earlier
questions and answers) plus a new question, and gets an answer of --answer-tokens tokens. Each
request is measured twice in the same run, back to back:
  recompute  the model prefills the whole prompt and picks the first token (no cache);
  kvpool     KvpoolHFCache.load_prefix finds the cached prefix (system prompt, and from round 2
             on the user's own history), the model prefills only the rest, picks the first
             token; then the answer is decoded and the new full blocks stored (not in TTFT).
"prefill-only" is the model's own time for the uncached tokens with their prefix already in
memory: the limit kvpool's TTFT approaches when loading costs nothing. The first tokens of the
two paths must agree (counted; the run fails if one differs). The model is the tests' tiny
random-weight Llama (8 layers, hidden 512, 4 KV heads, fp32, eager attention): 256 KiB per
16-token block. Budget: at 4k tokens the load moves 4096/16 * 256 KiB = 64 MiB from kvpool's
shared memory into the cache tensors; recompute is ~0.35 TFLOP of prefill on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests", "hf"))

import torch  # noqa: E402

import kvpool  # noqa: E402
import kvpool.hf  # noqa: E402
from kvpool.testing import Daemon  # noqa: E402
from models import model_id, random_tokens, tiny_llama  # noqa: E402


def first_token(model, ids, cache):
    """One prefill of ids (the tokens the cache does not cover); the greedy next token."""
    out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=cache is not None,
                logits_to_keep=1)
    return int(out.logits[0, -1].argmax())


def decode(model, cache, tok, n):
    """n more greedy tokens after tok, feeding each back through the cache."""
    toks = []
    for _ in range(n):
        out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
        tok = int(out.logits[0, -1].argmax())
        toks.append(tok)
    return toks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system-tokens", type=int, default=4096)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--question-tokens", type=int, default=64)
    p.add_argument("--answer-tokens", type=int, default=16)
    p.add_argument("--tokens-per-block", type=int, default=16)
    p.add_argument("--socket", help="use this running kvpoold instead of starting one")
    p.add_argument("--json", help="write every request's figures here")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 512-token system prompt, 2 users, 2 rounds")
    a = p.parse_args()
    if a.quick:
        a.system_tokens, a.users, a.rounds, a.question_tokens, a.answer_tokens = 512, 2, 2, 32, 8

    torch.manual_seed(0)
    model = tiny_llama(seed=0)
    vocab = model.config.vocab_size
    system = random_tokens(a.system_tokens, seed=1000, vocab=vocab)
    questions = [[random_tokens(a.question_tokens, seed=2000 + 100 * u + r, vocab=vocab)
                  for r in range(a.rounds)] for u in range(a.users)]

    daemon = None
    socket = a.socket
    if socket is None:
        daemon = Daemon(flags=["--host_capacity=1GiB", "--host_segment_size=64MiB"])
        daemon.start()
        socket = daemon.socket
    kv = kvpool.hf.KvpoolHFCache(socket, model, model_id=model_id(seed=0),
                                 secret="bench-hf-multiround", namespace="bench",
                                 tokens_per_block=a.tokens_per_block, timeout=10.0)
    print(f"# kvpool.hf multi-round chat: system prompt {a.system_tokens} tokens, {a.users} "
          f"users, {a.rounds} rounds, question {a.question_tokens}, answer {a.answer_tokens} "
          f"tokens; block {kv.block_bytes // 1024} KiB ({a.tokens_per_block} tokens); "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"load average {os.getloadavg()[0]:.2f} at start", flush=True)

    rows = []
    mismatches = 0
    with torch.no_grad():
        first_token(model, system[:64], None)   # warm-up (threads, allocator), not measured
        history = [[] for _ in range(a.users)]
        for r in range(a.rounds):
            for u in range(a.users):
                prompt = system + history[u] + questions[u][r]
                t0 = time.perf_counter()
                ref_tok = first_token(model, prompt, None)
                ttft_rec = time.perf_counter() - t0

                t0 = time.perf_counter()
                cache, cached = kv.load_prefix(prompt)
                t1 = time.perf_counter()
                if cache is None:
                    from transformers import DynamicCache
                    cache = DynamicCache(config=model.config)
                tok = first_token(model, prompt[cached:], cache)
                t2 = time.perf_counter()
                if tok != ref_tok:
                    mismatches += 1
                answer = [tok] + decode(model, cache, tok, a.answer_tokens - 1)
                t3 = time.perf_counter()
                stored = kv.store(prompt + answer, cache)
                t4 = time.perf_counter()
                history[u] = history[u] + questions[u][r] + answer
                rows.append(dict(round=r + 1, user=u + 1, prompt_tokens=len(prompt),
                                 cached_tokens=cached, ttft_kvpool=t2 - t0, load=t1 - t0,
                                 prefill_only=t2 - t1, ttft_recompute=ttft_rec,
                                 decode=t3 - t2, store=t4 - t3, stored_blocks=stored,
                                 same_first_token=tok == ref_tok))
                print(f"  round {r + 1} user {u + 1}: prompt {len(prompt)}, cached {cached}, "
                      f"TTFT kvpool {1e3 * (t2 - t0):.0f} ms (load {1e3 * (t1 - t0):.0f}), "
                      f"recompute {1e3 * ttft_rec:.0f} ms, store {1e3 * (t4 - t3):.0f} ms "
                      f"({stored} blocks)", flush=True)

    med = statistics.median
    print()
    print("| round | requests | prompt tokens (mean) | prefix hit rate | TTFT kvpool ms "
          "(median) | of which load ms | prefill-only ms (limit) | TTFT recompute ms (median) "
          "| kvpool / recompute |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in range(1, a.rounds + 1):
        rr = [x for x in rows if x["round"] == r]
        hit = sum(x["cached_tokens"] for x in rr) / sum(x["prompt_tokens"] for x in rr)
        kvp, rec = med(x["ttft_kvpool"] for x in rr), med(x["ttft_recompute"] for x in rr)
        print(f"| {r} | {len(rr)} | {statistics.mean(x['prompt_tokens'] for x in rr):.0f} | "
              f"{100 * hit:.1f}% | {1e3 * kvp:.0f} | {1e3 * med(x['load'] for x in rr):.0f} | "
              f"{1e3 * med(x['prefill_only'] for x in rr):.0f} | {1e3 * rec:.0f} | "
              f"{kvp / rec:.3f} |")
    # The warm-prefix figure: requests whose system prompt was already in kvpool (all but the
    # first request of round 1), each against its own recompute.
    warm = [x for x in rows if x["cached_tokens"] >= a.system_tokens - a.tokens_per_block]
    if warm:
        ratio = med(x["ttft_kvpool"] / x["ttft_recompute"] for x in warm)
        print(f"\nwarm prefix ({len(warm)} requests, prompts {min(x['prompt_tokens'] for x in warm)}"
              f"-{max(x['prompt_tokens'] for x in warm)} tokens): median TTFT kvpool / recompute "
              f"= {ratio:.3f} (target <= 0.15); median load {1e3 * med(x['load'] for x in warm):.0f}"
              f" ms, prefill-only {1e3 * med(x['prefill_only'] for x in warm):.0f} ms, recompute "
              f"{1e3 * med(x['ttft_recompute'] for x in warm):.0f} ms")
    print(f"first tokens that differ between kvpool and recompute: {mismatches} of {len(rows)}")
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(args=vars(a), rows=rows), f, indent=1)
    kv.close()
    if daemon:
        daemon.close()
    ok = mismatches == 0 and bool(warm)
    if not ok:
        print("FAILED: a first token differs or no request found its prefix", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
