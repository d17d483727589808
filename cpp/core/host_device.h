// ACCORDION_HOST_DEVICE: a function the CPU's code and the CUDA kernels share (__host__ __device__
// where nvcc compiles it, a plain inline function elsewhere).
#pragma once

#ifdef __CUDACC__
#define ACCORDION_HOST_DEVICE __host__ __device__
#else
#define ACCORDION_HOST_DEVICE
#endif
