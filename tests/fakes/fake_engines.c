/*
 * A stand-in for NCCL's and NVSHMEM's host libraries, for the tests of symm's windows over
 * their memory on the host backend (tests/tests/engine_windows.rs). One process per rank: each
 * maps its own "device heap" (a file) at the same fixed address, as NVSHMEM's symmetric heap
 * is, and every peer's heap at an address of its own, as both engines map peers' memory; the
 * engines' address queries answer from those mappings. Only the calls symm makes, plus
 * fake_engine_* for the tests themselves (tests/tests/engine_windows.rs, and
 * python/tests/test_triton_engines.py for nvshmemx_cumodule_init).
 *
 * Knobs, read at each call: FAKE_ENGINE_UNREACHABLE=<rank> (that peer gets no address, and
 * NCCL reports its communicator's ranks in two load/store teams), FAKE_NCCL_VERSION=<code>
 * (what ncclGetVersion reports; default 23007), FAKE_NCCL_NO_GIN=1 (NCCL reports no GIN),
 * FAKE_NCCL_DEVCOMM_FAILS=1 (ncclDevCommCreate fails), FAKE_NCCL_MEM_ALLOC_FAILS=1
 * (ncclMemAlloc fails), FAKE_NVSHMEM_MALLOC_FAILS=1 (nvshmem_malloc fails).
 *
 * The structures of NCCL 2.32's device API (ncclCommProperties_t, ncclDevCommRequirements_t)
 * are declared here as NCCL lays them out; the calls check what symm fills in.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
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
static int live_allocations, live_windows, live_dev_comms, last_window_flags, window_registrations;

struct fake_comm { int rank, ranks; };
static struct fake_comm the_comm;
struct fake_window { char *buff; size_t size; int flags; };

#define FAKE_API_MAGIC 0xcafebeefu
#define FAKE_ENGINE_VERSION 23203u
struct fake_comm_properties {
  size_t size; unsigned magic, version;
  int rank, nRanks, cudaDev, nvmlDev;
  _Bool deviceApiSupport, multimemSupport;
  int ginType, nLsaTeams;
  _Bool hostRmaSupport;
  int railedGinType;
  unsigned long long commHash;
  int ginMinStride, ginConnectionType;
  _Bool ginSupport[64];
  size_t devCommRuntimeVersionSize;
  _Bool cftSupport, cftMulticastSupport, cftCountedSupport;
};
struct fake_dev_comm_requirements {
  size_t size; unsigned magic, version;
  void *resourceRequirementsList, *teamRequirementsList;
  _Bool lsaMultimem;
  int barrierCount, lsaBarrierCount, railGinBarrierCount, lsaLLA2ABlockCount, lsaLLA2ASlotCount;
  _Bool ginForceEnable;
  int ginContextCount, ginSignalCount, ginCounterCount, ginConnectionType;
  _Bool ginExclusiveContexts;
  int ginQueueDepth, ginTrafficClass, worldGinBarrierCount;
  _Bool ginStrongSignalsRequired, ginVaSignalsRequired;
  int ginCustomStride, ginType;
  _Bool useRuntimeVersion;
  int cftCaps, cftBarrierCount;
};
_Static_assert(sizeof(struct fake_comm_properties) == 152, "ncclCommProperties_t of NCCL 2.32");
_Static_assert(sizeof(struct fake_dev_comm_requirements) == 120, "ncclDevCommRequirements_t of NCCL 2.32");
/* An ncclDevComm (248 bytes in NCCL 2.32): magic, version, rank, ranks, then bytes the stand-in
   fills with fake_dev_comm_byte(rank, i). */
#define FAKE_DEV_COMM_BYTES 248
struct fake_dev_comm { unsigned magic, version; int rank, nRanks; unsigned char rest[FAKE_DEV_COMM_BYTES - 16]; };
_Static_assert(sizeof(struct fake_dev_comm) == FAKE_DEV_COMM_BYTES, "ncclDevComm of NCCL 2.32");
static unsigned char fake_dev_comm_byte(int rank, int i) { return (unsigned char)(i * 7 + rank); }

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
/* Device communicators not destroyed yet, and the flags of the last window registered. */
int fake_engine_live_dev_comms(void) { return live_dev_comms; }
int fake_engine_last_window_flags(void) { return last_window_flags; }
/* ncclCommWindowRegister calls so far (NCCL's collective: a rank that calls it waits for all). */
int fake_engine_window_registrations(void) { return window_registrations; }

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
int ncclMemAlloc(void **ptr, size_t size) {
  *ptr = heap_alloc(size);
  if (*ptr && getenv("FAKE_NCCL_MEM_ALLOC_FAILS")) {
    /* The failed allocation keeps its place, so that the ranks' heaps stay in step (a peer's
       bytes are found at the offset of one's own). */
    live_allocations--;
    *ptr = NULL;
  }
  return *ptr ? 0 : 1;
}
int ncclMemFree(void *ptr) { if (ptr) live_allocations--; return 0; }
int ncclCommWindowRegister(void *comm, void *buff, size_t size, void **win, int flags) {
  (void)comm;
  if ((flags & ~3) != 0 || (char *)buff < heap || (char *)buff + size > heap + HEAP_BYTES) return 4;
  last_window_flags = flags;
  window_registrations++;
  struct fake_window *w = malloc(sizeof *w);
  w->buff = buff;
  w->size = size;
  w->flags = flags;
  *win = w;
  live_windows++;
  return 0;
}
int ncclCommWindowDeregister(void *comm, void *win) {
  (void)comm;
  /* GIN pads outlive the device communicator that signals into them. */
  if (((struct fake_window *)win)->flags == 3 && live_dev_comms > 0) return 4;
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

/* NCCL 2.32's device API: the communicator's load/store teams (two when a peer is unreachable)
   and GIN, and device communicators (only the start written: magic, version, rank, ranks). */
/* What ncclGetVersion reports; an NCCL refuses structures of a newer version than its own. */
static unsigned reported_version(void) {
  int version;
  ncclGetVersion(&version);
  return (unsigned)version;
}
int ncclCommQueryProperties(const void *comm, struct fake_comm_properties *props) {
  if (props->size != sizeof *props || props->magic != FAKE_API_MAGIC || props->version != FAKE_ENGINE_VERSION ||
      props->version > reported_version()) return 4;
  props->rank = ((const struct fake_comm *)comm)->rank;
  props->nRanks = ((const struct fake_comm *)comm)->ranks;
  props->deviceApiSupport = 1;
  props->nLsaTeams = unreachable_peer() >= 0 ? 2 : 1;
  props->ginType = getenv("FAKE_NCCL_NO_GIN") ? 0 : 3;
  return 0;
}
int ncclDevCommCreate(const void *comm, const struct fake_dev_comm_requirements *reqs, struct fake_dev_comm *out) {
  if (reqs->size != sizeof *reqs || reqs->magic != FAKE_API_MAGIC || reqs->version != FAKE_ENGINE_VERSION ||
      reqs->version > reported_version()) return 4;
  /* GIN with every rank connected, VA and strong signals; the rest as NCCL's initializer has it. */
  if (reqs->ginContextCount < 1 || reqs->ginConnectionType != 1 || !reqs->ginStrongSignalsRequired ||
      !reqs->ginVaSignalsRequired || reqs->useRuntimeVersion || reqs->resourceRequirementsList ||
      reqs->teamRequirementsList || reqs->lsaMultimem || reqs->barrierCount || reqs->lsaBarrierCount ||
      reqs->railGinBarrierCount || reqs->worldGinBarrierCount || reqs->ginTrafficClass != INT_MIN ||
      reqs->ginType != 0 || reqs->ginCustomStride != 1 || reqs->cftCaps || reqs->cftBarrierCount) return 4;
  if (getenv("FAKE_NCCL_DEVCOMM_FAILS")) return 5;
  out->magic = FAKE_API_MAGIC;
  out->version = FAKE_ENGINE_VERSION;
  out->rank = ((const struct fake_comm *)comm)->rank;
  out->nRanks = ((const struct fake_comm *)comm)->ranks;
  for (int i = 0; i < FAKE_DEV_COMM_BYTES - 16; i++) out->rest[i] = fake_dev_comm_byte(out->rank, 16 + i);
  live_dev_comms++;
  return 0;
}
int ncclDevCommDestroy(const void *comm, const struct fake_dev_comm *dev_comm) {
  if (dev_comm->magic != FAKE_API_MAGIC || dev_comm->rank != ((const struct fake_comm *)comm)->rank) return 4;
  live_dev_comms--;
  return 0;
}

/* ---- NVSHMEM ---- */
int nvshmemx_init_status(void) { return my_pe >= 0 ? 2 : 0; }
int nvshmem_my_pe(void) { return my_pe; }
int nvshmem_n_pes(void) { return n_pes; }
void *nvshmem_malloc(size_t size) {
  void *ptr = heap_alloc(size);
  if (ptr && getenv("FAKE_NVSHMEM_MALLOC_FAILS")) {
    live_allocations--; /* as for ncclMemAlloc: the place is kept, the heaps stay in step */
    return NULL;
  }
  return ptr;
}
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
