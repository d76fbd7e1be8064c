"""kvpool.vllm against a real kvpoold and vLLM 0.33's own Scheduler, Request, config and KV view
classes on the CPU. The model does not run (no GPU): the KV "computed" by a forward is the
random content of the paged buffers, and what is checked is that the bytes of each token go
through kvpool unchanged into another instance's different blocks and physical layout."""

from __future__ import annotations

import logging

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import ModelRunnerOutput

import kvpool
import kvpool.vllm
from vllm_env import (BLOCK, SECRET, kv_config, kv_views, make_config, request, scheduler, step, token_kv,
                      worker)

LAYOUTS = list(KVCacheLayout)
PROMPT = [(i * 7919 + 13) % 997 + 3 for i in range(50)]   # 3 full blocks + 2 tokens


def _store(model_dir, d, layout, tokens, seed=1, **cfg_kw):
    """A vLLM instance whose forward "computed" `tokens`: one step stores their full blocks.
    Returns (views, block ids of the request, scheduler output)."""
    cfg = make_config(model_dir, d.socket, secret=SECRET, **cfg_kw)
    views, kvc = kv_views(layout, seed=seed)
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


@pytest.mark.parametrize("src", LAYOUTS, ids=[lay.name for lay in LAYOUTS])
def test_store_then_load_into_other_blocks_and_layout(model_dir, daemon, src):
    dst = LAYOUTS[(LAYOUTS.index(src) + 3) % len(LAYOUTS)]
    views_a, blocks_a, _ = _store(model_dir, daemon, src, PROMPT, seed=1)

    # A second instance: other random KV, another physical order, and a filler request first
    # so the prompt lands in other blocks; its prompt extends the stored one.
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
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
    blocks_b = list(new[req.request_id].block_ids[0])
    assert new[req.request_id].num_computed_tokens == 48      # the stored full blocks
    assert out.num_scheduled_tokens[req.request_id] == len(prompt_b) - 48
    assert new[filler.request_id].num_computed_tokens == 0
    assert blocks_b[:3] != blocks_a[:3]
    assert w.get_block_ids_with_load_errors() == set()
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
        out = step(sched, w)
        new = {r.req_id: r for r in out.scheduled_new_reqs}[req.request_id]
        assert new.num_computed_tokens == 48
        assert torch.equal(token_kv(views, list(new.block_ids[0]), 48).view(torch.int16),
                           token_kv(views_a, blocks_a, 48).view(torch.int16))


def test_chunked_prefill_saves_each_chunks_full_blocks(model_dir, daemon):
    """A 50-token prompt prefilled in chunks of 32 tokens: the first step stores 2 blocks, the
    second (a cached request in vLLM's SchedulerOutput) the third; decode KV is not stored."""
    cfg = make_config(model_dir, daemon.socket, secret=SECRET, max_batched_tokens=32)
    views_a, kvc = kv_views(KVCacheLayout.BHLNC, seed=7)
    sched, w = scheduler(cfg, kvc), worker(cfg, kvc, views_a)
    req = request(PROMPT, max_tokens=3)
    sched.add_request(req)
    rid = req.request_id
    out = step(sched, w)
    assert out.num_scheduled_tokens[rid] == 32
    blocks_a = list(out.scheduled_new_reqs[0].block_ids[0])
    assert _matched(model_dir, daemon, PROMPT + [1]) == (32, False)
    sched.update_from_output(out, ModelRunnerOutput(req_ids=[rid], req_id_to_index={rid: 0},
                                                    sampled_token_ids=[[]]))
    out = step(sched, w)
    assert out.num_scheduled_tokens[rid] == 18 and not out.scheduled_new_reqs
    for ids in out.scheduled_cached_reqs.new_block_ids:
        blocks_a += list(ids[0]) if ids else []
    assert _matched(model_dir, daemon, PROMPT + [1]) == (48, False)
    sched.update_from_output(out, ModelRunnerOutput(req_ids=[rid], req_id_to_index={rid: 0},
                                                    sampled_token_ids=[[PROMPT[0]]]))
    step(sched, w)                                           # a decode step: nothing stored
    assert _matched(model_dir, daemon, PROMPT + [PROMPT[0]] * 20) == (48, False)

    views_b, kvc_b = kv_views(KVCacheLayout.LBNHC, seed=8)
    sched, w = scheduler(make_config(model_dir, daemon.socket, secret=SECRET), kvc_b), \
        worker(cfg, kvc_b, views_b)
    req = request(PROMPT + [1])
    sched.add_request(req)
    new = step(sched, w).scheduled_new_reqs[0]
    assert new.num_computed_tokens == 48
    assert torch.equal(token_kv(views_b, list(new.block_ids[0]), 48).view(torch.int16),
                       token_kv(views_a, blocks_a, 48).view(torch.int16))


def test_matched_is_block_aligned_and_less_than_the_prompt(model_dir, daemon):
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    assert _matched(model_dir, daemon, PROMPT[:48]) == (32, False)   # one token must be computed
    assert _matched(model_dir, daemon, PROMPT[:49]) == (48, False)
    assert _matched(model_dir, daemon, PROMPT + [1, 2, 3]) == (48, False)
    assert _matched(model_dir, daemon, PROMPT[:20] + [999] * 30) == (16, False)
    assert _matched(model_dir, daemon, [999] + PROMPT[1:]) == (0, False)
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
    c = kvpool.vllm.KvpoolConnector(cfg, KVConnectorRole.SCHEDULER, kv_config())
    assert c.get_num_new_matched_tokens(request(PROMPT), 16) == (32, False)
    assert c.get_num_new_matched_tokens(request(PROMPT), 48) == (0, False)


def test_keys_are_kvpools_own_over_token_ids(model_dir, daemon):
    """What vLLM stored is found by any kvpool client that computes the same layout's keys
    (kvpool.hf, SGLang): kvpool.hash_chain over the token ids, not vLLM's block hashes."""
    _store(model_dir, daemon, KVCacheLayout.LBNHC, PROMPT)
    layout = kvpool.vllm.layout_for(model_dir, torch.bfloat16, 2, 2, 16, BLOCK)
    keys = kvpool.hash_chain(PROMPT, secret=SECRET, layout=layout, tokens_per_block=BLOCK)
    with kvpool.Client(daemon.socket, namespace="vllm-test") as c:
        assert c.lookup(keys).hit_blocks == 3


@pytest.mark.parametrize("change", [{"model_id": "another/model"}, {"secret": "other"},
                                    {"namespace": "other-tenant"}, {"dtype": "float16"},
                                    {"block_size": 8}])
def test_other_model_layout_or_namespace_is_a_miss(model_dir, daemon, change):
    _store(model_dir, daemon, KVCacheLayout.LBHNC, PROMPT)
    assert _matched(model_dir, daemon, PROMPT + [7]) == (48, False)
    assert _matched(model_dir, daemon, PROMPT + [7], **change) == (0, False)


def test_daemon_killed_is_a_miss_and_a_load_error_then_recovers(model_dir, daemon, caplog):
    caplog.set_level(logging.INFO, logger="kvpool.vllm")
    views_a, blocks_a, _ = _store(model_dir, daemon, KVCacheLayout.BLHNC, PROMPT)
    cfg = make_config(model_dir, daemon.socket, secret=SECRET)
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
    w.bind_connector_metadata(out.kv_connector_metadata)
    w.start_load_kv(None)
    w.wait_for_save()
    w.clear_connector_metadata()
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
