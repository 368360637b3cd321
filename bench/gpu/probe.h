// What the GPU probes (floor_probe.cu, host_read_probe.cu) share: a checked CUDA runtime call
// and the median of a run of timings.
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e = (x);                                                              \
    if (e != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static int compare_floats(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

// The median of the `n` timings at `t` (sorted in place).
static float median(float *t, int n) {
  qsort(t, n, sizeof(float), compare_floats);
  return t[n / 2];
}
