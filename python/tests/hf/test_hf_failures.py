"""Bad input: the adapter never raises into the model's code on a kvpool failure. A daemon that
is down, stalled (SIGSTOP: slow) or killed in the middle of a generation is a miss and a
skipped store, logged once as a warning; the model recomputes and the output stays correct."""

import logging

import pytest

import kvpool
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from conftest import MAX_NEW, adapter, count_tokens, greedy, kv_greedy
from kvpool.testing import Daemon
from models import random_tokens

SYSTEM = random_tokens(240, seed=400)
PROMPT = SYSTEM + random_tokens(23, seed=401)
OTHER = SYSTEM + random_tokens(27, seed=402)


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == "kvpool.hf" and r.levelno == logging.WARNING]


def test_daemon_down_is_a_miss_and_logged_once(model, mid, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="kvpool.hf")
    kv = adapter(str(tmp_path / "nobody-listens.sock"), model, mid, timeout=0.5)
    ref, ref_logits, _ = greedy(model, torch.tensor(PROMPT))
    for _ in range(3):
        got, logits = kv_greedy(kv, model, torch.tensor(PROMPT))
        assert got.tolist() == ref.tolist()
        assert torch.equal(logits, ref_logits)
        assert kv.last_load.cached_tokens == 0 and kv.last_load.error
    assert kv.store(PROMPT, None) == 0
    # Three loads and three stores failed; one warning for the outage.
    assert len(warnings_of(caplog)) == 1, [r.getMessage() for r in caplog.records]


def test_stalled_daemon_times_out_to_a_miss_then_recovers(model, mid, caplog):
    caplog.set_level(logging.INFO, logger="kvpool.hf")
    with Daemon() as d:
        kv = adapter(d.socket, model, mid, timeout=0.5)
        kv_greedy(kv, model, torch.tensor(PROMPT))             # blocks stored
        d.pause()                                              # alive, answering nothing
        try:
            got, _ = kv_greedy(kv, model, torch.tensor(OTHER))
            assert kv.last_load.cached_tokens == 0, kv.last_load
            assert kv.last_load.error
        finally:
            d.resume()
        ref, _, _ = greedy(model, torch.tensor(OTHER))
        assert got.tolist() == ref.tolist()
        assert len(warnings_of(caplog)) == 1
        # The daemon answers again: the next request hits.
        got, _ = kv_greedy(kv, model, torch.tensor(OTHER))
        assert kv.last_load.cached_tokens == (len(SYSTEM) // 16) * 16, kv.last_load
        assert got.tolist() == ref.tolist()
        assert any("answers again" in r.getMessage() for r in caplog.records)
        kv.close()


class KillAt(LogitsProcessor):
    """Kills the daemon (SIGKILL) when generation reaches its `step`-th new token."""

    def __init__(self, daemon, prompt_len, step):
        self.daemon, self.at, self.fired = daemon, prompt_len + step, False

    def __call__(self, input_ids, scores):
        if not self.fired and input_ids.shape[1] >= self.at:
            self.daemon.kill()
            self.fired = True
        return scores


def test_daemon_killed_in_the_middle_of_a_generation(model, mid, caplog):
    caplog.set_level(logging.INFO, logger="kvpool.hf")
    with Daemon() as d:
        kv = adapter(d.socket, model, mid, timeout=0.5)
        kv_greedy(kv, model, torch.tensor(PROMPT))             # system prompt stored
        ref, ref_logits, _ = greedy(model, torch.tensor(OTHER))
        killer = KillAt(d, len(OTHER), step=4)
        ids = torch.tensor([OTHER])
        with torch.no_grad():
            out = kv.generate(model, ids, max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW,
                              do_sample=False, output_logits=True, return_dict_in_generate=True,
                              logits_processor=LogitsProcessorList([killer]))
        assert killer.fired and not d.running
        # The prefix came from kvpool before the kill; the store after it failed quietly.
        assert kv.last_load.cached_tokens == (len(SYSTEM) // 16) * 16
        assert out.sequences[0].tolist() == ref.tolist()
        assert (torch.cat(out.logits) - ref_logits).abs().max().item() < 1e-3
        assert len(warnings_of(caplog)) == 1
        # While it is down: misses, the model recomputes everything, still the same answer.
        with count_tokens(model) as c:
            got, _ = kv_greedy(kv, model, torch.tensor(OTHER))
        assert c.calls[0] == len(OTHER)
        assert got.tolist() == ref.tolist()
        # Back up (its host tier was lost with the kill): stores and hits work again.
        d.start()
        kv_greedy(kv, model, torch.tensor(PROMPT))
        got, _ = kv_greedy(kv, model, torch.tensor(OTHER))
        assert kv.last_load.cached_tokens == (len(SYSTEM) // 16) * 16
        assert got.tolist() == ref.tolist()
        kv.close()


def test_a_credential_file_opens_a_guarded_namespace(model, mid, tmp_path):
    # An address and the namespace's credential file, as every connector takes them: the
    # adapter's own client proves it; without it every load and store is a miss.
    from conftest import NAMESPACE
    credential = tmp_path / "credential"
    credential.write_text("hf-credential-of-enough-bytes-0123\n")
    credential.chmod(0o600)
    admin = tmp_path / "admin"
    admin.write_text("hf-admin-credential-of-enough-bytes\n")
    admin.chmod(0o600)
    namespaces = tmp_path / "namespaces.yaml"
    namespaces.write_text(f"access: declared\nadmin: {{credential_file: {admin}}}\nnamespaces:\n"
                          f"  {NAMESPACE}: {{credential_file: {credential}}}\n")
    with Daemon([f"--namespaces_file={namespaces}"]) as d:
        kv = adapter(d.socket, model, mid, credential_file=str(credential))
        kv_greedy(kv, model, torch.tensor(PROMPT))             # blocks stored
        kv_greedy(kv, model, torch.tensor(PROMPT))
        assert kv.last_load.cached_tokens >= (len(SYSTEM) // 16) * 16, kv.last_load
        kv.close()
        refused = adapter(d.socket, model, mid, timeout=0.5)
        kv_greedy(refused, model, torch.tensor(PROMPT))
        assert refused.last_load.cached_tokens == 0 and "PermissionDenied" in str(
            refused.last_load.error)
        refused.close()
    with pytest.raises(ValueError, match="credential_file"):
        adapter(str(tmp_path / "x.sock"), model, mid, credential_file=str(tmp_path / "none"))


def test_blocks_decoded_from_lossy_copies_are_counted_and_said_once(model, mid, tmp_path, caplog):
    # A namespace whose policy keeps int8 disk copies (lossy: true) serves approximate KV once
    # its blocks left host: loaded, as its operator chose, counted and said once in the log.
    from conftest import NAMESPACE
    caplog.set_level(logging.INFO, logger="kvpool.hf")
    cfg = model.config
    namespaces = tmp_path / "namespaces.yaml"
    namespaces.write_text(
        f"namespaces:\n  {NAMESPACE}:\n    encoding: int8\n    lossy: true\n"
        f"    layout: {{layers: {cfg.num_hidden_layers}, kv_heads: {cfg.num_key_value_heads}, "
        f"head_dim: {cfg.head_dim}, tokens: 16, dtype: fp32}}\n")
    with Daemon([f"--namespaces_file={namespaces}"]) as d:
        kv = adapter(d.socket, model, mid)
        kv_greedy(kv, model, torch.tensor(PROMPT))             # blocks stored
        with kvpool.Client(d.socket, namespace=NAMESPACE) as c:
            assert c.evict("host")["evicted"] > 0                # on disk, as int8 only
        kv_greedy(kv, model, torch.tensor(PROMPT))
        hit = kv.last_load.hit_blocks
        assert hit == (len(PROMPT) - 1) // 16, kv.last_load
        assert kv.lossy.blocks == hit
        kv_greedy(kv, model, torch.tensor(PROMPT))
        said = [r for r in caplog.records if "lossy copies" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in caplog.records]
        kv.close()
