#include "kernels/host/attention_softmax.h"

#include <cmath>
#include <cstring>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "kernels/host/gemm.h"
#include "kernels/host/isa_target.h"

namespace mlag::host {
namespace {

using SoftmaxTileFn = void (*)(const SoftmaxLanes&, int64_t, int64_t, int64_t, float, float*,
                               float*, int64_t, float*, int64_t);
using ExpFn = float (*)(float);

#if defined(__x86_64__) || defined(__i386__)
MLAG_HOST_TARGET_BEGIN("avx512f,avx512bw,fma")
namespace avx512 {
constexpr int kLanes = 16;
typedef float V __attribute__((vector_size(64)));
typedef int32_t I __attribute__((vector_size(64)));
typedef uint32_t U __attribute__((vector_size(64)));
inline V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V Splat(float f) { return _mm512_set1_ps(f); }
#include "kernels/host/attention_softmax_kernel.inc"
}  // namespace avx512
MLAG_HOST_TARGET_END

MLAG_HOST_TARGET_BEGIN("avx2,fma")
namespace avx2 {
constexpr int kLanes = 8;
typedef float V __attribute__((vector_size(32)));
typedef int32_t I __attribute__((vector_size(32)));
typedef uint32_t U __attribute__((vector_size(32)));
inline V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V Splat(float f) { return _mm256_set1_ps(f); }
#include "kernels/host/attention_softmax_kernel.inc"
}  // namespace avx2
MLAG_HOST_TARGET_END
#endif

// Baseline x86-64 (SSE2), or any other architecture's default vector unit.
namespace base {
constexpr int kLanes = 4;
typedef float V __attribute__((vector_size(16)));
typedef int32_t I __attribute__((vector_size(16)));
typedef uint32_t U __attribute__((vector_size(16)));
inline V Fma(V a, V b, V c) { return c + a * b; }  // no FMA unit: no contraction either
inline V Splat(float f) { return V{f, f, f, f}; }
#include "kernels/host/attention_softmax_kernel.inc"
}  // namespace base

struct Variant {
  SoftmaxTileFn tile;
  ExpFn exp;
};

// The GEMM's choice (GemmIsa), so that MLAG_HOST_ISA caps both alike.
const Variant& Chosen() {
  static const Variant v = [] {
    const std::string_view isa = GemmIsa();
#if defined(__x86_64__) || defined(__i386__)
    if (isa == "avx512") return Variant{avx512::SoftmaxTile, avx512::Exp1};
    if (isa == "avx2") return Variant{avx2::SoftmaxTile, avx2::Exp1};
#endif
    return Variant{base::SoftmaxTile, base::Exp1};
  }();
  return v;
}

}  // namespace

void SoftmaxTile(const SoftmaxLanes& s, int64_t nq, int64_t n, int64_t key0, float scale,
                 float* scores_t, float* probs, int64_t ldp, float* acc, int64_t rkv) {
  Chosen().tile(s, nq, n, key0, scale, scores_t, probs, ldp, acc, rkv);
}

float ExpNonPositive(float x) { return Chosen().exp(x); }

}  // namespace mlag::host
