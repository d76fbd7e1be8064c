#pragma once
// kvpool._native's kernel entry points (kernel_*), over include/kvpool/kernels.h. kvpool/kernels.py
// is the Python face (names, dataclasses, allocation of outputs); these check every buffer's
// size, element type, contiguity and device against the layout before a kernel runs, so a
// mistake is an InvalidArgument with the argument's name, never a wild write.
//
// Buffers on the CPU run the CPU twins; CUDA tensors (DLPack device cuda) run the CUDA kernels
// on `stream` (0: the default stream), asynchronously; in a build without CUDA that raises
// Unimplemented. The GIL is released while a kernel runs.

#include <nanobind/nanobind.h>

namespace kvpool::py {

namespace nb = nanobind;

void RegisterKernels(nb::module_& m);

}  // namespace kvpool::py
