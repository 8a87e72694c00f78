// A generation request and its life in the engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mlag {

using RequestId = int64_t;

// One additive change to a token's logit before sampling.
struct LogitAdjustment {
  int32_t token;
  float delta;
};

// How a request draws its tokens. The logits are first adjusted, per token t:
//   logit[t] += float(bias[t] - presence_penalty * (c[t] > 0)
//                     - frequency_penalty * c[t])
// with c[t] the times the request has generated t (its prompt not counted)
// and the sum taken in double; then temperature, top-k and top-p apply. The
// returned log-probabilities are those of the adjusted logits (as OpenAI's
// are). Everything is per request, so its tokens do not depend on its batch.
struct SamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // <= 0: no top-k cut
  float top_p = 1.0f;        // >= 1: no top-p cut
  uint64_t seed = 0;         // per-request RNG seed (draws are keyed by seed and step)
  int logprobs = 0;          // top-K log-probabilities to return per generated token
  // Token -> bias in [-100, 100], at most kMaxLogitBias tokens, each once.
  std::vector<LogitAdjustment> logit_bias;
  float presence_penalty = 0.0f;   // in [-2, 2]
  float frequency_penalty = 0.0f;  // in [-2, 2]
  // >= 0: the log-probability of every prompt token after the first, with
  // its top-`prompt_logprobs` alternatives (OpenAI's echo). Such a request
  // computes its whole prompt (no prefix-cache hits). -1: none.
  int prompt_logprobs = -1;

  bool has_penalties() const { return presence_penalty != 0.0f || frequency_penalty != 0.0f; }
};

// The most logit_bias entries a request may give (OpenAI's limit).
constexpr int kMaxLogitBias = 300;

struct RequestSpec {
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  SamplingParams sampling;
};

enum class RequestState { kWaiting, kRunning, kFinished };
enum class FinishReason { kNone, kLength, kStop, kAbort };

// "", "length", "stop", "abort".
absl::string_view FinishReasonName(FinishReason reason);

// One log-probability entry: a token and its log-probability.
struct TokenLogprob {
  int32_t token;
  float logprob;
};

// A prompt token's log-probability under the model given the tokens before
// it, and the most likely alternatives there.
struct PromptLogprob {
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;
};

struct Request {
  RequestId id = 0;
  RequestSpec spec;
  // The prompt followed by every generated token. Tokens [0,
  // num_computed_tokens) have their latents in the KV cache.
  std::vector<int32_t> tokens;
  int num_prompt_tokens = 0;
  int num_computed_tokens = 0;
  // Tokens sampled by a launched step whose results the host has not yet
  // collected (the overlapped loop: 0 or 1). They follow `tokens`; the
  // scheduler counts them, and num_computed_tokens may already cover them.
  int num_pending_tokens = 0;
  RequestState state = RequestState::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  int num_preemptions = 0;
  // Per generated token: its top-`logprobs` alternatives (when asked for).
  std::vector<std::vector<TokenLogprob>> logprobs;
  // With prompt_logprobs >= 0: entry j - 1 for prompt token j, filled as its
  // prefill runs.
  std::vector<PromptLogprob> prompt_logprobs;

  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  bool finished() const { return state == RequestState::kFinished; }
  std::vector<int32_t> output_tokens() const {
    return std::vector<int32_t>(tokens.begin() + num_prompt_tokens, tokens.end());
  }
};

// What a finished (or aborted) request produced, detached from the engine
// that ran it: for reports, and for results gathered across ranks.
struct RequestResult {
  RequestId id = 0;
  int prompt_tokens = 0;
  std::vector<int32_t> output_tokens;
  FinishReason finish_reason = FinishReason::kNone;
  std::vector<std::vector<TokenLogprob>> logprobs;  // per output token, when asked for
  std::vector<PromptLogprob> prompt_logprobs;       // prompt tokens 1.., when asked for
};

inline RequestResult ResultOf(const Request& r) {
  return {r.id,       r.num_prompt_tokens, r.output_tokens(), r.finish_reason,
          r.logprobs, r.prompt_logprobs};
}

// The adjustments a request's next sampled token gets (SamplingParams): its
// logit_bias and penalties folded into one delta per token, sorted by token.
// `generated` is every token the request has generated so far.
std::vector<LogitAdjustment> LogitAdjustments(const SamplingParams& sampling,
                                              absl::Span<const int32_t> generated);

}  // namespace mlag
