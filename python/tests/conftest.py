"""Fixtures for kvpool's Python tests: a real kvpoold child (kvpool.testing.Daemon) and clients
over each data path. The daemon binary is $KVPOOL_KVPOOLD (CTest sets it), else kvpoold on PATH,
else the repository's build/daemon/kvpoold."""

from __future__ import annotations

import os
import pathlib

import pytest

import kvpool
from kvpool.testing import Daemon

REPO = pathlib.Path(__file__).resolve().parents[2]

if "KVPOOL_KVPOOLD" not in os.environ and (REPO / "build/daemon/kvpoold").exists():
    os.environ["KVPOOL_KVPOOLD"] = str(REPO / "build/daemon/kvpoold")


@pytest.fixture(scope="module")
def daemon():
    """One daemon shared by a module's tests (each test uses its own namespace secret / keys)."""
    with Daemon() as d:
        yield d


@pytest.fixture
def own_daemon():
    """A daemon of this test alone (for tests that stop, kill or restart it)."""
    with Daemon() as d:
        yield d


@pytest.fixture(params=["socket", "shm"])
def client(request, daemon):
    with kvpool.Client(daemon.socket, namespace="test", data_path=request.param) as c:
        yield c


_counter = [0]


@pytest.fixture
def make_keys(request):
    """make_keys(n) -> n keys of a chain no other test uses."""

    def make(n: int, tokens_per_block: int = 16) -> list[bytes]:
        _counter[0] += 1
        tokens = list(range(n * tokens_per_block))
        return kvpool.hash_chain(tokens, secret=f"{request.node.nodeid}-{_counter[0]}",
                                 layout="model=test;dtype=bf16", tokens_per_block=tokens_per_block)

    return make
