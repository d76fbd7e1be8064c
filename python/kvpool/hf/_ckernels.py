"""A minimal ctypes binding of the compression calls of kvpool's kernel C API
(include/kvpool/kernels.h), for kvpool.hf.compress when the compiled extension (kvpool._native)
is not installed. CPU only: every call passes exec = NULL (KVPOOL_DEVICE_CPU).

The library is the one $KVPOOL_KERNELS_LIB names: a shared build of kvpool_kernels, e.g.

    cmake -S . -B build-k -DKVPOOL_KERNELS_ONLY=ON -DKVPOOL_WITH_CUDA=OFF -G Ninja
    cmake --build build-k --target kvpool_kernels
    g++ -shared -o build-k/libkvpool_kernels_c.so -Wl,--whole-archive \\
        build-k/kernels/libkvpool_kernels.a -Wl,--no-whole-archive build-k/common/libkvpool_status.a

Tensors are torch tensors (contiguous, on the CPU); their data pointers go straight to C.
A non-zero return raises RuntimeError with kvpool_kernel_last_error().
"""

from __future__ import annotations

import ctypes
import os

_I32 = ctypes.c_int32


class _Params(ctypes.Structure):
    _fields_ = [(n, _I32) for n in ("method", "window_size", "max_capacity_prompt",
                                    "kernel_size", "pooling", "sink_size", "beta")]


class _Shape(ctypes.Structure):
    _fields_ = [(n, _I32) for n in ("num_layers", "seq_len", "num_q_heads", "num_kv_heads",
                                    "head_dim", "dtype")]


def _ptr(t):
    if t is None:
        return None
    if not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("tensors passed to the kernels must be contiguous CPU tensors")
    return ctypes.c_void_p(t.data_ptr())


class CKernels:
    def __init__(self, path: str) -> None:
        self._lib = ctypes.CDLL(path)
        self._lib.kvpool_kernel_last_error.restype = ctypes.c_char_p
        for name in ("kvpool_kernel_compress_sizes", "kvpool_kernel_compute_scores",
                     "kvpool_kernel_select_tokens", "kvpool_kernel_compact_kv"):
            getattr(self._lib, name).restype = ctypes.c_int

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self._lib.kvpool_kernel_last_error().decode()
            raise RuntimeError(f"{what}: code {rc}: {msg}")

    def compress_sizes(self, params, shape):
        p, s = _Params(*params), _Shape(*shape)
        keep = (_I32 * max(shape[0], 0))()
        total = ctypes.c_int64()
        nq, scored = _I32(), _I32()
        self._check(self._lib.kvpool_kernel_compress_sizes(
            ctypes.byref(p), ctypes.byref(s), keep, ctypes.byref(total), ctypes.byref(nq),
            ctypes.byref(scored)), "compress_sizes")
        return list(keep), total.value, nq.value, scored.value

    def compute_scores(self, params, shape, q, kv, scores) -> None:
        p, s = _Params(*params), _Shape(*shape)
        self._check(self._lib.kvpool_kernel_compute_scores(
            None, ctypes.byref(p), ctypes.byref(s), _ptr(q), _ptr(kv), _ptr(scores)),
            "compute_scores")

    def select_tokens(self, params, shape, scores, indices) -> None:
        p, s = _Params(*params), _Shape(*shape)
        self._check(self._lib.kvpool_kernel_select_tokens(
            None, ctypes.byref(p), ctypes.byref(s), _ptr(scores), _ptr(indices)), "select_tokens")

    def compact_kv(self, shape, keep, indices, kv, out) -> None:
        s = _Shape(*shape)
        keep_arr = (_I32 * len(keep))(*keep)
        self._check(self._lib.kvpool_kernel_compact_kv(
            None, ctypes.byref(s), keep_arr, _ptr(indices), _ptr(kv), _ptr(out)), "compact_kv")


def load() -> CKernels:
    path = os.environ.get("KVPOOL_KERNELS_LIB")
    if not path:
        raise ImportError("kvpool._native has no kernel_* functions and $KVPOOL_KERNELS_LIB "
                          "names no shared kvpool_kernels library")
    return CKernels(path)
