"""kvpool's KV kernels for inference engines, on CPU buffers and CUDA tensors.

    from kvpool import kernels as K
    layout = K.BlockLayout(num_layers=32, num_kv_heads=8, head_dim=128, tokens=16, dtype="bf16")
    K.gather_paged(k_caches, v_caches, block_table, payloads, layout)   # engine pages -> blocks
    K.scatter_paged(k_caches, v_caches, block_table, payloads, layout)  # blocks -> engine pages
    enc = K.quantize(layout.with_encoding("int8"), payloads)             # and K.dequantize
    kept = K.select(K.CompressParams("snapkv", max_capacity_prompt=512), q, kv)
    small = K.compact(params, q, kv, kept)                               # per-layer [2, keep, H, D]

Buffers are anything with the buffer protocol or DLPack (numpy arrays, torch CPU or CUDA
tensors, bytearray), C-contiguous, taken without a copy. All buffers of one call are on one
device: host memory runs the CPU twins; CUDA tensors (on the current CUDA device) run the CUDA
kernels, enqueued on `stream` (an int cudaStream_t or an object with .cuda_stream; default: torch's
current stream for torch tensors, else the default stream) and not waited for. A build without
CUDA raises kvpool.Unimplemented for CUDA tensors. Shapes, sizes and dtypes are checked before a
kernel runs: a mismatch raises kvpool.InvalidArgument naming the argument.

dtype names: "fp16", "bf16", "fp32". numpy has no bfloat16: pass bf16 data as uint16 arrays
(integer buffers are accepted as raw storage; floating ones must match the dtype).
Byte layouts: include/kvpool/kernels.h and docs/KERNELS.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from kvpool import _native

__all__ = [
    "DTYPES", "ENCODINGS", "PAGED_LAYOUTS", "METHODS", "POOLINGS", "built_with_cuda",
    "BlockLayout", "CompressParams", "AttentionShape", "CompressSizes", "Selection",
    "raw_bytes", "encoded_bytes", "gather_paged", "scatter_paged", "quantize", "dequantize",
    "compress_sizes", "compute_scores", "select_tokens", "compact_kv", "select", "compact",
]

Buffer = Any

DTYPES = {"fp16": 0, "bf16": 1, "fp32": 2}
ENCODINGS = {"raw": 0, "int8": 1, "fp8_e4m3": 2, "int4_g32": 3, "int4_g64": 4}
PAGED_LAYOUTS = {"separate": 0, "kv_first": 1, "kv_interleaved": 2}
METHODS = {"streamingllm": 0, "h2o": 1, "snapkv": 2, "pyramidkv": 3}
POOLINGS = {"avg": 0, "max": 1}
_ELEM_SIZE = {"fp16": 2, "bf16": 2, "fp32": 4}

built_with_cuda: bool = _native.built_with_cuda


def _code(table: dict, name: str, what: str) -> int:
    try:
        return table[name]
    except KeyError:
        raise _native.InvalidArgument(
            f"{what} must be one of {', '.join(table)}, not {name!r}") from None


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """What a block payload holds: raw layout [layer][k|v][token][kv_head][head_dim]."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    tokens: int
    dtype: str = "bf16"
    encoding: str = "raw"

    def _native(self) -> tuple:
        return (self.num_layers, self.num_kv_heads, self.head_dim, self.tokens,
                _code(DTYPES, self.dtype, "dtype"), _code(ENCODINGS, self.encoding, "encoding"))

    @property
    def raw_bytes(self) -> int:
        """Bytes of a raw payload (0 when the layout is invalid)."""
        return _native.kernel_raw_bytes(self._native())

    @property
    def encoded_bytes(self) -> int:
        """Bytes of a block in this layout's encoding (0 when invalid)."""
        return _native.kernel_encoded_bytes(self._native())

    def with_encoding(self, encoding: str) -> "BlockLayout":
        return dataclasses.replace(self, encoding=encoding)


def raw_bytes(layout: BlockLayout) -> int:
    """Bytes of a raw payload of `layout`."""
    return layout.raw_bytes


def encoded_bytes(layout: BlockLayout) -> int:
    """Bytes of a block of `layout` in its encoding."""
    return layout.encoded_bytes


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _stream(stream: Any, ref: Any) -> int:
    if stream is None:
        if _is_torch(ref) and getattr(ref, "is_cuda", False):
            import torch  # only when the caller passed torch tensors

            return int(torch.cuda.current_stream(ref.device).cuda_stream)
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    raise TypeError(f"stream must be an int (cudaStream_t) or have .cuda_stream, not "
                    f"{type(stream).__name__}")


def _first(seq: Any) -> Any:
    try:
        return seq[0] if len(seq) else None
    except TypeError:
        return seq


def _empty(ref: Any, shape: Sequence[int], kind: str) -> Any:
    """An uninitialized array of `shape` on ref's device with the same library as `ref`:
    torch for torch tensors, numpy for numpy arrays, else a memoryview over a bytearray.
    kind: "i32", "f32", or a kvpool dtype name."""
    n = 1
    for d in shape:
        n *= int(d)
    if _is_torch(ref):
        import torch

        dt = {"i32": torch.int32, "f32": torch.float32, "fp32": torch.float32,
              "fp16": torch.float16, "bf16": torch.bfloat16}[kind]
        return torch.empty(tuple(shape), dtype=dt, device=ref.device)
    if type(ref).__module__.startswith("numpy"):
        import numpy as np

        dt = {"i32": np.int32, "f32": np.float32, "fp32": np.float32, "fp16": np.float16,
              "bf16": np.uint16}[kind]
        return np.empty(tuple(shape), dtype=dt)
    fmt, size = {"i32": ("i", 4), "f32": ("f", 4), "fp32": ("f", 4), "fp16": ("e", 2),
                 "bf16": ("H", 2)}[kind]
    mv = memoryview(bytearray(n * size)).cast(fmt)
    return mv.cast("B").cast(fmt, tuple(shape)) if len(shape) > 1 and n else mv


def gather_paged(k_layers: Sequence[Buffer], v_layers: Optional[Sequence[Buffer]],
                 block_table: Buffer | Sequence[int], payloads: Sequence[Buffer],
                 layout: BlockLayout, *, first_token: int = 0, paged_layout: str = "separate",
                 stream: Any = None) -> None:
    """Engine pages -> len(payloads) raw payloads of layout.tokens tokens each, starting at the
    sequence's token `first_token`. k_layers / v_layers: one cache tensor per layer, shaped by
    paged_layout: "separate" (vLLM) K and V [num_blocks, block_size, kv_heads, head_dim];
    "kv_first" [2, num_blocks, ...] or "kv_interleaved" (FlashInfer) [num_blocks, 2, ...] in
    k_layers with v_layers None. block_table: the sequence's page ids (int32 array on the caches'
    device, or a list of ints for CPU caches). Each payload: layout.raw_bytes, writable."""
    ref = _first(k_layers)
    _native.kernel_gather_paged(layout._native(), _code(PAGED_LAYOUTS, paged_layout,
                                                        "paged_layout"),
                                k_layers, v_layers, block_table, first_token, payloads,
                                _stream(stream, ref))


def scatter_paged(k_layers: Sequence[Buffer], v_layers: Optional[Sequence[Buffer]],
                  block_table: Buffer | Sequence[int], payloads: Sequence[Buffer],
                  layout: BlockLayout, *, first_token: int = 0, paged_layout: str = "separate",
                  stream: Any = None) -> None:
    """Raw payloads -> engine pages: the inverse of gather_paged (same arguments; the caches are
    written)."""
    ref = _first(k_layers)
    _native.kernel_scatter_paged(layout._native(), _code(PAGED_LAYOUTS, paged_layout,
                                                         "paged_layout"),
                                 k_layers, v_layers, block_table, first_token, payloads,
                                 _stream(stream, ref))


def quantize(layout: BlockLayout, raw: Sequence[Buffer],
             encoded: Optional[Sequence[Buffer]] = None, *, stream: Any = None) -> list:
    """raw[i] (layout.raw_bytes each) -> encoded[i] (layout.encoded_bytes each) in
    layout.encoding. Without `encoded`, allocates uint8 outputs like raw[0] (numpy, torch on its
    device, or bytearray) and returns them."""
    if encoded is None:
        ref = _first(raw)
        encoded = [_empty_bytes(ref, layout.encoded_bytes) for _ in raw]
    _native.kernel_quantize(layout._native(), raw, encoded, _stream(stream, _first(raw)))
    return list(encoded)


def dequantize(layout: BlockLayout, encoded: Sequence[Buffer],
               raw: Optional[Sequence[Buffer]] = None, *, stream: Any = None) -> list:
    """encoded[i] -> raw[i]. Without `raw`, allocates outputs like encoded[0] (numpy / torch
    arrays of layout.dtype elements, or bytearrays) and returns them."""
    if raw is None:
        ref = _first(encoded)
        n = layout.raw_bytes // _ELEM_SIZE.get(layout.dtype, 1)
        raw = [_empty(ref, [n], layout.dtype) if _is_array(ref)
               else bytearray(layout.raw_bytes) for _ in encoded]
    _native.kernel_dequantize(layout._native(), encoded, raw, _stream(stream, _first(encoded)))
    return list(raw)


def _is_array(x: Any) -> bool:
    return _is_torch(x) or type(x).__module__.startswith("numpy")


def _empty_bytes(ref: Any, n: int) -> Any:
    if _is_torch(ref):
        import torch

        return torch.empty(n, dtype=torch.uint8, device=ref.device)
    if type(ref).__module__.startswith("numpy"):
        import numpy as np

        return np.empty(n, dtype=np.uint8)
    return bytearray(n)


@dataclasses.dataclass(frozen=True)
class CompressParams:
    """KV-cache compression parameters (named as in KVCache-Factory). method: "streamingllm",
    "h2o", "snapkv", "pyramidkv". max_capacity_prompt: tokens kept per layer and KV head, window
    included (prompts shorter than it are kept whole). window_size: observation window (SnapKV,
    PyramidKV) / recent tokens (H2O). kernel_size, pooling ("avg" | "max"): SnapKV's pooling.
    sink_size: StreamingLLM's attention sinks. beta: PyramidKV's budget slope."""

    method: str = "snapkv"
    window_size: int = 32
    max_capacity_prompt: int = 2048
    kernel_size: int = 5
    pooling: str = "avg"
    sink_size: int = 4
    beta: int = 20

    def _native(self) -> tuple:
        return (_code(METHODS, self.method, "method"), self.window_size, self.max_capacity_prompt,
                self.kernel_size, _code(POOLINGS, self.pooling, "pooling"), self.sink_size,
                self.beta)


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """Shapes of a compression call: q [num_layers, query_tokens, num_q_heads, head_dim] and
    kv [num_layers, 2, seq_len, num_kv_heads, head_dim], elements of `dtype`."""

    num_layers: int
    seq_len: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bf16"

    def _native(self) -> tuple:
        return (self.num_layers, self.seq_len, self.num_q_heads, self.num_kv_heads,
                self.head_dim, _code(DTYPES, self.dtype, "dtype"))


@dataclasses.dataclass(frozen=True)
class CompressSizes:
    keep_counts: list  # tokens kept per KV head, per layer
    total_kept: int    # sum of keep_counts
    query_tokens: int  # queries compute_scores reads (the prompt's last ones); 0: none needed
    scored_tokens: int  # prefix positions scored per (layer, kv_head)


def compress_sizes(params: CompressParams, shape: AttentionShape) -> CompressSizes:
    """How many tokens each layer keeps, and the sizes of the scoring buffers."""
    keep, total, nq, scored = _native.kernel_compress_sizes(params._native(), shape._native())
    return CompressSizes(list(keep), total, nq, scored)


def compute_scores(params: CompressParams, shape: AttentionShape, q: Optional[Buffer],
                   kv: Buffer, scores: Optional[Buffer], *, stream: Any = None) -> None:
    """q [layers, query_tokens, q_heads, dim], kv [layers, 2, seq, kv_heads, dim] -> scores f32
    [layers, kv_heads, scored_tokens]. A no-op (q, scores may be None) when query_tokens is 0."""
    _native.kernel_compute_scores(params._native(), shape._native(), q, kv, scores,
                                  _stream(stream, kv))


def select_tokens(params: CompressParams, shape: AttentionShape, scores: Optional[Buffer],
                  indices: Buffer, *, stream: Any = None) -> None:
    """scores -> indices: int32, kv_heads * total_kept, per layer [kv_head][keep] ascending."""
    _native.kernel_select_tokens(params._native(), shape._native(), scores, indices,
                                 _stream(stream, indices))


def compact_kv(shape: AttentionShape, keep_counts: Sequence[int], indices: Buffer, kv: Buffer,
               kv_out: Buffer, *, stream: Any = None) -> None:
    """kv -> kv_out, per layer [2][keep][kv_head][head_dim], keeping the selected tokens."""
    _native.kernel_compact_kv(shape._native(), list(keep_counts), indices, kv, kv_out,
                              _stream(stream, kv))


class Selection(list):
    """select()'s result: per layer an int32 array [kv_heads, keep] of kept token positions
    (ascending), views into one flat buffer (`.flat`); `.keep_counts` per layer, `.shape` the
    AttentionShape used."""

    flat: Any
    keep_counts: list
    shape: AttentionShape


def _dtype_of(x: Any, dtype: Optional[str]) -> str:
    if dtype is not None:
        _code(DTYPES, dtype, "dtype")
        return dtype
    name = str(getattr(x, "dtype", "")).replace("torch.", "")
    found = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(name)
    if found is None:
        raise _native.InvalidArgument(
            f"cannot tell the dtype of {type(x).__name__} with dtype {name or '?'}: pass "
            f"dtype='fp16' | 'bf16' | 'fp32'")
    return found


def _shape_of(q: Any, kv: Any, dtype: Optional[str]) -> AttentionShape:
    ks = tuple(getattr(kv, "shape", ()))
    if len(ks) != 5 or ks[1] != 2:
        raise _native.InvalidArgument(
            f"kv must be shaped [layers, 2, seq_len, kv_heads, head_dim], not {list(ks)}")
    qs = tuple(getattr(q, "shape", ())) if q is not None else ()
    if q is not None and (len(qs) != 4 or qs[0] != ks[0] or qs[3] != ks[4]):
        raise _native.InvalidArgument(
            f"q must be shaped [layers, queries, q_heads, head_dim] matching kv {list(ks)}, "
            f"not {list(qs)}")
    q_heads = qs[2] if q is not None else ks[3]
    return AttentionShape(ks[0], ks[2], q_heads, ks[3], ks[4], _dtype_of(kv, dtype))


def _last_queries(q: Any, n: int) -> Any:
    if q is None or n == 0:
        return None
    if q.shape[1] == n:
        return q
    if q.shape[1] < n:
        raise _native.InvalidArgument(
            f"q holds {q.shape[1]} queries; this method scores the last {n}")
    tail = q[:, q.shape[1] - n:]
    if _is_torch(tail):
        return tail.contiguous()
    import numpy as np

    return np.ascontiguousarray(tail)


def select(params: CompressParams, q: Optional[Buffer], kv: Buffer, *,
           dtype: Optional[str] = None, stream: Any = None) -> Selection:
    """The tokens a compression method keeps: per layer an int32 array [kv_heads, keep]
    (ascending positions). q: [layers, queries, q_heads, head_dim] (the prompt's queries; only
    the last compress_sizes().query_tokens are read — pass exactly those to avoid a copy; None
    for StreamingLLM), kv: [layers, 2, seq_len, kv_heads, head_dim] (numpy arrays or torch
    tensors; dtype from kv, or `dtype` for uint16-carried bf16)."""
    shape = _shape_of(q, kv, dtype)
    sizes = compress_sizes(params, shape)
    qq = _last_queries(q, sizes.query_tokens)
    scores = None
    if sizes.scored_tokens > 0:
        scores = _empty(kv, [shape.num_layers, shape.num_kv_heads, sizes.scored_tokens], "f32")
        compute_scores(params, shape, qq, kv, scores, stream=stream)
    flat = _empty(kv, [shape.num_kv_heads * sizes.total_kept], "i32")
    select_tokens(params, shape, scores, flat, stream=stream)
    out = Selection()
    off = 0
    for keep in sizes.keep_counts:
        n = shape.num_kv_heads * keep
        part = flat[off:off + n]
        out.append(part.reshape(shape.num_kv_heads, keep) if _is_array(part)
                   else part.cast("B").cast("i", (shape.num_kv_heads, keep)) if n else part)
        off += n
    out.flat = flat
    out.keep_counts = list(sizes.keep_counts)
    out.shape = shape
    return out


def compact(params: CompressParams, q: Optional[Buffer], kv: Buffer,
            selection: Optional[Selection] = None, *, dtype: Optional[str] = None,
            stream: Any = None) -> list:
    """The compressed cache: per layer an array [2, keep, kv_heads, head_dim] of the kept K and
    V (views into one buffer), from `selection` (select()'s result) or a fresh select()."""
    if selection is None:
        selection = select(params, q, kv, dtype=dtype, stream=stream)
    shape = selection.shape
    total = sum(selection.keep_counts)
    per_token = 2 * shape.num_kv_heads * shape.head_dim
    out_flat = _empty(kv, [total * per_token], shape.dtype)
    compact_kv(shape, selection.keep_counts, selection.flat, kv, out_flat, stream=stream)
    layers = []
    off = 0
    for keep in selection.keep_counts:
        n = keep * per_token
        part = out_flat[off:off + n]
        dims = (2, keep, shape.num_kv_heads, shape.head_dim)
        layers.append(part.reshape(*dims) if _is_array(part)
                      else part.cast("B").cast(part.format, dims) if n else part)
        off += n
    return layers
