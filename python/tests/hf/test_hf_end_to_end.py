"""Issue 10, part 1: the same answer through kvpool. Process 1 runs system prompt + question 1
and pushes its blocks; process 2 (another OS process, same daemon) runs system prompt +
question 2, gets the system prompt's blocks from kvpool, prefills only the rest and generates
greedily: its tokens equal a full recompute's. Also through a daemon SIGKILLed and restarted
(write-through: the blocks were on disk when kill -9 came)."""

import json
import os
import subprocess
import sys

import torch

from conftest import MAX_NEW, greedy
from kvpool.testing import Daemon
from models import random_tokens

HERE = os.path.dirname(os.path.abspath(__file__))
B = 16
SYSTEM = random_tokens(333, seed=100)        # 20 full blocks + 13 tokens
Q1 = random_tokens(41, seed=101)
Q2 = random_tokens(37, seed=102)


def run_worker(socket, prompt, tmp_path, name):
    pf = tmp_path / f"{name}.json"
    pf.write_text(json.dumps(prompt))
    out = tmp_path / f"{name}.pt"
    r = subprocess.run([sys.executable, os.path.join(HERE, "hf_worker.py"), "--socket", socket,
                        "--prompt", str(pf), "--out", str(out), "--max-new", str(MAX_NEW)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return torch.load(out)


def first_process(d, tmp_path):
    p1 = SYSTEM + Q1
    first = run_worker(d.socket, p1, tmp_path, "p1")
    assert first["cached_tokens"] == 0
    # Process 1 left its blocks in kvpool: every full block its cache covered (prompt plus
    # generated tokens but the last, which was never fed back).
    assert first["held_blocks"] == (len(p1) + MAX_NEW - 1) // B


def second_process_matches_recompute(d, model, tmp_path, record_property, label):
    p2 = SYSTEM + Q2
    second = run_worker(d.socket, p2, tmp_path, "p2")
    ref_seq, ref_logits, _ = greedy(model, torch.tensor(p2))
    shared = (len(SYSTEM) // B) * B
    assert second["cached_tokens"] == shared, second
    # Prefill of only the uncached tokens, then one token per further step.
    assert second["processed_tokens"] == (len(p2) - shared) + (MAX_NEW - 1)
    assert second["tokens"] == ref_seq.tolist()
    diff = (second["logits"] - ref_logits).abs().max().item()
    print(f"\n[{label}] cached {shared}/{len(p2)} prompt tokens; {MAX_NEW} tokens identical; "
          f"max |logit diff| vs recompute = {diff:.3e}")
    record_property(f"{label}_max_logit_diff", diff)
    assert diff < 1e-3


def test_second_process_reuses_system_prompt_same_tokens(model, tmp_path, record_property):
    with Daemon() as d:
        first_process(d, tmp_path)
        second_process_matches_recompute(d, model, tmp_path, record_property, "same_daemon")


def test_same_answer_after_sigkill_and_restart(model, tmp_path, record_property):
    with Daemon(flags=["--write_policy=write-through"]) as d:
        first_process(d, tmp_path)
        d.kill()           # kill -9: only what was written down survives
        d.start()
        second_process_matches_recompute(d, model, tmp_path, record_property, "after_sigkill")
