/*
 * A stand-in for NCCL's and NVSHMEM's host libraries, for the tests of symm's windows over
 * their memory on the host backend (tests/tests/engine_windows.rs). One process per rank: each
 * maps its own "device heap" (a file) at the same fixed address, as NVSHMEM's symmetric heap
 * is, and every peer's heap at an address of its own, as both engines map peers' memory; the
 * engines' address queries answer from those mappings. Only the calls symm makes, plus
 * fake_engine_* for the tests themselves (tests/tests/engine_windows.rs, and
 * python/tests/test_triton_engines.py for nvshmemx_cumodule_init).
 *
 * Knobs, read at each call: FAKE_ENGINE_UNREACHABLE=<rank> (that peer gets no address),
 * FAKE_NCCL_VERSION=<code> (what ncclGetVersion reports; default 23007).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define HEAP_ADDRESS ((char *)0x7e5400000000ULL)
#define HEAP_BYTES ((size_t)64 << 20)
#define MAX_PES 16

static char *heap;
static size_t heap_used;
static int my_pe = -1, n_pes;
static char *peer_heaps[MAX_PES];
static int live_allocations, live_windows;

struct fake_comm { int rank, ranks; };
static struct fake_comm the_comm;
struct fake_window { char *buff; size_t size; };

static int unreachable_peer(void) {
  const char *text = getenv("FAKE_ENGINE_UNREACHABLE");
  return text ? atoi(text) : -1;
}

/* Map this rank's heap at HEAP_ADDRESS and every peer's (waiting up to 30 s for each). */
int fake_engine_init(const char *directory, int rank, int ranks) {
  char path[4096];
  if (ranks > MAX_PES || rank < 0 || rank >= ranks) return -1;
  snprintf(path, sizeof path, "%s/heap-%d", directory, rank);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, HEAP_BYTES) != 0) return -2;
  heap = mmap(HEAP_ADDRESS, HEAP_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
  close(fd);
  if (heap != HEAP_ADDRESS) return -3;
  for (int peer = 0; peer < ranks; peer++) {
    if (peer == rank) { peer_heaps[peer] = heap; continue; }
    snprintf(path, sizeof path, "%s/heap-%d", directory, peer);
    for (int tries = 0; ; tries++) {
      fd = open(path, O_RDWR);
      if (fd >= 0 && lseek(fd, 0, SEEK_END) == (off_t)HEAP_BYTES) break;
      if (fd >= 0) close(fd);
      if (tries > 3000) return -4;
      struct timespec pause = {0, 10000000};
      nanosleep(&pause, NULL);
    }
    peer_heaps[peer] = mmap(NULL, HEAP_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (peer_heaps[peer] == MAP_FAILED) return -5;
  }
  my_pe = rank;
  n_pes = ranks;
  the_comm.rank = rank;
  the_comm.ranks = ranks;
  return 0;
}

/* Where this process maps PE pe's heap, reachable or not (the tests' stand-in for the
   engine's own transport to a PE it gives no address for). */
void *fake_engine_peer_heap(int pe) { return pe >= 0 && pe < n_pes ? peer_heaps[pe] : NULL; }
/* The NCCL communicator handle of this process's rank. */
void *fake_engine_nccl_comm(void) { return &the_comm; }
/* Allocations (either engine's) not freed yet, and NCCL windows not deregistered yet. */
int fake_engine_live_allocations(void) { return live_allocations; }
int fake_engine_live_windows(void) { return live_windows; }

static void *heap_alloc(size_t bytes) {
  size_t at = (heap_used + 255) & ~(size_t)255;
  if (heap == NULL || at + bytes > HEAP_BYTES) return NULL;
  heap_used = at + bytes;
  live_allocations++;
  return heap + at;
}

static char *peer_address(const char *address, int peer) {
  if (peer < 0 || peer >= n_pes || peer == unreachable_peer()) return NULL;
  return peer_heaps[peer] + (address - heap);
}

/* ---- NCCL ---- */
int ncclGetVersion(int *version) {
  const char *text = getenv("FAKE_NCCL_VERSION");
  *version = text ? atoi(text) : 23007;
  return 0;
}
const char *ncclGetErrorString(int result) { return result ? "fake NCCL error" : "no error"; }
int ncclCommCount(const void *comm, int *count) { *count = ((const struct fake_comm *)comm)->ranks; return 0; }
int ncclCommUserRank(const void *comm, int *rank) { *rank = ((const struct fake_comm *)comm)->rank; return 0; }
int ncclMemAlloc(void **ptr, size_t size) { *ptr = heap_alloc(size); return *ptr ? 0 : 1; }
int ncclMemFree(void *ptr) { if (ptr) live_allocations--; return 0; }
int ncclCommWindowRegister(void *comm, void *buff, size_t size, void **win, int flags) {
  (void)comm;
  if (flags != 1 || (char *)buff < heap || (char *)buff + size > heap + HEAP_BYTES) return 4;
  struct fake_window *w = malloc(sizeof *w);
  w->buff = buff;
  w->size = size;
  *win = w;
  live_windows++;
  return 0;
}
int ncclCommWindowDeregister(void *comm, void *win) {
  (void)comm;
  free(win);
  live_windows--;
  return 0;
}
int ncclGetPeerDevicePointer(void *win, size_t offset, int peer, void **out) {
  struct fake_window *w = win;
  if (offset > w->size) return 4;
  *out = peer_address(w->buff + offset, peer);
  return 0;
}

/* ---- NVSHMEM ---- */
int nvshmemx_init_status(void) { return my_pe >= 0 ? 2 : 0; }
int nvshmem_my_pe(void) { return my_pe; }
int nvshmem_n_pes(void) { return n_pes; }
void *nvshmem_malloc(size_t size) { return heap_alloc(size); }
void nvshmem_free(void *ptr) { if (ptr) live_allocations--; }
void *nvshmem_ptr(const void *ptr, int pe) { return peer_address(ptr, pe); }

/* nvshmemx_cumodule_init: records the module (FAKE_ENGINE_MODULE_INIT_FAILS=1: returns 7). */
static void *last_module;
static int module_inits;
int nvshmemx_cumodule_init(void *module) {
  if (getenv("FAKE_ENGINE_MODULE_INIT_FAILS")) return 7;
  last_module = module;
  module_inits++;
  return 0;
}
void *fake_engine_last_module(void) { return last_module; }
int fake_engine_module_inits(void) { return module_inits; }
