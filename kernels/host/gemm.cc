#include "kernels/host/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "kernels/host/isa_target.h"
#include "kernels/host/parallel.h"
#include "runtime/core/fp8_blocks.h"

namespace mlag::host {
namespace {

// The e4m3 bits of a weight, moved to where an f32's sign and top mantissa
// bits are, read as an f32 are the weight times 2^-120 (normal and subnormal
// alike); multiplying by the scale times 2^120 gives scale * weight, rounded
// once: exactly Fp8Dequantize.
constexpr float kFp8Unbias = 0x1p120f;

// The kernels' building blocks (gemm_kernel.inc) are forced inline: their
// register blocking and constant trip counts exist only once inlined into
// the loops that call them. Under AddressSanitizer, a test build where their
// speed does not matter, the compiler chooses instead: forced and
// instrumented, the AVX2 panels alone came to 2 MB of code, and this file
// to over two minutes of CI's sanitizer build.
#if defined(__SANITIZE_ADDRESS__)
#define MLAG_GEMM_BLOCK_INLINE inline
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MLAG_GEMM_BLOCK_INLINE inline
#endif
#endif
#ifndef MLAG_GEMM_BLOCK_INLINE
#define MLAG_GEMM_BLOCK_INLINE __attribute__((always_inline)) inline
#endif

// GNU vectors of N elements of T.
template <typename T, int N>
struct Vec {
  typedef T type __attribute__((vector_size(N * sizeof(T))));
};

// Storage type of one weight element.
template <DType kW>
using WType = std::conditional_t<kW == DType::kF32, float,
                                 std::conditional_t<kW == DType::kBF16, uint16_t, uint8_t>>;

// Software prefetch of w: one cache line per line of weights read. Row-major
// w: kPrefetchAheadBytes ahead in each row (past a short row's end: the rows
// after it, which come next). Packed w, one stream: further ahead in it.
constexpr size_t kCacheLine = 64;
constexpr int64_t kPrefetchAheadBytes = 2048;
constexpr int64_t kPackedPrefetchAheadBytes = 4096;

// The packed kernels' block: rows of x by vectors of w rows.
struct SlabBlocking {
  int rows;
  int vectors;
};

using GemmFn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, const GemmWeights&,
                        float*, int64_t);
using AccumulateFn = void (*)(int64_t, int64_t, int64_t, const float*, int64_t, const float* const*,
                              float*, int64_t, const void*, int64_t);

// One copy of the kernels per ISA, each compiled for it. Register budgets:
// AVX-512 has 32 vector registers (6 x 4 accumulators, 4 w vectors, 1 x
// vector; fp8 needs temporaries for its conversion, so 5 x 4 row-major;
// packed blocks 6 x 4 accumulators and 4 w vectors, x broadcast from memory;
// 4 x 4 accumulators for GemmNNAccumulate), AVX2 and SSE2 16.
#if defined(__x86_64__) || defined(__i386__)
MLAG_HOST_TARGET_BEGIN("avx512f,avx512bw,fma")
namespace avx512 {
constexpr int kLanes = 16;
constexpr bool kFma = true;
constexpr int kRowBlock = 6, kColBlock = 4, kRowBlockFp8 = 5;
// Packed: 6 rows x 4 vectors, 24 accumulators, every dtype and row count.
template <DType>
constexpr SlabBlocking kSlabBlockingOne = {6, 4};
template <DType>
constexpr SlabBlocking kSlabBlocking = {6, 4};
template <DType>
constexpr SlabBlocking kSlabBlockingMany = {6, 4};
constexpr int kSlabManyRows = 1;
template <DType kW, int>
constexpr SlabBlocking kSlabBlockingLeft = kSlabBlocking<kW>;
constexpr int kAccRows = 4, kAccVectors = 4;
template <typename V>
__attribute__((always_inline)) inline V VFma(V a, V b, V c) {
  return _mm512_fmadd_ps(a, b, c);
}
__attribute__((always_inline)) inline Vec<float, 16>::type Splat(float f) {
  return _mm512_set1_ps(f);
}
// Intrinsics: __builtin_convertvector of bytes to int32 is scalarised. The
// zero-masked form, as the plain one passes GCC an undefined vector that
// -Wmaybe-uninitialized flags.
__attribute__((always_inline)) inline Vec<int32_t, 16>::type WidenBytes(const uint8_t* p) {
  return reinterpret_cast<Vec<int32_t, 16>::type>(_mm512_maskz_cvtepi8_epi32(
      static_cast<__mmask16>(0xffff), _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
template <typename V>
__attribute__((always_inline)) inline void InRegister(V& v) {
  asm("" : "+v"(v));
}
#include "kernels/host/gemm_kernel.inc"
}  // namespace avx512
MLAG_HOST_TARGET_END

MLAG_HOST_TARGET_BEGIN("avx2,fma")
namespace avx2 {
constexpr int kLanes = 8;
constexpr bool kFma = true;
constexpr int kRowBlock = 4, kColBlock = 2, kRowBlockFp8 = 3;
// Packed, in 16 registers. A row alone (batch-1 decode, which streams w
// from memory): 1 x 8, a whole slab a step, 8 chains (with parts, each
// would be a pass over the group's memory reading every other cache line).
// 2 to 4 rows: 2 x 4 from L1 (the rows a larger panel leaves over:
// kSlabBlockingLeft below). From
// kSlabManyRows rows a block (blocks from L1, arithmetic-bound): f32 6 x 2 (12
// accumulators, 2 w vectors, the x broadcast: 2 x 4's 8 chains are too few
// to hide the FMA latency, and it loads w once per 2 FMAs instead of once
// per 1.3), bf16 and fp8 5 x 2 (their conversion takes registers; from 11
// rows fp8 is converted to f32 once per chunk and multiplied as f32). On a
// 2-core Zen 4 capped to AVX2, f32
// [512 x 2048] x [2048 x 7168]: 93 GFLOP/s with 2 x 4, 179 with 6 x 2
// (OpenBLAS's Haswell kernel: 188).
template <DType>
constexpr SlabBlocking kSlabBlockingOne = {1, 8};
template <DType>
constexpr SlabBlocking kSlabBlocking = {2, 4};
template <DType kW>
constexpr SlabBlocking kSlabBlockingMany =
    kW == DType::kF32 ? SlabBlocking{6, 2} : SlabBlocking{5, 2};
constexpr int kSlabManyRows = 5;
// The r rows left after those blocks (and a panel of 2 to 4 rows), in one
// block that converts each weight once: 1 x 8, 2 x 4, 3 x 2, 4 x 2, 5 x 2
// (fp8 too, since its vectors load one by one: see kFp8ByteLoads). Before,
// every leftover ran 2 x 4: 3 rows as 1 + 2 (the one row's 4 chains cannot
// hide the FMA latency, and each block converts the weights again). 3 x 4
// would not fit: GCC kept 3 of its 12 accumulators on the stack, chains
// through memory.
template <DType kW, int kR>
constexpr SlabBlocking kSlabBlockingLeft = kR == 1   ? SlabBlocking{1, 8}
                                           : kR == 2 ? SlabBlocking{2, 4}
                                                     : SlabBlocking{kR, 2};
// GemmNNAccumulate: 6 rows x 2 vectors, 12 chains (2 x 4's 8 cannot hide the
// FMA latency), as the packed blocks of many rows.
constexpr int kAccRows = 6, kAccVectors = 2;
template <typename V>
__attribute__((always_inline)) inline V VFma(V a, V b, V c) {
  return _mm256_fmadd_ps(a, b, c);
}
__attribute__((always_inline)) inline Vec<float, 8>::type Splat(float f) {
  return _mm256_set1_ps(f);
}
__attribute__((always_inline)) inline Vec<int32_t, 8>::type WidenBytes(const uint8_t* p) {
  return reinterpret_cast<Vec<int32_t, 8>::type>(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
template <typename V>
__attribute__((always_inline)) inline void InRegister(V& v) {
  asm("" : "+v"(v));
}
#include "kernels/host/gemm_kernel.inc"
}  // namespace avx2
MLAG_HOST_TARGET_END
#endif

// Baseline x86-64 (SSE2), or any other architecture's default vector unit.
namespace base {
constexpr int kLanes = 4;
constexpr bool kFma = false;
constexpr int kRowBlock = 4, kColBlock = 2, kRowBlockFp8 = 3;
template <DType>
constexpr SlabBlocking kSlabBlockingOne = {2, 4};
template <DType>
constexpr SlabBlocking kSlabBlocking = {2, 4};
template <DType>
constexpr SlabBlocking kSlabBlockingMany = {2, 4};
constexpr int kSlabManyRows = 1;
template <DType kW, int>
constexpr SlabBlocking kSlabBlockingLeft = kSlabBlocking<kW>;
constexpr int kAccRows = 2, kAccVectors = 4;
template <typename V>
__attribute__((always_inline)) inline V VFma(V a, V b, V c) {
  return c + a * b;  // no FMA unit: no contraction either
}
__attribute__((always_inline)) inline Vec<float, 4>::type Splat(float f) {
  return Vec<float, 4>::type{f, f, f, f};
}
__attribute__((always_inline)) inline Vec<int32_t, 4>::type WidenBytes(const uint8_t* p) {
  Vec<int8_t, 4>::type b;
  __builtin_memcpy(&b, p, sizeof(b));
  return __builtin_convertvector(b, Vec<int32_t, 4>::type);
}
template <typename V>
__attribute__((always_inline)) inline void InRegister(V&) {}
#include "kernels/host/gemm_kernel.inc"
}  // namespace base

struct Variant {
  GemmFn f32, bf16, fp8;
  AccumulateFn accumulate;
  int64_t (*peak_probe)(int64_t);
  const char* isa;
};

Variant Select() {
  // MLAG_HOST_ISA caps the choice (tests of the narrower variants).
  const char* env = std::getenv("MLAG_HOST_ISA");
  const std::string cap = env != nullptr ? env : "";
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (cap != "avx2" && cap != "sse2" && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("fma")) {
    return {avx512::GemmF32,          avx512::GemmBf16,  avx512::GemmFp8,
            avx512::GemmNNAccumulate, avx512::PeakProbe, "avx512"};
  }
  if (cap != "sse2" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return {avx2::GemmF32,          avx2::GemmBf16,  avx2::GemmFp8,
            avx2::GemmNNAccumulate, avx2::PeakProbe, "avx2"};
  }
#endif
  return {base::GemmF32,          base::GemmBf16,  base::GemmFp8,
          base::GemmNNAccumulate, base::PeakProbe, "sse2"};
}

const Variant& Chosen() {
  static const Variant v = Select();
  return v;
}

}  // namespace

GemmWeights GemmWeights::FromRow(int64_t r) const {
  GemmWeights w = *this;
  // A packed group occupies its rows' bytes, so row r (a group's first)
  // starts where it would row-major.
  w.data = static_cast<const char*>(data) + r * ld * static_cast<int64_t>(DTypeSize(dtype));
  if (scales != nullptr) w.scales = scales + r * scales_ld;
  w.packed_rows = std::max<int64_t>(0, packed_rows - r);
  return w;
}

namespace {

// Rewrites every whole group of the [n, k] matrix at `data` (elements of
// kESize bytes), packing it or (unpack) undoing that. A group is copied
// aside and its elements moved a tile of kTileK elements of k at a time, so
// the tile's slabs stay in L1 while its rows are read (or written) in runs.
template <size_t kESize>
void RearrangeGroups(void* data, DType dtype, int64_t n, int64_t k, bool unpack) {
  using E =
      std::conditional_t<kESize == 4, uint32_t, std::conditional_t<kESize == 2, uint16_t, uint8_t>>;
  constexpr int64_t kG = kGemmGroupRows, kTileK = 16;
  int64_t position[kG];
  for (int64_t r = 0; r < kG; ++r) position[r] = GemmSlabPosition(dtype, r);
  const int64_t groups = n / kG;
  const size_t group_elems = static_cast<size_t>(kG * k);
  ParallelFor(groups, [&](int64_t g) {
    thread_local std::vector<E> scratch;
    if (scratch.size() < group_elems) scratch.resize(group_elems);
    E* group = static_cast<E*>(data) + static_cast<size_t>(g) * group_elems;
    std::memcpy(scratch.data(), group, group_elems * kESize);
    const E* from = scratch.data();
    E* to = group;
    for (int64_t p0 = 0; p0 < k; p0 += kTileK) {
      const int64_t p1 = std::min(k, p0 + kTileK);
      for (int64_t r = 0; r < kG; ++r) {
        // Row r's elements [p0, p1): row-major at r k + p, packed at
        // p kG + position[r].
        for (int64_t p = p0; p < p1; ++p) {
          if (unpack) {
            to[r * k + p] = from[p * kG + position[r]];
          } else {
            to[p * kG + position[r]] = from[r * k + p];
          }
        }
      }
    }
  });
}

void RearrangeGroups(void* data, DType dtype, int64_t n, int64_t k, bool unpack) {
  switch (DTypeSize(dtype)) {
    case 4:
      return RearrangeGroups<4>(data, dtype, n, k, unpack);
    case 2:
      return RearrangeGroups<2>(data, dtype, n, k, unpack);
    default:
      return RearrangeGroups<1>(data, dtype, n, k, unpack);
  }
}

}  // namespace

int64_t GemmSlabPosition(DType dtype, int64_t r) {
  switch (DTypeSize(dtype)) {
    case 4:
      return r;
    case 2:
      return 2 * (r % 16 + 16 * (r / 32)) + (r % 32) / 16;
    default:
      return 4 * (r % 16) + r / 16;
  }
}

int64_t PackGemmRowGroups(void* data, DType dtype, int64_t n, int64_t k) {
  RearrangeGroups(data, dtype, n, k, /*unpack=*/false);
  return n / kGemmGroupRows * kGemmGroupRows;
}

void UnpackGemmRowGroups(void* data, DType dtype, int64_t n, int64_t k) {
  RearrangeGroups(data, dtype, n, k, /*unpack=*/true);
}

void GemmNT(int64_t rows, int64_t n_out, int64_t k, const float* x, int64_t ldx,
            const GemmWeights& w, float* y, int64_t ldy) {
  if (rows <= 0 || n_out <= 0) return;
  const Variant& v = Chosen();
  const GemmFn fn = w.dtype == DType::kBF16 ? v.bf16 : w.dtype == DType::kF8E4M3 ? v.fp8 : v.f32;
  fn(rows, n_out, k, x, ldx, w, y, ldy);
}

void GemmNNAccumulate(int64_t rows, int64_t n, int64_t k, const float* x, int64_t ldx,
                      const float* const* w_rows, float* y, int64_t ldy, const void* prefetch,
                      int64_t prefetch_bytes) {
  if (rows <= 0 || n <= 0 || k <= 0) return;
  Chosen().accumulate(rows, n, k, x, ldx, w_rows, y, ldy, prefetch, prefetch_bytes);
}

int64_t GemmPeakProbe(int64_t steps) { return steps > 0 ? Chosen().peak_probe(steps) : 0; }

const char* GemmIsa() { return Chosen().isa; }

}  // namespace mlag::host
