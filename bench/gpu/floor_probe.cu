// The floor of a small all-reduce of virtual ranks on one GPU, timed as symm-perf times a
// collective (issue 22's goal: 8 ranks x 1 KiB within 1.5x "launch + one flag round trip").
//
// symm-perf captures one grouped call into a CUDA graph (with every rank of the process on
// one GPU, that is one kernel launch, the grid split among the ranks, and one event record on
// the caller's stream) and times each replay with CUDA events. This program builds the same
// graph shapes with kernels that do nothing but the floor's parts, for 1, 2, 4 and 8 ranks
// (one block of 512 threads per rank, as the LL kernel runs small calls):
//   empty        the kernel returns at once;
//   flag round   thread 0 of each block stores its epoch into its flag (st.release.sys, device
//                memory) and waits until every other block's flag holds it (ld.acquire.sys):
//                one cross-rank barrier, as each symm call passes at least one;
//   read first   the flag round, after thread 0 read a word of pinned host memory and used
//                the value before storing its flag (the barrier kernels' start until
//                2026-11-27: the abort word read before announcing);
//   read overlap the flag round, thread 0 issuing that read right after storing its flag and
//                using the value only after the wait (the start barrier now);
//   + event      the flag round followed by an event record in the same capture, as symm's
//                launch records one on the caller's stream.
// Median of 200 replays after 20, microseconds.
//
//   nvcc -O2 -arch=sm_90 floor_probe.cu -o floor_probe && ./floor_probe
#include "probe.h"

#define MAX_BLOCKS 8
#define FLAG_STRIDE 32 // one 128-byte line per flag

__global__ void empty_kernel(unsigned *, unsigned *) {}

enum Read { NO_READ = 0, READ_FIRST = 1, READ_OVERLAP = 2 };

// flags[b * FLAG_STRIDE]: block b's epoch, as its peers see it; epochs[b]: block b's own count
// of rounds (device memory, read and written by thread 0 of block b only); host_word: a word
// of pinned host memory, always 0; sink: where a value that is never 0 would go.
__global__ void flag_round(unsigned *flags, unsigned *epochs, const unsigned *host_word,
                           unsigned *sink, int read) {
  if (threadIdx.x == 0) {
    unsigned epoch = epochs[blockIdx.x] + 1;
    unsigned looked = 0;
    if (read == READ_FIRST) {
      asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(looked) : "l"(host_word) : "memory");
      epoch += looked; // the store below waits for the read
    }
    epochs[blockIdx.x] = epoch;
    unsigned *own = flags + blockIdx.x * FLAG_STRIDE;
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(own), "r"(epoch) : "memory");
    if (read == READ_OVERLAP) {
      asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(looked) : "l"(host_word) : "memory");
    }
    for (unsigned b = 0; b < gridDim.x; b++) {
      const unsigned *peer = flags + b * FLAG_STRIDE;
      unsigned seen;
      do {
        asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(peer) : "memory");
      } while ((int)(seen - epoch) < 0);
    }
    if (read == READ_OVERLAP && looked != 0) sink[blockIdx.x] = looked; // used after the wait
  }
  __syncthreads();
}

struct Buffers {
  unsigned *flags, *epochs, *host_word, *sink;
};

// Median microseconds of one replay of a graph holding one launch on `blocks` blocks (the
// empty kernel when `read` < 0, else the flag round with that read), followed by an event
// record when `with_event`.
static float time_graph(int blocks, int read, bool with_event, Buffers b, cudaStream_t stream) {
  cudaEvent_t marker;
  CHECK(cudaEventCreateWithFlags(&marker, cudaEventDisableTiming));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  if (read < 0) {
    empty_kernel<<<blocks, 512, 0, stream>>>(b.flags, b.epochs);
  } else {
    flag_round<<<blocks, 512, 0, stream>>>(b.flags, b.epochs, b.host_word, b.sink, read);
  }
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
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaEventDestroy(marker));
  return median(t, RUNS);
}

// Zero the flags and epochs, in order with the graphs launched on `stream`.
static void reset(Buffers b, cudaStream_t stream) {
  CHECK(cudaMemsetAsync(b.flags, 0, MAX_BLOCKS * FLAG_STRIDE * sizeof(unsigned), stream));
  CHECK(cudaMemsetAsync(b.epochs, 0, MAX_BLOCKS * sizeof(unsigned), stream));
}

int main(void) {
  Buffers b;
  unsigned *host;
  CHECK(cudaMalloc((void **)&b.flags, MAX_BLOCKS * FLAG_STRIDE * sizeof(unsigned)));
  CHECK(cudaMalloc((void **)&b.epochs, MAX_BLOCKS * sizeof(unsigned)));
  CHECK(cudaMalloc((void **)&b.sink, MAX_BLOCKS * sizeof(unsigned)));
  CHECK(cudaHostAlloc((void **)&host, 128, cudaHostAllocMapped));
  host[0] = 0;
  CHECK(cudaHostGetDevicePointer((void **)&b.host_word, host, 0));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  printf("# one graph replay, median us of 200 (blocks of 512 threads, one per rank)\n");
  printf("%6s %8s %11s %11s %13s %8s\n", "ranks", "empty", "flag round", "read first",
         "read overlap", "+ event");
  int ranks[] = {1, 2, 4, 8};
  for (int i = 0; i < 4; i++) {
    int r = ranks[i];
    float t[5];
    t[0] = time_graph(r, -1, false, b, stream);
    // Each flag-round graph starts from zero: every replay runs all blocks, in step.
    int reads[4] = {NO_READ, READ_FIRST, READ_OVERLAP, NO_READ};
    for (int k = 0; k < 4; k++) {
      reset(b, stream);
      t[k + 1] = time_graph(r, reads[k], k == 3, b, stream);
    }
    printf("%6d %8.2f %11.2f %11.2f %13.2f %8.2f\n", r, t[0], t[1], t[2], t[3], t[4]);
  }
  CHECK(cudaFree(b.flags));
  CHECK(cudaFree(b.epochs));
  CHECK(cudaFree(b.sink));
  CHECK(cudaFreeHost(host));
  return 0;
}
