"""Issue 10, part 3: wrong hits are impossible. A different layout (dtype, model id, tokens per
block), another namespace or secret, a corrupted block on disk, or a block of the wrong size
never yields a cache hit that changes the output. Each test first shows the right adapter
does hit (so a miss is the layout's doing, not an empty daemon), then that the other one
misses or stops its prefix before the bad block, and that its output equals a recompute."""

import pathlib

import pytest
import torch

import kvpool
from conftest import NAMESPACE, SECRET, adapter, count_tokens, greedy, kv_greedy
from kvpool.testing import Daemon
from models import model_id, random_tokens, tiny_llama

B = 16
SYSTEM = random_tokens(256, seed=300)       # 16 full blocks
PROMPT = SYSTEM + random_tokens(21, seed=301)
OTHER = SYSTEM + random_tokens(19, seed=302)


def seed_daemon(d, model, mid, **kw):
    """Stores PROMPT's blocks through a right adapter and checks that OTHER then hits."""
    kv = adapter(d.socket, model, mid, **kw)
    kv_greedy(kv, model, torch.tensor(PROMPT))
    cache, n = kv.load_prefix(OTHER)
    assert n == len(SYSTEM) and cache is not None, kv.last_load
    kv.close()


def assert_miss_and_correct(kv, model, prompt=OTHER):
    with count_tokens(model) as c:
        got, logits = kv_greedy(kv, model, torch.tensor(prompt))
    assert kv.last_load.cached_tokens == 0, kv.last_load
    assert c.calls[0] == len(prompt)          # the whole prompt was computed
    ref, ref_logits, _ = greedy(model, torch.tensor(prompt))
    assert got.tolist() == ref.tolist()
    assert torch.equal(logits, ref_logits)


def test_other_dtype_misses(daemon, model, mid):
    seed_daemon(daemon, model, mid)
    half = tiny_llama(seed=0).to(torch.bfloat16)     # same weights rounded: another dtype
    kv = adapter(daemon.socket, half, mid)
    assert "dtype=bf16" in kv.layout
    assert_miss_and_correct(kv, half)


def test_other_model_id_misses(daemon, model, mid):
    seed_daemon(daemon, model, mid)
    other = tiny_llama(seed=1)                       # same shape, other weights
    kv = adapter(daemon.socket, other, model_id(seed=1))
    assert_miss_and_correct(kv, other)


def test_weights_fingerprint_tells_seeds_apart(model):
    assert kvpool.hf.weights_fingerprint(model) == kvpool.hf.weights_fingerprint(tiny_llama(0))
    assert kvpool.hf.weights_fingerprint(model) != kvpool.hf.weights_fingerprint(tiny_llama(1))


def test_other_tokens_per_block_misses(daemon, model, mid):
    seed_daemon(daemon, model, mid)
    kv = adapter(daemon.socket, model, mid, tokens_per_block=32)
    assert_miss_and_correct(kv, model)


def test_other_namespace_misses(daemon, model, mid):
    seed_daemon(daemon, model, mid)
    # Same secret, so the same keys: the daemon partitions by the authenticated namespace.
    kv = adapter(daemon.socket, model, mid, namespace="another-tenant")
    assert kv.keys(OTHER) == adapter(daemon.socket, model, mid).keys(OTHER)
    assert_miss_and_correct(kv, model)


def test_other_secret_misses(daemon, model, mid):
    seed_daemon(daemon, model, mid)
    kv = adapter(daemon.socket, model, mid, secret="another-secret")
    assert_miss_and_correct(kv, model)


@pytest.mark.parametrize("delta", [-4, +4], ids=["short", "long"])
def test_block_of_wrong_size_is_not_used(daemon, model, mid, delta):
    # A writer with the right keys but a payload of the wrong size (a buggy or hostile client
    # of the same tenant): the adapter checks every size against the layout.
    kv = adapter(daemon.socket, model, mid)
    keys = kv.keys(OTHER)
    with kvpool.Client(daemon.socket, namespace=NAMESPACE) as c:
        r = c.put(keys[:1], [bytes(kv.block_bytes + delta)])
        assert r.all_ok() and r.stored == 1
        assert c.lookup(keys).hit_blocks == 1
    with count_tokens(model) as cnt:
        got, _ = kv_greedy(kv, model, torch.tensor(OTHER))
    assert kv.last_load.lookup_hit == 1 and kv.last_load.cached_tokens == 0, kv.last_load
    assert cnt.calls[0] == len(OTHER)
    ref, _, _ = greedy(model, torch.tensor(OTHER))
    assert got.tolist() == ref.tolist()


def flip_block_bytes_on_disk(data_dir, payload: bytes) -> list[str]:
    """Flips one byte in the middle of `payload` wherever RocksDB's files hold it."""
    needle = payload[len(payload) // 2:len(payload) // 2 + 64]
    hit = []
    for f in pathlib.Path(data_dir).rglob("*"):
        if not f.is_file():
            continue
        data = bytearray(f.read_bytes())
        i = data.find(needle)
        while i >= 0:
            data[i + 32] ^= 0x5A
            hit.append(f.name)
            i = data.find(needle, i + 64)
        if f.name in hit:
            f.write_bytes(bytes(data))
    return hit


def test_corrupted_block_on_disk_ends_the_prefix(model, mid):
    with Daemon(flags=["--write_policy=write-through"]) as d:
        kv = adapter(d.socket, model, mid)
        kv_greedy(kv, model, torch.tensor(PROMPT))
        keys = kv.keys(OTHER)
        with kvpool.Client(d.socket, namespace=NAMESPACE) as c:
            assert c.lookup(keys).hit_blocks == len(SYSTEM) // B
            block3 = c.get([keys[3]])[0]
            assert block3 is not None and len(block3) == kv.block_bytes
        kv.close()
        d.stop()                 # SIGTERM: RocksDB flushes; the bodies sit in blob files
        files = flip_block_bytes_on_disk(d.data_dir, block3)
        assert files, "block 3's bytes were not found in the data directory"
        d.start()                # host tier empty: every read comes from disk

        kv = adapter(d.socket, model, mid)
        with count_tokens(model) as cnt:
            got, logits = kv_greedy(kv, model, torch.tensor(OTHER))
        info = kv.last_load
        # Blocks 0-2 are served, block 3 fails its checksum and ends the prefix there.
        assert info.cached_tokens == 3 * B, info
        assert info.block_error in ("Corruption", "NotFound", "IoError"), info
        assert cnt.calls[0] == len(OTHER) - 3 * B
        ref, ref_logits, _ = greedy(model, torch.tensor(OTHER))
        assert got.tolist() == ref.tolist()
        assert (logits - ref_logits).abs().max().item() < 1e-3
        print(f"\ncorrupted block 3 in {sorted(set(files))}: served {info.cached_tokens} tokens, "
              f"block 3 refused ({info.block_error}), output equals recompute")
        kv.close()


def test_a_sliding_window_cache_is_not_stored(daemon, monkeypatch):
    """transformers keeps only the last window of a sliding-window layer while
    get_seq_length() counts every token: stored by position, its blocks would hold other tokens'
    KV. Such a cache is refused (nothing stored); a full cache of the same model is stored."""
    from transformers import MistralConfig, MistralForCausalLM

    # A block a put: the first block lies inside the window's tensor, so without the check it
    # would be stored (holding tokens 69-84 under the key of tokens 0-15).
    monkeypatch.setattr(kvpool.hf, "_PUT_CHUNK_BYTES", 1)

    torch.manual_seed(0)
    config = MistralConfig(vocab_size=8192, hidden_size=128, intermediate_size=256,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=32, max_position_embeddings=1024, sliding_window=32,
                           torch_dtype="float32")
    config._attn_implementation = "eager"
    mistral = MistralForCausalLM(config).eval()
    tokens = random_tokens(100, seed=310)
    with torch.no_grad():
        cache = mistral(torch.tensor([tokens]), use_cache=True).past_key_values
    assert cache.get_seq_length() == 100
    assert cache.layers[0].keys.shape[2] < 100        # the window only
    kv = adapter(daemon.socket, mistral, "mistral-sliding-test")
    assert kv.store(tokens, cache) == 0
    with kvpool.Client(daemon.socket, namespace=NAMESPACE) as c:
        assert c.lookup(kv.keys(tokens)).hit_blocks == 0
    kv.close()

    config.sliding_window = None                       # the same model without a window
    full = MistralForCausalLM(config).eval()
    with torch.no_grad():
        cache = full(torch.tensor([tokens]), use_cache=True).past_key_values
    kv = adapter(daemon.socket, full, "mistral-full-test")
    assert kv.store(tokens, cache) == 100 // B
    kv.close()


@pytest.mark.parametrize("arg", ["inputs_embeds", "pixel_values", "position_ids"])
def test_generate_refuses_inputs_that_change_the_kv_of_the_same_tokens(daemon, model, mid, arg):
    # kvpool's keys name the tokens only: KV that depends on more must not be stored or loaded.
    kv = adapter(daemon.socket, model, mid)
    with pytest.raises(ValueError, match=arg):
        kv.generate(model, torch.tensor([1, 2, 3]), max_new_tokens=1, **{arg: torch.zeros(1)})
    kv.close()


def test_generate_takes_all_zero_token_type_ids(daemon, model, mid):
    # Text-only processors give them; they change nothing.
    kv = adapter(daemon.socket, model, mid)
    ids = torch.tensor([[5, 6, 7, 8]])
    with pytest.raises(ValueError, match="token_type_ids"):
        kv.generate(model, ids, max_new_tokens=1, token_type_ids=torch.ones_like(ids))
    # All zeros pass kvpool to model.generate (which, for this Llama, refuses an argument it
    # has no use for: the refusal is transformers', not kvpool's).
    with pytest.raises(ValueError) as e:
        kv.generate(model, ids, max_new_tokens=1, do_sample=False,
                    token_type_ids=torch.zeros_like(ids))
    assert "kvpool" not in str(e.value) and "not used by the model" in str(e.value)
    kv.close()

