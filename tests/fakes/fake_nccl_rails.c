/*
 * A stand-in for NCCL's host collectives, for the tests of symm's rails between machines on
 * NCCL (tests/tests/machines.rs) on the host backend: buffers are host memory, calls complete
 * before they return (streams are ignored), and the ranks of a communicator meet in a shared
 * memory segment named by the ncclUniqueId. Only the calls symm's rails make.
 *
 * Element types: every type is moved; the integers, float and double are reduced (reducing
 * the 16- and 8-bit floats is refused with ncclInvalidArgument). Every wait is bounded (60 s) and ends at once when this process aborts
 * the communicator (ncclCommAbort from another thread). Knobs: FAKE_NCCL_VERSION=<code>
 * (default 22203); FAKE_NCCL_DEVICE=1: buffers are device memory of the libcuda this process
 * loaded (the simulated GPU's), read and written with cuMemcpy after the stream's work;
 * FAKE_NCCL_DIE_IN=<call>:<k> (ncclAllReduce or ncclBroadcast): the process dies (SIGKILL)
 * 300 ms into its k-th such call, as a machine lost in the middle of a rail's call (its peers
 * are in theirs).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SLOT_BYTES ((size_t)4 << 20)
#define WAIT_SECONDS 60

typedef struct { char internal[128]; } ncclUniqueId;

struct header {
  atomic_int arrived;
  atomic_uint generation;
  int nranks;
};

struct fake_comm {
  int rank, nranks;
  struct header *header;
  char *slots;
  size_t bytes;
  char name[128];
  atomic_int aborted;
};

enum { SUCCESS = 0, SYSTEM_ERROR = 2, INVALID_ARGUMENT = 4 };

int ncclGetVersion(int *version) {
  const char *text = getenv("FAKE_NCCL_VERSION");
  *version = text ? atoi(text) : 22203;
  return SUCCESS;
}

const char *ncclGetErrorString(int result) {
  switch (result) {
  case SUCCESS: return "no error";
  case SYSTEM_ERROR: return "fake NCCL: a peer did not come, or the communicator was aborted";
  case INVALID_ARGUMENT: return "fake NCCL: unsupported argument";
  default: return "fake NCCL error";
  }
}

int ncclGetUniqueId(ncclUniqueId *id) {
  static atomic_int counter;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "/fake-nccl-%d-%d-%ld", (int)getpid(),
           atomic_fetch_add(&counter, 1), (long)now.tv_nsec);
  return SUCCESS;
}

static double seconds(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec + now.tv_nsec / 1e9;
}

static int barrier(struct fake_comm *c) {
  struct header *h = c->header;
  unsigned generation = atomic_load(&h->generation);
  if (atomic_fetch_add(&h->arrived, 1) == c->nranks - 1) {
    atomic_store(&h->arrived, 0);
    atomic_fetch_add(&h->generation, 1);
    return SUCCESS;
  }
  double deadline = seconds() + WAIT_SECONDS;
  while (atomic_load(&h->generation) == generation) {
    if (atomic_load(&c->aborted) || seconds() > deadline) return SYSTEM_ERROR;
    usleep(20);
  }
  return SUCCESS;
}

int ncclCommInitRank(struct fake_comm **out, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks || id.internal[0] != '/') return INVALID_ARGUMENT;
  struct fake_comm *c = calloc(1, sizeof *c);
  if (!c) return SYSTEM_ERROR;
  c->rank = rank;
  c->nranks = nranks;
  memcpy(c->name, id.internal, sizeof c->name);
  c->name[sizeof c->name - 1] = 0;
  c->bytes = 4096 + (size_t)nranks * SLOT_BYTES;
  int fd = shm_open(c->name, O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)c->bytes) != 0) {
    if (fd >= 0) close(fd);
    free(c);
    return SYSTEM_ERROR;
  }
  void *memory = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (memory == MAP_FAILED) {
    free(c);
    return SYSTEM_ERROR;
  }
  c->header = memory;
  c->slots = (char *)memory + 4096;
  int result = barrier(c);
  if (result == SUCCESS && rank == 0) shm_unlink(c->name); /* every rank has it mapped */
  if (result == SUCCESS) result = barrier(c);
  if (result != SUCCESS) {
    munmap(memory, c->bytes);
    free(c);
    return result;
  }
  *out = c;
  return SUCCESS;
}

static size_t type_size(int type) {
  switch (type) {
  case 0: case 1: case 10: case 11: return 1;
  case 6: case 9: return 2;
  case 2: case 3: case 7: return 4;
  case 4: case 5: case 8: return 8;
  default: return 0;
  }
}

/* The types this stand-in reduces (it moves every type). */
static int reduces(int type) { return type <= 5 || type == 7 || type == 8; }

/* out[i] = op over ranks (in rank order) of in_r[i]; wrapping integers, as NCCL. */
#define REDUCE(T, U)                                                                          \
  static void reduce_##T(int op, int n, char **inputs, T *out, size_t count) {                \
    for (size_t i = 0; i < count; i++) {                                                      \
      T acc = ((T *)inputs[0])[i];                                                            \
      for (int r = 1; r < n; r++) {                                                           \
        T v = ((T *)inputs[r])[i];                                                            \
        switch (op) {                                                                         \
        case 0: case 4: acc = (T)((U)acc + (U)v); break;                                     \
        case 1: acc = (T)((U)acc * (U)v); break;                                             \
        case 2: acc = v > acc ? v : acc; break;                                               \
        default: acc = v < acc ? v : acc; break;                                              \
        }                                                                                     \
      }                                                                                       \
      if (op == 4) acc = (T)(acc / (T)n);                                                     \
      out[i] = acc;                                                                           \
    }                                                                                         \
  }
REDUCE(int8_t, uint8_t)
REDUCE(uint8_t, uint8_t)
REDUCE(int32_t, uint32_t)
REDUCE(uint32_t, uint32_t)
REDUCE(int64_t, uint64_t)
REDUCE(uint64_t, uint64_t)
REDUCE(float, float)
REDUCE(double, double)

static void reduce(int type, int op, int n, char **inputs, void *out, size_t count) {
  switch (type) {
  case 0: reduce_int8_t(op, n, inputs, out, count); break;
  case 1: reduce_uint8_t(op, n, inputs, out, count); break;
  case 2: reduce_int32_t(op, n, inputs, out, count); break;
  case 3: reduce_uint32_t(op, n, inputs, out, count); break;
  case 4: reduce_int64_t(op, n, inputs, out, count); break;
  case 5: reduce_uint64_t(op, n, inputs, out, count); break;
  case 7: reduce_float(op, n, inputs, out, count); break;
  default: reduce_double(op, n, inputs, out, count); break;
  }
}

static char *slot(struct fake_comm *c, int rank) { return c->slots + (size_t)rank * SLOT_BYTES; }

/* NCCL frees an aborted communicator: a call on it afterwards is a use after free. */
static void live(struct fake_comm *c, const char *call) {
  if (atomic_load(&c->aborted)) {
    fprintf(stderr, "fake NCCL: %s on a communicator after ncclCommAbort\n", call);
    abort();
  }
}

/* Buffers in device memory (FAKE_NCCL_DEVICE=1): copies through the loaded libcuda. */
typedef int (*dtoh_fn)(void *, unsigned long long, size_t);
typedef int (*htod_fn)(unsigned long long, const void *, size_t);
typedef int (*sync_fn)(void *);
static int on_device(void) {
  const char *text = getenv("FAKE_NCCL_DEVICE");
  return text && text[0] == '1';
}
static void *cuda(const char *name) {
  void *library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return library ? dlsym(library, name) : NULL;
}
/* Copy `bytes` of the caller's buffer `src` (after the stream's work) to host memory. */
static int to_host(void *dst, const void *src, size_t bytes, void *stream) {
  if (!on_device()) { memmove(dst, src, bytes); return SUCCESS; }
  sync_fn sync = (sync_fn)cuda("cuStreamSynchronize");
  dtoh_fn dtoh = (dtoh_fn)cuda("cuMemcpyDtoH_v2");
  if (!sync || !dtoh || sync(stream) || dtoh(dst, (unsigned long long)(uintptr_t)src, bytes))
    return SYSTEM_ERROR;
  return SUCCESS;
}
/* Copy `bytes` of host memory into the caller's buffer `dst` (after the stream's work). */
static int from_host(void *dst, const void *src, size_t bytes, void *stream) {
  if (!on_device()) { memmove(dst, src, bytes); return SUCCESS; }
  sync_fn sync = (sync_fn)cuda("cuStreamSynchronize");
  htod_fn htod = (htod_fn)cuda("cuMemcpyHtoD_v2");
  if (!sync || !htod || sync(stream) || htod((unsigned long long)(uintptr_t)dst, src, bytes))
    return SYSTEM_ERROR;
  return SUCCESS;
}

/* FAKE_NCCL_DIE_IN=<call>:<k>: die in this process's k-th call named `call`. */
static void die_if_told(const char *call) {
  static atomic_int calls;
  const char *text = getenv("FAKE_NCCL_DIE_IN");
  const char *colon = text ? strchr(text, ':') : NULL;
  if (!colon || strlen(call) != (size_t)(colon - text) || strncmp(text, call, colon - text))
    return;
  if (atomic_fetch_add(&calls, 1) + 1 == atoi(colon + 1)) {
    usleep(300 * 1000);
    kill(getpid(), SIGKILL);
  }
}

int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op,
                  struct fake_comm *c, void *stream) {
  live(c, "ncclAllReduce");
  die_if_told("ncclAllReduce");
  size_t size = type_size(type);
  if (!size || !reduces(type) || op < 0 || op > 4) return INVALID_ARGUMENT;
  size_t chunk = SLOT_BYTES / size;
  char *inputs[64];
  if (c->nranks > 64) return INVALID_ARGUMENT;
  char *out = malloc(SLOT_BYTES);
  if (!out) return SYSTEM_ERROR;
  int result = SUCCESS;
  for (size_t done = 0; done < count && !result; done += chunk) {
    size_t n = count - done < chunk ? count - done : chunk;
    result = to_host(slot(c, c->rank), (const char *)send + done * size, n * size, stream);
    if (!result) result = barrier(c);
    if (result) break;
    for (int r = 0; r < c->nranks; r++) inputs[r] = slot(c, r);
    reduce(type, op, c->nranks, inputs, out, n);
    result = barrier(c);
    if (!result) result = from_host((char *)recv + done * size, out, n * size, stream);
  }
  free(out);
  return result;
}

int ncclReduceScatter(const void *send, void *recv, size_t count, int type, int op,
                      struct fake_comm *c, void *stream) {
  live(c, "ncclReduceScatter");
  size_t size = type_size(type);
  if (!size || !reduces(type) || op < 0 || op > 4) return INVALID_ARGUMENT;
  size_t chunk = SLOT_BYTES / size / (size_t)c->nranks;
  char *inputs[64];
  if (c->nranks > 64) return INVALID_ARGUMENT;
  char *out = malloc(SLOT_BYTES);
  if (!out) return SYSTEM_ERROR;
  int result = SUCCESS;
  for (size_t done = 0; done < count && !result; done += chunk) {
    size_t n = count - done < chunk ? count - done : chunk;
    for (int b = 0; b < c->nranks && !result; b++)
      result = to_host(slot(c, c->rank) + (size_t)b * n * size,
                       (const char *)send + ((size_t)b * count + done) * size, n * size, stream);
    if (!result) result = barrier(c);
    if (result) break;
    for (int r = 0; r < c->nranks; r++) inputs[r] = slot(c, r) + (size_t)c->rank * n * size;
    reduce(type, op, c->nranks, inputs, out, n);
    result = barrier(c);
    if (!result) result = from_host((char *)recv + done * size, out, n * size, stream);
  }
  free(out);
  return result;
}

int ncclBroadcast(const void *send, void *recv, size_t count, int type, int root,
                  struct fake_comm *c, void *stream) {
  live(c, "ncclBroadcast");
  die_if_told("ncclBroadcast");
  size_t size = type_size(type);
  if (!size || root < 0 || root >= c->nranks) return INVALID_ARGUMENT;
  size_t chunk = SLOT_BYTES / size;
  char *out = malloc(SLOT_BYTES);
  if (!out) return SYSTEM_ERROR;
  int result = SUCCESS;
  for (size_t done = 0; done < count && !result; done += chunk) {
    size_t n = count - done < chunk ? count - done : chunk;
    if (c->rank == root)
      result = to_host(slot(c, root), (const char *)send + done * size, n * size, stream);
    if (!result) result = barrier(c);
    if (result) break;
    memcpy(out, slot(c, root), n * size);
    result = barrier(c);
    if (!result) result = from_host((char *)recv + done * size, out, n * size, stream);
  }
  free(out);
  return result;
}

int ncclGroupStart(void) { return SUCCESS; }
int ncclGroupEnd(void) { return SUCCESS; }

int ncclCommAbort(struct fake_comm *c) {
  live(c, "ncclCommAbort");
  atomic_store(&c->aborted, 1);
  return SUCCESS; /* the memory stays: a call of another thread may still be in it */
}

int ncclCommDestroy(struct fake_comm *c) {
  live(c, "ncclCommDestroy");
  munmap(c->header, c->bytes);
  free(c);
  return SUCCESS;
}
