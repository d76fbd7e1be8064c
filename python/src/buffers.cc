#include "buffers.h"

#include <sstream>

#include "errors.h"

namespace kvpool::py {

const char* ElemKindName(ElemKind kind) {
  switch (kind) {
    case ElemKind::kFloat16:
      return "float16";
    case ElemKind::kBFloat16:
      return "bfloat16";
    case ElemKind::kFloat32:
      return "float32";
    case ElemKind::kFloat64:
      return "float64";
    case ElemKind::kInt:
      return "int";
    case ElemKind::kUInt:
      return "uint";
    case ElemKind::kBool:
      return "bool";
    case ElemKind::kOther:
      break;
  }
  return "bytes";
}

Buffer::Buffer(Buffer&& o) noexcept { *this = std::move(o); }

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this == &o) return *this;
  if (view_) PyBuffer_Release(view_.get());
  data_ = o.data_;
  nbytes_ = o.nbytes_;
  readonly_ = o.readonly_;
  device_ = o.device_;
  device_id_ = o.device_id_;
  shape_ = std::move(o.shape_);
  itemsize_ = o.itemsize_;
  kind_ = o.kind_;
  view_ = std::move(o.view_);
  dlpack_ = std::move(o.dlpack_);
  o.dlpack_.reset();
  o.data_ = nullptr;
  o.nbytes_ = 0;
  return *this;
}

Buffer::~Buffer() {
  if (view_) PyBuffer_Release(view_.get());
}

std::string Buffer::Describe() const {
  std::ostringstream os;
  os << ElemKindName(kind_) << itemsize_ * 8 << "[";
  for (size_t i = 0; i < shape_.size(); ++i) os << (i ? ", " : "") << shape_[i];
  os << "] on " << (device_ == Device::kCpu ? "cpu" : "cuda");
  return os.str();
}

namespace {

ElemKind KindOfFormat(const char* format) {
  if (format == nullptr) return ElemKind::kUInt;  // plain bytes
  const char* f = format;
  while (*f == '@' || *f == '=' || *f == '<' || *f == '>' || *f == '!') ++f;
  if (f[0] == '\0' || f[1] != '\0') return ElemKind::kOther;
  switch (f[0]) {
    case 'e':
      return ElemKind::kFloat16;
    case 'f':
      return ElemKind::kFloat32;
    case 'd':
      return ElemKind::kFloat64;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      return ElemKind::kInt;
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
    case 'N':
    case 'c':
      return ElemKind::kUInt;
    case '?':
      return ElemKind::kBool;
    default:
      return ElemKind::kOther;
  }
}

ElemKind KindOfDlpack(const nb::dlpack::dtype& t) {
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Float:
      return t.bits == 16   ? ElemKind::kFloat16
             : t.bits == 32 ? ElemKind::kFloat32
             : t.bits == 64 ? ElemKind::kFloat64
                            : ElemKind::kOther;
    case nb::dlpack::dtype_code::Bfloat:
      return ElemKind::kBFloat16;
    case nb::dlpack::dtype_code::Int:
      return ElemKind::kInt;
    case nb::dlpack::dtype_code::UInt:
      return ElemKind::kUInt;
    case nb::dlpack::dtype_code::Bool:
      return ElemKind::kBool;
    default:
      return ElemKind::kOther;
  }
}

std::string TypeName(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

}  // namespace

std::optional<Buffer> TryAcquire(nb::handle obj, bool writable, bool allow_cuda,
                                 const std::string& what) {
  Buffer b;
  if (PyObject_CheckBuffer(obj.ptr())) {
    auto view = std::make_unique<Py_buffer>();
    if (PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_RECORDS_RO) != 0) {
      PyErr_Clear();
      RaiseInvalid(what + ": its buffer cannot be exported (" + TypeName(obj) + ")");
    }
    b.data_ = view->buf;
    b.nbytes_ = static_cast<size_t>(view->len);
    b.readonly_ = view->readonly != 0;
    b.itemsize_ = static_cast<size_t>(view->itemsize);
    b.kind_ = KindOfFormat(view->format);
    if (view->ndim == 0) {
      b.shape_ = {static_cast<int64_t>(b.nbytes_ / (b.itemsize_ ? b.itemsize_ : 1))};
    } else {
      for (int i = 0; i < view->ndim; ++i) b.shape_.push_back(view->shape[i]);
    }
    const bool contiguous = PyBuffer_IsContiguous(view.get(), 'C') != 0;
    b.view_ = std::move(view);
    if (!contiguous) RaiseInvalid(what + " is not C-contiguous (" + b.Describe() + ")");
  } else if (nb::hasattr(obj, "__dlpack__")) {
    nb::ndarray<nb::ro> arr;
    if (!nb::try_cast(obj, arr, false)) {
      RaiseInvalid(what + ": its DLPack export failed (" + TypeName(obj) +
                   "; a tensor that requires grad needs .detach())");
    }
    b.data_ = const_cast<void*>(arr.data());
    b.itemsize_ = arr.itemsize();
    b.nbytes_ = arr.nbytes();
    b.kind_ = KindOfDlpack(arr.dtype());
    // DLPack before 1.0 has no read-only flag: torch tensors are writable.
    b.readonly_ = false;
    int64_t expect = 1;
    bool contiguous = true;
    for (size_t i = arr.ndim(); i-- > 0;) {
      if (arr.shape(i) != 1 && arr.stride(i) != expect) contiguous = false;
      expect *= static_cast<int64_t>(arr.shape(i));
    }
    for (size_t i = 0; i < arr.ndim(); ++i) b.shape_.push_back(static_cast<int64_t>(arr.shape(i)));
    if (arr.device_type() == nb::device::cuda::value) {
      b.device_ = Buffer::Device::kCuda;
    } else if (arr.device_type() != nb::device::cpu::value) {
      RaiseInvalid(what + " is on a device kvpool cannot use (DLPack device type " +
                   std::to_string(arr.device_type()) + ")");
    }
    b.device_id_ = arr.device_id();
    b.dlpack_ = std::move(arr);
    if (!contiguous) RaiseInvalid(what + " is not C-contiguous (" + b.Describe() + ")");
  } else {
    return std::nullopt;
  }
  if (writable && b.readonly_) {
    RaiseInvalid(what + " is read-only (" + TypeName(obj) + "); a writable buffer is needed");
  }
  if (b.device_ == Buffer::Device::kCuda && !allow_cuda) {
    RaiseInvalid(what + " is in CUDA memory; this call takes host memory (a CPU tensor)");
  }
  return b;
}

Buffer Acquire(nb::handle obj, bool writable, bool allow_cuda, const std::string& what) {
  std::optional<Buffer> b = TryAcquire(obj, writable, allow_cuda, what);
  if (!b) {
    throw nb::type_error((what +
                          " must support the buffer protocol or DLPack (numpy array, "
                          "torch tensor, bytearray, memoryview), not " +
                          TypeName(obj))
                             .c_str());
  }
  return std::move(*b);
}

std::vector<nb::handle> Items(nb::handle seq, const std::string& what, nb::object* keep) {
  if (PyUnicode_Check(seq.ptr()) || PyBytes_Check(seq.ptr()) || PyByteArray_Check(seq.ptr())) {
    throw nb::type_error(
        (what + " must be a sequence (list, tuple), not " + TypeName(seq)).c_str());
  }
  PyObject* fast = PySequence_Fast(seq.ptr(), "");
  if (fast == nullptr) {
    PyErr_Clear();
    throw nb::type_error(
        (what + " must be a sequence (list, tuple), not " + TypeName(seq)).c_str());
  }
  *keep = nb::steal(fast);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  std::vector<nb::handle> out;
  out.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) out.emplace_back(PySequence_Fast_GET_ITEM(fast, i));
  return out;
}

std::vector<Buffer> AcquireAll(nb::handle seq, bool writable, bool allow_cuda,
                               const std::string& what) {
  nb::object keep;
  std::vector<nb::handle> items = Items(seq, what, &keep);
  std::vector<Buffer> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    out.push_back(Acquire(items[i], writable, allow_cuda, what + "[" + std::to_string(i) + "]"));
  }
  return out;
}

}  // namespace kvpool::py
