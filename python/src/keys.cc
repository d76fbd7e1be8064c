#include "keys.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "buffers.h"
#include "errors.h"

namespace kvpool::py {
namespace {

std::string StrOrBytes(nb::handle obj, const char* what) {
  if (PyUnicode_Check(obj.ptr())) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(obj.ptr(), &n);
    if (s == nullptr) throw nb::python_error();
    return std::string(s, static_cast<size_t>(n));
  }
  if (PyBytes_Check(obj.ptr())) {
    return std::string(PyBytes_AS_STRING(obj.ptr()),
                       static_cast<size_t>(PyBytes_GET_SIZE(obj.ptr())));
  }
  throw nb::type_error((std::string(what) + " must be str or bytes").c_str());
}

int32_t TokenOf(nb::handle item, size_t i) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(item.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    throw nb::type_error(("tokens[" + std::to_string(i) + "] must be an int, not " +
                          std::string(nb::type_name(item.type()).c_str()))
                             .c_str());
  }
  if (overflow != 0 || v < INT32_MIN || v > INT32_MAX) {
    RaiseInvalid("tokens[" + std::to_string(i) + "] does not fit a 32-bit token id");
  }
  return static_cast<int32_t>(v);
}

// Tokens as int32: an int32 buffer is used in place; other integer buffers and sequences of ints
// are converted (range checked).
std::vector<int32_t> Tokens(nb::handle obj, const int32_t** data, size_t* n, Buffer* held) {
  std::vector<int32_t> copy;
  if (PyObject_CheckBuffer(obj.ptr()) || nb::hasattr(obj, "__dlpack__")) {
    if (PyBytes_Check(obj.ptr()) || PyByteArray_Check(obj.ptr())) {
      throw nb::type_error("tokens must be ints or an integer array, not raw bytes");
    }
    *held = Acquire(obj, /*writable=*/false, /*allow_cuda=*/false, "tokens");
    const Buffer& b = *held;
    if (b.kind() == ElemKind::kInt && b.itemsize() == 4) {
      *data = static_cast<const int32_t*>(b.data());
      *n = b.nbytes() / 4;
      return copy;
    }
    if (b.kind() != ElemKind::kInt && b.kind() != ElemKind::kUInt) {
      RaiseInvalid("tokens must be an integer array, not " + b.Describe());
    }
    const size_t count = b.nbytes() / b.itemsize();
    copy.resize(count);
    const auto* p = static_cast<const uint8_t*>(b.data());
    for (size_t i = 0; i < count; ++i) {
      int64_t v = 0;
      const bool is_signed = b.kind() == ElemKind::kInt;
      switch (b.itemsize()) {
        case 1:
          v = is_signed ? int64_t(reinterpret_cast<const int8_t*>(p)[i]) : int64_t(p[i]);
          break;
        case 2:
          v = is_signed ? int64_t(reinterpret_cast<const int16_t*>(p)[i])
                        : int64_t(reinterpret_cast<const uint16_t*>(p)[i]);
          break;
        case 4:
          v = int64_t(reinterpret_cast<const uint32_t*>(p)[i]);
          break;
        case 8: {
          if (is_signed) {
            v = reinterpret_cast<const int64_t*>(p)[i];
          } else {
            const uint64_t u = reinterpret_cast<const uint64_t*>(p)[i];
            v = u > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(u);
          }
          break;
        }
        default:
          RaiseInvalid("tokens: unsupported integer size " + std::to_string(b.itemsize()));
      }
      if (v < INT32_MIN || v > INT32_MAX) {
        RaiseInvalid("tokens[" + std::to_string(i) + "] does not fit a 32-bit token id");
      }
      copy[i] = static_cast<int32_t>(v);
    }
  } else {
    nb::object keep;
    std::vector<nb::handle> items = Items(obj, "tokens", &keep);
    copy.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) copy.push_back(TokenOf(items[i], i));
  }
  *data = copy.data();
  *n = copy.size();
  return copy;
}

}  // namespace

nb::bytes KeyBytes(const BlockKey& key) { return nb::bytes(key.bytes.data(), key.bytes.size()); }

BlockKey ToKey(nb::handle obj, const std::string& what) {
  BlockKey k;
  if (PyBytes_Check(obj.ptr())) {
    if (PyBytes_GET_SIZE(obj.ptr()) != 32) {
      RaiseInvalid(what + " is " + std::to_string(PyBytes_GET_SIZE(obj.ptr())) +
                   " bytes; a block key is 32");
    }
    std::memcpy(k.bytes.data(), PyBytes_AS_STRING(obj.ptr()), 32);
    return k;
  }
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw nb::type_error((what + " must be a 32-byte bytes object, not " +
                          std::string(nb::type_name(obj.type()).c_str()))
                             .c_str());
  }
  Buffer b = Acquire(obj, false, false, what);
  if (b.nbytes() != 32) {
    RaiseInvalid(what + " is " + std::to_string(b.nbytes()) + " bytes; a block key is 32");
  }
  std::memcpy(k.bytes.data(), b.data(), 32);
  return k;
}

BlockKey ToParent(nb::handle obj) {
  if (obj.is_none()) return BlockKey{};
  return ToKey(obj, "parent");
}

std::vector<BlockKey> ToKeys(nb::handle seq, const std::string& what) {
  nb::object keep;
  std::vector<nb::handle> items = Items(seq, what, &keep);
  std::vector<BlockKey> keys;
  keys.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    keys.push_back(ToKey(items[i], what + "[" + std::to_string(i) + "]"));
  }
  return keys;
}

void RegisterKeys(nb::module_& m) {
  m.def(
      "layout_string",
      [](const std::string& model, const std::string& dtype, uint32_t layers, uint32_t kv_heads,
         uint32_t head_dim, uint32_t tokens_per_block, uint32_t tp_rank, uint32_t tp_size,
         const std::string& encoding) {
        LayoutSpec spec;
        spec.model = model;
        spec.dtype = dtype;
        spec.layers = layers;
        spec.kv_heads = kv_heads;
        spec.head_dim = head_dim;
        spec.tokens_per_block = tokens_per_block;
        spec.tp_rank = tp_rank;
        spec.tp_size = tp_size;
        spec.encoding = encoding;
        return spec.ToCanonicalString();
      },
      nb::arg("model"), nb::arg("dtype"), nb::arg("layers"), nb::arg("kv_heads"),
      nb::arg("head_dim"), nb::arg("tokens_per_block") = 16, nb::arg("tp_rank") = 0,
      nb::arg("tp_size") = 1, nb::arg("encoding") = "raw",
      "The canonical layout string (spec/block-keys.md), e.g. 'model=llama-3-8b;dtype=bf16;"
      "layers=32;...;encoding=raw'. Its SHA-256 is part of every block key.");

  m.def(
      "hash_chain",
      [](nb::handle tokens, nb::handle secret, const std::string& layout, uint32_t tokens_per_block,
         nb::handle parent) {
        if (tokens_per_block == 0) RaiseInvalid("tokens_per_block must be positive");
        const std::string secret_bytes = StrOrBytes(secret, "secret");
        const BlockKey parent_key = ToParent(parent);
        const int32_t* data = nullptr;
        size_t n = 0;
        Buffer held;
        std::vector<int32_t> copy = Tokens(tokens, &data, &n, &held);
        std::vector<BlockKey> keys;
        {
          nb::gil_scoped_release release;  // one SHA-256 per block: long chains take a while
          ChainHasher hasher(secret_bytes, layout, tokens_per_block);
          keys = hasher.Hash(std::span<const int32_t>(data, n), parent_key);
        }
        nb::list out;
        for (const BlockKey& k : keys) out.append(KeyBytes(k));
        return out;
      },
      nb::arg("tokens"), nb::kw_only(), nb::arg("secret"), nb::arg("layout"),
      nb::arg("tokens_per_block"), nb::arg("parent") = nb::none(),
      "Keys (32 bytes each) of the full blocks of `tokens` (ints, or an integer array; an int32 "
      "array is read in place), exactly as spec/block-keys.md: key_i = SHA-256(key_{i-1} || "
      "SHA-256(secret) || SHA-256(layout) || tokens of block i as little-endian int32). A tail "
      "of fewer than tokens_per_block tokens gets no key. `parent`: the last key of the chain "
      "being extended (None: a new chain).");

  m.def(
      "namespace_salt",
      [](nb::handle secret) { return KeyBytes(NamespaceSalt(StrOrBytes(secret, "secret"))); },
      nb::arg("secret"), "SHA-256 of a namespace secret: the salt in every key of it.");
  m.def(
      "layout_fingerprint",
      [](const std::string& layout) { return KeyBytes(LayoutFingerprint(layout)); },
      nb::arg("layout"), "SHA-256 of a canonical layout string.");
}

}  // namespace kvpool::py
