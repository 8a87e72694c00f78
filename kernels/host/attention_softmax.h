// One key tile of the host attention's online softmax, vectorised across
// queries (kernels/host/mla_attention.cc). Compiled for AVX-512, AVX2 + FMA
// or SSE2, the same choice as the host GEMM (GemmIsa, MLAG_HOST_ISA).
//
// The scores of a tile are stored key-major, one lane per query
// (scores_t[j * lanes + q]), which is how the score GEMM writes them, so
// every step below is one vector operation over a row of queries: the
// scaled and masked scores, their tile maximum, the rescale factor, the
// exponentials and the tile sum. Each lane's result depends only on that
// lane's scores, limit and state: never on the other queries of the tile.
#pragma once

#include <cstdint>

namespace mlag::host {

// The running softmax of `lanes` queries, one lane each (a multiple of
// kSoftmaxLanes; lanes past the real queries have limit 0 and stay empty).
struct SoftmaxLanes {
  int64_t lanes;
  float* max;            // running maximum, -inf before the first unmasked score
  float* sum;            // running sum of exp(score - max)
  const int32_t* limit;  // query q sees keys at positions < limit[q]
};

// Every host vector width divides this.
inline constexpr int64_t kSoftmaxLanes = 16;

// Folds the n keys at positions key0, key0 + 1, ... (below 2^31) into the
// softmax (lanes a multiple of kSoftmaxLanes, nq <= lanes):
//   s = scale * scores_t[j * lanes + q], or -inf at positions >= limit[q];
//   m = max(max[q], max_j s); alpha = exp(max[q] - m) (0 when max[q] is
//   -inf); sum[q] = fma(sum[q], alpha, sum_j p_j in j order) (fused where
//   the ISA has FMA), p_j = exp(s_j - m) (0 for s_j = -inf); max[q] = m;
//   acc[q * rkv, (q + 1) * rkv) *= alpha when alpha != 1, for q < nq;
//   probs[q * ldp + j] = p_j for q < nq, j < n (query-major, as the value
//   GEMM reads them).
// exp is ExpNonPositive below. Overwrites scores_t.
void SoftmaxTile(const SoftmaxLanes& s, int64_t nq, int64_t n, int64_t key0, float scale,
                 float* scores_t, float* probs, int64_t ldp, float* acc, int64_t rkv);

// exp(x) for x <= 0 (a softmax's shifted scores), within 2 ulp of the exact
// value; 0 for x below -87.3 (past f32's normal range) and for -inf. The
// same bits for x whatever the vector width; the SSE2 variant, without
// FMA, rounds its products separately.
float ExpNonPositive(float x);

}  // namespace mlag::host
