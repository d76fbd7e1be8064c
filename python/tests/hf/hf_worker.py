"""One inference process of the end-to-end tests: builds the tiny model, runs one greedy
generation through kvpool.hf against the daemon at --socket, and writes what it saw.

    python hf_worker.py --socket S --prompt prompt.json --out result.pt [--seed 0]

result.pt holds {"tokens": [..], "logits": tensor [max_new, vocab], "cached_tokens": n,
"processed_tokens": n, "stored_blocks_lookup": n}. A separate OS process on purpose: what it
finds in kvpool can only have come through the daemon.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kvpool.hf  # noqa: E402
from conftest import NAMESPACE, SECRET, count_tokens, kv_greedy  # noqa: E402
from models import model_id, tiny_llama  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--prompt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new", type=int, default=12)
    a = p.parse_args()
    with open(a.prompt) as f:
        prompt = json.load(f)
    model = tiny_llama(seed=a.seed)
    kv = kvpool.hf.KvpoolHFCache(a.socket, model, model_id=model_id(seed=a.seed), secret=SECRET,
                                 namespace=NAMESPACE, timeout=10.0)
    ids = torch.tensor(prompt, dtype=torch.long)
    with count_tokens(model) as counter:
        seq, logits = kv_greedy(kv, model, ids, max_new=a.max_new)
    info = kv.last_load
    # How much of this run's sequence kvpool holds now (the blocks this process stored).
    keys = kv.keys(seq.tolist())
    held = kv._get_client().lookup(keys, prefetch=False).hit_blocks
    torch.save({"tokens": seq.tolist(), "logits": logits, "cached_tokens": info.cached_tokens,
                "processed_tokens": counter.tokens, "held_blocks": held,
                "load_error": info.error}, a.out)
    kv.close()


if __name__ == "__main__":
    main()
