/* symm broadcast, one thread driving every rank: init all ranks, symmMemAlloc, one window per
 * rank holding a send and a receive buffer, then symmBroadcast from every root in turn inside a
 * group (in place on even roots, out of place on odd ones; the other ranks pass NULL as
 * sendbuff, which they may, as in NCCL), each result checked on every rank.
 *
 * usage: broadcast [nranks=8] [count=262147]
 * All ranks are placed on device 0 (several ranks per GPU), as on a one-GPU machine. */
#include "common.h"

#define MAX_RANKS 64

static float value(int rank, int root, size_t i) {
  return (float)(rank * 1000 + root * 10) + (float)(i % 997);
}

int main(int argc, char** argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 8;
  size_t count = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 262147;
  if (nranks < 1 || nranks > MAX_RANKS || count < 1) {
    fprintf(stderr, "usage: %s [nranks 1..%d] [count >= 1]\n", argv[0], MAX_RANKS);
    return 2;
  }
  size_t bytes = count * sizeof(float);

  symmComm_t comms[MAX_RANKS];
  int devices[MAX_RANKS] = {0};
  char* buffers[MAX_RANKS];
  symmWindow_t windows[MAX_RANKS];
  SYMMCHECK(symmCommInitAll(comms, nranks, devices), NULL);
  const char* backend = NULL;
  SYMMCHECK(symmCommGetBackend(comms[0], &backend), comms[0]);
  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmMemAlloc(comms[r], (void**)&buffers[r], 2 * bytes), comms[r]);
  }
  SYMMCHECK(symmGroupStart(), NULL);
  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmCommWindowRegister(comms[r], buffers[r], 2 * bytes, &windows[r],
                                     SYMM_WIN_COLL_SYMMETRIC), comms[r]);
  }
  SYMMCHECK(symmGroupEnd(), NULL);

  /* The receive buffer is the window's second half (the same offset on every rank); out of
   * place, the root sends from the first half. */
  float* host = malloc(bytes);
  size_t wrong = 0;
  for (int root = 0; root < nranks; root++) {
    int in_place = root % 2 == 0;
    for (int r = 0; r < nranks; r++) {
      for (size_t i = 0; i < count; i++) host[i] = value(r, root, i);
      copy_buffer(comms[r], buffers[r] + (in_place ? bytes : 0), host, bytes, 1);
    }
    SYMMCHECK(symmGroupStart(), NULL);
    for (int r = 0; r < nranks; r++) {
      char* recv = buffers[r] + bytes;
      const void* send = r != root ? NULL : in_place ? recv : buffers[r];
      SYMMCHECK(symmBroadcast(send, recv, count, symmFloat32, root, comms[r], NULL), comms[r]);
    }
    SYMMCHECK(symmGroupEnd(), NULL);
    for (int r = 0; r < nranks; r++) finish(comms[r]);
    for (int r = 0; r < nranks; r++) {
      copy_buffer(comms[r], host, buffers[r] + bytes, bytes, 0);
      for (size_t i = 0; i < count; i++) {
        if (host[i] != value(root, root, i)) wrong++;
      }
    }
  }

  for (int r = 0; r < nranks; r++) {
    SYMMCHECK(symmCommWindowDeregister(comms[r], windows[r]), comms[r]);
    SYMMCHECK(symmMemFree(comms[r], buffers[r]), comms[r]);
    SYMMCHECK(symmCommDestroy(comms[r]), NULL);
  }
  free(host);

  printf("symm broadcast: backend %s, %d ranks, %zu x float32 from every root\n", backend, nranks,
         count);
  printf("result check: %s (%zu wrong elements of %zu)\n", wrong ? "FAILED" : "OK", wrong,
         count * (size_t)nranks * (size_t)nranks);
  return wrong ? 1 : 0;
}
