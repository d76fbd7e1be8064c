// kvpool._native: the compiled half of the kvpool package. Users import `kvpool`, which
// re-exports these names; kvpool.kernels wraps the kernel_* functions.
#include <nanobind/nanobind.h>

#include "client.h"
#include "errors.h"
#include "kernels.h"
#include "keys.h"

NB_MODULE(_native, m) {
  m.doc() = "kvpool's C++ client and KV kernels (bundled; see kvpool/_native.pyi)";
  kvpool::py::RegisterErrors(m);
  kvpool::py::RegisterKeys(m);
  kvpool::py::RegisterClient(m);
  kvpool::py::RegisterKernels(m);
}
