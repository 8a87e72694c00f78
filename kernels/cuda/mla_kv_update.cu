// The MLA KV-cache write (kernels/mla_kv_update.h) on CUDA: one thread block
// per token, a dummy or padding token (slot < 0) leaves at once; and the same
// write with the step's rope fused in front of it (one launch for both).
#include <cstdint>
#include <cstring>

#include "kernels/common/rope_math.h"
#include "kernels/cuda/mla_kv_update.cuh"
#include "runtime/core/scalar_types.h"

namespace mlag::cuda {
namespace {

constexpr int kThreads = 128;

// Element types are the raw storage: float for f32, the bf16 bits (uint16_t)
// for bf16. Same-dtype conversions move bits only.
template <typename Src, typename Dst>
__device__ __forceinline__ Dst ConvertElement(Src v);
template <>
__device__ __forceinline__ float ConvertElement<float, float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ uint16_t ConvertElement<uint16_t, uint16_t>(uint16_t v) {
  return v;
}
template <>
__device__ __forceinline__ uint16_t ConvertElement<float, uint16_t>(float v) {
  return F32ToBf16(v);
}
template <>
__device__ __forceinline__ float ConvertElement<uint16_t, float>(uint16_t v) {
  return Bf16ToF32(v);
}

// An aligned register image of `kBytes` bytes, loaded and stored in one
// instruction.
template <int kBytes>
struct Vec;
template <>
struct Vec<16> {
  using Type = uint4;
};
template <>
struct Vec<8> {
  using Type = uint2;
};

// Copies n elements src -> dst with the cast. Vectors of kW elements (16
// bytes on the wider side) when both pointers are aligned for them; the rest
// (or everything, when they are not) element by element. Same-dtype copies
// move bits only, so they are exact whatever the values (NaN payloads too).
template <typename Src, typename Dst>
__device__ __forceinline__ void CopySegment(const Src* __restrict__ src, Dst* __restrict__ dst,
                                            int n) {
  constexpr int kWide = sizeof(Src) > sizeof(Dst) ? sizeof(Src) : sizeof(Dst);
  constexpr int kW = 16 / kWide;
  constexpr int kSrcBytes = kW * static_cast<int>(sizeof(Src));
  constexpr int kDstBytes = kW * static_cast<int>(sizeof(Dst));
  using SrcVec = typename Vec<kSrcBytes>::Type;
  using DstVec = typename Vec<kDstBytes>::Type;
  const bool aligned = reinterpret_cast<uintptr_t>(src) % kSrcBytes == 0 &&
                       reinterpret_cast<uintptr_t>(dst) % kDstBytes == 0;
  const int num_vec = aligned ? n / kW : 0;
  for (int i = threadIdx.x; i < num_vec; i += blockDim.x) {
    const SrcVec raw = reinterpret_cast<const SrcVec*>(src)[i];
    Src in[kW];
    memcpy(in, &raw, sizeof(raw));
    Dst out[kW];
#pragma unroll
    for (int e = 0; e < kW; ++e) out[e] = ConvertElement<Src, Dst>(in[e]);
    DstVec packed;
    memcpy(&packed, out, sizeof(packed));
    reinterpret_cast<DstVec*>(dst)[i] = packed;
  }
  for (int e = num_vec * kW + static_cast<int>(threadIdx.x); e < n; e += blockDim.x) {
    dst[e] = ConvertElement<Src, Dst>(src[e]);
  }
}

template <typename SrcC, typename SrcPe, typename Dst>
__global__ void __launch_bounds__(kThreads)
    MlaKvUpdateKernel(const SrcC* __restrict__ kv_c, int64_t kv_c_row_stride,
                      const SrcPe* __restrict__ k_pe, int64_t k_pe_row_stride,
                      const int64_t* __restrict__ slot_mapping, int64_t slot_mapping_stride,
                      Dst* __restrict__ cache, int64_t num_slots, int rkv, int dr) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t * slot_mapping_stride];
  if (slot < 0 || slot >= num_slots) return;  // dummy/padding row, or out of range
  Dst* row = cache + slot * static_cast<int64_t>(rkv + dr);
  CopySegment<SrcC, Dst>(kv_c + t * kv_c_row_stride, row, rkv);
  CopySegment<SrcPe, Dst>(k_pe + t * k_pe_row_stride, row + rkv, dr);
}

// The fused kernel's block: as many threads as LaunchRmsNorm's, so that the
// latent's sum of squares is reduced in the same order (the same bits).
constexpr int kRopeKvThreads = 256;
using RopeKvReduce = cub::BlockReduce<double, kRopeKvThreads>;

// Writes kv_c's row to the cache row: as it is, or (kNorm) as LaunchRmsNorm
// computes y = w * cast(x * inv_rms) in f32 (kernels/cuda/rms_norm.cu), cast
// to the cache dtype.
template <typename SrcC, typename Dst, bool kNorm>
__device__ __forceinline__ void WriteLatent(const SrcC* x, Dst* row, int rkv,
                                            const void* norm_weight, DType norm_weight_dtype,
                                            float norm_eps) {
  if constexpr (!kNorm) {
    CopySegment<SrcC, Dst>(x, row, rkv);
  } else {
    __shared__ typename RopeKvReduce::TempStorage reduce;
    __shared__ double sum_sq_shared;
    const int tid = static_cast<int>(threadIdx.x);
    double sum_sq = 0.0;
    for (int i = tid; i < rkv; i += kRopeKvThreads) {
      const float v = ConvertElement<SrcC, float>(x[i]);
      sum_sq += static_cast<double>(v) * static_cast<double>(v);
    }
    sum_sq = RopeKvReduce(reduce).Sum(sum_sq);  // valid in thread 0
    if (tid == 0) sum_sq_shared = sum_sq;
    __syncthreads();
    // Every thread forms the same inv_rms from the same sum, as
    // LaunchRmsNorm's thread 0 does.
    const float mean_sq = __double2float_rn(__ddiv_rn(sum_sq_shared, static_cast<double>(rkv)));
    const float inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean_sq, norm_eps)));
    for (int i = tid; i < rkv; i += kRopeKvThreads) {
      float normed = __fmul_rn(ConvertElement<SrcC, float>(x[i]), inv_rms);
      if constexpr (sizeof(SrcC) == 2) normed = Bf16ToF32(F32ToBf16(normed));  // x's dtype
      row[i] = ConvertElement<float, Dst>(
          __fmul_rn(LoadAsF32(norm_weight_dtype, norm_weight, static_cast<size_t>(i)), normed));
    }
  }
}

template <typename SrcC, typename Dst, bool kNorm>
__global__ void __launch_bounds__(kRopeKvThreads) MlaRopeKvUpdateKernel(const RopeKvUpdateArgs a) {
  MLAG_GRID_DEPENDENCY_SYNC();  // first: launched with PDL (cuda_api.cuh)
  const int64_t t = blockIdx.x;
  const int64_t p = a.positions[t * a.position_stride];
  const bool rotate = p >= 0 && p < a.table_rows;  // else left unchanged, as ApplyRope
  const int64_t slot = t < a.num_slot_tokens ? a.slot_mapping[t * a.slot_mapping_stride] : -1;
  Dst* row = slot >= 0 && slot < a.num_slots
                 ? static_cast<Dst*>(a.cache) + slot * (a.rkv + 2 * a.half)
                 : nullptr;
  const float* cos_row = a.table + (rotate ? p : 0) * a.table_row_stride;
  const float* sin_row = cos_row + a.half;
  // The pairs of every head of q_pe, then k_pe's (the last "head"), whose
  // rotated values also go to the cache row.
  for (int64_t idx = threadIdx.x; idx < (a.heads + 1) * a.half; idx += kRopeKvThreads) {
    const int64_t h = idx / a.half;
    const int64_t i = idx - h * a.half;
    float* x = h < a.heads ? a.q_pe + t * a.q_token_stride + h * a.q_head_stride
                           : a.k_pe + t * a.k_pe_row_stride;
    float y0 = x[2 * i], y1 = x[2 * i + 1];
    if (rotate) {
      RopeRotatePair(x[2 * i], x[2 * i + 1], cos_row[i], sin_row[i], &y0, &y1);
      x[2 * i] = y0;
      x[2 * i + 1] = y1;
    }
    if (h == a.heads && row != nullptr) {
      row[a.rkv + 2 * i] = ConvertElement<float, Dst>(y0);
      row[a.rkv + 2 * i + 1] = ConvertElement<float, Dst>(y1);
    }
  }
  if (row != nullptr) {  // uniform in the block: WriteLatent may synchronise it
    WriteLatent<SrcC, Dst, kNorm>(static_cast<const SrcC*>(a.kv_c) + t * a.kv_c_row_stride, row,
                                  static_cast<int>(a.rkv), a.norm_weight, a.norm_weight_dtype,
                                  a.norm_eps);
  }
}

template <typename SrcC, typename Dst>
cudaError_t LaunchRopeKv(const RopeKvUpdateArgs& a, cudaStream_t stream) {
  auto* const kernel = a.norm_weight != nullptr ? MlaRopeKvUpdateKernel<SrcC, Dst, true>
                                                : MlaRopeKvUpdateKernel<SrcC, Dst, false>;
  MLAG_LAUNCH_PDL(kernel, static_cast<unsigned>(a.num_tokens), kRopeKvThreads, 0, stream)(a);
  return cudaGetLastError();
}

struct KvArgs {
  const void* kv_c;
  int64_t kv_c_row_stride;
  const void* k_pe;
  int64_t k_pe_row_stride;
  const int64_t* slot_mapping;
  int64_t slot_mapping_stride;
  int64_t num_tokens;
  void* cache;
  int64_t num_slots;
  int rkv, dr;
};

template <typename SrcC, typename SrcPe, typename Dst>
cudaError_t Launch(const KvArgs& a, cudaStream_t stream) {
  auto* const kernel = MlaKvUpdateKernel<SrcC, SrcPe, Dst>;
  MLAG_LAUNCH_PDL(kernel, static_cast<unsigned>(a.num_tokens), kThreads, 0, stream)
  (static_cast<const SrcC*>(a.kv_c), a.kv_c_row_stride, static_cast<const SrcPe*>(a.k_pe),
   a.k_pe_row_stride, a.slot_mapping, a.slot_mapping_stride, static_cast<Dst*>(a.cache),
   a.num_slots, a.rkv, a.dr);
  return cudaGetLastError();
}

template <typename SrcC, typename SrcPe>
cudaError_t LaunchForCache(const KvArgs& a, DType cache_dtype, cudaStream_t stream) {
  return cache_dtype == DType::kF32 ? Launch<SrcC, SrcPe, float>(a, stream)
                                    : Launch<SrcC, SrcPe, uint16_t>(a, stream);
}

}  // namespace

cudaError_t LaunchMlaKvUpdate(const void* kv_c, DType kv_c_dtype, int64_t kv_c_row_stride,
                              const void* k_pe, DType k_pe_dtype, int64_t k_pe_row_stride,
                              const int64_t* slot_mapping, int64_t slot_mapping_stride,
                              int64_t num_tokens, void* cache, DType cache_dtype, int64_t num_slots,
                              int64_t rkv, int64_t dr, cudaStream_t stream) {
  auto is_float = [](DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; };
  if (num_tokens < 0 || num_tokens > 0x7fffffff || rkv < 0 || dr < 0 || rkv + dr > 0x7fffffff ||
      !is_float(kv_c_dtype) || !is_float(k_pe_dtype) || !is_float(cache_dtype)) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  const KvArgs a{kv_c,
                 kv_c_row_stride,
                 k_pe,
                 k_pe_row_stride,
                 slot_mapping,
                 slot_mapping_stride,
                 num_tokens,
                 cache,
                 num_slots,
                 static_cast<int>(rkv),
                 static_cast<int>(dr)};
  if (kv_c_dtype == DType::kF32) {
    return k_pe_dtype == DType::kF32 ? LaunchForCache<float, float>(a, cache_dtype, stream)
                                     : LaunchForCache<float, uint16_t>(a, cache_dtype, stream);
  }
  return k_pe_dtype == DType::kF32 ? LaunchForCache<uint16_t, float>(a, cache_dtype, stream)
                                   : LaunchForCache<uint16_t, uint16_t>(a, cache_dtype, stream);
}

cudaError_t LaunchMlaRopeKvUpdate(const RopeKvUpdateArgs& a, cudaStream_t stream) {
  auto is_float = [](DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; };
  if (a.num_tokens < 0 || a.num_tokens > 0x7fffffff || a.half < 0 || a.heads < 0 || a.rkv < 0 ||
      a.rkv + 2 * a.half > 0x7fffffff || a.num_slot_tokens > a.num_tokens ||
      !is_float(a.kv_c_dtype) || !is_float(a.cache_dtype) ||
      (a.norm_weight != nullptr && !is_float(a.norm_weight_dtype))) {
    return cudaErrorInvalidValue;
  }
  if (a.num_tokens == 0) return cudaSuccess;
  if (a.kv_c_dtype == DType::kF32) {
    return a.cache_dtype == DType::kF32 ? LaunchRopeKv<float, float>(a, stream)
                                        : LaunchRopeKv<float, uint16_t>(a, stream);
  }
  return a.cache_dtype == DType::kF32 ? LaunchRopeKv<uint16_t, float>(a, stream)
                                      : LaunchRopeKv<uint16_t, uint16_t>(a, stream);
}

}  // namespace mlag::cuda
