"""Where kvpool.hf stages blocks and makes loaded caches: the model's device. On a GPU the
blocks move between device memory and kvpool with one copy, device to device where kvpoold
runs a gpu tier there."""

import pytest
import torch

import kvpool
import kvpool.kernels
from conftest import adapter, greedy, kv_greedy
from kvpool.testing import Daemon
from models import model_id, random_tokens, tiny_llama

B = 16


def test_blocks_are_staged_on_the_models_device(daemon, model, mid):
    kv = adapter(daemon.socket, model, mid)
    assert kv.device == next(model.parameters()).device
    assert adapter(daemon.socket, model.config, mid, dtype=torch.float32).device.type == "cpu"
    with pytest.raises(ValueError, match="CPU or a CUDA device"):
        adapter(daemon.socket, model, mid, device="meta")
    prompt = random_tokens(2 * B + 5, seed=52)
    kv_greedy(kv, model, torch.tensor(prompt))
    cache, n = kv.load_prefix(prompt)
    assert n == 2 * B and cache.layers[0].keys.device == kv.device
    kv.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not kvpool.kernels.built_with_cuda,
                    reason="no CUDA device, or kvpool built without CUDA")
def test_a_model_on_a_gpu_stores_into_the_gpu_tier_and_generates_the_same_from_it(mid):
    model = tiny_llama(seed=0).to("cuda")
    prompt = torch.tensor(random_tokens(4 * B + 7, seed=53), device="cuda")
    flags = ["--gpu_devices=0", "--gpu_capacity=256MiB", "--gpu_segment_size=64MiB"]
    with Daemon(flags=flags) as d:
        kv = adapter(d.socket, model, mid)
        assert kv.device.type == "cuda"
        ref, ref_logits, _ = greedy(model, prompt)
        kv_greedy(kv, model, prompt)
        client = kvpool.Client(d.socket, namespace=kv._get_client().server["namespace"])
        try:
            found = client.lookup(kv.keys(prompt.tolist()), prefetch=False)
            assert found.hit_blocks == 4 and found.tiers == ["gpu"] * 4
        finally:
            client.close()
        got, logits = kv_greedy(kv, model, prompt)
        assert kv.last_load.cached_tokens == 4 * B
        assert got.tolist() == ref.tolist()
        assert (logits - ref_logits).abs().max().item() < 1e-3   # as the CPU tests
        kv.close()
