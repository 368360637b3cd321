/* Compiled (not run) by tests/tests/c_header.rs, as C11 and as C++: the generated header is
 * self-contained, and the layout and values the C ABI promises hold. */
#include <stddef.h>
#include "symm.h"

/* The header declares only symm-prefixed names (and CUDA's CUstream_st): a program's own types
 * with common names must not clash with it (`cargo xtask header` checks every name). */
typedef double Model;
typedef int Plan;
typedef struct Window { int id; } Window;

#ifdef __cplusplus
#define STATIC_ASSERT static_assert
#else
#define STATIC_ASSERT _Static_assert
#endif

/* NCCL's numbers and names, so that ported code keeps its meaning. */
STATIC_ASSERT(symmSuccess == 0 && symmUnhandledCudaError == 1 && symmSystemError == 2 &&
                  symmInternalError == 3 && symmInvalidArgument == 4 && symmInvalidUsage == 5 &&
                  symmRemoteError == 6,
              "result codes as ncclResult_t");
STATIC_ASSERT(symmChar == symmInt8 && symmInt == symmInt32 && symmHalf == symmFloat16 &&
                  symmFloat == symmFloat32 && symmDouble == symmFloat64 && symmBfloat16 == 9 &&
                  symmFloat8e5m2 == 11,
              "element types as ncclDataType_t");
STATIC_ASSERT(symmSum == 0 && symmProd == 1 && symmMax == 2 && symmMin == 3 && symmAvg == 4,
              "operators as ncclRedOp_t");

STATIC_ASSERT(sizeof(symmDeviceContext) == 96, "context size");
STATIC_ASSERT(offsetof(symmDeviceContext, backend) == 0, "backend");
STATIC_ASSERT(offsetof(symmDeviceContext, version) == 4, "version");
STATIC_ASSERT(offsetof(symmDeviceContext, rank) == 8, "rank");
STATIC_ASSERT(offsetof(symmDeviceContext, world_size) == 12, "world_size");
STATIC_ASSERT(offsetof(symmDeviceContext, local_base) == 16, "local_base");
STATIC_ASSERT(offsetof(symmDeviceContext, window_size) == 24, "window_size");
STATIC_ASSERT(offsetof(symmDeviceContext, peer_bases) == 32, "peer_bases");
STATIC_ASSERT(offsetof(symmDeviceContext, peer_signal_pads) == 40, "peer_signal_pads");
STATIC_ASSERT(offsetof(symmDeviceContext, signal_pad_size) == 48, "signal_pad_size");
STATIC_ASSERT(offsetof(symmDeviceContext, abort_flag) == 56, "abort_flag");
STATIC_ASSERT(offsetof(symmDeviceContext, timeout_ns) == 64, "timeout_ns");
STATIC_ASSERT(offsetof(symmDeviceContext, engine) == 72, "engine");
STATIC_ASSERT(sizeof(((symmDeviceContext *)0)->engine) == 24, "three engine words");
STATIC_ASSERT(sizeof(symmUniqueId) == SYMM_UNIQUE_ID_BYTES, "unique id");
STATIC_ASSERT(symmNoDevice == 8 && symmTimeout == 10 && symmOutOfMemory == 11, "symm's own results");
STATIC_ASSERT(symmFloat32 == 7 && symmBfloat16 == 9 && symmFloat8e5m2 == 11, "types");
STATIC_ASSERT(symmSum == 0 && symmAvg == 4, "ops");
STATIC_ASSERT(SYMM_WIN_COLL_SYMMETRIC == 1, "flag");

/* The v0 entry points, with the exact shapes of the contract. */
static symmResult_t (*all_reduce)(const void*, void*, size_t, symmDataType_t, symmRedOp_t,
                                        symmComm_t, symmStream_t) = symmAllReduce;
static symmResult_t (*register_window)(symmComm_t, void*, size_t, symmWindow_t*, int) =
    symmCommWindowRegister;
static symmResult_t (*init_all)(symmComm_t*, int, const int*) = symmCommInitAll;
static symmResult_t (*init_rank)(symmComm_t*, int, symmUniqueId, int) = symmCommInitRank;
static symmResult_t (*init_from_env)(symmComm_t*, const char *const *) = symmCommInitFromEnv;
static symmResult_t (*device_context)(symmComm_t, symmWindow_t, const void**) =
    symmCommGetDeviceContext;
static const char* (*error_string)(symmResult_t) = symmGetErrorString;
/* ncclBroadcast's shape: (sendbuff, recvbuff, count, datatype, root, comm, stream). */
static symmResult_t (*broadcast)(const void*, void*, size_t, symmDataType_t, int, symmComm_t,
                                 symmStream_t) = symmBroadcast;

/* ncclAlltoAll's shape: (sendbuff, recvbuff, count, datatype, comm, stream). */
static symmResult_t (*all_to_all)(const void*, void*, size_t, symmDataType_t, symmComm_t,
                                  symmStream_t) = symmAlltoAll;

/* ncclGather's and ncclScatter's shape: (sendbuff, recvbuff, count, datatype, root, comm,
   stream). */
static symmResult_t (*gather)(const void*, void*, size_t, symmDataType_t, int, symmComm_t,
                              symmStream_t) = symmGather;
static symmResult_t (*scatter)(const void*, void*, size_t, symmDataType_t, int, symmComm_t,
                               symmStream_t) = symmScatter;

int symm_header_check_uses(void) {
  return all_reduce != 0 && register_window != 0 && init_all != 0 && init_rank != 0 &&
         init_from_env != 0 && device_context != 0 && error_string != 0 && broadcast != 0 && all_to_all != 0 &&
         gather != 0 && scatter != 0;
}
