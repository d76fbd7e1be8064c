"""Fixtures of kvpool.sglang's tests: SGLang's real HiCacheStorageConfig and HiCacheStorage base
class, a host pool over a CPU torch tensor, and a real kvpoold (the parent conftest's daemon and
own_daemon fixtures)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.hicache_storage")
