/* A C program that loads a user kernel calling symm's device API from PTX, linking it with
 * symm's device library at run time (cuLinkCreate / cuLinkAddFile / cuLinkComplete): the path
 * for programs that load PTX rather than build with nvcc -rdc (and the one the simulated GPU
 * runs, as it executes PTX only).
 *
 * usage: jit_link KERNEL.ptx SYMM_DEVICE_LIBRARY [nranks=4] [count=4099]
 * KERNEL.ptx is kernel.cu compiled with `nvcc -ptx -rdc=true`. SYMM_DEVICE_LIBRARY is either
 * target/device-lib/libsymm_device.a (from `cargo xtask device-lib`): relocatable SASS for
 * sm_80 and sm_90, which the driver links without compiling (CU_JIT_INPUT_LIBRARY; its
 * compute_80 PTX serves newer GPUs), or symm_device.ptx next to it (CU_JIT_INPUT_PTX),
 * which the driver JIT-compiles whole: tens of seconds for its 10 MB. The input kind follows
 * the file's extension (.a, .o, .fatbin, .cubin, else PTX), as it would in a user's loader.
 * The time the link took is printed. Every rank is a
 * communicator on device 0; each launches the kernel on its own stream; the host checks every
 * value against a reference computed in double. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime under -std=c11 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fused.h"
#include "symm.h"

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

#define CUCHECK(call)                                                             \
  do {                                                                            \
    CUresult e_ = (call);                                                         \
    if (e_ != CUDA_SUCCESS) {                                                     \
      const char* s_ = NULL;                                                      \
      cuGetErrorString(e_, &s_);                                                  \
      fprintf(stderr, "%s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, #call,        \
              (int)e_, s_ ? s_ : "?");                                            \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

/* The linker input kind of `path`, by its extension. */
static CUjitInputType input_kind(const char* path) {
  const char* dot = strrchr(path, '.');
  if (dot == NULL) return CU_JIT_INPUT_PTX;
  if (strcmp(dot, ".a") == 0) return CU_JIT_INPUT_LIBRARY;
  if (strcmp(dot, ".o") == 0) return CU_JIT_INPUT_OBJECT;
  if (strcmp(dot, ".fatbin") == 0) return CU_JIT_INPUT_FATBINARY;
  if (strcmp(dot, ".cubin") == 0) return CU_JIT_INPUT_CUBIN;
  return CU_JIT_INPUT_PTX;
}

static double seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s KERNEL.ptx SYMM_DEVICE_LIBRARY [nranks] [count]\n", argv[0]);
    return 2;
  }
  int nranks = argc > 3 ? atoi(argv[3]) : 4;
  size_t count = argc > 4 ? (size_t)strtoull(argv[4], NULL, 10) : 4099;
  if (nranks < 1 || nranks > MAX_RANKS) {
    fprintf(stderr, "nranks must be 1..%d\n", MAX_RANKS);
    return 2;
  }
  size_t bytes = fused_window_bytes(count, nranks);
  symmComm_t comms[MAX_RANKS];
  int devices[MAX_RANKS] = {0};
  void* buffers[MAX_RANKS];
  symmWindow_t windows[MAX_RANKS];
  const void* contexts[MAX_RANKS];
  CUstream streams[MAX_RANKS];

  SYMMCHECK(symmCommInitAll(comms, nranks, devices), NULL);
  const char* backend = NULL;
  SYMMCHECK(symmCommGetBackend(comms[0], &backend), comms[0]);
  if (backend[0] != 'c') {
    fprintf(stderr, "jit_link needs the cuda backend (got %s)\n", backend);
    return 1;
  }
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

  /* The library made device 0's primary context current on this thread. */
  CUdevice dev;
  CUcontext ctx;
  CUCHECK(cuDeviceGet(&dev, 0));
  CUCHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CUCHECK(cuCtxSetCurrent(ctx));

  /* Link the user's PTX with symm's device library (the time includes loading the image). */
  double link_start = seconds_now();
  char error_log[8192] = {0};
  CUjit_option options[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[2] = {error_log, (void*)(size_t)sizeof(error_log)};
  CUlinkState link;
  CUCHECK(cuLinkCreate(2, options, values, &link));
  CUresult linked = cuLinkAddFile(link, input_kind(argv[1]), argv[1], 0, NULL, NULL);
  if (linked == CUDA_SUCCESS) {
    linked = cuLinkAddFile(link, input_kind(argv[2]), argv[2], 0, NULL, NULL);
  }
  void* image = NULL;
  size_t image_bytes = 0;
  if (linked == CUDA_SUCCESS) linked = cuLinkComplete(link, &image, &image_bytes);
  if (linked != CUDA_SUCCESS) {
    fprintf(stderr, "linking %s with %s failed (%d): %s\n", argv[1], argv[2], (int)linked,
            error_log);
    return 1;
  }
  CUmodule module;
  CUfunction kernel;
  CUCHECK(cuModuleLoadData(&module, image));
  CUCHECK(cuLinkDestroy(link));
  CUCHECK(cuModuleGetFunction(&kernel, module, "fused_all_reduce_gather"));
  double link_seconds = seconds_now() - link_start;

  CUdeviceptr status;
  CUCHECK(cuMemAlloc(&status, sizeof(int) * nranks));
  CUCHECK(cuMemsetD8(status, 0xff, sizeof(int) * (size_t)nranks));
  for (int r = 0; r < nranks; r++) CUCHECK(cuStreamCreate(&streams[r], CU_STREAM_NON_BLOCKING));
  for (int r = 0; r < nranks; r++) {
    unsigned long long n = count;
    int rank = r;
    CUdeviceptr ctx_arg = (CUdeviceptr)contexts[r];
    CUdeviceptr window = (CUdeviceptr)buffers[r];
    CUdeviceptr status_r = status + sizeof(int) * (size_t)r;
    void* args[] = {&ctx_arg, &window, &n, &rank, &status_r};
    CUCHECK(cuLaunchKernel(kernel, 1, 1, 1, FUSED_THREADS, 1, 1, 0, streams[r], args, NULL));
  }
  CUCHECK(cuCtxSynchronize());

  float* host = malloc(bytes);
  int statuses[MAX_RANKS];
  CUCHECK(cuMemcpyDtoH(statuses, status, sizeof(int) * nranks));
  size_t wrong = 0;
  for (int r = 0; r < nranks; r++) {
    CUCHECK(cuMemcpyDtoH(host, (CUdeviceptr)buffers[r], bytes));
    wrong += fused_check(r, nranks, count, host, &statuses[r], 1);
  }
  for (int r = 0; r < nranks; r++) CUCHECK(cuStreamDestroy(streams[r]));
  CUCHECK(cuMemFree(status));
  CUCHECK(cuModuleUnload(module));
  for (int r = 0; r < nranks; r++) SYMMCHECK(symmCommWindowDeregister(comms[r], windows[r]), comms[r]);
  for (int r = 0; r < nranks; r++) SYMMCHECK(symmMemFree(comms[r], buffers[r]), comms[r]);
  for (int r = 0; r < nranks; r++) SYMMCHECK(symmCommDestroy(comms[r]), NULL);
  free(host);
  if (wrong) {
    fprintf(stderr, "jit_link: %zu wrong values\n", wrong);
    return 1;
  }
  printf("jit_link: %d ranks x %zu floats: all-reduce and all-gather from a run-time linked "
         "user kernel correct (%s linked and loaded in %.2f s)\n", nranks, count, argv[2],
         link_seconds);
  return 0;
}
