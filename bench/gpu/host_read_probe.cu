// Does a read of pinned host memory from many blocks at once cost one PCIe round trip, or one
// per block (same-address reads serialized)? Each symm kernel that passes cross-rank barriers
// reads its rank's abort word (pinned host memory) once per block at start; on an H100 the
// barrier kernels' time grew by about 2 us per block per rank where the LL kernel's (no such
// read) did not (bench/RESULTS.md, second GPU run).
//
// For each block count: one launch in which thread 0 of every block reads a host word with
// ld.relaxed.sys (as the kernels do), all blocks the same word, then each block its own
// 128-byte line; and a launch with no read. Median of 50 launches, CUDA events.
//
//   nvcc -O2 -arch=sm_90 host_read_probe.cu -o host_read_probe && ./host_read_probe
#include "probe.h"

// mode 0: no read; 1: every block reads word 0; 2: block b reads word b * 32 (own line).
__global__ void probe(const unsigned *words, int mode, unsigned *sink) {
  unsigned v = 0;
  if (threadIdx.x == 0 && mode != 0) {
    const unsigned *p = words + (mode == 2 ? blockIdx.x * 32 : 0);
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  }
  v = __syncthreads_or(v != 0);
  if (v && threadIdx.x == 0) sink[blockIdx.x] = v;
}

int main(void) {
  unsigned *words, *dwords, *sink;
  CHECK(cudaHostAlloc((void **)&words, 1024 * 32 * sizeof(unsigned), cudaHostAllocMapped));
  for (int i = 0; i < 1024 * 32; i++) words[i] = 0;
  CHECK(cudaHostGetDevicePointer((void **)&dwords, words, 0));
  CHECK(cudaMalloc((void **)&sink, 1024 * sizeof(unsigned)));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  const char *names[3] = {"no read", "same word", "own line"};
  printf("# blocks x 512 threads; median us of 50 launches\n");
  printf("%8s %10s %10s %10s\n", "blocks", names[0], names[1], names[2]);
  int counts[] = {1, 2, 4, 8, 16, 32, 64, 128};
  for (int c = 0; c < 8; c++) {
    printf("%8d", counts[c]);
    for (int mode = 0; mode < 3; mode++) {
      float t[50];
      for (int i = 0; i < 53; i++) {
        CHECK(cudaEventRecord(a));
        probe<<<counts[c], 512>>>(dwords, mode, sink);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        if (i >= 3) CHECK(cudaEventElapsedTime(&t[i - 3], a, b));
      }
      printf(" %10.2f", median(t, 50) * 1000.0f);
    }
    printf("\n");
  }
  CHECK(cudaGetLastError());
  return 0;
}
