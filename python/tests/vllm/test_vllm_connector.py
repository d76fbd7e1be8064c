"""kvpool.vllm against a real kvpoold and vLLM 0.33's own Scheduler, Request, config and KV view
classes on the CPU. The model does not run (no GPU): the KV "computed" by a forward is the
random content of the paged buffers, and what is checked is that the bytes of each token go
through kvpool unchanged into another instance's different blocks and physical layout."""

from __future__ import annotations

import functools
import logging
import threading
import types

import prometheus_client
import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import RequestStatus
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

import kvpool
import kvpool._outage
import kvpool.kernels
import kvpool.vllm
from kvpool.testing import Daemon
from vllm_env import (BLOCK, NUM_BLOCKS, SECRET, admit, finish, forward, kv_config, kv_views,
                      make_config, request, scheduler, step, token_kv, worker)
from conftest import HEAD_DIM, KV_HEADS, LAYERS

LAYOUTS = list(KVCacheLayout)
PROMPT = [(i * 7919 + 13) % 997 + 3 for i in range(50)]   # 3 full blocks + 2 tokens


def _store(model_dir, d, layout, tokens, seed=1, device="cpu", **cfg_kw):
    """A vLLM instance whose forward "computed" `tokens`: one step stores their full blocks.
    Returns (views, block ids of the request, scheduler output)."""
    cfg = make_config(model_dir, d.socket, secret=SECRET, **cfg_kw)
    views, kvc = kv_views(layout, seed=seed, device=device)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views)
    req = request(tokens)
    sched.add_request(req)
    out = step(sched, w)
    assert out.num_scheduled_tokens[req.request_id] == len(tokens)  # nothing cached yet
    return views, list(out.scheduled_new_reqs[0].block_ids[0]), out


def _matched(model_dir, d, tokens, **cfg_kw):
    cfg = make_config(model_dir, d.socket, secret=cfg_kw.pop("secret", SECRET), **cfg_kw)
    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    return c.get_num_new_matched_tokens(request(tokens), 0)


def test_views_are_not_contiguous_in_most_layouts():
    views = [kv_views(lay)[0]["model.layers.1.self_attn.attn"] for lay in LAYOUTS]
    assert sum(not v.is_contiguous() for v in views) >= 4
    assert len({v.stride() for v in views}) == len(LAYOUTS)


def _keys(model_dir, tokens):
    """kvpool.vllm's keys of `tokens` for the test model (one rank, default model id)."""
    layout = kvpool.vllm.layout_for(model_dir, torch.bfloat16, LAYERS, KV_HEADS, HEAD_DIM, BLOCK)
    return kvpool.hash_chain(tokens, secret=SECRET, layout=layout, tokens_per_block=BLOCK)


@pytest.mark.parametrize("load_async", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize("src", LAYOUTS, ids=[lay.name for lay in LAYOUTS])
def test_store_then_load_into_other_blocks_and_layout(model_dir, daemon, src, load_async):
    dst = LAYOUTS[(LAYOUTS.index(src) + 3) % len(LAYOUTS)]
    views_a, blocks_a, _ = _store(model_dir, daemon, src, PROMPT, seed=1)

    # A second instance: other random KV, another physical order, and a filler request first
    # so the prompt lands in other blocks; its prompt extends the stored one.
    cfg = make_config(model_dir, daemon.socket, secret=SECRET, load_async=load_async)
    views_b, kvc = kv_views(dst, seed=2)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views_b)
    assert isinstance(sched.connector, kvpool.vllm.KvpoolConnector)  # via the module path
    filler = request([5] * 40)
    prompt_b = PROMPT[:48] + [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    req = request(prompt_b)
    sched.add_request(filler)
    sched.add_request(req)
    out = step(sched, w)
    new = {r.req_id: r for r in out.scheduled_new_reqs}
    assert new[filler.request_id].num_computed_tokens == 0
    if load_async:   # the prompt waits for its blocks while the filler computes
        assert req.request_id not in new and req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        kv_out = finish(sched, w, out)
        assert kv_out.finished_recving == {req.request_id} and not kv_out.invalid_block_ids
        out = step(sched, w)
        new = {r.req_id: r for r in out.scheduled_new_reqs}
    else:
        assert w.get_block_ids_with_load_errors() == set()
    blocks_b = list(new[req.request_id].block_ids[0])
    assert new[req.request_id].num_computed_tokens == 48      # the stored full blocks
    assert out.num_scheduled_tokens[req.request_id] == len(prompt_b) - 48
    assert blocks_b[:3] != blocks_a[:3]
    got = token_kv(views_b, blocks_b, 48).view(torch.int16)
    want = token_kv(views_a, blocks_a, 48).view(torch.int16)
    assert torch.equal(got, want)                             # byte-identical per token
    assert not torch.equal(token_kv(views_b, blocks_b, 48),   # and it was not already there
                           token_kv(kv_views(dst, seed=2)[0], blocks_b, 48))


def test_kernel_split_blocks(model_dir, daemon):
    """vLLM splits a 16-token block into two 8-token kernel blocks (views [2 * blocks, H, 8,
    C]): slots still map to the right rows, on store and on load."""
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    views_a, kvc = kv_views(KVCacheLayout.LBNHC, seed=4, kernel_block_size=8)
    assert views_a["model.layers.0.self_attn.attn"].shape[2] == 8
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views_a)
    req = request(PROMPT)
    sched.add_request(req)
    blocks_a = list(step(sched, w).scheduled_new_reqs[0].block_ids[0])
    views_b, _ = kv_views(KVCacheLayout.BHLNC, seed=5)
    views_c, _ = kv_views(KVCacheLayout.LBHNC, seed=6, kernel_block_size=8)
    for views in (views_b, views_c):
        sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views)
        sched.add_request(request([4] * 20))
        req = request(PROMPT + [3])
        sched.add_request(req)
        new = admit(sched, w)[req.request_id]
        assert new.num_computed_tokens == 48
        assert torch.equal(token_kv(views, list(new.block_ids[0]), 48).view(torch.int16),
                           token_kv(views_a, blocks_a, 48).view(torch.int16))


def test_chunked_prefill_saves_each_chunks_full_blocks(model_dir, daemon):
    """A 50-token prompt prefilled in chunks of 32 tokens: the first step stores 2 blocks, the
    second (a cached request in vLLM's SchedulerOutput) the third, hashing only that block;
    decode KV is not stored."""
    cfg = make_config(model_dir, daemon.socket, secret=SECRET, max_batched_tokens=32)
    views_a, kvc = kv_views(KVCacheLayout.BHLNC, seed=7)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views_a)
    hashed = []                                              # blocks each worker hash call keyed
    keys_of = w._keys
    w._keys = lambda *a, **kw: hashed.append(len(k := keys_of(*a, **kw))) or k
    req = request(PROMPT, max_tokens=3)
    sched.add_request(req)
    rid = req.request_id
    out = step(sched, w)
    assert out.num_scheduled_tokens[rid] == 32
    blocks_a = list(out.scheduled_new_reqs[0].block_ids[0])
    assert _matched(model_dir, daemon, PROMPT + [1]) == (32, True)
    sched.update_from_output(out, ModelRunnerOutput(req_ids=[rid], req_id_to_index={rid: 0},
                                                    sampled_token_ids=[[]]))
    out = step(sched, w)
    assert out.num_scheduled_tokens[rid] == 18 and not out.scheduled_new_reqs
    for ids in out.scheduled_cached_reqs.new_block_ids:
        blocks_a += list(ids[0]) if ids else []
    assert _matched(model_dir, daemon, PROMPT + [1]) == (48, True)
    sched.update_from_output(out, ModelRunnerOutput(req_ids=[rid], req_id_to_index={rid: 0},
                                                    sampled_token_ids=[[PROMPT[0]]]))
    step(sched, w)                                           # a decode step: nothing stored
    assert _matched(model_dir, daemon, PROMPT + [PROMPT[0]] * 20) == (48, True)
    assert hashed == [2, 1]                                  # each block hashed once
    w.get_finished({rid})                                    # its saves done: its chain goes
    assert rid not in w._chains

    views_b, kvc_b = kv_views(KVCacheLayout.LBNHC, seed=8)
    sched, w = scheduler(make_config(model_dir, daemon.socket, secret=SECRET), kvc_b), \
        worker(cfg, kvc_b, views_b)
    req = request(PROMPT + [1])
    sched.add_request(req)
    new = admit(sched, w)[req.request_id]
    assert new.num_computed_tokens == 48
    assert torch.equal(token_kv(views_b, list(new.block_ids[0]), 48).view(torch.int16),
                       token_kv(views_a, blocks_a, 48).view(torch.int16))


def test_matched_is_block_aligned_and_less_than_the_prompt(model_dir, daemon):
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    assert _matched(model_dir, daemon, PROMPT[:48]) == (32, True)   # one token must be computed
    assert _matched(model_dir, daemon, PROMPT[:49]) == (48, True)
    assert _matched(model_dir, daemon, PROMPT + [1, 2, 3]) == (48, True)
    assert _matched(model_dir, daemon, PROMPT[:20] + [999] * 30) == (16, True)
    assert _matched(model_dir, daemon, [999] + PROMPT[1:]) == (0, False)
    assert _matched(model_dir, daemon, PROMPT[:49], load_async=False) == (48, False)
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    assert c.get_num_new_matched_tokens(request(PROMPT), 16) == (32, True)
    assert c.get_num_new_matched_tokens(request(PROMPT), 48) == (0, False)


def test_keys_are_kvpools_own_over_token_ids(model_dir, daemon):
    """What vLLM stored is found by any kvpool client that computes the same layout's keys
    (kvpool.hf, SGLang): kvpool.hash_chain over the token ids, not vLLM's block hashes."""
    _store(model_dir, daemon, KVCacheLayout.LBNHC, PROMPT)
    with kvpool.Client(daemon.socket, namespace="vllm-test") as c:
        assert c.lookup(_keys(model_dir, PROMPT)).hit_blocks == 3


@pytest.mark.parametrize("change", [{"model_id": "another/model"}, {"secret": "other"},
                                    {"namespace": "other-tenant"}, {"dtype": "float16"},
                                    {"block_size": 8}])
def test_other_model_layout_or_namespace_is_a_miss(model_dir, daemon, change):
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    assert _matched(model_dir, daemon, PROMPT + [7]) == (48, True)
    assert _matched(model_dir, daemon, PROMPT + [7], **change) == (0, False)


def test_daemon_killed_is_a_miss_and_a_load_error_then_recovers(model_dir, daemon, caplog):
    caplog.set_level(logging.INFO, logger="kvpool.vllm")
    views_a, blocks_a, _ = _store(model_dir, daemon, KVCacheLayout.BLHNC, PROMPT)
    cfg = make_config(model_dir, daemon.socket, secret=SECRET, load_async=False)
    views_b, kvc = kv_views(KVCacheLayout.LHBNC, seed=3)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views_b)

    # Matched while the daemon is up, killed before the worker loads: the blocks are reported
    # as load errors (vLLM recomputes them), nothing raises.
    req = request(PROMPT + [1])
    sched.add_request(req)
    out = sched.schedule()
    blocks = list(out.scheduled_new_reqs[0].block_ids[0])
    assert out.scheduled_new_reqs[0].num_computed_tokens == 48
    daemon.kill()
    forward(w, out)
    assert w.get_block_ids_with_load_errors() == set(blocks[:3])
    assert w.get_block_ids_with_load_errors() == set()        # reported once
    assert any(r.name == "kvpool.vllm" and r.levelno == logging.WARNING for r in caplog.records)

    # Down: a lookup is a miss, a store is skipped, no exception.
    assert sched.connector.get_num_new_matched_tokens(request(PROMPT + [2]), 0) == (0, False)
    req2 = request([9] * 40)
    sched.add_request(req2)
    out2 = step(sched, w)
    assert out2.scheduled_new_reqs[0].num_computed_tokens == 0

    # Restarted: the same connectors find kvpool again and serve hits.
    daemon.start()
    req3 = request([21] * 33)
    sched.add_request(req3)
    step(sched, w)                                             # stores 2 blocks
    assert sched.connector.get_num_new_matched_tokens(request([21] * 40), 0) == (32, False)
    assert any("answers again" in r.getMessage() for r in caplog.records)


def test_a_stalled_daemon_costs_one_timeout_then_lookups_miss_without_asking(model_dir, daemon,
                                                                            monkeypatch):
    # vLLM's scheduler asks for every waiting request on every step: a stopped daemon must not
    # cost each ask its timeout. (The guard's clock is the test's.)
    now = [1000.0]
    monkeypatch.setattr(kvpool._outage, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    _store(model_dir, daemon, KVCacheLayout.BLHNC, PROMPT)
    made = []

    def factory():
        made.append(1)
        return kvpool.Client(daemon.socket, namespace="vllm-test", timeout=0.3,
                             connect_timeout=0.3)

    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    cfg.kv_transfer_config.kv_connector_extra_config["client_factory"] = factory
    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    assert c.get_num_new_matched_tokens(request(PROMPT), 0) == (48, True)
    daemon.pause()
    try:
        assert c.get_num_new_matched_tokens(request(PROMPT), 0) == (0, False)   # by its deadline
        assert len(made) == 1
        for _ in range(50):   # held back: misses, no client made, kvpool not asked
            assert c.get_num_new_matched_tokens(request(PROMPT), 0) == (0, False)
        assert len(made) == 1
        now[0] += 0.6         # past the first 0.5 s: one try (a new client), stalled again
        assert c.get_num_new_matched_tokens(request(PROMPT), 0) == (0, False)
        assert len(made) == 2
        now[0] += 0.6         # within the next window, doubled to 1 s
        assert c.get_num_new_matched_tokens(request(PROMPT), 0) == (0, False)
        assert len(made) == 2
    finally:
        daemon.resume()
    now[0] += 1.0             # it answers again: the hit is back, and the guard is reset
    assert c.get_num_new_matched_tokens(request(PROMPT), 0) == (48, True)
    assert len(made) == 3


@pytest.mark.parametrize("load_async", [False, True])
def test_a_block_of_the_wrong_size_ends_the_load_there(model_dir, daemon, load_async):
    # Another writer's block under the key (a bug, another layout under a colliding model id):
    # blocks from it on are load errors, recomputed; the good one before it is used.
    keys = _keys(model_dir, PROMPT[:48])
    size = LAYERS * 2 * BLOCK * KV_HEADS * HEAD_DIM * 2
    with kvpool.Client(daemon.socket, namespace="vllm-test") as c:
        assert c.put(keys, [bytes([7]) * size, bytes(size - 2), bytes(size)]).all_ok()
    cfg = make_config(model_dir, daemon.socket, secret=SECRET, load_async=load_async)
    views, kvc = kv_views(KVCacheLayout.LHBNC, seed=41)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views)
    req = request(PROMPT + [1])
    sched.add_request(req)
    out = sched.schedule()
    blocks = list(sched.kv_cache_manager.get_block_ids(req.request_id)[0])
    if load_async:
        forward(w, out)
        kv_out = finish(sched, w, out)
        assert kv_out.finished_recving == {req.request_id}
        assert kv_out.invalid_block_ids == set(blocks[1:3])
    else:
        assert out.scheduled_new_reqs[0].num_computed_tokens == 48
        forward(w, out)
        assert w.get_block_ids_with_load_errors() == set(blocks[1:3])
    # The first block was loaded as put.
    assert bool((token_kv(views, blocks, BLOCK).view(torch.uint8) == 7).all())


def _parked(model_dir, d, layout, seed, prompt):
    """An instance with asynchronous loads and a request for `prompt` that vLLM parked waiting
    for its kvpool blocks: (scheduler, worker, views, request, its SchedulerOutput, its block
    ids). The worker has not started the load yet."""
    cfg = make_config(model_dir, d.socket, secret=SECRET)
    views, kvc = kv_views(layout, seed=seed)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views)
    req = request(prompt)
    sched.add_request(req)
    out = sched.schedule()
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS and not out.scheduled_new_reqs
    return sched, w, views, req, out, list(sched.kv_cache_manager.get_block_ids(req.request_id)[0])


def test_async_load_failure_comes_with_the_finished_request_and_is_recomputed(model_dir, daemon):
    _store(model_dir, daemon, KVCacheLayout.BLHNC, PROMPT)
    sched, w, _, req, out, blocks = _parked(model_dir, daemon, KVCacheLayout.LHBNC, 3,
                                            PROMPT + [1])
    daemon.kill()
    forward(w, out)
    kv_out = finish(sched, w, out)
    assert kv_out.finished_recving == {req.request_id}       # finished, failed, same pass
    assert kv_out.invalid_block_ids == set(blocks[:3])
    new = admit(sched, w)[req.request_id]
    assert new.num_computed_tokens == 0                      # vLLM computes the whole prompt


@pytest.mark.parametrize("load_async", [True, False], ids=["async", "sync"])
def test_an_exception_inside_a_load_or_save_is_a_recompute_not_a_crash(model_dir, daemon,
                                                                       load_async, caplog):
    """Not a kvpool failure but a bug (here: the scatter into the paged KV raises): the load's
    blocks are load errors, reported with the request; a save that raises stores nothing; the
    engine goes on."""
    _store(model_dir, daemon, KVCacheLayout.BLHNC, PROMPT)
    cfg = make_config(model_dir, daemon.socket, secret=SECRET, load_async=load_async,
                      save_async=load_async)
    views, kvc = kv_views(KVCacheLayout.LHBNC, seed=7)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views)

    def broken(*args, **kwargs):
        raise RuntimeError("scatter bug")

    w._scatter = broken
    w._gather = broken
    req = request(PROMPT + [1])
    sched.add_request(req)
    out = step(sched, w)
    blocks = list(sched.kv_cache_manager.get_block_ids(req.request_id)[0])
    kv_out = finish(sched, w, out, expect={req.request_id} if load_async else set())
    if load_async:
        assert kv_out.finished_recving == {req.request_id}
    assert kv_out.invalid_block_ids == set(blocks[:3])
    if load_async:
        assert admit(sched, w)[req.request_id].num_computed_tokens == 0
    else:                                # scheduled with the load; vLLM rolls it back
        assert req.num_computed_tokens == 0, req.num_computed_tokens
    other = request([13] * 40)                               # a save that raises: nothing stored
    sched.add_request(other)
    finish(sched, w, step(sched, w))
    assert _keys_hit(model_dir, daemon, [13] * 40) == 0
    assert any("scatter bug" in (r.exc_text or "") for r in caplog.records)


def test_async_load_of_a_block_gone_meanwhile_recomputes_and_stores_it_again(model_dir, daemon):
    views_a, blocks_a, _ = _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    sched, w, views_b, req, out, blocks = _parked(model_dir, daemon, KVCacheLayout.BLNHC, 4,
                                                  PROMPT + [1])
    keys = _keys(model_dir, PROMPT)
    with kvpool.Client(daemon.socket, namespace="vllm-test") as c:
        assert c.evict("disk", keys[2:])["evicted"] == 1         # the tail block leaves kvpool
        forward(w, out)
        kv_out = finish(sched, w, out)
        assert kv_out.invalid_block_ids == {blocks[2]}
        new = admit(sched, w)[req.request_id]
        assert new.num_computed_tokens == 32                      # the two good blocks
        assert torch.equal(token_kv(views_b, blocks, 32).view(torch.int16),
                           token_kv(views_a, blocks_a, 32).view(torch.int16))
        assert c.lookup(keys).hit_blocks == 3                     # recomputed and stored again


def test_a_request_aborted_while_loading_keeps_its_blocks_until_the_load_ends(model_dir, daemon):
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    sched, w, _, req, out, _ = _parked(model_dir, daemon, KVCacheLayout.LBHNC, 5, PROMPT + [1])
    pool = sched.kv_cache_manager.block_pool
    sched.finish_requests(req.request_id, RequestStatus.FINISHED_ABORTED)
    held = pool.get_num_free_blocks()
    assert held < NUM_BLOCKS - 1                              # the load's blocks stay taken
    forward(w, out)                                          # the load still runs
    kv_out = finish(sched, w, out, expect={req.request_id})
    assert kv_out.finished_recving == {req.request_id}
    assert req.request_id not in sched.requests
    assert pool.get_num_free_blocks() == NUM_BLOCKS - 1      # all free once reported


@pytest.mark.parametrize("taken,end", [(48, 3), (20, 2)])
def test_a_recorded_load_goes_out_even_for_a_request_finished_before_it(model_dir, daemon, taken,
                                                                          end):
    """vLLM may finish a request between update_state_after_alloc and the next
    build_connector_meta (its deferred loads), and then frees the blocks only once a worker
    reports the load: the load still goes out. It covers the tokens vLLM took (`taken`), which
    may be fewer than offered."""
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    c = kvpool.vllm.KvpoolConnector(make_config(model_dir, daemon.socket, secret=SECRET),
                                    KVConnectorRole.SCHEDULER, kv_config())
    req = request(PROMPT + [1])
    assert c.get_num_new_matched_tokens(req, 0) == (48, True)
    c.update_state_after_alloc(req, KVCacheBlocks(([KVCacheBlock(i) for i in (7, 3, 9, 4)],)),
                               taken)
    assert c.request_finished(req, [7, 3, 9, 4]) == (False, None)
    out = SchedulerOutput.make_empty()
    out.finished_req_ids = {req.request_id}
    meta = c.build_connector_meta(out)
    assert [(s.req_id, s.first, s.end, s.block_ids) for s in meta.async_loads] == [
        (req.request_id, 0, end, [7, 3, 9][:end])]
    assert meta.async_loads[0].token_ids == (PROMPT + [1])[:end * BLOCK]
    assert not c.build_connector_meta(SchedulerOutput.make_empty()).async_loads   # once


def _hold_saver(w):
    """Keeps the worker's save thread busy until the returned event is set: saves handed to it
    meanwhile wait, as a slow put would."""
    gate = threading.Event()
    w._saver.submit(lambda _item, _link: gate.wait(10) and 0, None, torch.device("cpu"), None)
    return gate


def test_a_finished_request_keeps_its_blocks_until_its_saves_are_stored(model_dir, daemon):
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    views, kvc = kv_views(KVCacheLayout.LBHNC, seed=9)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views)
    pool = sched.kv_cache_manager.block_pool
    free0 = pool.get_num_free_blocks()
    gate = _hold_saver(w)
    req = request(PROMPT, max_tokens=1)
    sched.add_request(req)
    out = step(sched, w, settle=False)                       # hands 3 blocks to the saver
    kv_out = finish(sched, w, out)                           # samples its one token: finished
    assert not kv_out.finished_sending
    assert req.request_id in sched.requests                  # blocks held for the save
    out = step(sched, w, settle=False)                       # tells the worker it finished
    assert out.finished_req_ids == {req.request_id}
    assert not w.get_transfer_results(out.finished_req_ids).finished_sending   # still saving
    assert pool.get_num_free_blocks() < free0
    with kvpool.Client(daemon.socket, namespace="vllm-test") as c:
        assert c.lookup(_keys(model_dir, PROMPT[:48]), prefetch=False).hit_blocks == 0
        gate.set()
        assert w.wait_for_background(timeout=10.0)
        assert c.lookup(_keys(model_dir, PROMPT[:48])).hit_blocks == 3
    kv_out = finish(sched, w, out)
    assert kv_out.finished_sending == {req.request_id}       # reported once stored
    assert req.request_id not in sched.requests
    assert pool.get_num_free_blocks() == free0
    assert not finish(sched, w, step(sched, w)).finished_sending   # and only once


def test_a_preempted_requests_save_reads_its_blocks_before_they_are_written_again(model_dir,
                                                                                  daemon):
    """Two requests decode in a KV cache too small for both: vLLM preempts one and hands its
    blocks to the other. The save of the preempted one's prompt, still queued, finishes before
    the step's forward (here: the test) writes those blocks; what kvpool holds is the KV the
    prompt had."""
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    views, kvc = kv_views(KVCacheLayout.LHBNC, seed=10, num_blocks=8)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views)
    a, b = request(PROMPT, max_tokens=40), request([(t * 13) % 997 + 5 for t in range(40)],
                                                   max_tokens=40)
    sched.add_request(a)
    sched.add_request(b)
    gate = _hold_saver(w)                                    # every save stays queued
    out = step(sched, w, settle=False)                       # both prefill: saves handed out
    finish(sched, w, out)
    blocks_b = list(sched.kv_cache_manager.get_block_ids(b.request_id)[0])
    want = token_kv(views, blocks_b, 32).clone()             # B's two full prompt blocks
    while True:                                              # decode until the cache is full
        out = sched.schedule()
        if out.preempted_req_ids:
            break
        forward(w, out, settle=False)
        finish(sched, w, out)
    assert out.preempted_req_ids == {b.request_id}
    threading.Timer(0.5, gate.set).start()
    forward(w, out, settle=False)                            # waits for B's save first
    for blk in blocks_b[:2]:                                 # the forward writes B's old blocks
        for v in views.values():
            v[blk].fill_(7)
    assert w.wait_for_background(timeout=10.0)
    assert _keys_hit(model_dir, daemon, b.prompt_token_ids) == 2
    views_c, kvc_c = kv_views(KVCacheLayout.BHLNC, seed=11)
    cfg_c = make_config(model_dir, daemon.socket, secret=SECRET)
    sched_c, w_c = scheduler(cfg_c, kvc_c), worker(cfg_c, kvc_c, views_c)
    req = request(b.prompt_token_ids[:33])
    sched_c.add_request(req)
    new = admit(sched_c, w_c)[req.request_id]
    assert new.num_computed_tokens == 32
    assert torch.equal(token_kv(views_c, list(new.block_ids[0]), 32).view(torch.int16),
                       want.view(torch.int16))


def _keys_hit(model_dir, d, tokens):
    with kvpool.Client(d.socket, namespace="vllm-test") as c:
        return c.lookup(_keys(model_dir, tokens)).hit_blocks


def test_a_load_failing_from_its_first_block_every_time_is_computed_not_retried(model_dir,
                                                                                 daemon):
    """kvpool has the prompt, but this worker turned itself off (its KV dtype does not match
    the scheduler's config), so every load fails from its first block. vLLM re-admits the
    request, and the connector then offers nothing: it is computed (without that, vLLM would
    look up and load again every step)."""
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    views, kvc = kv_views(KVCacheLayout.LBHNC, seed=12)
    sched = scheduler(make_config(model_dir, daemon.socket, secret=SECRET), kvc)
    w = worker(make_config(model_dir, daemon.socket, secret=SECRET, dtype="float16"), kvc, views)
    req = request(PROMPT + [1])
    sched.add_request(req)
    for _ in range(3):
        out = step(sched, w)
        new = {r.req_id: r for r in out.scheduled_new_reqs}
        if req.request_id in new:
            break
        kv_out = finish(sched, w, out)
        assert kv_out.invalid_block_ids                      # the failed load, reported
    assert new[req.request_id].num_computed_tokens == 0
    assert out.num_scheduled_tokens[req.request_id] == len(PROMPT) + 1


def test_a_load_after_a_local_prefix_hit_fills_the_blocks_after_it(model_dir, daemon):
    """With vLLM's own prefix cache holding the prompt's first block, kvpool loads blocks 1-2
    into the request's blocks 1-2 (not 0-1)."""
    init_none_hash(sha256)
    views_a, blocks_a, _ = _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    cfg.cache_config.enable_prefix_caching = True
    views, kvc = kv_views(KVCacheLayout.BLHNC, seed=13)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views)
    first = _hashed(PROMPT[:16] + [999] * 10)               # computed here: block 0 cached
    sched.add_request(first)
    admit(sched, w)
    # The blocks vLLM computed for `first` hold random KV in this test: make block 0 the
    # stored prompt's, as a forward would have.
    block0 = sched.kv_cache_manager.get_block_ids(first.request_id)[0][0]
    for name, v in views.items():
        v[block0].copy_(views_a[name][blocks_a[0]])
    req = _hashed(PROMPT + [1])
    sched.add_request(req)
    out = step(sched, w)
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert [(s.first, s.end) for s in out.kv_connector_metadata.async_loads] == [(1, 3)]
    new = admit(sched, w)[req.request_id]
    assert new.num_computed_tokens == 48
    assert new.block_ids[0][0] == block0                      # vLLM's own hit
    assert torch.equal(token_kv(views, list(new.block_ids[0]), 48).view(torch.int16),
                       token_kv(views_a, blocks_a, 48).view(torch.int16))


def _hashed(tokens):
    """A request carrying vLLM's block hasher, so its prefix cache can find it."""
    return request(tokens, block_hasher=get_request_block_hasher(BLOCK, sha256))


def test_preempted_resumed_from_kvpool_and_finished_requests_end_cleanly(model_dir, daemon):
    """Two requests in a cache too small for both: one is preempted after its saves are done,
    comes back through an asynchronous load of all its full blocks (so hands out no new save),
    and both run to their end. Every block comes back and nothing is reported that vLLM does
    not wait for (its scheduler asserts on that)."""
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    views, kvc = kv_views(KVCacheLayout.LHBNC, seed=14, num_blocks=8)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views)
    a = request(PROMPT, max_tokens=30)
    b = request([(t * 13) % 997 + 5 for t in range(40)], max_tokens=36)
    sched.add_request(a)
    sched.add_request(b)
    preempted, reloaded = set(), set()
    for _ in range(150):
        out = step(sched, w)
        preempted |= out.preempted_req_ids or set()
        reloaded |= {s.req_id for s in out.kv_connector_metadata.async_loads}
        finish(sched, w, out)
        if not sched.requests:
            break
    assert preempted and preempted <= reloaded
    assert not sched.requests
    finish(sched, w, step(sched, w))                        # their ends reach the worker
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 7


def test_sliding_window_and_pipeline_stages_turn_the_connector_off(model_dir, daemon):
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    swa = kv_config()
    swa.kv_cache_groups[0] = KVCacheGroupSpec(
        swa.kv_cache_groups[0].layer_names,
        SlidingWindowSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.bfloat16,
                          sliding_window=32))
    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, swa)
    assert c.get_num_new_matched_tokens(request(PROMPT + [1]), 0) == (0, False)
    # Stage 0 of 2 holds layer 0: blocks of a one-layer layout, which stage 1 (layer 1) would
    # compute too. They are there, and still not used.
    cfg.parallel_config.pipeline_parallel_size = 2
    stage = kvpool.vllm.layout_for(model_dir, torch.bfloat16, 1, 2, 16, BLOCK)
    keys = kvpool.hash_chain(PROMPT[:48], secret=SECRET, layout=stage, tokens_per_block=BLOCK)
    with kvpool.Client(daemon.socket, namespace="vllm-test") as client:
        assert client.put(keys, [bytes(1 * 2 * BLOCK * 2 * 16 * 2)] * 3).all_ok()
    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    assert c.get_num_new_matched_tokens(request(PROMPT + [1]), 0) == (0, False)


def test_kv_layers_beyond_the_models_turn_the_scheduler_side_off_too(model_dir, daemon):
    # E.g. a draft model's layers in the KV cache group: the worker turns itself off when they
    # are registered, so the scheduler must not offer hits its loads would all fail.
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    assert _matched(model_dir, daemon, PROMPT + [1]) == (48, True)
    extra = kv_config()
    extra.kv_cache_groups[0].layer_names.append("model.layers.99.self_attn.attn")
    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, extra)
    assert c._disabled and "KV layers" in c._disabled
    assert c.get_num_new_matched_tokens(request(PROMPT + [1]), 0) == (0, False)


@pytest.mark.parametrize("field", ["decode_context_parallel_size",
                                   "prefill_context_parallel_size"])
def test_context_parallelism_turns_the_connector_off(model_dir, daemon, field):
    """A context-parallel rank's block interleaves the tokens of dcp x pcp blocks: its KV is not
    the tokens a key names, so nothing is looked up or stored."""
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    assert hasattr(cfg.parallel_config, field)
    setattr(cfg.parallel_config, field, 2)
    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    assert c.get_num_new_matched_tokens(request(PROMPT + [1]), 0) == (0, False)


def test_a_failed_synchronous_load_stores_none_of_its_steps_blocks(model_dir, daemon, caplog):
    """A synchronous load that fails part way leaves the blocks after the failure as they were,
    and the step's forward computes the blocks after them from those: none of what the step
    computed may be stored (vLLM recomputes the request from the failed block)."""
    long_prompt = PROMPT[:48] + [(i * 31 + 5) % 991 + 2 for i in range(33)]   # 5 blocks + 1
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)                   # blocks 0-2
    assert _keys_hit(model_dir, daemon, long_prompt[:80]) == 3
    cfg = make_config(model_dir, daemon.socket, secret=SECRET, load_async=False,
                      save_async=False)
    views, kvc = kv_views(KVCacheLayout.LHBNC, seed=21)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views)
    w._load_span = lambda span, link: (1, 0)   # blocks 1-2 failed (e.g. evicted since the lookup)
    req = request(long_prompt)
    sched.add_request(req)
    out = sched.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 48   # blocks 0-2 to load
    with caplog.at_level(logging.WARNING, logger="kvpool.vllm"):
        forward(w, out)
    blocks = list(out.scheduled_new_reqs[0].block_ids[0])
    assert w.get_block_ids_with_load_errors() == set(blocks[1:3])
    assert _keys_hit(model_dir, daemon, long_prompt[:80]) == 3, "blocks 3-4 were stored"
    assert any("its saves are skipped" in r.getMessage() for r in caplog.records)


def test_load_async_false_with_tensor_parallelism_loads_asynchronously(model_dir, daemon):
    """A rank's failed synchronous load would reach every rank through the forward."""
    cfg = make_config(model_dir, daemon.socket, secret=SECRET, load_async=False, tp_size=2)
    assert kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())._load_async
    cfg = make_config(model_dir, daemon.socket, secret=SECRET, load_async=False)
    assert not kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER,
                                           kv_config())._load_async


def test_a_failing_load_policy_is_made_recompute(model_dir, daemon):
    """vLLM's default kv_load_failure_policy fails a request whose load failed; the connector
    makes it recompute, so a block evicted between lookup and load never fails a request."""
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    cfg.kv_transfer_config.kv_load_failure_policy = "fail"
    kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    assert cfg.kv_transfer_config.kv_load_failure_policy == "recompute"


def test_the_default_model_id_names_quantization_overrides_and_dummy_weights():
    class Model:
        model, revision, quantization, hf_overrides = "org/m", None, None, None
    plain = kvpool.vllm._default_model_id(Model())
    Model.quantization = "fp8"
    quantized = kvpool.vllm._default_model_id(Model())
    Model.hf_overrides = {"rope_scaling": {"factor": 4.0}}
    overridden = kvpool.vllm._default_model_id(Model())
    assert plain == "org/m"
    assert len({plain, quantized, overridden}) == 3
    # Random weights (a benchmark instance) never share the real weights' keys.
    Model.hf_overrides = None
    assert kvpool.vllm._default_model_id(Model(), "dummy") == "org/m+quantization=fp8" \
        "+load_format=dummy"
    assert kvpool.vllm._default_model_id(Model(), "safetensors") == "org/m+quantization=fp8"
    Model.hf_overrides = lambda config: config   # a function: no stable name
    assert kvpool.vllm._default_model_id(Model()) is None


def test_the_connector_is_a_best_effort_cache_to_vllms_scheduler(model_dir, daemon):
    # A preempted request's output is kept (vLLM drops it only for connectors whose saves must
    # be delivered; a kvpool save that does not happen is a later miss).
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    sched = scheduler(cfg, kv_config())
    assert sched.connector.requires_kv_delivery is False
    assert sched.requires_kv_delivery is False


def test_a_tensor_parallel_worker_without_a_rank_turns_the_connector_off(model_dir, daemon):
    # Keyed as rank 0, it would store its heads under rank 0's keys and load rank 0's heads.
    cfg = make_config(model_dir, daemon.socket, secret=SECRET, tp_size=2)
    views, kvc = kv_views(KVCacheLayout.LHBNC, seed=2)
    w = worker(cfg, kvc, views, tp_rank=None)
    assert w._disabled and "rank" in w._disabled
    one = worker(make_config(model_dir, daemon.socket, secret=SECRET), kvc, views, tp_rank=None)
    assert one._disabled is None   # a single rank is rank 0


def test_two_tensor_parallel_ranks_store_and_load_their_own_shards(model_dir, daemon):
    """Each rank stores its KV heads under its own layout (tp_rank in the layout string); the
    scheduler offers only what every rank has; vLLM's KVOutputAggregator reports a load done
    once both ranks did theirs, and each rank's shard comes back byte for byte."""
    cfg = make_config(model_dir, daemon.socket, secret=SECRET, tp_size=2)
    heads = KV_HEADS // 2

    def instance(layout, seed):
        shards = [kv_views(layout, seed=seed + r, kv_heads=heads) for r in (0, 1)]
        sched = scheduler(cfg, shards[0][1])
        workers = [worker(cfg, kvc, views, tp_rank=r) for r, (views, kvc) in enumerate(shards)]
        return sched, workers, [views for views, _ in shards]

    def run_step(sched, workers, agg):
        out = sched.schedule()
        for w in workers:
            forward(w, out)
        ids = list(out.num_scheduled_tokens)
        sampled = [[1] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens
                   else [] for r in ids]
        outputs = []
        for w in workers:
            res = w.get_transfer_results(out.finished_req_ids)
            outputs.append(ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=sampled,
                kv_connector_output=KVConnectorOutput(
                    finished_recving=res.finished_recving or None,
                    finished_sending=res.finished_sending or None,
                    invalid_block_ids=w.get_block_ids_with_load_errors())))
        sched.update_from_output(out, agg.aggregate(outputs))
        return out

    sched, workers, views_a = instance(KVCacheLayout.LBHNC, seed=31)
    assert [w.layout for w in workers] == [
        kvpool.vllm.layout_for(model_dir, torch.bfloat16, LAYERS, heads, HEAD_DIM, BLOCK, r, 2)
        for r in (0, 1)]
    agg = KVOutputAggregator(expected_finished_count=2)
    req = request(PROMPT)
    sched.add_request(req)
    out = run_step(sched, workers, agg)
    blocks_a = list(out.scheduled_new_reqs[0].block_ids[0])
    with kvpool.Client(daemon.socket, namespace="vllm-test") as c:
        rank_keys = [kvpool.hash_chain(PROMPT, secret=SECRET, layout=w.layout,
                                       tokens_per_block=BLOCK) for w in workers]
        assert [c.lookup(k).hit_blocks for k in rank_keys] == [3, 3]
        assert rank_keys[0] != rank_keys[1]

    # Another instance: both ranks load in the background; the request runs once both are done.
    sched, workers, views_b = instance(KVCacheLayout.BHLNC, seed=41)
    agg = KVOutputAggregator(expected_finished_count=2)
    req = request(PROMPT + [1])
    sched.add_request(req)
    new = {}
    for _ in range(10):
        out = run_step(sched, workers, agg)
        new.update({r.req_id: r for r in out.scheduled_new_reqs})
        if req.request_id in new:
            break
    assert new[req.request_id].num_computed_tokens == 48
    blocks_b = list(new[req.request_id].block_ids[0])
    for r in (0, 1):
        assert torch.equal(token_kv(views_b[r], blocks_b, 48).view(torch.int16),
                           token_kv(views_a[r], blocks_a, 48).view(torch.int16)), r

    # Rank 1 lost its last block: only the blocks both ranks have are offered.
    with kvpool.Client(daemon.socket, namespace="vllm-test") as c:
        c.evict("disk", rank_keys[1][2:])
    s = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    assert s.get_num_new_matched_tokens(request(PROMPT + [2]), 0) == (32, True)


def _loads_48_elsewhere(cfg, req, views_a, blocks_a, seed):
    """Another instance (other blocks, another layout), busy with a request of its own, admits
    `req`: its first 48 tokens load from kvpool and hold views_a's blocks_a byte for byte."""
    views_b, kvc = kv_views(KVCacheLayout.BLNHC, seed=seed)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views_b)
    sched.add_request(request([6] * 20))
    sched.add_request(req)
    new = admit(sched, w)[req.request_id]
    assert new.num_computed_tokens == 48
    assert torch.equal(token_kv(views_b, list(new.block_ids[0]), 48).view(torch.int16),
                       token_kv(views_a, blocks_a, 48).view(torch.int16))


EXTRAS = {
    "salt": ({"cache_salt": "tenant-a"}, {"cache_salt": "tenant-b"}),
    "lora": ({"lora_request": LoRARequest("adapter-a", 1, "/adapters/a")},
             {"lora_request": LoRARequest("adapter-a", 1, "/adapters/a-v2")}),
    "salt+lora": ({"cache_salt": "t", "lora_request": LoRARequest("adapter-a", 1, "/a")},
                  {"cache_salt": "t", "lora_request": LoRARequest("adapter-b", 2, "/a")}),
}


@pytest.mark.parametrize("kind", list(EXTRAS))
def test_salted_and_lora_requests_use_keys_of_their_own(model_dir, daemon, kind):
    """vLLM's cache salt keeps tenants' prefixes apart and a LoRA adapter changes the KV: such a
    request stores and finds its blocks under keys that say so, never a plain request's, nor
    another salt's or adapter's (vLLM's own prefix-cache hash extras)."""
    mine, other = EXTRAS[kind]
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    views_a, kvc = kv_views(KVCacheLayout.LBHNC, seed=21)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views_a)
    req = request(PROMPT, **mine)
    sched.add_request(req)
    out = step(sched, w)
    assert [(s.first, s.end) for s in out.kv_connector_metadata.saves] == [(0, 3)]
    blocks_a = list(out.scheduled_new_reqs[0].block_ids[0])
    assert _keys_hit(model_dir, daemon, PROMPT) == 0          # not under the plain keys

    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    assert c.get_num_new_matched_tokens(request(PROMPT + [1], **mine), 0) == (48, True)
    assert c.get_num_new_matched_tokens(request(PROMPT + [1], **other), 0) == (0, False)
    assert c.get_num_new_matched_tokens(request(PROMPT + [1]), 0) == (0, False)

    # Another instance loads them (the workers compute the same keys) byte for byte.
    _loads_48_elsewhere(cfg, request(PROMPT + [1], **mine), views_a, blocks_a, seed=22)


def _image(identifier: str, offset: int, length: int) -> MultiModalFeatureSpec:
    return MultiModalFeatureSpec(data=None, modality="image", identifier=identifier,
                                 mm_position=PlaceholderRange(offset=offset, length=length))


def test_a_multimodal_request_shares_only_the_blocks_before_its_first_image(model_dir,
                                                                            daemon):
    """An image's placeholder tokens are the same for every image: the blocks an image
    overlaps, and every block after them, are keyed with its content hash and its offset."""
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)   # the text alone, 3 blocks
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    plain = request(PROMPT + [1])
    assert c.get_num_new_matched_tokens(plain, 0) == (48, True)
    with_image = request(PROMPT + [1], mm_features=[_image("img-a", 20, 8)])   # in block 1
    assert c.get_num_new_matched_tokens(with_image, 0) == (16, True)
    late_image = request(PROMPT + [1], mm_features=[_image("img-a", 40, 4)])   # in block 2
    assert c.get_num_new_matched_tokens(late_image, 0) == (32, True)

    # Keys: equal to the plain chain before the image; from its block on, they depend on the
    # image and on where it sits.
    B = BLOCK
    keys = {}
    for name, feats in [("plain", []), ("a@20", [_image("img-a", 20, 8)]),
                        ("b@20", [_image("img-b", 20, 8)]), ("a@18", [_image("img-a", 18, 8)]),
                        ("a@20 again", [_image("img-a", 20, 8)])]:
        r = request(PROMPT, mm_features=feats)
        keys[name] = c._keys(PROMPT, c.layout, kvpool.vllm._key_context(r, len(PROMPT) // B, B))
    assert keys["plain"] == _keys(model_dir, PROMPT)
    assert keys["a@20"][0] == keys["plain"][0]
    for other in ("plain", "b@20", "a@18"):
        assert all(x != y for x, y in zip(keys["a@20"][1:], keys[other][1:])), other
    assert keys["a@20 again"] == keys["a@20"]


def _embeds(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, 8, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.bfloat16)


def test_a_request_with_prompt_embeddings_is_keyed_by_them(model_dir, daemon):
    """Its KV depends on the embeddings, not on token ids (vLLM gives 0 for each): each block's
    key hashes its own rows of them, so the same embeddings find the blocks, and a change in a
    block misses it and every block after it."""
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    views_a, kvc = kv_views(KVCacheLayout.LBHNC, seed=23)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views_a)
    embeds = _embeds(len(PROMPT), seed=5)
    req = request(None, prompt_embeds=embeds)
    sched.add_request(req)
    out = step(sched, w)
    assert [(s.first, s.end) for s in out.kv_connector_metadata.saves] == [(0, 3)]
    blocks_a = list(out.scheduled_new_reqs[0].block_ids[0])
    assert _keys_hit(model_dir, daemon, [0] * len(PROMPT)) == 0   # not under token ids 0

    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    more = torch.cat([embeds, _embeds(1, seed=6)])
    assert c.get_num_new_matched_tokens(request(None, prompt_embeds=more), 0) == (48, True)
    changed = more.clone()
    changed[20, 3] += 1                                            # a row of block 1
    assert c.get_num_new_matched_tokens(request(None, prompt_embeds=changed), 0) == (16, True)
    assert c.get_num_new_matched_tokens(request(None, prompt_embeds=more.float()), 0) == \
        (0, False)                                                 # other bytes, other keys
    assert c.get_num_new_matched_tokens(request([0] * len(more)), 0) == (0, False)

    # Another instance loads them (the workers compute the same keys) byte for byte.
    _loads_48_elsewhere(cfg, request(None, prompt_embeds=more), views_a, blocks_a, seed=24)


def test_a_prompt_mixing_token_ids_and_embeddings_keys_which_rows_are_which(model_dir, daemon):
    """vLLM zeroes the token id where an embedding stands: the keys say which positions are
    token ids, so a token 0 and an embedding at the same place never share a key."""
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    tokens = list(PROMPT)
    tokens[20] = 0
    embeds = _embeds(len(PROMPT), seed=7)
    mask = [True] * len(PROMPT)
    B = BLOCK

    def keys(is_token):
        r = request(tokens, prompt_embeds=embeds, prompt_is_token_ids=is_token)
        assert kvpool.vllm._prompt_tokens(r) == [t if k else 0 for t, k in zip(tokens, is_token)]
        return c._keys(kvpool.vllm._prompt_tokens(r), c.layout,
                       kvpool.vllm._key_context(r, len(PROMPT) // B, B))

    all_tokens = keys(mask)
    one_embedded = keys([i != 20 for i in range(len(PROMPT))])
    assert one_embedded[0] == all_tokens[0]
    assert all(x != y for x, y in zip(one_embedded[1:], all_tokens[1:]))
    assert keys([i != 20 for i in range(len(PROMPT))]) == one_embedded


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not kvpool.kernels.built_with_cuda,
                    reason="no CUDA device, or kvpool built without CUDA")
@pytest.mark.parametrize("background", [True, False], ids=["async", "sync"])
def test_store_then_load_in_gpu_memory(model_dir, daemon, background):
    """The paged KV in CUDA memory: staging on the device, get_into/put of CUDA tensors and,
    in the background, the loader's and saver's own streams behind events on vLLM's."""
    views_a, blocks_a, _ = _store(model_dir, daemon, KVCacheLayout.LHBNC, PROMPT, device="cuda",
                                  save_async=background)
    _expect_loaded_in_gpu_memory(model_dir, daemon, views_a, blocks_a, seed=16,
                                 load_async=background, save_async=background)


def _expect_loaded_in_gpu_memory(model_dir, d, views_a, blocks_a, seed, **cfg_kw):
    """Another instance, its paged KV in CUDA memory in another layout, loads PROMPT's 3 stored
    blocks: the same bytes per token as in views_a's blocks_a."""
    cfg = make_config(model_dir, d.socket, secret=SECRET, **cfg_kw)
    views_b, kvc = kv_views(KVCacheLayout.BLNHC, seed=seed, device="cuda")
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views_b)
    req = request(PROMPT + [1])
    sched.add_request(req)
    new = admit(sched, w)[req.request_id]
    assert new.num_computed_tokens == 48
    assert torch.equal(token_kv(views_b, list(new.block_ids[0]), 48).cpu().view(torch.int16),
                       token_kv(views_a, blocks_a, 48).cpu().view(torch.int16))


def test_saves_ask_for_the_gpu_tier_only_from_device_memory_it_serves(daemon):
    """gpu_tier_device, what a save passes as put's gpu_device: never for host memory, and for
    device memory only where the daemon runs a gpu tier on that GPU (this one runs none)."""
    from types import SimpleNamespace
    from kvpool._transfer import gpu_tier_device
    client = kvpool.Client(daemon.socket, namespace="vllm-test")
    try:
        assert gpu_tier_device(client, torch.zeros(4)) is None
        on_gpu = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
        assert gpu_tier_device(client, on_gpu) is None
    finally:
        client.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not kvpool.kernels.built_with_cuda,
                    reason="no CUDA device, or kvpool built without CUDA (no gpu tier)")
@pytest.mark.parametrize("to_gpu", [True, False], ids=["gpu-tier", "host"])
def test_saves_go_device_to_device_into_a_gpu_tier_and_load_from_it(model_dir, to_gpu):
    """With kvpoold running a gpu tier on the KV cache's GPU, saves land in it (save_to_gpu,
    the default) and the next instance's load reads them from there; with save_to_gpu false
    they land in host. Either way the bytes are the ones saved."""
    flags = ["--gpu_devices=0", "--gpu_capacity=256MiB", "--gpu_segment_size=64MiB"]
    with Daemon(flags=flags) as d:
        views_a, blocks_a, _ = _store(model_dir, d, KVCacheLayout.LHBNC, PROMPT, device="cuda",
                                      save_to_gpu=to_gpu, save_async=False)
        client = kvpool.Client(d.socket, namespace="vllm-test")
        try:
            assert client.gpu_tier(torch.cuda.current_device()) is not None
            saver = kvpool.vllm.KvpoolConnector(make_config(model_dir, d.socket, secret=SECRET),
                                                KVConnectorRole.SCHEDULER, kv_config())
            keys = saver._keys(PROMPT)
            found = client.lookup(keys, prefetch=False)
            assert found.hit_blocks == 3
            assert found.tiers == (["gpu"] * 3 if to_gpu else ["host"] * 3)
        finally:
            client.close()
        _expect_loaded_in_gpu_memory(model_dir, d, views_a, blocks_a, seed=19)


def test_connector_stats_count_lookups_loads_and_stores(model_dir, daemon):
    """What vLLM gathers each step (get_kv_connector_stats on the scheduler and every worker,
    summed through build_kv_connector_stats / aggregate) and logs (reduce)."""
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    views_a, kvc = kv_views(KVCacheLayout.LBHNC, seed=17)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views_a)
    sched.add_request(request(PROMPT))
    finish(sched, w, step(sched, w))
    stored = w.get_kv_connector_stats()
    assert stored.reduce()["blocks_stored"] == 3 and stored.reduce()["stores"] == 1
    assert w.get_kv_connector_stats() is None                 # counted once

    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    assert c.get_num_new_matched_tokens(request(PROMPT + [1]), 0) == (48, True)
    looked_stats = c.get_kv_connector_stats()                 # (vLLM's scheduler asks itself)
    looked = looked_stats.reduce()
    assert looked["lookups"] == 1 and looked["hit_tokens"] == 48
    views_b, kvc_b = kv_views(KVCacheLayout.BHLNC, seed=18)
    sched_b, w_b = scheduler(cfg, kvc_b), worker(cfg, kvc_b, views_b)
    req = request(PROMPT + [1])
    sched_b.add_request(req)
    assert admit(sched_b, w_b)[req.request_id].num_computed_tokens == 48
    loaded = w_b.get_kv_connector_stats()
    assert loaded.reduce()["blocks_loaded"] == 3 and loaded.reduce()["blocks_load_failed"] == 0
    assert loaded.reduce()["bytes_loaded"] == 3 * w_b.block_bytes
    total = kvpool.vllm.KvpoolConnector.build_kv_connector_stats(stored.data).aggregate(loaded)
    assert total.reduce()["blocks_stored"] == 3 and total.reduce()["blocks_loaded"] == 3
    assert total.reduce()["load_GBps"] > 0
    # And as Prometheus counters on vLLM's /metrics (its KVConnectorProm builds them through
    # build_prom_metrics and observes each interval's sums).
    registry = prometheus_client.CollectorRegistry()
    types = {k: functools.partial(k, registry=registry)
             for k in (prometheus_client.Counter, prometheus_client.Gauge,
                       prometheus_client.Histogram)}
    prom = kvpool.vllm.KvpoolConnector.build_prom_metrics(cfg, types, ["model_name", "engine"],
                                                          {0: ["m", "0"], 1: ["m", "1"]})
    prom.observe(total.to_dict(), engine_idx=1)
    prom.observe(looked_stats.to_dict(), engine_idx=1)

    def sample(name, engine="1"):
        return registry.get_sample_value(f"vllm:kvpool_{name}_total",
                                         {"model_name": "m", "engine": engine})

    assert sample("blocks_stored") == 3 and sample("blocks_loaded") == 3
    assert sample("bytes_loaded") == 3 * w_b.block_bytes and sample("lookups") == 1
    assert sample("hit_tokens") == 48 and sample("blocks_load_failed") == 0
    assert sample("blocks_loaded", engine="0") == 0


def test_blocks_decoded_from_lossy_copies_are_counted(model_dir, tmp_path):
    """A namespace whose policy keeps int8 disk copies serves approximate KV once its blocks
    left host: loaded (as its operator chose), and counted in blocks_loaded_lossy."""
    ns = tmp_path / "namespaces.yaml"
    ns.write_text("namespaces:\n  lossy-ns:\n    encoding: int8\n    lossy: true\n"
                  f"    layout: {{layers: {LAYERS}, kv_heads: {KV_HEADS}, head_dim: {HEAD_DIM}, "
                  f"tokens: {BLOCK}, dtype: bf16}}\n")
    with Daemon([f"--namespaces_file={ns}"]) as d:
        views_a, blocks_a, _ = _store(model_dir, d, KVCacheLayout.LBHNC, PROMPT, seed=31,
                                      namespace="lossy-ns")
        keys = _keys(model_dir, PROMPT[:48])
        with kvpool.Client(d.socket, namespace="lossy-ns") as c:
            assert c.evict("host", keys)["evicted"] == 3     # on disk as int8 only
        cfg = make_config(model_dir, d.socket, secret=SECRET, namespace="lossy-ns")
        views_b, kvc = kv_views(KVCacheLayout.BHLNC, seed=32)
        sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views_b)
        req = request(PROMPT + [1])
        sched.add_request(req)
        new = admit(sched, w)
        assert new[req.request_id].num_computed_tokens == 48
        stats = w.get_kv_connector_stats().reduce()
        assert stats["blocks_loaded"] == 3 and stats["blocks_loaded_lossy"] == 3
        blocks_b = list(new[req.request_id].block_ids[0])
        got = token_kv(views_b, blocks_b, 48).float()
        want = token_kv(views_a, blocks_a, 48).float()
        assert not torch.equal(got, want)                    # approximate...
        assert torch.allclose(got, want, rtol=0.05, atol=0.05 * want.abs().max().item())

