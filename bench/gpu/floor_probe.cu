// The floor of a small all-reduce of virtual ranks on one GPU, timed as symm-perf times a
// collective (issue 22's goal: 8 ranks x 1 KiB within 1.5x "launch + one flag round trip").
//
// symm-perf captures one grouped call into a CUDA graph (with every rank of the process on
// one GPU, that is one kernel launch, the grid split among the ranks, and one event record on
// the caller's stream) and times each replay with CUDA events. This program builds the same
// graph shapes with kernels that do nothing but the floor's parts, for 1, 2, 4 and 8 ranks
// (one block of 512 threads per rank, as the LL kernel runs small calls):
//   empty      the kernel returns at once;
//   flag round thread 0 of each block stores its epoch into its flag (st.release.sys, device
//              memory) and waits until every other block's flag holds it (ld.acquire.sys):
//              one cross-rank barrier, as each symm call passes at least one;
//   + event    the flag-round kernel followed by an event record in the same capture, as
//              symm's launch records one on the caller's stream.
// Median of 200 replays after 20, microseconds.
//
//   nvcc -O2 -arch=sm_90 floor_probe.cu -o floor_probe && ./floor_probe
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e = (x);                                                              \
    if (e != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

#define MAX_BLOCKS 8
#define FLAG_STRIDE 32 // one 128-byte line per flag

__global__ void empty_kernel(unsigned *, unsigned *) {}

// flags[b * FLAG_STRIDE]: block b's epoch, as its peers see it; epochs[b]: block b's own count
// of rounds (device memory, read and written by thread 0 of block b only).
__global__ void flag_round(unsigned *flags, unsigned *epochs) {
  if (threadIdx.x == 0) {
    unsigned epoch = epochs[blockIdx.x] + 1;
    epochs[blockIdx.x] = epoch;
    unsigned *own = flags + blockIdx.x * FLAG_STRIDE;
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(own), "r"(epoch) : "memory");
    for (unsigned b = 0; b < gridDim.x; b++) {
      const unsigned *peer = flags + b * FLAG_STRIDE;
      unsigned seen;
      do {
        asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(peer) : "memory");
      } while ((int)(seen - epoch) < 0);
    }
  }
  __syncthreads();
}

static int cmp(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

// Median microseconds of one replay of a graph holding one launch of `kernel` on `blocks`
// blocks, followed by an event record when `with_event`.
static float time_graph(void (*kernel)(unsigned *, unsigned *), int blocks, bool with_event,
                        unsigned *flags, unsigned *epochs, cudaStream_t stream) {
  cudaEvent_t marker;
  CHECK(cudaEventCreateWithFlags(&marker, cudaEventDisableTiming));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  kernel<<<blocks, 512, 0, stream>>>(flags, epochs);
  if (with_event) CHECK(cudaEventRecord(marker, stream));
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  enum { WARM = 20, RUNS = 200 };
  static cudaEvent_t ev[RUNS + 1];
  static bool made = false;
  if (!made) {
    for (int i = 0; i <= RUNS; i++) CHECK(cudaEventCreate(&ev[i]));
    made = true;
  }
  for (int i = 0; i < WARM; i++) CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaEventRecord(ev[0], stream));
  for (int i = 1; i <= RUNS; i++) {
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(ev[i], stream));
  }
  CHECK(cudaStreamSynchronize(stream));
  float t[RUNS];
  for (int i = 0; i < RUNS; i++) {
    CHECK(cudaEventElapsedTime(&t[i], ev[i], ev[i + 1]));
    t[i] *= 1000.0f;
  }
  qsort(t, RUNS, sizeof(float), cmp);
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaEventDestroy(marker));
  return t[RUNS / 2];
}

// Zero the flags and epochs, in order with the graphs launched on `stream`.
static void reset(unsigned *flags, unsigned *epochs, cudaStream_t stream) {
  CHECK(cudaMemsetAsync(flags, 0, MAX_BLOCKS * FLAG_STRIDE * sizeof(unsigned), stream));
  CHECK(cudaMemsetAsync(epochs, 0, MAX_BLOCKS * sizeof(unsigned), stream));
}

int main(void) {
  unsigned *flags, *epochs;
  CHECK(cudaMalloc((void **)&flags, MAX_BLOCKS * FLAG_STRIDE * sizeof(unsigned)));
  CHECK(cudaMalloc((void **)&epochs, MAX_BLOCKS * sizeof(unsigned)));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  reset(flags, epochs, stream);
  printf("# one graph replay, median us of 200 (blocks of 512 threads, one per rank)\n");
  printf("%6s %10s %11s %10s\n", "ranks", "empty", "flag round", "+ event");
  int ranks[] = {1, 2, 4, 8};
  for (int i = 0; i < 4; i++) {
    int r = ranks[i];
    float empty = time_graph(empty_kernel, r, false, flags, epochs, stream);
    // Each flag-round graph keeps every block's epochs in step: every replay runs all blocks.
    reset(flags, epochs, stream);
    float round = time_graph(flag_round, r, false, flags, epochs, stream);
    reset(flags, epochs, stream);
    float event = time_graph(flag_round, r, true, flags, epochs, stream);
    printf("%6d %10.2f %11.2f %10.2f\n", r, empty, round, event);
  }
  CHECK(cudaFree(flags));
  CHECK(cudaFree(epochs));
  return 0;
}
