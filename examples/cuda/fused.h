/* What the two device-API examples share: the kernel's signature, the layout of each rank's
 * window, the values a rank produces and the independent check (in double). Plain C, so that
 * both the CUDA C++ program (device_allreduce.cu) and the C driver-API program (jit_link.c)
 * include it. */
#ifndef SYMM_EXAMPLE_FUSED_H
#define SYMM_EXAMPLE_FUSED_H

#include <stddef.h>
#include <stdio.h>
#include "symm.h"

#ifdef __CUDACC__
#define FUSED_FN static inline __host__ __device__
#else
#define FUSED_FN static inline
#endif

/* Threads per block of the example kernel. */
#define FUSED_THREADS 256
/* Floats each rank contributes to the all-gather. */
#define FUSED_TAG 4

/* Window layout, in floats: [data: count][gathered: nranks * FUSED_TAG][tag: FUSED_TAG], each
 * part starting at a multiple of 16 bytes. */
FUSED_FN size_t fused_round4(size_t n) { return (n + 3) / 4 * 4; }
FUSED_FN size_t fused_gathered_at(size_t count) { return fused_round4(count); }
FUSED_FN size_t fused_tag_at(size_t count, int nranks) {
  return fused_gathered_at(count) + fused_round4((size_t)nranks * FUSED_TAG);
}
FUSED_FN size_t fused_window_bytes(size_t count, int nranks) {
  return (fused_tag_at(count, nranks) + FUSED_TAG) * sizeof(float);
}

/* What rank `rank` writes at index i before the all-reduce (exact sums in float). */
FUSED_FN float fused_input(int rank, size_t i) {
  return (float)(rank + 1) + 0.25f * (float)(i % 13);
}
/* The tag rank `rank` contributes to the all-gather. */
FUSED_FN float fused_tag(int rank, int j) { return (float)(100 * rank + j); }

/* Check one rank's window after the kernel (host copy `window`, the statuses of every block);
 * returns the number of wrong values, printing the first few. */
static inline size_t fused_check(int rank, int nranks, size_t count, const float* window,
                                 const int* status, int blocks) {
  size_t wrong = 0;
  for (int b = 0; b < blocks; b++) {
    if (status[b] != symmDeviceSuccess) {
      fprintf(stderr, "rank %d block %d: device status %d\n", rank, b, status[b]);
      wrong++;
    }
  }
  for (size_t i = 0; i < count; i++) {
    double want = 0.0;
    for (int r = 0; r < nranks; r++) want += (double)r + 1.0 + 0.25 * (double)(i % 13);
    if ((double)window[i] != want && wrong++ < 5) {
      fprintf(stderr, "rank %d: data[%zu] = %g, want %g\n", rank, i, window[i], want);
    }
  }
  const float* gathered = window + fused_gathered_at(count);
  for (int r = 0; r < nranks; r++) {
    for (int j = 0; j < FUSED_TAG; j++) {
      float got = gathered[r * FUSED_TAG + j];
      if (got != fused_tag(r, j) && wrong++ < 5) {
        fprintf(stderr, "rank %d: gathered[%d][%d] = %g, want %g\n", rank, r, j, got,
                fused_tag(r, j));
      }
    }
  }
  return wrong;
}

#endif
