// A user's CUDA C++ kernel that calls symm's device API (symm_device.cuh): it produces its
// rank's data, all-reduces it in place across the ranks, then all-gathers a small tag from
// every rank, all in one launch. One block: block b of each rank synchronizes only with block b
// of the others, so a kernel that writes the data it then reduces runs one block (see the
// rules in symm_device.cuh).
//
// Built two ways (examples/cuda/Makefile): linked at build time into device_allreduce with
// `nvcc -rdc=true ... -lsymm_device`, and compiled to PTX (`nvcc -ptx -rdc=true`) for
// jit_link, which links it with symm_device.ptx at run time.
#include "fused.h"
#include "symm_device.cuh"

extern "C" __global__ void fused_all_reduce_gather(const symmDeviceContext* ctx, float* window,
                                                   unsigned long long count, int rank,
                                                   int* status) {
  float* data = window;
  float* gathered = window + fused_gathered_at(count);
  float* tag = window + fused_tag_at(count, ctx->world_size);
  for (unsigned long long i = threadIdx.x; i < count; i += blockDim.x) {
    data[i] = fused_input(rank, i);
  }
  if (threadIdx.x < FUSED_TAG) tag[threadIdx.x] = fused_tag(rank, threadIdx.x);
  // Every thread calls, with the same arguments.
  symmDeviceStatus_t s = symm::all_reduce(ctx, data, count, symmSum);
  if (s == symmDeviceSuccess) s = symm::all_gather(ctx, tag, gathered, FUSED_TAG);
  if (s == symmDeviceSuccess) s = symm::barrier(ctx);
  if (threadIdx.x == 0) status[blockIdx.x] = s;
}
