// symm device API for CUDA C++ kernels.
//
// The functions below are the device functions that Triton kernels already link
// (`ptx-out/symm_triton.ll`), shipped for CUDA C++ as relocatable device code:
//
//   target/device-lib/libsymm_device.a   sm_80 and sm_90 SASS + compute_80 PTX (`nvcc -lib`)
//   target/device-lib/symm_device.ptx    the same functions as PTX, for linking at run time
//                                        (`cuLinkAddData(..., CU_JIT_INPUT_PTX, ...)`); the
//                                        driver compiles all of it at each link (tens of s):
//                                        linking the archive at run time is faster
//                                        (`cuLinkAddFile(..., CU_JIT_INPUT_LIBRARY, ...)`)
//
// both built by `cargo xtask device-lib` (and installed by `cargo xtask install`). A kernel
// includes this header and links with relocatable device code:
//
//   nvcc -rdc=true -arch=sm_90 -I<prefix>/include my_kernel.cu -L<prefix>/lib \
//        -lsymm_device -lsymm
//
// The context argument is the device address that `symmCommGetDeviceContext` returns for a
// registered window. Every function returns a `symmDeviceStatus_t` (from symm.h), the same on
// every thread of a block.
//
// Rules (the functions synchronize with every rank):
// * Every thread of every block calls with the same arguments, outside any branch that
//   differs between threads, blocks or ranks (the functions contain `__syncthreads()`).
// * The grid is one-dimensional with at most SYMM_DEVICE_MAX_BLOCKS blocks, and blocks are
//   one-dimensional; every rank launches the same kernel with the same grid, on the stream it
//   uses for the window's other collectives. Anything else returns
//   symmDeviceInvalidArgument before touching memory (peers that did start time out).
// * Block `b` of every rank handles the same part of the data and synchronizes only with
//   block `b` of the other ranks (there is no grid-wide barrier without a cooperative launch).
//   So a kernel that writes the data it then reduces must run one block, or write from each
//   block only what that block will reduce; data written before the kernel is always seen.
// * A call is one collective in the window's sequence: calls and launched collectives on one
//   window are ordered the same way on every rank.
// * symmDeviceTimeout: a peer did not arrive within the window's timeout, or the window was
//   aborted; the host then reports symmTimeout for the communicator.
#ifndef SYMM_DEVICE_CUH
#define SYMM_DEVICE_CUH

#include "symm.h"

// Most blocks of a grid that calls the device functions (one barrier slot per block index).
#define SYMM_DEVICE_MAX_BLOCKS 64

#ifdef __cplusplus
extern "C" {
#endif

// In-place all-reduce of `num_elements` elements of `dtype` (a symmDataType_t) at
// `byte_offset` of the window described by `ctx`, with `reduce_op` (a symmRedOp_t).
// `local_ptr` is this rank's window base as the caller sees it, or 0 (not checked).
__device__ int symm_all_reduce(long long ctx, long long local_ptr, long long byte_offset,
                               long long num_elements, int reduce_op, int dtype);

// All-gather within the window of `ctx`: this rank's `n_bytes` at `send_byte_offset` land at
// `recv_byte_offset + rank * n_bytes` of every rank's window. In place when the send range is
// exactly this rank's segment of the receive range; any other overlap is refused.
__device__ int symm_all_gather(long long ctx, long long send_byte_offset,
                               long long recv_byte_offset, long long n_bytes);

// Block `b` of every rank meets block `b` of every other rank; what block `b` of each rank
// wrote to the window before the call is visible to block `b` of every rank after it.
__device__ int symm_barrier(long long ctx);

#ifdef __cplusplus
}  // extern "C"

// Typed C++ wrappers: pointers instead of byte offsets (checked against the window by the
// device functions: a pointer outside this rank's window returns symmDeviceInvalidArgument),
// and the data type from the element type.
namespace symm {

// The symmDataType_t of an element type; undefined for types symm does not reduce.
template <typename T>
struct data_type;
#define SYMM_DEVICE_DATA_TYPE(T, code) \
  template <>                          \
  struct data_type<T> {                \
    static constexpr symmDataType_t value = code; \
  }
SYMM_DEVICE_DATA_TYPE(signed char, symmInt8);
SYMM_DEVICE_DATA_TYPE(unsigned char, symmUint8);
SYMM_DEVICE_DATA_TYPE(int, symmInt32);
SYMM_DEVICE_DATA_TYPE(unsigned int, symmUint32);
SYMM_DEVICE_DATA_TYPE(long long, symmInt64);
SYMM_DEVICE_DATA_TYPE(unsigned long long, symmUint64);
#if __SIZEOF_LONG__ == 8
SYMM_DEVICE_DATA_TYPE(long, symmInt64);
SYMM_DEVICE_DATA_TYPE(unsigned long, symmUint64);
#endif
SYMM_DEVICE_DATA_TYPE(float, symmFloat32);
SYMM_DEVICE_DATA_TYPE(double, symmFloat64);
#ifdef __CUDA_FP16_TYPES_EXIST__
SYMM_DEVICE_DATA_TYPE(__half, symmFloat16);
#endif
#ifdef __CUDA_BF16_TYPES_EXIST__
SYMM_DEVICE_DATA_TYPE(__nv_bfloat16, symmBfloat16);
#endif
#ifdef __CUDA_FP8_TYPES_EXIST__
SYMM_DEVICE_DATA_TYPE(__nv_fp8_e4m3, symmFloat8e4m3);
SYMM_DEVICE_DATA_TYPE(__nv_fp8_e5m2, symmFloat8e5m2);
#endif
#undef SYMM_DEVICE_DATA_TYPE

// Byte offset of `p` in this rank's window (negative or past the end when `p` is outside:
// the device functions then refuse the call).
__device__ inline long long window_offset(const symmDeviceContext* ctx, const void* p) {
  return (long long)((unsigned long long)p - ctx->local_base);
}

// In-place all-reduce of `count` elements at `data` (in this rank's window) with `op`.
template <typename T>
__device__ inline symmDeviceStatus_t all_reduce(const symmDeviceContext* ctx, T* data,
                                                unsigned long long count, symmRedOp_t op) {
  return (symmDeviceStatus_t)symm_all_reduce((long long)ctx, (long long)ctx->local_base,
                                             window_offset(ctx, data), (long long)count,
                                             (int)op, (int)data_type<T>::value);
}

// All-gather: this rank's `count` elements at `send` land at `recv + rank * count` on every
// rank (both in this rank's window; in place when `send == recv + rank * count`).
template <typename T>
__device__ inline symmDeviceStatus_t all_gather(const symmDeviceContext* ctx, const T* send,
                                                T* recv, unsigned long long count) {
  return (symmDeviceStatus_t)symm_all_gather((long long)ctx, window_offset(ctx, send),
                                             window_offset(ctx, recv),
                                             (long long)(count * sizeof(T)));
}

// Block `b` of every rank meets block `b` of every other rank.
__device__ inline symmDeviceStatus_t barrier(const symmDeviceContext* ctx) {
  return (symmDeviceStatus_t)symm_barrier((long long)ctx);
}

}  // namespace symm
#endif  // __cplusplus

#endif  // SYMM_DEVICE_CUH
