/* symm all-reduce with one process per rank, the way torchrun, mpirun or Slurm run NCCL jobs.
 *
 * Two ways to start it:
 *  - `allreduce_mp [nranks=4] [count=100003]`: the program makes the unique id
 *    (symmGetUniqueId starts the bootstrap root in this process), forks `nranks` children, each
 *    one rank, and waits for them. The id's bytes reach the children through fork; a real
 *    program moves them any way it likes (MPI_Bcast, a file, a key-value store).
 *  - started `nranks` times by a launcher, each process with `SYMM_COMM_ID=host:port`,
 *    `SYMM_RANK` and `SYMM_WORLD_SIZE` set (count from argv[1]): every process calls
 *    symmGetUniqueId, which returns the id named by SYMM_COMM_ID, and rank 0's
 *    symmCommInitRank starts the root there (as NCCL_COMM_ID does).
 *
 * Each rank: symmCommInitRank, symmMemAlloc (shareable memory), symmCommWindowRegister
 * (collective: the ranks exchange their memory), several all-reduces (in place and out of
 * place) checked against a reference computed in double, then teardown.
 *
 * On the cuda backend each rank uses the device current in its process (set it before
 * symmCommInitRank, e.g. from LOCAL_RANK) and launches on its own non-blocking stream. */
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include "common.h"

#define MAX_RANKS 64

/* Wait for the stream's work. */
static void wait_stream(symmComm_t comm, symmStream_t stream) {
#ifdef SYMM_EXAMPLE_CUDA
  if (stream != NULL && cuStreamSynchronize((CUstream)stream) != CUDA_SUCCESS) {
    fprintf(stderr, "stream synchronize failed\n");
    exit(1);
  }
#else
  (void)stream;
#endif
  finish(comm);
}

/* One rank: returns the number of wrong elements. */
static size_t run_rank(symmUniqueId id, int rank, int nranks, size_t count) {
  symmComm_t comm;
  void* buffer;
  symmWindow_t window;
  size_t bytes = 2 * count * sizeof(float); /* send half, receive half */
  size_t wrong = 0;
  SYMMCHECK(symmCommInitRank(&comm, nranks, id, rank), NULL);
  SYMMCHECK(symmMemAlloc(comm, &buffer, bytes), comm);
  SYMMCHECK(symmCommWindowRegister(comm, buffer, bytes, &window, SYMM_WIN_COLL_SYMMETRIC), comm);
  symmStream_t stream = rank_stream(comm);
  float* host = malloc(bytes);
  float* send = buffer;
  float* recv = (float*)buffer + count;
  /* The same window for every call, as a training loop reuses its buffers. */
  for (int iteration = 0; iteration < 4; iteration++) {
    int in_place = iteration % 2 == 0;
    for (size_t i = 0; i < count; i++) host[i] = input_value(rank, i + (size_t)iteration);
    copy_buffer(comm, send, host, count * sizeof(float), 1);
    float* out = in_place ? send : recv;
    SYMMCHECK(symmAllReduce(send, out, count, symmFloat32, symmSum, comm, stream), comm);
    wait_stream(comm, stream);
    copy_buffer(comm, host, out, count * sizeof(float), 0);
    for (size_t i = 0; i < count; i++) {
      if ((double)host[i] != expected_sum(nranks, i + (size_t)iteration)) wrong++;
    }
  }
  free(host);
  SYMMCHECK(symmCommWindowDeregister(comm, window), comm);
  SYMMCHECK(symmMemFree(comm, buffer), comm);
  SYMMCHECK(symmCommDestroy(comm), NULL);
  return wrong;
}

int main(int argc, char** argv) {
  const char* env_rank = getenv("SYMM_RANK");
  const char* env_size = getenv("SYMM_WORLD_SIZE");
  if (getenv("SYMM_COMM_ID") != NULL && env_rank != NULL && env_size != NULL) {
    /* Started by a launcher: this process is one rank. */
    int rank = atoi(env_rank), nranks = atoi(env_size);
    size_t count = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 100003;
    symmUniqueId id;
    SYMMCHECK(symmGetUniqueId(&id), NULL);
    size_t wrong = run_rank(id, rank, nranks, count);
    printf("rank %d of %d: %zu x float32 sum, 4 calls: %s (%zu wrong elements)\n", rank, nranks,
           count, wrong ? "FAILED" : "OK", wrong);
    return wrong ? 1 : 0;
  }

  int nranks = argc > 1 ? atoi(argv[1]) : 4;
  size_t count = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 100003;
  if (nranks < 1 || nranks > MAX_RANKS) {
    fprintf(stderr, "usage: %s [nranks 1..%d] [count]\n", argv[0], MAX_RANKS);
    return 2;
  }
  /* Before any fork and before any CUDA call: the root listens in this process. */
  symmUniqueId id;
  SYMMCHECK(symmGetUniqueId(&id), NULL);
  double start = now_seconds();
  pid_t children[MAX_RANKS];
  for (int r = 0; r < nranks; r++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) {
      size_t wrong = run_rank(id, r, nranks, count);
      _exit(wrong ? 1 : 0);
    }
    children[r] = pid;
  }
  int failed = 0;
  for (int r = 0; r < nranks; r++) {
    int status = 0;
    if (waitpid(children[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d (pid %d) failed (status %#x)\n", r, (int)children[r], status);
      failed = 1;
    }
  }
  printf("symm all-reduce, one process per rank: %d ranks, %zu x float32 sum, 4 calls\n", nranks,
         count);
  printf("result check: %s\n", failed ? "FAILED" : "OK");
  printf("wall time (fork, init, register, all-reduces, teardown): %.1f ms\n",
         1e3 * (now_seconds() - start));
  return failed;
}
