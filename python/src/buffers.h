#pragma once
// Caller memory taken without a copy: anything with the buffer protocol (numpy arrays,
// bytearray, memoryview, bytes for reading) or DLPack (`__dlpack__`: torch tensors, CPU or CUDA,
// cupy, jax). Buffer protocol first (numpy, bytes), then DLPack through nanobind's nb::ndarray.
//
// A Buffer holds the exporter's view (Py_buffer or the DLPack capsule) for its lifetime;
// destroy it with the GIL held. For the buffer protocol that keeps the memory valid while the GIL
// is released: the exporter refuses to resize or free it (numpy, bytearray). A DLPack export does
// not: torch's resize_() and set_() free a tensor's storage while an export of it exists. A
// tensor given to a call must not be resized or given other storage, by any thread, until the
// call (or the pending get's wait) returns; the calls' docstrings say so.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvpool::py {

namespace nb = nanobind;

// Element kinds, as far as the exporter says (kOther: raw storage such as uint16 for bf16).
enum class ElemKind { kFloat16, kBFloat16, kFloat32, kFloat64, kInt, kUInt, kBool, kOther };
const char* ElemKindName(ElemKind kind);

class Buffer {
 public:
  enum class Device { kCpu, kCuda };

  Buffer() = default;
  Buffer(Buffer&&) noexcept;
  Buffer& operator=(Buffer&&) noexcept;
  ~Buffer();

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  bool readonly() const { return readonly_; }
  Device device() const { return device_; }
  int device_id() const { return device_id_; }
  const std::vector<int64_t>& shape() const { return shape_; }  // elements; {nbytes} if unknown
  size_t itemsize() const { return itemsize_; }
  ElemKind kind() const { return kind_; }
  std::string Describe() const;  // "float16[2, 16, 8, 128] on cpu" for error messages

 private:
  friend std::optional<Buffer> TryAcquire(nb::handle, bool, bool, const std::string&);
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  bool readonly_ = true;
  Device device_ = Device::kCpu;
  int device_id_ = 0;
  std::vector<int64_t> shape_;
  size_t itemsize_ = 1;
  ElemKind kind_ = ElemKind::kOther;
  std::unique_ptr<Py_buffer> view_;            // buffer-protocol exporters
  std::optional<nb::ndarray<nb::ro>> dlpack_;  // a DLPack exporter's tensor
};

// The memory of `obj` as a C-contiguous buffer. `what` names the argument in errors
// ("buffers[3]"). Raises TypeError when obj exports neither protocol, kvpool.InvalidArgument
// when it is not C-contiguous, read-only while `writable` is asked, or on a device other than
// the CPU while `allow_cuda` is false.
Buffer Acquire(nb::handle obj, bool writable, bool allow_cuda, const std::string& what);

// Each item of a sequence, as Acquire; items named what[i].
std::vector<Buffer> AcquireAll(nb::handle seq, bool writable, bool allow_cuda,
                               const std::string& what);

// Items of a sequence (list, tuple, any iterable with len) as handles; TypeError otherwise.
std::vector<nb::handle> Items(nb::handle seq, const std::string& what, nb::object* keep);

}  // namespace kvpool::py
