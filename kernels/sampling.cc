#include "kernels/sampling.h"

#include "absl/strings/str_cat.h"
#include "kernels/check.h"
#include "kernels/host/sampling.h"
#include "mlag_config.h"
#include "runtime/core/status.h"

#if MLAG_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/sampling.cuh"
#endif

namespace mlag {
namespace {

// Logits [B, V] in f32, row-major, on the stream, V an int the kernels index by.
absl::Status CheckLogits(const Stream& stream, const Tensor& logits) {
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, logits, "logits"));
  MLAG_RETURN_IF_ERROR(CheckDType(logits, "logits", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(logits, "logits", {-1, -1}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(logits, "logits"));
  const int64_t V = logits.size(1);
  if (V <= 0 || V > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits: vocabulary size must be in [1, 2^31), got ", V));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Sample(Stream& stream, const Tensor& logits, const Tensor& temperature,
                    const Tensor& top_k, const Tensor& top_p, const Tensor& seeds,
                    const Tensor& steps, const Tensor& out_tokens) {
  MLAG_RETURN_IF_ERROR(CheckLogits(stream, logits));
  const int64_t B = logits.size(0);
  const int64_t V = logits.size(1);
  struct PerRow {
    const Tensor& t;
    const char* name;
    DType dtype;
  };
  for (const PerRow& r :
       {PerRow{temperature, "temperature", DType::kF32}, PerRow{top_k, "top_k", DType::kI32},
        PerRow{top_p, "top_p", DType::kF32}, PerRow{seeds, "seeds", DType::kI64},
        PerRow{steps, "steps", DType::kI64}, PerRow{out_tokens, "out_tokens", DType::kI32}}) {
    MLAG_RETURN_IF_ERROR(CheckOnStream(stream, r.t, r.name));
    MLAG_RETURN_IF_ERROR(CheckDType(r.t, r.name, {r.dtype}));
    MLAG_RETURN_IF_ERROR(CheckShape(r.t, r.name, {B}));
    MLAG_RETURN_IF_ERROR(CheckContiguous(r.t, r.name));
  }
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    // Cost: the byte floor, one read of the logits (top-k/top-p rows read theirs again).
    return stream.LaunchCuda(
        "sample", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(
              cuda::LaunchSample(logits.data_as<const float>(), B, V, logits.stride(0),
                                 temperature.data_as<const float>(), top_k.data_as<const int32_t>(),
                                 top_p.data_as<const float>(), seeds.data_as<const int64_t>(),
                                 steps.data_as<const int64_t>(), out_tokens.data_as<int32_t>(),
                                 static_cast<cudaStream_t>(s)));
        },
        MovedBytes({&logits, &temperature, &top_k, &top_p, &seeds, &steps, &out_tokens}));
#endif
  }
  return stream.LaunchHost(
      "sample", OpKind::kKernel, [logits, temperature, top_k, top_p, seeds, steps, out_tokens] {
        host::Sample(logits, temperature, top_k, top_p, seeds, steps, out_tokens);
        return absl::OkStatus();
      });
}

absl::Status TopLogprobs(Stream& stream, const Tensor& logits, const Tensor& k,
                         const Tensor& out_tokens, const Tensor& out_logprobs) {
  MLAG_RETURN_IF_ERROR(CheckLogits(stream, logits));
  const int64_t B = logits.size(0);
  const int64_t V = logits.size(1);
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, k, "k"));
  MLAG_RETURN_IF_ERROR(CheckDType(k, "k", {DType::kI32}));
  MLAG_RETURN_IF_ERROR(CheckShape(k, "k", {B}));
  MLAG_RETURN_IF_ERROR(CheckContiguous(k, "k"));
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, out_tokens, "out_tokens"));
  MLAG_RETURN_IF_ERROR(CheckDType(out_tokens, "out_tokens", {DType::kI32}));
  MLAG_RETURN_IF_ERROR(CheckShape(out_tokens, "out_tokens", {B, -1}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(out_tokens, "out_tokens"));
  const int64_t K = out_tokens.size(1);
  MLAG_RETURN_IF_ERROR(CheckOnStream(stream, out_logprobs, "out_logprobs"));
  MLAG_RETURN_IF_ERROR(CheckDType(out_logprobs, "out_logprobs", {DType::kF32}));
  MLAG_RETURN_IF_ERROR(CheckShape(out_logprobs, "out_logprobs", {B, K}));
  MLAG_RETURN_IF_ERROR(CheckRowMajor(out_logprobs, "out_logprobs"));
  if (K > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top log-probabilities: ", K, " columns, at most ", kMaxTopLogprobs));
  }
  if (B == 0 || K == 0) return absl::OkStatus();
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    static_assert(kMaxTopLogprobs == cuda::kTopLogprobsMaxCols, "one limit for both backends");
    // Cost: the byte floor, one read of the logits (the radix passes read a row about six
    // times, mostly from L2).
    return stream.LaunchCuda(
        "top_logprobs", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchTopLogprobs(
              logits.data_as<const float>(), B, V, logits.stride(0), k.data_as<const int32_t>(), K,
              out_tokens.data_as<int32_t>(), out_tokens.stride(0), out_logprobs.data_as<float>(),
              out_logprobs.stride(0), static_cast<cudaStream_t>(s)));
        },
        MovedBytes({&logits, &k, &out_tokens, &out_logprobs}));
#endif
  }
  return stream.LaunchHost("top_logprobs", OpKind::kKernel, [logits, k, out_tokens, out_logprobs] {
    host::TopLogprobsRows(logits, k, out_tokens, out_logprobs);
    return absl::OkStatus();
  });
}

absl::Status AdjustLogits(Stream& stream, const Tensor& logits, const Tensor& offsets,
                          const Tensor& tokens, const Tensor& deltas) {
  MLAG_RETURN_IF_ERROR(CheckLogits(stream, logits));
  const int64_t B = logits.size(0);
  const int64_t V = logits.size(1);
  MLAG_RETURN_IF_ERROR(CheckShape(offsets, "offsets", {B + 1}));
  MLAG_RETURN_IF_ERROR(CheckShape(tokens, "tokens", {-1}));
  const int64_t A = tokens.size(0);
  MLAG_RETURN_IF_ERROR(CheckShape(deltas, "deltas", {A}));
  struct Operand {
    const Tensor& t;
    const char* name;
    DType dtype;
  };
  for (const Operand& o :
       {Operand{offsets, "offsets", DType::kI32}, Operand{tokens, "tokens", DType::kI32},
        Operand{deltas, "deltas", DType::kF32}}) {
    MLAG_RETURN_IF_ERROR(CheckOnStream(stream, o.t, o.name));
    MLAG_RETURN_IF_ERROR(CheckDType(o.t, o.name, {o.dtype}));
    MLAG_RETURN_IF_ERROR(CheckContiguous(o.t, o.name));
  }
  if (B == 0) return absl::OkStatus();
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return stream.LaunchCuda(
        "adjust_logits", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchAdjustLogits(
              logits.data_as<float>(), B, V, logits.stride(0), offsets.data_as<const int32_t>(),
              tokens.data_as<const int32_t>(), deltas.data_as<const float>(), A,
              static_cast<cudaStream_t>(s)));
        },
        MovedBytes({&offsets}));
#endif
  }
  return stream.LaunchHost("adjust_logits", OpKind::kKernel, [logits, offsets, tokens, deltas] {
    host::AdjustLogits(logits, offsets, tokens, deltas);
    return absl::OkStatus();
  });
}

absl::Status FeedSampledTokens(Stream& stream, const Tensor& src, const Tensor& stop_ids,
                               const Tensor& query_start_loc, const Tensor& prev_tokens,
                               const Tensor& input_ids, const Tensor& slot_mapping) {
  MLAG_RETURN_IF_ERROR(CheckShape(src, "src", {-1}));
  const int64_t B = src.size(0);
  MLAG_RETURN_IF_ERROR(CheckShape(stop_ids, "stop_ids", {B, kMaxFeedStopIds}));
  MLAG_RETURN_IF_ERROR(CheckShape(query_start_loc, "query_start_loc", {B + 1}));
  MLAG_RETURN_IF_ERROR(CheckShape(prev_tokens, "prev_tokens", {-1}));
  MLAG_RETURN_IF_ERROR(CheckShape(input_ids, "input_ids", {-1}));
  MLAG_RETURN_IF_ERROR(CheckShape(slot_mapping, "slot_mapping", {-1}));
  struct Operand {
    const Tensor& t;
    const char* name;
    DType dtype;
  };
  for (const Operand& o :
       {Operand{src, "src", DType::kI32}, Operand{stop_ids, "stop_ids", DType::kI32},
        Operand{query_start_loc, "query_start_loc", DType::kI32},
        Operand{prev_tokens, "prev_tokens", DType::kI32},
        Operand{input_ids, "input_ids", DType::kI32},
        Operand{slot_mapping, "slot_mapping", DType::kI64}}) {
    MLAG_RETURN_IF_ERROR(CheckOnStream(stream, o.t, o.name));
    MLAG_RETURN_IF_ERROR(CheckDType(o.t, o.name, {o.dtype}));
    MLAG_RETURN_IF_ERROR(CheckContiguous(o.t, o.name));
  }
  if (slot_mapping.size(0) != input_ids.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("slot_mapping has ", slot_mapping.size(0),
                                                   " rows, input_ids ", input_ids.size(0)));
  }
  if (stream.is_cuda()) {
#if MLAG_HAVE_CUDA
    return stream.LaunchCuda(
        "feed_sampled", OpKind::kKernel,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchFeedSampledTokens(
              src.data_as<const int32_t>(), stop_ids.data_as<const int32_t>(), kMaxFeedStopIds,
              query_start_loc.data_as<const int32_t>(), B, prev_tokens.data_as<const int32_t>(),
              prev_tokens.size(0), input_ids.data_as<int32_t>(), slot_mapping.data_as<int64_t>(),
              input_ids.size(0), static_cast<cudaStream_t>(s)));
        },
        MovedBytes({&src, &stop_ids, &query_start_loc}));
#endif
  }
  return stream.LaunchHost("feed_sampled", OpKind::kKernel,
                           [src, stop_ids, query_start_loc, prev_tokens, input_ids, slot_mapping] {
                             host::FeedSampledTokens(src, stop_ids, query_start_loc, prev_tokens,
                                                     input_ids, slot_mapping);
                             return absl::OkStatus();
                           });
}

}  // namespace mlag
