#include "kernels/host/small_gemm.h"

#include <algorithm>

namespace mlag::host {
namespace {

// One block: rows [0, kMB) of x against rows [0, kNB) of w. Each (m, n) has
// its own accumulator vector of kLanes partial sums (lane j sums k = j mod
// kLanes over the vector part of k); the lanes are then added in order and
// the scalar tail of k follows. Inlined into the ISA-specific callers below,
// whose target options decide the instructions (the body itself is plain
// GNU vector code).
template <int kLanes, int kNB, int kMB>
__attribute__((always_inline)) inline void Block(const float* x, int64_t ldx, const float* w,
                                                 int64_t ldw, float* y, int64_t ldy, int64_t k) {
  typedef float V __attribute__((vector_size(kLanes * sizeof(float))));
  V acc[kNB][kMB];
  for (int j = 0; j < kNB; ++j) {
    for (int i = 0; i < kMB; ++i) acc[j][i] = V{};
  }
  const int64_t k_vec = k / kLanes * kLanes;
  for (int64_t p = 0; p < k_vec; p += kLanes) {
    V wv[kNB];
    for (int j = 0; j < kNB; ++j) __builtin_memcpy(&wv[j], w + j * ldw + p, sizeof(V));
    for (int i = 0; i < kMB; ++i) {
      V xv;
      __builtin_memcpy(&xv, x + i * ldx + p, sizeof(V));
      for (int j = 0; j < kNB; ++j) acc[j][i] += wv[j] * xv;
    }
  }
  for (int j = 0; j < kNB; ++j) {
    for (int i = 0; i < kMB; ++i) {
      float lanes[kLanes];
      __builtin_memcpy(lanes, &acc[j][i], sizeof(V));
      float s = 0.0f;
      for (int l = 0; l < kLanes; ++l) s += lanes[l];
      for (int64_t p = k_vec; p < k; ++p) s += x[i * ldx + p] * w[j * ldw + p];
      y[i * ldy + j] = s;
    }
  }
}

// w rows in groups of kNB, read from memory once and from L1 for every
// block of up to kMB rows of x (kNB x kMB accumulators, the kNB w vectors
// and one x vector fit the vector registers). A last partial group of w
// rows goes one row at a time; the sums are the same either way.
template <int kLanes, int kMB, int kNB>
__attribute__((always_inline)) inline void Gemm(int64_t rows, int64_t n_out, int64_t k,
                                                const float* x, int64_t ldx, const float* w,
                                                int64_t ldw, float* y, int64_t ldy) {
  for (int64_t n0 = 0; n0 < n_out; n0 += kNB) {
    const bool full = n0 + kNB <= n_out;
    const float* wn = w + n0 * ldw;
    for (int64_t m0 = 0; m0 < rows; m0 += kMB) {
      const int64_t mb = std::min<int64_t>(kMB, rows - m0);
      const float* xm = x + m0 * ldx;
      float* ym = y + m0 * ldy + n0;
#define MLAG_SMALL_GEMM_CASE(MB)                                                \
  case MB:                                                                      \
    if (full) {                                                                 \
      Block<kLanes, kNB, MB>(xm, ldx, wn, ldw, ym, ldy, k);                     \
    } else {                                                                    \
      for (int64_t j = n0; j < n_out; ++j) {                                    \
        Block<kLanes, 1, MB>(xm, ldx, w + j * ldw, ldw, ym + (j - n0), ldy, k); \
      }                                                                         \
    }                                                                           \
    break;
      switch (mb) {
        MLAG_SMALL_GEMM_CASE(1)
        MLAG_SMALL_GEMM_CASE(2)
        MLAG_SMALL_GEMM_CASE(3)
        MLAG_SMALL_GEMM_CASE(4)
        case 5:
        case 6:
          if constexpr (kMB >= 6) {
            switch (mb) {
              MLAG_SMALL_GEMM_CASE(5)
              MLAG_SMALL_GEMM_CASE(6)
            }
          }
          break;
      }
#undef MLAG_SMALL_GEMM_CASE
    }
  }
}

using GemmFn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t,
                        float*, int64_t);

#if defined(__x86_64__) || defined(__i386__)
// 32 zmm registers: 4 x 6 accumulators of 16 lanes, 4 w vectors, 1 x vector.
__attribute__((target("avx512f,fma"))) void GemmAvx512(int64_t rows, int64_t n_out, int64_t k,
                                                       const float* x, int64_t ldx, const float* w,
                                                       int64_t ldw, float* y, int64_t ldy) {
  Gemm<16, 6, 4>(rows, n_out, k, x, ldx, w, ldw, y, ldy);
}

// 16 ymm registers: 2 x 4 accumulators of 8 lanes, 2 w vectors, 1 x vector.
__attribute__((target("avx2,fma"))) void GemmAvx2(int64_t rows, int64_t n_out, int64_t k,
                                                  const float* x, int64_t ldx, const float* w,
                                                  int64_t ldw, float* y, int64_t ldy) {
  Gemm<8, 4, 2>(rows, n_out, k, x, ldx, w, ldw, y, ldy);
}
#endif

// Baseline x86-64 (SSE2), or any other architecture's default vector unit.
void GemmBase(int64_t rows, int64_t n_out, int64_t k, const float* x, int64_t ldx, const float* w,
              int64_t ldw, float* y, int64_t ldy) {
  Gemm<4, 4, 2>(rows, n_out, k, x, ldx, w, ldw, y, ldy);
}

struct Variant {
  GemmFn fn;
  const char* isa;
};

Variant Select() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) {
    return {GemmAvx512, "avx512"};
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {GemmAvx2, "avx2"};
#endif
  return {GemmBase, "sse2"};
}

const Variant& Chosen() {
  static const Variant v = Select();
  return v;
}

}  // namespace

void SmallRowsGemmNT(int64_t rows, int64_t n_out, int64_t k, const float* x, int64_t ldx,
                     const float* w, int64_t ldw, float* y, int64_t ldy) {
  if (rows <= 0 || n_out <= 0) return;
  Chosen().fn(rows, n_out, k, x, ldx, w, ldw, y, ldy);
}

const char* SmallGemmIsa() { return Chosen().isa; }

}  // namespace mlag::host
