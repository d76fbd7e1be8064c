"""Fixtures of kvpool.hf's tests: a real kvpoold per test, the tiny random-weight Llama, and a
counter of the tokens the model processes (what a cache hit saves)."""

from __future__ import annotations

import contextlib
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import kvpool  # noqa: E402
import kvpool.hf  # noqa: E402
from kvpool.testing import Daemon  # noqa: E402

from models import model_id, tiny_llama  # noqa: E402

SECRET = "hf-test-secret"
NAMESPACE = "hf-test"
MAX_NEW = 12


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


@pytest.fixture(scope="session")
def model():
    torch.manual_seed(0)
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def mid():
    return model_id(seed=0)


@pytest.fixture
def daemon():
    with Daemon() as d:
        yield d


def adapter(socket, model, mid, **kw):
    """A KvpoolHFCache on the test daemon, its client made by kvpool.hf (short timeout)."""
    kw.setdefault("secret", SECRET)
    kw.setdefault("namespace", NAMESPACE)
    return kvpool.hf.KvpoolHFCache(socket, model, model_id=mid, **kw)


class TokenCounter:
    """Counts the tokens the model runs through its layers, over all forward calls."""

    def __init__(self, model):
        self.tokens = 0
        self.calls = []
        self._h = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        if ids is None:
            ids = kwargs["inputs_embeds"]
        self.calls.append(int(ids.shape[1]))
        self.tokens += int(ids.shape[1])

    def close(self):
        self._h.remove()


@contextlib.contextmanager
def count_tokens(model):
    c = TokenCounter(model)
    try:
        yield c
    finally:
        c.close()


def greedy(model, ids, cache=None, max_new=MAX_NEW):
    """Greedy generation; returns (sequence [n + max_new] tensor, logits [max_new, vocab])."""
    from transformers import DynamicCache
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if cache is None:
        cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model.generate(ids, past_key_values=cache, max_new_tokens=max_new,
                             min_new_tokens=max_new, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    return out.sequences[0], torch.cat(out.logits, dim=0), cache


def kv_greedy(kv, model, ids, max_new=MAX_NEW, session_id=None):
    """Greedy generation through the adapter (load, generate, store)."""
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    with torch.no_grad():
        out = kv.generate(model, ids, session_id=session_id, max_new_tokens=max_new,
                          min_new_tokens=max_new, do_sample=False, output_logits=True,
                          return_dict_in_generate=True)
    return out.sequences[0], torch.cat(out.logits, dim=0)
