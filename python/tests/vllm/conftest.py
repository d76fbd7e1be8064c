"""Fixtures of kvpool.vllm's tests: a real kvpoold per test, vLLM's own config classes on the
CPU (a ModelConfig over a local config.json of a tiny Llama, no weights), and per-layer KV
views made by vLLM's own create_kv_cache_views in each of its six physical layouts."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

from kvpool.testing import Daemon  # noqa: E402

from vllm_env import HEAD_DIM, HEADS, KV_HEADS, LAYERS  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[3]
if "KVPOOL_KVPOOLD" not in os.environ and (REPO / "build/daemon/kvpoold").exists():
    os.environ["KVPOOL_KVPOOLD"] = str(REPO / "build/daemon/kvpoold")



def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


@pytest.fixture
def daemon():
    with Daemon() as d:
        yield d


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A local model directory holding only a tiny Llama config.json (ModelConfig reads it)."""
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HEADS * HEAD_DIM, "intermediate_size": 128,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "num_hidden_layers": LAYERS, "vocab_size": 1000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": 2,
    }))
    return str(d)
