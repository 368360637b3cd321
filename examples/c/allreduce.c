/* symm all-reduce, NCCL's symmetric-window flow, one thread driving every rank:
 * init all ranks, symmMemAlloc, symmCommWindowRegister(SYMM_WIN_COLL_SYMMETRIC), symmAllReduce
 * inside a group, check against a reference computed in double, deregister, free, destroy.
 *
 * usage: allreduce [nranks=8] [count=262147] [iterations=5]
 * All ranks are placed on device 0 (several ranks per GPU), as on a one-GPU machine. */
#include "common.h"

#define MAX_RANKS 64

int main(int argc, char** argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 8;
  size_t count = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 262147;
  int iterations = argc > 3 ? atoi(argv[3]) : 5;
  if (nranks < 1 || nranks > MAX_RANKS || iterations < 1) {
    fprintf(stderr, "usage: %s [nranks 1..%d] [count] [iterations >= 1]\n", argv[0], MAX_RANKS);
    return 2;
  }
  size_t bytes = count * sizeof(float);

  symmComm_t comms[MAX_RANKS];
  int devices[MAX_RANKS] = {0};
  void* buffers[MAX_RANKS];
  symmWindow_t windows[MAX_RANKS];
  SYMMCHECK(symmCommInitAll(comms, nranks, devices), NULL);
  const char* backend = NULL;
  SYMMCHECK(symmCommGetBackend(comms[0], &backend), comms[0]);

  float* host = malloc(bytes);
  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmMemAlloc(comms[r], &buffers[r], bytes), comms[r]);
  }
  SYMMCHECK(symmGroupStart(), NULL);
  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmCommWindowRegister(comms[r], buffers[r], bytes, &windows[r],
                                     SYMM_WIN_COLL_SYMMETRIC), comms[r]);
  }
  SYMMCHECK(symmGroupEnd(), NULL);

  /* Out of place is not possible in one window without overlap, so the example runs in place;
   * each iteration refills the inputs so that every run is checked. */
  double total = 0.0;
  size_t wrong = 0;
  for (int it = 0; it < iterations; it++) {
    for (int r = 0; r < nranks; r++) {
      for (size_t i = 0; i < count; i++) host[i] = input_value(r, i);
      copy_buffer(comms[r], buffers[r], host, bytes, 1);
    }
    double start = now_seconds();
    SYMMCHECK(symmGroupStart(), NULL);
    for (int r = 0; r < nranks; r++) {
      SYMMCHECK(symmAllReduce(buffers[r], buffers[r], count, symmFloat32, symmSum, comms[r], NULL),
                comms[r]);
    }
    SYMMCHECK(symmGroupEnd(), NULL);
    for (int r = 0; r < nranks; r++) finish(comms[r]);
    total += now_seconds() - start;

    for (int r = 0; r < nranks; r++) {
      copy_buffer(comms[r], host, buffers[r], bytes, 0);
      for (size_t i = 0; i < count; i++) {
        if ((double)host[i] != expected_sum(nranks, i)) wrong++;
      }
    }
  }

  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmCommWindowDeregister(comms[r], windows[r]), comms[r]);
    SYMMCHECK(symmMemFree(comms[r], buffers[r]), comms[r]);
    SYMMCHECK(symmCommDestroy(comms[r]), NULL);
  }
  free(host);

  printf("symm all-reduce: backend %s, %d ranks, %zu x float32 sum, in place\n", backend, nranks,
         count);
  printf("result check: %s (%zu wrong elements of %zu)\n", wrong ? "FAILED" : "OK", wrong,
         count * (size_t)nranks * (size_t)iterations);
  printf("time per all-reduce (all ranks, group launch to completion, mean of %d): %.1f us\n",
         iterations, 1e6 * total / iterations);
  return wrong ? 1 : 0;
}
