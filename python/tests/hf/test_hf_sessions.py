"""Issue 10, part 2: a 4-round chat saves its session after each round; the daemon restarts;
round 5 resumes from load_session and generates the same tokens as a run that never stopped,
computing only the new round's tokens."""

import pytest
import torch

from conftest import MAX_NEW, adapter, count_tokens, greedy, kv_greedy
from models import random_tokens

SYSTEM = random_tokens(200, seed=200)
USER = [random_tokens(n, seed=201 + i) for i, n in enumerate([23, 31, 17, 29, 26])]


def uninterrupted(model):
    """All five rounds on one in-memory DynamicCache; round 5's tokens and its token count."""
    history = list(SYSTEM)
    cache = None
    for r in range(5):
        prompt = history + USER[r]
        if r == 4:
            with count_tokens(model) as c:
                seq, logits, cache = greedy(model, torch.tensor(prompt), cache)
            return seq.tolist(), logits, c.tokens
        seq, _, cache = greedy(model, torch.tensor(prompt), cache)
        history = seq.tolist()


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
def test_round5_resumes_from_session_after_restart(daemon, model, mid, hard):
    ref_tokens, ref_logits, ref_count = uninterrupted(model)
    kv = adapter(daemon.socket, model, mid)
    history = list(SYSTEM)
    for r in range(4):
        seq, _ = kv_greedy(kv, model, torch.tensor(history + USER[r]), session_id="chat-1")
        if r > 0:
            # Each round resumed the previous round's session: everything but the last token.
            assert kv.last_load.source == "session"
            assert kv.last_load.cached_tokens == len(history) - 1
        history = seq.tolist()
    kv.close()
    daemon.restart(hard=hard)   # sessions (and the blocks they pin) are on disk

    kv = adapter(daemon.socket, model, mid)
    prompt5 = history + USER[4]
    with count_tokens(model) as c:
        seq, logits = kv_greedy(kv, model, torch.tensor(prompt5), session_id="chat-1")
    assert kv.last_load.source == "session", kv.last_load
    # The session covers the whole history but its last token, which the model never fed back;
    # round 5 computes that token, the new user turn, and one token per decode step.
    assert kv.last_load.cached_tokens == len(history) - 1
    assert c.tokens == (len(USER[4]) + 1) + (MAX_NEW - 1)
    assert c.tokens == ref_count
    assert seq.tolist() == ref_tokens
    diff = (logits - ref_logits).abs().max().item()
    print(f"\nround 5 after {'SIGKILL' if hard else 'SIGTERM'}: processed {c.tokens} tokens "
          f"(prompt {len(prompt5)}), tokens identical, max |logit diff| {diff:.3e}")
    # The resumed KV is byte-for-byte the uninterrupted run's: the same computation follows.
    assert diff == 0.0
    kv.close()


def test_session_of_other_history_is_not_used(daemon, model, mid):
    kv = adapter(daemon.socket, model, mid)
    seq, _ = kv_greedy(kv, model, torch.tensor(SYSTEM + USER[0]), session_id="chat-2")
    # Another conversation (same system prompt, other first turn) under the same session id:
    # the session's tokens are not a prefix of it, so only the shared blocks are used.
    other = SYSTEM + USER[1] + USER[2]
    with count_tokens(model) as c:
        got, logits = kv_greedy(kv, model, torch.tensor(other), session_id="chat-2")
    assert kv.last_load.source == "prefix"
    assert kv.last_load.cached_tokens == (len(SYSTEM) // 16) * 16
    ref, ref_logits, _ = greedy(model, torch.tensor(other))
    assert got.tolist() == ref.tolist()
    assert c.tokens == len(other) - kv.last_load.cached_tokens + MAX_NEW - 1
    kv.close()


def test_prompt_equal_to_session_history_is_cropped(daemon, model, mid):
    # A prompt that is exactly the saved history: the cache must cover fewer tokens than the
    # prompt, so it is cropped to len(prompt) - 1 and one token is computed.
    kv = adapter(daemon.socket, model, mid)
    seq, _ = kv_greedy(kv, model, torch.tensor(SYSTEM + USER[0]), session_id="chat-3")
    covered = len(seq) - 1
    prompt = seq.tolist()[:covered]
    with count_tokens(model) as c:
        got, _ = kv_greedy(kv, model, torch.tensor(prompt), session_id="chat-3")
    assert kv.last_load.source == "session"
    assert kv.last_load.cached_tokens == covered - 1
    assert c.calls[0] == 1
    ref, _, _ = greedy(model, torch.tensor(prompt))
    assert got.tolist() == ref.tolist()
    kv.close()
