"""kvpool.kernels on CPU buffers against small numpy references."""

import numpy as np
import pytest

import kvpool
from kvpool import kernels as K

L, H, D, T = 3, 2, 32, 8  # layers, kv heads, head dim, tokens per block


def _layout(dtype="fp16", encoding="raw"):
    return K.BlockLayout(num_layers=L, num_kv_heads=H, head_dim=D, tokens=T, dtype=dtype,
                         encoding=encoding)


def _bf16(x):
    """float32 -> bf16 bits (round to nearest even), as uint16."""
    b = np.asarray(x, np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def _from_bf16(u):
    return (u.astype(np.uint32) << 16).view(np.float32)


def test_sizes():
    lay = _layout()
    assert lay.raw_bytes == L * 2 * T * H * D * 2
    assert lay.with_encoding("int8").encoded_bytes < lay.raw_bytes
    assert K.BlockLayout(0, H, D, T).raw_bytes == 0


@pytest.mark.parametrize("encoding,tol", [("int8", 0.02), ("fp8_e4m3", 0.06), ("int4_g32", 0.15)])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_quantize_round_trip(dtype, encoding, tol):
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((3, L * 2 * T * H * D)).astype(np.float32)
    raw = [r.astype(np.float16) if dtype == "fp16" else _bf16(r) for r in ref]
    lay = _layout(dtype, encoding)
    enc = K.quantize(lay, raw)
    assert all(e.nbytes == lay.encoded_bytes for e in enc)
    back = K.dequantize(lay, enc)
    for r, b in zip(ref, back):
        got = b.astype(np.float32) if dtype == "fp16" else _from_bf16(b.view(np.uint16))
        assert np.linalg.norm(got - r) / np.linalg.norm(r) < tol


def test_quantize_into_callers_buffers_and_bytearrays():
    lay = _layout("fp16", "int8")
    raw = np.random.default_rng(1).standard_normal(lay.raw_bytes // 2).astype(np.float16)
    out = bytearray(lay.encoded_bytes)
    assert K.quantize(lay, [raw], [out])[0] is out and any(out)
    back = np.zeros_like(raw)
    K.dequantize(lay, [out], [back])
    assert np.abs(back.astype(np.float32) - raw).max() < 0.05


def test_kernel_arguments_are_checked():
    lay = _layout("fp16", "int8")
    raw = np.zeros(lay.raw_bytes // 2, np.float16)
    with pytest.raises(kvpool.InvalidArgument, match="encoded"):
        K.quantize(lay, [raw], [bytearray(3)])
    with pytest.raises(kvpool.InvalidArgument, match="float32"):
        K.quantize(lay, [np.zeros(lay.raw_bytes // 4, np.float32)])
    with pytest.raises(kvpool.InvalidArgument, match="contiguous"):
        K.quantize(lay, [np.zeros(lay.raw_bytes, np.float16)[::2]])
    with pytest.raises(kvpool.InvalidArgument, match="read-only"):
        K.quantize(lay, [raw], [bytes(lay.encoded_bytes)])
    with pytest.raises(kvpool.InvalidArgument):
        K.quantize(_layout("fp64"), [raw])
    with pytest.raises(TypeError):
        K.quantize(lay, [object()])


def _paged_reference(k, v, table, block_size, first, n):
    """payload[p] [layer][kv][token][H][D] from separate caches k[l], v[l] [blocks, bs, H, D]."""
    out = np.zeros((n, L, 2, T, H, D), k[0].dtype)
    for p in range(n):
        for t in range(T):
            tok = first + p * T + t
            page, off = table[tok // block_size], tok % block_size
            for layer in range(L):
                out[p, layer, 0, t] = k[layer][page, off]
                out[p, layer, 1, t] = v[layer][page, off]
    return out


@pytest.mark.parametrize("paged_layout", ["separate", "kv_first", "kv_interleaved"])
@pytest.mark.parametrize("first_token", [0, 5])
def test_paged_gather_and_scatter(paged_layout, first_token):
    rng = np.random.default_rng(2)
    blocks, bs, n = 7, 4, 2
    k = [rng.standard_normal((blocks, bs, H, D)).astype(np.float16) for _ in range(L)]
    v = [rng.standard_normal((blocks, bs, H, D)).astype(np.float16) for _ in range(L)]
    table = [6, 2, 4, 0, 1, 5]  # a shuffled page order
    if paged_layout == "separate":
        kc, vc = k, v
    elif paged_layout == "kv_first":
        kc, vc = [np.ascontiguousarray(np.stack([a, b])) for a, b in zip(k, v)], None
    else:
        kc, vc = [np.ascontiguousarray(np.stack([a, b], axis=1)) for a, b in zip(k, v)], None
    lay = _layout()
    payloads = [np.zeros(lay.raw_bytes // 2, np.float16) for _ in range(n)]
    K.gather_paged(kc, vc, np.array(table, np.int32), payloads, lay, first_token=first_token,
                   paged_layout=paged_layout)
    ref = _paged_reference(k, v, table, bs, first_token, n)
    for p in range(n):
        np.testing.assert_array_equal(payloads[p].reshape(L, 2, T, H, D), ref[p])
    # Scatter the payloads into zeroed caches: exactly the gathered positions come back.
    kz = [np.zeros_like(a) for a in kc]
    vz = [np.zeros_like(a) for a in vc] if vc is not None else None
    K.scatter_paged(kz, vz, table, payloads, lay, first_token=first_token,
                    paged_layout=paged_layout)
    if paged_layout == "separate":
        ks, vs = kz, vz
    elif paged_layout == "kv_first":
        ks, vs = [a[0] for a in kz], [a[1] for a in kz]
    else:
        ks, vs = [a[:, 0] for a in kz], [a[:, 1] for a in kz]
    np.testing.assert_array_equal(_paged_reference(ks, vs, table, bs, first_token, n), ref)


def test_paged_shapes_are_checked():
    lay = _layout()
    k = [np.zeros((4, 4, H, D), np.float16) for _ in range(L)]
    payload = [np.zeros(lay.raw_bytes // 2, np.float16)]
    with pytest.raises(kvpool.InvalidArgument, match="v_layers"):
        K.gather_paged(k, None, [0, 1], payload, lay)
    with pytest.raises(kvpool.InvalidArgument, match="heads"):
        K.gather_paged([np.zeros((4, 4, H + 1, D), np.float16)] * L, k, [0, 1], payload, lay)
    with pytest.raises(kvpool.InvalidArgument, match="k_layers"):
        K.gather_paged(k[:1], k[:1], [0, 1], payload, lay)
    with pytest.raises(kvpool.InvalidArgument, match="payloads"):
        K.gather_paged(k, k, [0, 1], [np.zeros(10, np.float16)], lay)


def _streaming_reference(seq, sinks, capacity):
    if seq < capacity:
        return np.arange(seq)
    return np.concatenate([np.arange(sinks), np.arange(seq - (capacity - sinks), seq)])


@pytest.mark.parametrize("seq", [100, 20])
def test_select_and_compact_streamingllm(seq):
    rng = np.random.default_rng(3)
    params = K.CompressParams("streamingllm", max_capacity_prompt=32, sink_size=4)
    kv = rng.standard_normal((L, 2, seq, H, D)).astype(np.float16)
    kept = K.select(params, None, kv)
    want = _streaming_reference(seq, 4, 32)
    assert len(kept) == L
    for layer in kept:
        assert layer.shape == (H, len(want)) and layer.dtype == np.int32
        for h in range(H):
            np.testing.assert_array_equal(layer[h], want)
    small = K.compact(params, None, kv, kept)
    for layer in range(L):
        assert small[layer].shape == (2, len(want), H, D)
        for h in range(H):
            np.testing.assert_array_equal(small[layer][:, :, h], kv[layer][:, want, h])


def test_select_snapkv_keeps_window_and_budget():
    rng = np.random.default_rng(4)
    seq, window, cap = 96, 8, 24
    params = K.CompressParams("snapkv", window_size=window, max_capacity_prompt=cap,
                              kernel_size=3)
    kv = rng.standard_normal((L, 2, seq, H, D)).astype(np.float32).astype(np.float16)
    q = rng.standard_normal((L, seq, 2 * H, D)).astype(np.float16)  # the whole prompt's queries
    sizes = K.compress_sizes(params, K.AttentionShape(L, seq, 2 * H, H, D, "fp16"))
    assert sizes.keep_counts == [cap] * L and sizes.query_tokens == window
    kept = K.select(params, q, kv)
    for layer in kept:
        assert layer.shape == (H, cap)
        for h in range(H):
            row = layer[h]
            assert (np.diff(row) > 0).all()  # ascending, distinct
            np.testing.assert_array_equal(row[-window:], np.arange(seq - window, seq))
    # The same selection from exactly the last `window` queries (no copy made).
    again = K.select(params, np.ascontiguousarray(q[:, -window:]), kv)
    for a, b in zip(kept, again):
        np.testing.assert_array_equal(a, b)


def test_torch_tensors_through_dlpack():
    torch = pytest.importorskip("torch")
    lay = _layout("bf16", "int8")
    raw = torch.randn(lay.raw_bytes // 2, dtype=torch.bfloat16)
    enc = K.quantize(lay, [raw])
    assert isinstance(enc[0], torch.Tensor)
    back = K.dequantize(lay, enc)[0]
    assert back.dtype == torch.bfloat16
    assert ((back.float() - raw.float()).norm() / raw.float().norm()) < 0.02
    with pytest.raises(kvpool.InvalidArgument, match="float16"):
        K.quantize(lay, [raw.half()])
    kv = torch.randn(L, 2, 50, H, D, dtype=torch.float16)
    kept = K.select(K.CompressParams("streamingllm", max_capacity_prompt=16, sink_size=2),
                    None, kv)
    assert kept[0].tolist()[0] == list(_streaming_reference(50, 2, 16))
