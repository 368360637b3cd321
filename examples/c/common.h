/* Helpers shared by the examples: error checks and copies into symmMemAlloc memory, which is
 * host memory on the host backend and device memory on the cuda backend (build with
 * `make CUDA=1` to use the latter; that links the CUDA driver). */
#ifndef SYMM_EXAMPLE_COMMON_H
#define SYMM_EXAMPLE_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "symm.h"
#ifdef SYMM_EXAMPLE_CUDA
#include <cuda.h>
#endif

#define SYMMCHECK(call, comm)                                                            \
  do {                                                                                   \
    symmResult_t r_ = (call);                                                            \
    if (r_ != symmSuccess) {                                                             \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,                \
              symmGetErrorString(r_), symmGetLastError(comm));                          \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static inline int backend_is_cuda(symmComm_t comm) {
  const char* name = NULL;
  SYMMCHECK(symmCommGetBackend(comm, &name), comm);
  return strcmp(name, "cuda") == 0;
}

/* Copy between the host and memory from symmMemAlloc. */
static inline void copy_buffer(symmComm_t comm, void* dst, const void* src, size_t bytes,
                               int to_symm) {
  if (!backend_is_cuda(comm)) {
    memcpy(dst, src, bytes);
    return;
  }
#ifdef SYMM_EXAMPLE_CUDA
  CUcontext ctx;
  CUdevice dev;
  int ordinal;
  SYMMCHECK(symmCommCuDevice(comm, &ordinal), comm);
  if (cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    fprintf(stderr, "cannot make device %d current\n", ordinal);
    exit(1);
  }
  CUresult r = to_symm ? cuMemcpyHtoD((CUdeviceptr)dst, src, bytes)
                       : cuMemcpyDtoH(dst, (CUdeviceptr)src, bytes);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuMemcpy failed: %d\n", (int)r);
    exit(1);
  }
#else
  (void)dst; (void)src; (void)bytes; (void)to_symm;
  fprintf(stderr, "the cuda backend is active: rebuild the examples with `make CUDA=1`, "
                  "or run with SYMM_BACKEND=host\n");
  exit(1);
#endif
}

/* Wait for the comm's work (the cuda backend is asynchronous). */
static inline void finish(symmComm_t comm) {
#ifdef SYMM_EXAMPLE_CUDA
  if (backend_is_cuda(comm)) cuCtxSynchronize();
#else
  (void)comm;
#endif
}

/* A non-blocking stream on the comm's device (cuda backend), else NULL. */
static inline symmStream_t rank_stream(symmComm_t comm) {
#ifdef SYMM_EXAMPLE_CUDA
  if (backend_is_cuda(comm)) {
    int ordinal;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    SYMMCHECK(symmCommCuDevice(comm, &ordinal), comm);
    if (cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
        cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
      fprintf(stderr, "cannot create a non-blocking stream on device %d\n", ordinal);
      exit(1);
    }
    return (symmStream_t)stream;
  }
#else
  (void)comm;
#endif
  return NULL;
}

static inline double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The value rank `rank` contributes at index `i`; sums of these are exact in float. */
static inline float input_value(int rank, size_t i) {
  return (float)(rank + 1) + 0.25f * (float)(i % 13);
}

/* The expected all-reduce sum at index i, computed independently in double. */
static inline double expected_sum(int nranks, size_t i) {
  double s = 0.0;
  for (int r = 0; r < nranks; r++) s += (double)(r + 1) + 0.25 * (double)(i % 13);
  return s;
}

#endif
