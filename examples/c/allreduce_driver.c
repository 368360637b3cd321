/* symm all-reduce in a program that opens the CUDA driver itself, as CUDA's runtime does
 * (dlopen("libcuda.so.1")): the program and symm must share one driver, so that the device
 * memory symm allocates is the program's too. The program makes device 0's primary context
 * current (what cudaSetDevice(0) does), fills every rank's window with cuMemcpyHtoD,
 * all-reduces, waits with cuCtxSynchronize and reads the sums back with cuMemcpyDtoH, checking
 * every element against the exact sum.
 *
 * usage: allreduce_driver [nranks=3] [count=4099]
 * Built by `make CUDA=1` only (cuda.h gives the driver's types); it needs the cuda backend. All
 * ranks are placed on device 0. */
#include <dlfcn.h>
#include "common.h"

#define MAX_RANKS 64

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*device_get_fn)(CUdevice*, int);
typedef CUresult (*primary_ctx_retain_fn)(CUcontext*, CUdevice);
typedef CUresult (*primary_ctx_release_fn)(CUdevice);
typedef CUresult (*ctx_set_current_fn)(CUcontext);
typedef CUresult (*ctx_synchronize_fn)(void);
typedef CUresult (*memcpy_htod_fn)(CUdeviceptr, const void*, size_t);
typedef CUresult (*memcpy_dtoh_fn)(void*, CUdeviceptr, size_t);
typedef CUresult (*get_error_name_fn)(CUresult, const char**);

/* The driver's functions, looked up by their exported names (cuda.h maps some of the names
 * programs call to versioned symbols: cuMemcpyHtoD is cuMemcpyHtoD_v2). */
static struct {
  init_fn init;
  device_get_fn device_get;
  primary_ctx_retain_fn primary_ctx_retain;
  primary_ctx_release_fn primary_ctx_release;
  ctx_set_current_fn ctx_set_current;
  ctx_synchronize_fn ctx_synchronize;
  memcpy_htod_fn memcpy_htod;
  memcpy_dtoh_fn memcpy_dtoh;
  get_error_name_fn get_error_name;
} cu;

static void* symbol(void* library, const char* name) {
  void* address = dlsym(library, name);
  if (!address) {
    fprintf(stderr, "libcuda.so.1 does not export %s\n", name);
    exit(1);
  }
  return address;
}

/* Exit with a message when the driver call `call` failed. */
static void check(CUresult r, const char* call) {
  if (r == CUDA_SUCCESS) return;
  const char* name = NULL;
  if (cu.get_error_name(r, &name) != CUDA_SUCCESS || !name) name = "unknown error";
  fprintf(stderr, "%s failed: %s (%d)\n", call, name, (int)r);
  exit(1);
}

int main(int argc, char** argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 3;
  size_t count = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 4099;
  if (nranks < 1 || nranks > MAX_RANKS || count < 1) {
    fprintf(stderr, "usage: %s [nranks 1..%d] [count >= 1]\n", argv[0], MAX_RANKS);
    return 2;
  }
  size_t bytes = count * sizeof(float);

  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    fprintf(stderr, "cannot open libcuda.so.1: %s\n", dlerror());
    return 1;
  }
  cu.init = (init_fn)symbol(library, "cuInit");
  cu.device_get = (device_get_fn)symbol(library, "cuDeviceGet");
  cu.primary_ctx_retain = (primary_ctx_retain_fn)symbol(library, "cuDevicePrimaryCtxRetain");
  cu.primary_ctx_release = (primary_ctx_release_fn)symbol(library, "cuDevicePrimaryCtxRelease_v2");
  cu.ctx_set_current = (ctx_set_current_fn)symbol(library, "cuCtxSetCurrent");
  cu.ctx_synchronize = (ctx_synchronize_fn)symbol(library, "cuCtxSynchronize");
  cu.memcpy_htod = (memcpy_htod_fn)symbol(library, "cuMemcpyHtoD_v2");
  cu.memcpy_dtoh = (memcpy_dtoh_fn)symbol(library, "cuMemcpyDtoH_v2");
  cu.get_error_name = (get_error_name_fn)symbol(library, "cuGetErrorName");

  /* Device 0's primary context, current on this thread: the context symm's cuda backend uses. */
  CUdevice device;
  CUcontext context;
  check(cu.init(0), "cuInit");
  check(cu.device_get(&device, 0), "cuDeviceGet");
  check(cu.primary_ctx_retain(&context, device), "cuDevicePrimaryCtxRetain");
  check(cu.ctx_set_current(context), "cuCtxSetCurrent");

  symmComm_t comms[MAX_RANKS];
  int devices[MAX_RANKS] = {0};
  void* buffers[MAX_RANKS];
  symmWindow_t windows[MAX_RANKS];
  SYMMCHECK(symmCommInitAll(comms, nranks, devices), NULL);
  if (!backend_is_cuda(comms[0])) {
    fprintf(stderr, "the cuda backend is not active: run with SYMM_BACKEND=cuda\n");
    return 1;
  }
  /* symm may open the driver as libcuda.so: that must be this same library. */
  int two_drivers = 0;
  void* other = dlopen("libcuda.so", RTLD_NOW | RTLD_NOLOAD);
  if (other) {
    two_drivers = other != library;
    dlclose(other);
  }
  if (two_drivers) {
    fprintf(stderr, "two CUDA drivers in this process: libcuda.so and libcuda.so.1 are "
                    "different libraries\n");
  }

  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmMemAlloc(comms[r], &buffers[r], bytes), comms[r]);
  }
  SYMMCHECK(symmGroupStart(), NULL);
  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmCommWindowRegister(comms[r], buffers[r], bytes, &windows[r],
                                     SYMM_WIN_COLL_SYMMETRIC), comms[r]);
  }
  SYMMCHECK(symmGroupEnd(), NULL);

  float* host = malloc(bytes);
  if (!host) {
    fprintf(stderr, "out of host memory\n");
    return 1;
  }
  for (int r = 0; r < nranks; r++) {
    for (size_t i = 0; i < count; i++) host[i] = input_value(r, i);
    check(cu.memcpy_htod((CUdeviceptr)buffers[r], host, bytes), "cuMemcpyHtoD");
  }
  SYMMCHECK(symmGroupStart(), NULL);
  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmAllReduce(buffers[r], buffers[r], count, symmFloat32, symmSum, comms[r], NULL),
              comms[r]);
  }
  SYMMCHECK(symmGroupEnd(), NULL);
  check(cu.ctx_synchronize(), "cuCtxSynchronize");

  size_t wrong = 0;
  for (int r = 0; r < nranks; r++) {
    memset(host, 0, bytes);
    check(cu.memcpy_dtoh(host, (CUdeviceptr)buffers[r], bytes), "cuMemcpyDtoH");
    for (size_t i = 0; i < count; i++) {
      if ((double)host[i] != expected_sum(nranks, i)) {
        if (wrong == 0) {
          fprintf(stderr, "rank %d, element %zu: %g, expected %g\n", r, i, (double)host[i],
                  expected_sum(nranks, i));
        }
        wrong++;
      }
    }
  }

  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmCommWindowDeregister(comms[r], windows[r]), comms[r]);
    SYMMCHECK(symmMemFree(comms[r], buffers[r]), comms[r]);
    SYMMCHECK(symmCommDestroy(comms[r]), NULL);
  }
  check(cu.primary_ctx_release(device), "cuDevicePrimaryCtxRelease");
  free(host);

  printf("symm all-reduce through the program's own libcuda.so.1: %d ranks, %zu x float32 sum, "
         "in place\n", nranks, count);
  printf("result check: %s (%zu wrong elements of %zu)\n", wrong ? "FAILED" : "OK", wrong,
         count * (size_t)nranks);
  return wrong || two_drivers ? 1 : 0;
}
