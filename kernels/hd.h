/*
 * BRG_HD: a function the CUDA kernels call as well as the host code (the
 * plan of schedule.h, the element operations of elem.h, the ring kernel's
 * arguments of cuda/ring_args.h): __host__ __device__ under nvcc, nothing
 * elsewhere.
 */
#ifndef BRG_HD_H
#define BRG_HD_H

#if defined(__CUDACC__)
#define BRG_HD __host__ __device__
#else
#define BRG_HD
#endif

#endif
