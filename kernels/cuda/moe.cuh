// CUDA launchers behind kernels/moe.h. CUDA, CCCL and the standard library
// only (no Abseil): kernels/moe.cc validates the arguments and turns the
// returned cudaError_t into a Status.
//
// Both launches are graph-capturable: their grids depend only on the shapes
// (T, K, E, L, D, I), never on the routing, and they neither allocate nor
// synchronise nor read device memory on the host. MoeExperts takes its
// scratch from a caller-owned device buffer of MoeExpertsWorkspaceBytes().
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// ---- Routing ---------------------------------------------------------------

// Top-k method codes (mirror mlag::TopkMethod).
enum MoeTopkMethod : int { kMoeGreedy = 0, kMoeGroupLimitedGreedy = 1, kMoeNoauxTc = 2 };

// mlag::RoutingParams in plain types (see kernels/moe.h for the semantics).
struct MoeRouteParams {
  int num_experts = 0;   // E
  int top_k = 0;         // K (<= E)
  int n_group = 1;       // G, divides E
  int topk_group = 1;    // groups kept (grouped methods)
  bool sigmoid = false;  // scoring: sigmoid, else softmax
  int method = kMoeGreedy;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};

// The router keeps a token's scores in shared memory (one warp per token):
// at most this many experts.
inline constexpr int kMoeRouteMaxExperts = 4096;

// One warp per token: scores (softmax / sigmoid), selection scores (+ bias
// for noaux_tc), group masking, top-k with ties to the lower index (the rule
// of kernels/common/routing_math.h), weights as on the host.
//   logits: f32 [T, E], row stride logits_ld; correction_bias: f32 [E] or
//   nullptr (used only for kMoeNoauxTc); topk_ids: i32 [T, K]; topk_weights:
//   f32 [T, K], both contiguous.
// NaN scores rank as -inf here (the host's order is undefined for NaN).
cudaError_t LaunchMoeRoute(const MoeRouteParams& params, const float* logits, int64_t logits_ld,
                           const float* correction_bias, int64_t num_tokens, int32_t* topk_ids,
                           float* topk_weights, cudaStream_t stream);

// The gate and the routing in one launch, for decode-sized batches: logits
// [T, E] (row stride logits_ld) = x [T, D] (row stride x_ld) w_gate^T
// (w_gate f32 [E, D] contiguous), one CTA of 4 warps per expert, each warp
// a quarter of the row in a fixed summation order (a token's logits are the
// same in any batch); then the last CTA to finish routes every token as
// LaunchMoeRoute does. `counter`: one i32 of device
// memory, 0 before the launch and left 0 after (launches using one counter
// must be stream-ordered). Design: at batch 1 the gate is a 4 x D x E byte
// read (V3: 7.3 MB, 256 CTAs of 28 KB, about 2 a SM; each warp keeps 4 loads
// of 512 B in flight, 16 KB a SM: ~3 us at ~0.8 us latency on an H200;
// v2-lite: 512 KB, 64 CTAs, latency-bound at ~1-2 us), where cuBLASLt's
// GEMM plus the router are two nodes and a launch gap. num_tokens <= kMoeGateRouteMaxTokens (the
// last CTA routes them all: 4 warps, at most 8 tokens each); E as
// LaunchMoeRoute, with 4 warps' route and logit rows fitting 48 KB of shared
// memory (E <= about 1500).
inline constexpr int64_t kMoeGateRouteMaxTokens = 32;
cudaError_t LaunchMoeGateRoute(const MoeRouteParams& params, const float* x, int64_t x_ld,
                               const float* w_gate, int64_t D, const float* correction_bias,
                               int64_t num_tokens, float* logits, int64_t logits_ld,
                               int32_t* counter, int32_t* topk_ids, float* topk_weights,
                               cudaStream_t stream);

// Whether LaunchMoeGateRoute takes E experts in G groups (shared memory).
bool MoeGateRouteFits(int E, int G);

// ---- Routed experts ----------------------------------------------------------

// Local experts (L) the CUDA planner handles: its per-slot counters live in
// shared memory.
inline constexpr int kMoeMaxLocalExperts = 8192;
// D and I are covered by tiles of 32 or more columns on gridDim.y (<= 65535).
inline constexpr int64_t kMoeMaxColumns = int64_t{65535} * 32;

// Bytes of device scratch LaunchMoeExperts needs for T tokens with K experts
// each, hidden size D, expert width I and L local experts: per-slot row and
// tile offsets, (token, k) -> row and row -> token maps, the activations
// [T*K, I] and the expert outputs [T*K, D] (regions 256-byte aligned). It
// grows with every argument, so a buffer sized for the largest T serves every
// smaller T. Pure host arithmetic; needs no device.
size_t MoeExpertsWorkspaceBytes(int64_t T, int64_t K, int64_t D, int64_t I, int64_t L);

struct MoeExpertsArgs {
  const float* x = nullptr;  // [T, D], row stride x_ld
  int64_t x_ld = 0;
  const int32_t* topk_ids = nullptr;    // [T, K] contiguous
  const float* topk_weights = nullptr;  // [T, K] contiguous
  const int32_t* expert_map = nullptr;  // [E]: global expert -> local slot or -1
  const void* w_gate_up = nullptr;      // [L, 2I, D] contiguous, in w_dtype
  const void* w_down = nullptr;         // [L, D, I] contiguous, in w_dtype
  // f32, bf16 or fp8 e4m3: see LaunchMoeExperts for how each is multiplied.
  DType w_dtype = DType::kF32;
  // fp8 only: per-row 128-column block scales, [L, 2I, ceil(D / 128)] and
  // [L, D, ceil(I / 128)] contiguous.
  const float* w_gate_up_scales = nullptr;
  const float* w_down_scales = nullptr;
  float* out = nullptr;       // [T, D] contiguous, overwritten
  void* workspace = nullptr;  // >= MoeExpertsWorkspaceBytes(T, K, D, I, L), 4-byte aligned
  size_t workspace_bytes = 0;
  int T = 0, K = 0, E = 0, L = 0, D = 0, I = 0;  // T * K fits int
};

// out[t] = sum_k topk_weights[t,k] * f_slot(x[t]) over the pairs whose expert
// is held here (ids outside [0, E) or slots outside [0, L) are skipped),
// f(x) = W_down (silu(W_gate x) * (W_up x)). Steps, all on `stream`:
//   1. plan (one CTA): per-slot row counts, their exclusive scan (cub::BlockScan)
//      into row offsets and row-tile offsets, and a stable placement of the
//      pairs: rows of a slot in ascending (t, k) order, as on the host;
//   2. grouped GEMM gate|up with x rows gathered by token and silu(gate)*up
//      fused into the epilogue -> act [N, I];
//   3. grouped GEMM down -> y [N, D];
//   4. combine: out[t] = sum over k, in k order, of w * y[row(t,k)] (0 when no
//      pair of t is local).
// The GEMM grids are sized for the worst case (ceil(T*K/BM) + min(L, T*K) row
// tiles); tiles past the planned count exit at once. How the products are
// formed (MoeExpertsOnTensorCores tells which applies):
//   - on tensor cores, bf16 weights (sm_80+): x rounded to bf16, mma.sync
//     m16n8k16 with f32 accumulation, act rounded to bf16 for down;
//   - on tensor cores, fp8 weights (sm_89+): x quantized per row and
//     128-column block to e4m3 (LaunchQuantizeFp8Rows), mma.sync m16n8k32,
//     each 128-wide K block's f32 sum scaled by the weight row's and the
//     activation row's block scales and added to an f32 accumulator; act
//     (f32) quantized the same way for down;
//   - otherwise (f32 weights, older GPUs): every weight widened to f32 as
//     loaded (fp8: times its scale, rounded once, as Fp8Dequantize), f32
//     FMAs, each output a sequential fmaf chain over the reduction.
// Either way a row's result does not depend on the tile configuration or on
// how rows were placed: the op is deterministic.
// Returns cudaErrorInvalidValue for a workspace that is too small or sizes
// beyond the limits above, else the first launch error.
cudaError_t LaunchMoeExperts(const MoeExpertsArgs& args, cudaStream_t stream);

// Whether LaunchMoeExperts runs experts with `w_dtype` weights on `device`'s
// tensor cores (bf16 from sm_80, fp8 from sm_89, in a build with code for
// such a target).
cudaError_t MoeExpertsOnTensorCores(int device, DType w_dtype, bool* yes);

}  // namespace mlag::cuda
