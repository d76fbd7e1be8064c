#pragma once
// KVPOOL_HOST_DEVICE: a function written once for both sides, compiled by the host compiler for a
// CPU twin and by nvcc (__host__ __device__) for a CUDA kernel, so both compute the same bits from
// the same code.

#ifdef __CUDACC__
#define KVPOOL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KVPOOL_HOST_DEVICE inline
#endif
