// A CUDA C++ program whose own kernel (kernel.cu) calls symm's device API, linked at build time:
//
//   nvcc -rdc=true -arch=sm_90 -I<include> device_allreduce.cu kernel.cu \
//        -L<lib> -lsymm_device -lsymm
//
// usage: device_allreduce [nranks=4] [count=100003]
// Every rank is a communicator on device 0 (several ranks per GPU, as on a one-GPU machine);
// each launches the kernel on its own stream. The kernel produces the rank's data, all-reduces
// it and all-gathers a tag; the host checks every value against a reference in double.
#include <cuda_runtime.h>
#include <stdlib.h>

#include "fused.h"
#include "symm.h"
#include "symm_device.cuh"

extern "C" __global__ void fused_all_reduce_gather(const symmDeviceContext* ctx, float* window,
                                                   unsigned long long count, int rank,
                                                   int* status);

#define MAX_RANKS 16

#define SYMMCHECK(call, comm)                                                     \
  do {                                                                            \
    symmResult_t r_ = (call);                                                     \
    if (r_ != symmSuccess) {                                                      \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,         \
              symmGetErrorString(r_), symmGetLastError(comm));                   \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

#define CUDACHECK(call)                                                           \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call,             \
              cudaGetErrorString(e_));                                           \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

int main(int argc, char** argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 4;
  size_t count = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 100003;
  if (nranks < 1 || nranks > MAX_RANKS) {
    fprintf(stderr, "usage: %s [nranks 1..%d] [count]\n", argv[0], MAX_RANKS);
    return 2;
  }
  size_t bytes = fused_window_bytes(count, nranks);
  symmComm_t comms[MAX_RANKS];
  int devices[MAX_RANKS] = {0};
  void* buffers[MAX_RANKS];
  symmWindow_t windows[MAX_RANKS];
  const void* contexts[MAX_RANKS];
  cudaStream_t streams[MAX_RANKS];

  SYMMCHECK(symmCommInitAll(comms, nranks, devices), NULL);
  for (int r = 0; r < nranks; r++) SYMMCHECK(symmMemAlloc(comms[r], &buffers[r], bytes), comms[r]);
  SYMMCHECK(symmGroupStart(), NULL);
  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmCommWindowRegister(comms[r], buffers[r], bytes, &windows[r],
                                     SYMM_WIN_COLL_SYMMETRIC),
              comms[r]);
  }
  SYMMCHECK(symmGroupEnd(), NULL);
  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmCommGetDeviceContext(comms[r], windows[r], &contexts[r]), comms[r]);
  }

  CUDACHECK(cudaSetDevice(0));
  int* status;
  CUDACHECK(cudaMalloc(&status, sizeof(int) * nranks));
  CUDACHECK(cudaMemset(status, 0xff, sizeof(int) * nranks));
  for (int r = 0; r < nranks; r++) {
    CUDACHECK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
  }
  for (int r = 0; r < nranks; r++) {
    fused_all_reduce_gather<<<1, FUSED_THREADS, 0, streams[r]>>>(
        (const symmDeviceContext*)contexts[r], (float*)buffers[r], count, r, status + r);
    CUDACHECK(cudaGetLastError());
  }
  CUDACHECK(cudaDeviceSynchronize());

  float* host = (float*)malloc(bytes);
  int statuses[MAX_RANKS];
  CUDACHECK(cudaMemcpy(statuses, status, sizeof(int) * nranks, cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (int r = 0; r < nranks; r++) {
    CUDACHECK(cudaMemcpy(host, buffers[r], bytes, cudaMemcpyDeviceToHost));
    wrong += fused_check(r, nranks, count, host, &statuses[r], 1);
  }
  for (int r = 0; r < nranks; r++) CUDACHECK(cudaStreamDestroy(streams[r]));
  for (int r = 0; r < nranks; r++) SYMMCHECK(symmCommWindowDeregister(comms[r], windows[r]), comms[r]);
  for (int r = 0; r < nranks; r++) SYMMCHECK(symmMemFree(comms[r], buffers[r]), comms[r]);
  for (int r = 0; r < nranks; r++) SYMMCHECK(symmCommDestroy(comms[r]), NULL);
  CUDACHECK(cudaFree(status));
  free(host);
  if (wrong) {
    fprintf(stderr, "device_allreduce: %zu wrong values\n", wrong);
    return 1;
  }
  printf("device_allreduce: %d ranks x %zu floats: all-reduce and all-gather from a user kernel "
         "correct\n", nranks, count);
  return 0;
}
