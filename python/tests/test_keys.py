"""Block keys: spec/block-keys.md's known-answer vectors, byte for byte."""

import json
import pathlib

import numpy as np
import pytest

import kvpool

VECTORS = json.loads((pathlib.Path(__file__).resolve().parents[2] /
                      "common/testdata/block_key_vectors.json").read_text())["cases"]


@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_known_answer_vectors(case):
    keys = kvpool.hash_chain(case["tokens"], secret=case["namespace_secret"],
                             layout=case["layout"], tokens_per_block=case["tokens_per_block"])
    assert [k.hex() for k in keys] == case["keys_hex"]
    assert all(isinstance(k, bytes) and len(k) == 32 for k in keys)
    assert kvpool.namespace_salt(case["namespace_secret"]).hex() == case["namespace_salt_hex"]
    assert kvpool.layout_fingerprint(case["layout"]).hex() == case["layout_fingerprint_hex"]


@pytest.mark.parametrize("case", VECTORS, ids=[c["name"] for c in VECTORS])
def test_vectors_from_arrays_and_bytes_secret(case):
    args = dict(secret=case["namespace_secret"].encode(), layout=case["layout"],
                tokens_per_block=case["tokens_per_block"])
    for arr in (np.array(case["tokens"], dtype=np.int32), np.array(case["tokens"], dtype=np.int64)):
        assert [k.hex() for k in kvpool.hash_chain(arr, **args)] == case["keys_hex"]


def test_layout_string_is_the_vectors_layout():
    assert kvpool.layout_string("llama-3-8b", "bf16", 32, 8, 128) == VECTORS[0]["layout"]
    assert (kvpool.layout_string("llama-3-8b", "bf16", 32, 8, 128, encoding="int8")
            == VECTORS[4]["layout"])


def test_parent_continues_a_chain():
    case = VECTORS[0]
    args = dict(secret=case["namespace_secret"], layout=case["layout"], tokens_per_block=16)
    whole = kvpool.hash_chain(case["tokens"], **args)
    head = kvpool.hash_chain(case["tokens"][:16], **args)
    tail = kvpool.hash_chain(case["tokens"][16:], parent=head[-1], **args)
    assert head + tail == whole


def test_bad_tokens_and_arguments():
    with pytest.raises(kvpool.InvalidArgument):
        kvpool.hash_chain([2**31], secret="", layout="x", tokens_per_block=1)
    with pytest.raises(kvpool.InvalidArgument):
        kvpool.hash_chain(np.array([2**40], dtype=np.int64), secret="", layout="x",
                          tokens_per_block=1)
    with pytest.raises(TypeError):
        kvpool.hash_chain(["a"], secret="", layout="x", tokens_per_block=1)
    with pytest.raises(kvpool.InvalidArgument):
        kvpool.hash_chain([1.5] and np.array([1.5]), secret="", layout="x", tokens_per_block=1)
    with pytest.raises(kvpool.InvalidArgument):
        kvpool.hash_chain([1, 2], secret="", layout="x", tokens_per_block=0)
    with pytest.raises(kvpool.InvalidArgument):
        kvpool.hash_chain([1, 2], secret="", layout="x", tokens_per_block=1, parent=b"short")
    # The error hierarchy: every class is a kvpool.Error carrying code and message.
    try:
        kvpool.hash_chain([1], secret="", layout="x", tokens_per_block=0)
    except kvpool.Error as e:
        assert isinstance(e, kvpool.InvalidArgument)
        assert e.code == "InvalidArgument" and "tokens_per_block" in e.message
