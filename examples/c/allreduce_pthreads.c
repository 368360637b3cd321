/* symm all-reduce with one thread per rank: symmGetUniqueId, then each thread calls
 * symmCommInitRank, allocates, registers its window (collective, no group needed), all-reduces
 * in place, checks against a reference computed in double, deregisters, frees and destroys.
 *
 * On the cuda backend (`make CUDA=1`) each thread launches on its own non-blocking stream:
 * ranks sharing a GPU and launching separately wait for each other inside their kernels, so
 * they must not be serialized by the NULL (legacy) stream or blocking streams; symm refuses
 * those with symmInvalidUsage. On the host backend the stream is ignored (NULL).
 *
 * usage: allreduce_pthreads [nranks=4] [count=100003] */
#include <pthread.h>
#include "common.h"

#define MAX_RANKS 64

struct rank_args {
  int rank, nranks;
  size_t count;
  symmUniqueId id;
  size_t wrong;
};

/* Wait for the rank's stream and destroy it. */
static void finish_stream(symmComm_t comm, symmStream_t stream) {
#ifdef SYMM_EXAMPLE_CUDA
  if (stream != NULL) {
    if (cuStreamSynchronize((CUstream)stream) != CUDA_SUCCESS ||
        cuStreamDestroy((CUstream)stream) != CUDA_SUCCESS) {
      fprintf(stderr, "stream synchronize/destroy failed\n");
      exit(1);
    }
  }
#else
  (void)stream;
#endif
  finish(comm);
}

static void* rank_main(void* p) {
  struct rank_args* a = p;
  symmComm_t comm;
  void* buffer;
  symmWindow_t window;
  size_t bytes = a->count * sizeof(float);
  SYMMCHECK(symmCommInitRank(&comm, a->nranks, a->id, a->rank), NULL);
  SYMMCHECK(symmMemAlloc(comm, &buffer, bytes), comm);
  SYMMCHECK(symmCommWindowRegister(comm, buffer, bytes, &window, SYMM_WIN_COLL_SYMMETRIC), comm);

  float* host = malloc(bytes);
  for (size_t i = 0; i < a->count; i++) host[i] = input_value(a->rank, i);
  copy_buffer(comm, buffer, host, bytes, 1);
  symmStream_t stream = rank_stream(comm);
  SYMMCHECK(symmAllReduce(buffer, buffer, a->count, symmFloat32, symmSum, comm, stream), comm);
  finish_stream(comm, stream);
  copy_buffer(comm, host, buffer, bytes, 0);
  for (size_t i = 0; i < a->count; i++) {
    if ((double)host[i] != expected_sum(a->nranks, i)) a->wrong++;
  }
  free(host);

  SYMMCHECK(symmCommWindowDeregister(comm, window), comm);
  SYMMCHECK(symmMemFree(comm, buffer), comm);
  SYMMCHECK(symmCommDestroy(comm), NULL);
  return NULL;
}

int main(int argc, char** argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 4;
  size_t count = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 100003;
  if (nranks < 1 || nranks > MAX_RANKS) {
    fprintf(stderr, "usage: %s [nranks 1..%d] [count]\n", argv[0], MAX_RANKS);
    return 2;
  }
  symmUniqueId id;
  SYMMCHECK(symmGetUniqueId(&id), NULL);
  pthread_t threads[MAX_RANKS];
  struct rank_args args[MAX_RANKS];
  double start = now_seconds();
  for (int r = 0; r < nranks; r++) {
    args[r] = (struct rank_args){.rank = r, .nranks = nranks, .count = count, .id = id, .wrong = 0};
    pthread_create(&threads[r], NULL, rank_main, &args[r]);
  }
  size_t wrong = 0;
  for (int r = 0; r < nranks; r++) {
    pthread_join(threads[r], NULL);
    wrong += args[r].wrong;
  }
  printf("symm all-reduce, one thread per rank: %d ranks, %zu x float32 sum\n", nranks, count);
  printf("result check: %s (%zu wrong elements of %zu)\n", wrong ? "FAILED" : "OK", wrong,
         count * (size_t)nranks);
  printf("wall time (init, register, all-reduce, teardown): %.1f ms\n",
         1e3 * (now_seconds() - start));
  return wrong ? 1 : 0;
}
