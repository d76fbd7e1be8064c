#include "kernels.h"

#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <kvpool/kernels.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "buffers.h"
#include "errors.h"

namespace kvpool::py {
namespace {

using Layout6 = std::array<int32_t, 6>;  // layers, kv_heads, head_dim, tokens, dtype, encoding
using Shape6 = std::array<int32_t, 6>;   // layers, seq_len, q_heads, kv_heads, head_dim, dtype
using Params7 = std::array<int32_t, 7>;  // method, window, capacity, kernel, pooling, sinks, beta

constexpr int kDTypeFloat32 = 2;  // KVPOOL_DTYPE_FLOAT32 (include/kvpool/kernels.h)

kvpool_block_layout ToLayout(const Layout6& a) { return {a[0], a[1], a[2], a[3], a[4], a[5]}; }
kvpool_attention_shape ToShape(const Shape6& a) { return {a[0], a[1], a[2], a[3], a[4], a[5]}; }
kvpool_compress_params ToParams(const Params7& a) {
  return {a[0], a[1], a[2], a[3], a[4], a[5], a[6]};
}

size_t ElemSize(int32_t dtype) {
  switch (dtype) {
    case KVPOOL_DTYPE_FLOAT16:
    case KVPOOL_DTYPE_BFLOAT16:
      return 2;
    case kDTypeFloat32:
      return 4;
    default:
      RaiseInvalid("dtype " + std::to_string(dtype) + " is not fp16 (0), bf16 (1) or fp32 (2)");
  }
}

const char* DTypeName(int32_t dtype) {
  return dtype == KVPOOL_DTYPE_FLOAT16 ? "fp16" : dtype == KVPOOL_DTYPE_BFLOAT16 ? "bf16" : "fp32";
}

// A floating-point buffer must hold `dtype`; integer or untyped buffers are raw storage (numpy
// has no bfloat16: bf16 data travels as uint16) and only their size is checked.
void CheckElem(const Buffer& b, int32_t dtype, const std::string& what) {
  ElemKind want = dtype == KVPOOL_DTYPE_FLOAT16    ? ElemKind::kFloat16
                  : dtype == KVPOOL_DTYPE_BFLOAT16 ? ElemKind::kBFloat16
                                                   : ElemKind::kFloat32;
  const ElemKind k = b.kind();
  const bool is_float = k == ElemKind::kFloat16 || k == ElemKind::kBFloat16 ||
                        k == ElemKind::kFloat32 || k == ElemKind::kFloat64;
  if (is_float && k != want) {
    RaiseInvalid(what + " holds " + b.Describe() + " but the layout's dtype is " +
                 DTypeName(dtype));
  }
}

void CheckBytes(const Buffer& b, size_t want, const std::string& what) {
  if (b.nbytes() != want) {
    RaiseInvalid(what + " is " + std::to_string(b.nbytes()) + " bytes (" + b.Describe() +
                 "); the layout needs exactly " + std::to_string(want));
  }
}

// All buffers of one call on one device; returns the exec context.
kvpool_exec ExecFor(const std::vector<const Buffer*>& buffers, uintptr_t stream) {
  const Buffer* first = nullptr;
  for (const Buffer* b : buffers) {
    if (b == nullptr) continue;
    if (first == nullptr) {
      first = b;
    } else if (b->device() != first->device() || b->device_id() != first->device_id()) {
      RaiseInvalid("buffers on different devices in one kernel call (" + first->Describe() +
                   " and " + b->Describe() + ")");
    }
  }
  kvpool_exec e{};
  e.device = first != nullptr && first->device() == Buffer::Device::kCuda ? KVPOOL_DEVICE_CUDA
                                                                          : KVPOOL_DEVICE_CPU;
  if (e.device == KVPOOL_DEVICE_CPU && stream != 0) {
    RaiseInvalid("a CUDA stream was given but the buffers are in host memory");
  }
  e.stream = reinterpret_cast<void*>(stream);
  return e;
}

// Runs a kernel with the GIL released; raises its status.
template <typename Fn>
void Run(Fn&& fn) {
  int rc;
  std::string message;
  {
    nb::gil_scoped_release release;
    rc = fn();
    if (rc != KVPOOL_KERNEL_OK) message = kvpool_kernel_last_error();
  }
  if (rc != KVPOOL_KERNEL_OK) Raise(Status(static_cast<StatusCode>(rc), message));
}

std::vector<void*> Pointers(const std::vector<Buffer>& bs) {
  std::vector<void*> p;
  for (const Buffer& b : bs) p.push_back(b.data());
  return p;
}

void CheckCount(size_t got, size_t want, const std::string& what) {
  if (got != want) {
    RaiseInvalid(what + " has " + std::to_string(got) + " entries; expected " +
                 std::to_string(want));
  }
}

struct PagedArgs {
  kvpool_paged_cache cache{};
  std::vector<Buffer> k, v, payloads;
  Buffer table_buf;
  std::vector<int32_t> table_copy;
  const int32_t* table = nullptr;
  int32_t table_len = 0;
  std::vector<void*> kp, vp, pp;
  kvpool_exec exec{};
};

// Checks an engine cache and payloads against `layout`: k/v tensor shapes by paged_layout
// (separate [blocks, block_size, heads, dim]; kv_first [2, blocks, ...]; kv_interleaved
// [blocks, 2, ...]), element type and contiguity; each payload exactly the raw block size.
void PreparePaged(PagedArgs& a, const kvpool_block_layout& layout, int32_t paged_layout,
                  nb::handle k_layers, nb::handle v_layers, nb::handle block_table,
                  nb::handle payloads, bool gather, uintptr_t stream) {
  const size_t esize = ElemSize(layout.dtype);
  if (layout.encoding != KVPOOL_ENCODING_RAW) {
    RaiseInvalid("paged gather/scatter move raw payloads: the layout's encoding must be raw");
  }
  a.k = AcquireAll(k_layers, /*writable=*/!gather, true, "k_layers");
  const bool separate = paged_layout == KVPOOL_PAGED_SEPARATE;
  if (!separate && paged_layout != KVPOOL_PAGED_KV_FIRST &&
      paged_layout != KVPOOL_PAGED_KV_INTERLEAVED) {
    RaiseInvalid("paged_layout must be separate (0), kv_first (1) or kv_interleaved (2)");
  }
  if (separate) {
    if (v_layers.is_none()) RaiseInvalid("the separate layout needs v_layers");
    a.v = AcquireAll(v_layers, !gather, true, "v_layers");
    CheckCount(a.v.size(), a.k.size(), "v_layers");
  } else if (!v_layers.is_none()) {
    RaiseInvalid(
        "kv_first / kv_interleaved caches hold K and V in one tensor: v_layers must be "
        "None");
  }
  CheckCount(a.k.size(), static_cast<size_t>(layout.num_layers), "k_layers");
  if (a.k.empty()) RaiseInvalid("k_layers is empty");
  const std::vector<int64_t>& s0 = a.k[0].shape();
  const size_t want_ndim = separate ? 4 : 5;
  if (s0.size() != want_ndim) {
    RaiseInvalid("k_layers[0] has shape " + a.k[0].Describe() + "; this paged layout needs " +
                 std::to_string(want_ndim) + " dimensions");
  }
  int64_t blocks = 0;
  if (separate) {
    blocks = s0[0];
  } else if (paged_layout == KVPOOL_PAGED_KV_FIRST) {
    if (s0[0] != 2) RaiseInvalid("kv_first cache: dimension 0 must be 2 (K, V)");
    blocks = s0[1];
  } else {
    if (s0[1] != 2) RaiseInvalid("kv_interleaved cache: dimension 1 must be 2 (K, V)");
    blocks = s0[0];
  }
  const int64_t block_size = s0[want_ndim - 3];
  const int64_t heads = s0[want_ndim - 2];
  const int64_t dim = s0[want_ndim - 1];
  if (heads != layout.num_kv_heads || dim != layout.head_dim) {
    RaiseInvalid("cache tensors have " + std::to_string(heads) + " heads of dim " +
                 std::to_string(dim) + "; the layout says " + std::to_string(layout.num_kv_heads) +
                 " of " + std::to_string(layout.head_dim));
  }
  auto check_layer = [&](const Buffer& b, const std::string& what) {
    if (b.shape() != s0) RaiseInvalid(what + " has shape " + b.Describe() + " unlike k_layers[0]");
    if (b.itemsize() != esize) {
      RaiseInvalid(what + " has " + std::to_string(b.itemsize()) + "-byte elements; " +
                   DTypeName(layout.dtype) + " needs " + std::to_string(esize));
    }
    CheckElem(b, layout.dtype, what);
  };
  for (size_t i = 0; i < a.k.size(); ++i)
    check_layer(a.k[i], "k_layers[" + std::to_string(i) + "]");
  for (size_t i = 0; i < a.v.size(); ++i)
    check_layer(a.v[i], "v_layers[" + std::to_string(i) + "]");

  a.payloads = AcquireAll(payloads, /*writable=*/gather, true, "payloads");
  const size_t raw = kvpool_kernel_raw_bytes(&layout);
  if (raw == 0)
    RaiseInvalid(std::string("invalid block layout (positive sizes; int4 groups must divide "
                             "head_dim; a known dtype and encoding) ") +
                 kvpool_kernel_last_error());
  for (size_t i = 0; i < a.payloads.size(); ++i) {
    CheckBytes(a.payloads[i], raw, "payloads[" + std::to_string(i) + "]");
    CheckElem(a.payloads[i], layout.dtype, "payloads[" + std::to_string(i) + "]");
  }

  // Block table: an int32 array (on the cache's device), or a sequence of ints (CPU caches).
  if (PyObject_CheckBuffer(block_table.ptr()) || nb::hasattr(block_table, "__dlpack__")) {
    a.table_buf = Acquire(block_table, false, true, "block_table");
    if (a.table_buf.kind() != ElemKind::kInt || a.table_buf.itemsize() != 4) {
      RaiseInvalid("block_table must be int32, not " + a.table_buf.Describe());
    }
    a.table = static_cast<const int32_t*>(a.table_buf.data());
    a.table_len = static_cast<int32_t>(a.table_buf.nbytes() / 4);
  } else {
    nb::object keep;
    for (nb::handle item : Items(block_table, "block_table", &keep)) {
      a.table_copy.push_back(nb::cast<int32_t>(item));
    }
    a.table = a.table_copy.data();
    a.table_len = static_cast<int32_t>(a.table_copy.size());
  }

  std::vector<const Buffer*> all;
  for (const Buffer& b : a.k) all.push_back(&b);
  for (const Buffer& b : a.v) all.push_back(&b);
  for (const Buffer& b : a.payloads) all.push_back(&b);
  if (a.table_buf.data() != nullptr) all.push_back(&a.table_buf);
  a.exec = ExecFor(all, stream);
  if (a.exec.device == KVPOOL_DEVICE_CUDA && !a.table_copy.empty()) {
    RaiseInvalid("with CUDA caches, block_table must be an int32 tensor on the same device");
  }
  a.kp = Pointers(a.k);
  a.vp = Pointers(a.v);
  a.pp = Pointers(a.payloads);
  a.cache.layout = paged_layout;
  a.cache.dtype = layout.dtype;
  a.cache.num_layers = layout.num_layers;
  a.cache.num_blocks = static_cast<int32_t>(blocks);
  a.cache.block_size = static_cast<int32_t>(block_size);
  a.cache.num_kv_heads = static_cast<int32_t>(heads);
  a.cache.head_dim = static_cast<int32_t>(dim);
  a.cache.k_layers = a.kp.data();
  a.cache.v_layers = separate ? a.vp.data() : nullptr;
}

struct Sizes {
  std::vector<int32_t> keep;
  int64_t total = 0;
  int32_t query_tokens = 0;
  int32_t scored_tokens = 0;
};

Sizes CompressSizes(const kvpool_compress_params& p, const kvpool_attention_shape& s) {
  if (s.num_layers <= 0) RaiseInvalid("num_layers must be positive");
  Sizes z;
  z.keep.resize(static_cast<size_t>(s.num_layers));
  const int rc = kvpool_kernel_compress_sizes(&p, &s, z.keep.data(), &z.total, &z.query_tokens,
                                              &z.scored_tokens);
  if (rc != KVPOOL_KERNEL_OK)
    Raise(Status(static_cast<StatusCode>(rc), kvpool_kernel_last_error()));
  return z;
}

std::optional<Buffer> Optional(nb::handle obj, bool writable, const std::string& what) {
  if (obj.is_none()) return std::nullopt;
  return Acquire(obj, writable, true, what);
}

}  // namespace

void RegisterKernels(nb::module_& m) {
#ifdef KVPOOL_PY_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif

  m.def(
      "kernel_raw_bytes",
      [](const Layout6& l) {
        const kvpool_block_layout layout = ToLayout(l);
        return kvpool_kernel_raw_bytes(&layout);
      },
      nb::arg("layout"), "Bytes of a raw payload; 0 when the layout is invalid.");
  m.def(
      "kernel_encoded_bytes",
      [](const Layout6& l) {
        const kvpool_block_layout layout = ToLayout(l);
        return kvpool_kernel_encoded_bytes(&layout);
      },
      nb::arg("layout"), "Bytes of a block in the layout's encoding; 0 when invalid.");

  m.def(
      "kernel_gather_paged",
      [](const Layout6& l, int32_t paged_layout, nb::handle k_layers, nb::handle v_layers,
         nb::handle block_table, int64_t first_token, nb::handle payloads, uintptr_t stream) {
        const kvpool_block_layout layout = ToLayout(l);
        PagedArgs a;
        PreparePaged(a, layout, paged_layout, k_layers, v_layers, block_table, payloads,
                     /*gather=*/true, stream);
        Run([&] {
          return kvpool_kernel_gather_paged(&a.exec, &a.cache, &layout, a.table, a.table_len,
                                            first_token, static_cast<int32_t>(a.pp.size()),
                                            a.pp.data());
        });
      },
      nb::arg("layout"), nb::arg("paged_layout"), nb::arg("k_layers"), nb::arg("v_layers").none(),
      nb::arg("block_table"), nb::arg("first_token"), nb::arg("payloads"), nb::arg("stream") = 0,
      "Engine pages -> raw payloads (see kvpool.kernels.gather_paged).");

  m.def(
      "kernel_scatter_paged",
      [](const Layout6& l, int32_t paged_layout, nb::handle k_layers, nb::handle v_layers,
         nb::handle block_table, int64_t first_token, nb::handle payloads, uintptr_t stream) {
        const kvpool_block_layout layout = ToLayout(l);
        PagedArgs a;
        PreparePaged(a, layout, paged_layout, k_layers, v_layers, block_table, payloads,
                     /*gather=*/false, stream);
        std::vector<const void*> cp(a.pp.begin(), a.pp.end());
        Run([&] {
          return kvpool_kernel_scatter_paged(&a.exec, &a.cache, &layout, a.table, a.table_len,
                                             first_token, static_cast<int32_t>(cp.size()),
                                             cp.data());
        });
      },
      nb::arg("layout"), nb::arg("paged_layout"), nb::arg("k_layers"), nb::arg("v_layers").none(),
      nb::arg("block_table"), nb::arg("first_token"), nb::arg("payloads"), nb::arg("stream") = 0,
      "Raw payloads -> engine pages (see kvpool.kernels.scatter_paged).");

  auto codec = [](bool encode) {
    return [encode](const Layout6& l, nb::handle src_obj, nb::handle dst_obj, uintptr_t stream) {
      const kvpool_block_layout layout = ToLayout(l);
      const size_t raw = kvpool_kernel_raw_bytes(&layout);
      const size_t enc = kvpool_kernel_encoded_bytes(&layout);
      if (raw == 0 || enc == 0) {
        RaiseInvalid(std::string("invalid block layout (positive sizes; int4 groups must divide "
                                 "head_dim; a known dtype and encoding) ") +
                     kvpool_kernel_last_error());
      }
      const char* src_name = encode ? "raw" : "encoded";
      const char* dst_name = encode ? "encoded" : "raw";
      std::vector<Buffer> src = AcquireAll(src_obj, false, true, src_name);
      std::vector<Buffer> dst = AcquireAll(dst_obj, true, true, dst_name);
      CheckCount(dst.size(), src.size(), dst_name);
      std::vector<const Buffer*> all;
      for (size_t i = 0; i < src.size(); ++i) {
        const std::string si = std::string(src_name) + "[" + std::to_string(i) + "]";
        const std::string di = std::string(dst_name) + "[" + std::to_string(i) + "]";
        CheckBytes(src[i], encode ? raw : enc, si);
        CheckBytes(dst[i], encode ? enc : raw, di);
        CheckElem(encode ? src[i] : dst[i], layout.dtype, encode ? si : di);
        all.push_back(&src[i]);
        all.push_back(&dst[i]);
      }
      const kvpool_exec exec = ExecFor(all, stream);
      std::vector<const void*> sp;
      for (const Buffer& b : src) sp.push_back(b.data());
      std::vector<void*> dp = Pointers(dst);
      Run([&] {
        return encode ? kvpool_kernel_quantize(&exec, &layout, sp.data(), dp.data(),
                                               static_cast<int32_t>(sp.size()))
                      : kvpool_kernel_dequantize(&exec, &layout, sp.data(), dp.data(),
                                                 static_cast<int32_t>(sp.size()));
      });
    };
  };
  m.def("kernel_quantize", codec(true), nb::arg("layout"), nb::arg("raw"), nb::arg("encoded"),
        nb::arg("stream") = 0, "raw[i] -> encoded[i] in the layout's encoding.");
  m.def("kernel_dequantize", codec(false), nb::arg("layout"), nb::arg("encoded"), nb::arg("raw"),
        nb::arg("stream") = 0, "encoded[i] -> raw[i].");

  m.def(
      "kernel_compress_defaults",
      [] {
        kvpool_compress_params p;
        kvpool_kernel_compress_params_default(&p);
        return Params7{p.method,    p.window_size, p.max_capacity_prompt, p.kernel_size, p.pooling,
                       p.sink_size, p.beta};
      },
      "The kernels' default compression parameters, as (method, window_size, "
      "max_capacity_prompt, kernel_size, pooling, sink_size, beta).");

  m.def(
      "kernel_compress_sizes",
      [](const Params7& p, const Shape6& s) {
        Sizes z = CompressSizes(ToParams(p), ToShape(s));
        return std::make_tuple(z.keep, z.total, z.query_tokens, z.scored_tokens);
      },
      nb::arg("params"), nb::arg("shape"),
      "(keep_counts per layer, total_kept, query_tokens, scored_tokens).");

  m.def(
      "kernel_compute_scores",
      [](const Params7& pa, const Shape6& sa, nb::handle q_obj, nb::handle kv_obj,
         nb::handle scores_obj, uintptr_t stream) {
        const kvpool_compress_params p = ToParams(pa);
        const kvpool_attention_shape s = ToShape(sa);
        const Sizes z = CompressSizes(p, s);
        const size_t es = ElemSize(s.dtype);
        const size_t q_bytes =
            size_t(s.num_layers) * z.query_tokens * s.num_q_heads * s.head_dim * es;
        const size_t kv_bytes =
            size_t(s.num_layers) * 2 * s.seq_len * s.num_kv_heads * s.head_dim * es;
        const size_t sc_bytes = size_t(s.num_layers) * s.num_kv_heads * z.scored_tokens * 4;
        std::optional<Buffer> q = Optional(q_obj, false, "q");
        Buffer kv = Acquire(kv_obj, false, true, "kv");
        std::optional<Buffer> sc = Optional(scores_obj, true, "scores");
        if (q_bytes > 0 && !q)
          RaiseInvalid("q is needed: the method scores " + std::to_string(z.query_tokens) +
                       " queries");
        if (q) {
          CheckBytes(
              *q, q_bytes,
              "q [layers, query_tokens=" + std::to_string(z.query_tokens) + ", q_heads, head_dim]");
          CheckElem(*q, s.dtype, "q");
        }
        CheckBytes(kv, kv_bytes, "kv [layers, 2, seq_len, kv_heads, head_dim]");
        CheckElem(kv, s.dtype, "kv");
        if (sc_bytes > 0 && !sc) RaiseInvalid("scores is needed");
        if (sc) {
          CheckBytes(*sc, sc_bytes,
                     "scores f32 [layers, kv_heads, scored_tokens=" +
                         std::to_string(z.scored_tokens) + "]");
          if (sc->kind() != ElemKind::kFloat32 && sc->kind() != ElemKind::kOther &&
              sc->kind() != ElemKind::kUInt) {
            RaiseInvalid("scores must be float32, not " + sc->Describe());
          }
        }
        const kvpool_exec exec = ExecFor({q ? &*q : nullptr, &kv, sc ? &*sc : nullptr}, stream);
        const void* qp = q ? q->data() : nullptr;
        float* sp = sc ? static_cast<float*>(sc->data()) : nullptr;
        Run([&] { return kvpool_kernel_compute_scores(&exec, &p, &s, qp, kv.data(), sp); });
      },
      nb::arg("params"), nb::arg("shape"), nb::arg("q").none(), nb::arg("kv"),
      nb::arg("scores").none(), nb::arg("stream") = 0,
      "q, kv -> scores (f32). A no-op for StreamingLLM and prompts shorter than the budget.");

  m.def(
      "kernel_select_tokens",
      [](const Params7& pa, const Shape6& sa, nb::handle scores_obj, nb::handle indices_obj,
         uintptr_t stream) {
        const kvpool_compress_params p = ToParams(pa);
        const kvpool_attention_shape s = ToShape(sa);
        const Sizes z = CompressSizes(p, s);
        const size_t sc_bytes = size_t(s.num_layers) * s.num_kv_heads * z.scored_tokens * 4;
        std::optional<Buffer> sc = Optional(scores_obj, false, "scores");
        Buffer idx = Acquire(indices_obj, true, true, "indices");
        if (sc_bytes > 0 && !sc) RaiseInvalid("scores is needed");
        if (sc) CheckBytes(*sc, sc_bytes, "scores");
        CheckBytes(idx, size_t(s.num_kv_heads) * size_t(z.total) * 4,
                   "indices int32 [kv_heads * total_kept]");
        if (idx.kind() != ElemKind::kInt && idx.kind() != ElemKind::kOther) {
          RaiseInvalid("indices must be int32, not " + idx.Describe());
        }
        const kvpool_exec exec = ExecFor({sc ? &*sc : nullptr, &idx}, stream);
        const float* sp = sc ? static_cast<const float*>(sc->data()) : nullptr;
        Run([&] {
          return kvpool_kernel_select_tokens(&exec, &p, &s, sp, static_cast<int32_t*>(idx.data()));
        });
      },
      nb::arg("params"), nb::arg("shape"), nb::arg("scores").none(), nb::arg("indices"),
      nb::arg("stream") = 0,
      "scores -> kept indices (int32, per layer [kv_head][keep], ascending).");

  m.def(
      "kernel_compact_kv",
      [](const Shape6& sa, const std::vector<int32_t>& keep, nb::handle indices_obj,
         nb::handle kv_obj, nb::handle out_obj, uintptr_t stream) {
        const kvpool_attention_shape s = ToShape(sa);
        const size_t es = ElemSize(s.dtype);
        CheckCount(keep.size(), size_t(s.num_layers > 0 ? s.num_layers : 0), "keep_counts");
        int64_t total = 0;
        for (int32_t k : keep) {
          if (k < 0 || k > s.seq_len) RaiseInvalid("keep_counts entries must be in [0, seq_len]");
          total += k;
        }
        Buffer idx = Acquire(indices_obj, false, true, "indices");
        Buffer kv = Acquire(kv_obj, false, true, "kv");
        Buffer out = Acquire(out_obj, true, true, "kv_out");
        CheckBytes(idx, size_t(s.num_kv_heads) * size_t(total) * 4, "indices");
        CheckBytes(kv, size_t(s.num_layers) * 2 * s.seq_len * s.num_kv_heads * s.head_dim * es,
                   "kv [layers, 2, seq_len, kv_heads, head_dim]");
        CheckBytes(out, size_t(total) * 2 * s.num_kv_heads * s.head_dim * es,
                   "kv_out (per layer [2, keep, kv_heads, head_dim])");
        CheckElem(kv, s.dtype, "kv");
        CheckElem(out, s.dtype, "kv_out");
        const kvpool_exec exec = ExecFor({&idx, &kv, &out}, stream);
        Run([&] {
          return kvpool_kernel_compact_kv(&exec, &s, keep.data(),
                                          static_cast<const int32_t*>(idx.data()), kv.data(),
                                          out.data());
        });
      },
      nb::arg("shape"), nb::arg("keep_counts"), nb::arg("indices"), nb::arg("kv"),
      nb::arg("kv_out"), nb::arg("stream") = 0, "kv -> kv_out keeping the selected tokens.");
}

}  // namespace kvpool::py
