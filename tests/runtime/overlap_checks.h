// Checks of the overlapped engine loop (EngineOptions::step_overlap "on")
// against the step-by-step loop, shared by the host engine test and the CUDA
// runtime test: the same tokens, log-probabilities and finish reasons, with
// requests arriving while others run, chunked prefills, preemption, stop
// tokens the device checks and ones it cannot (more than kMaxFeedStopIds),
// the length limits, log-probabilities from the device and from the host,
// seeded sampling and an abort; and a request ended by a stop token leaves
// the KV pool as the loop without overlap does, so the step that was already
// in flight for it wrote nothing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/sampling.h"
#include "runtime/engine/engine.h"
#include "tests/status_matchers.h"

namespace mlag::testing {

// What one run produced, per request in spec order.
struct LoopRecord {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<std::vector<TokenLogprob>>> logprobs;
  std::vector<std::vector<PromptLogprob>> prompt_logprobs;
  std::vector<FinishReason> reasons;
  EngineStats stats;
  int64_t steps_with_carried_tokens = 0;  // Step calls that delivered an earlier launch's tokens
};

// Runs `specs`, adding request i before the Step call numbered arrive[i]
// (0: before the first), and aborting request `abort_index` (-1: none) once
// it has delivered two tokens. Every delivered token must extend its
// request's tokens in order, and every finished id must be reported once.
inline LoopRecord RunArrivals(Engine& engine, const std::vector<RequestSpec>& specs,
                              const std::vector<int>& arrive, int abort_index = -1) {
  LoopRecord rec;
  std::vector<RequestId> ids(specs.size(), -1);
  std::map<RequestId, int> delivered, finished;
  int step = 0;
  size_t added = 0;
  while (added < specs.size() || engine.HasUnfinished()) {
    for (size_t i = 0; i < specs.size(); ++i) {
      if (ids[i] < 0 && arrive[i] <= step) {
        auto id = engine.AddRequest(specs[i]);
        EXPECT_OK(id);
        if (!id.ok()) return rec;
        ids[i] = *id;
        ++added;
      }
    }
    SCOPED_TRACE(absl::StrCat("step ", step));
    auto out = engine.Step();
    EXPECT_OK(out);
    if (!out.ok()) return rec;
    ++step;
    for (const auto& [id, token] : out->new_tokens) {
      const Request* r = engine.request(id);
      EXPECT_NE(r, nullptr);
      if (r == nullptr) return rec;
      const int index = delivered[id]++;
      EXPECT_LT(index, r->num_output_tokens()) << "request " << id;
      if (index < r->num_output_tokens()) {
        EXPECT_EQ(r->output_tokens()[index], token);
      }
    }
    for (RequestId id : out->finished) EXPECT_EQ(++finished[id], 1) << "request " << id;
    if (abort_index >= 0 && ids[abort_index] >= 0 && delivered[ids[abort_index]] >= 2 &&
        !engine.request(ids[abort_index])->finished()) {
      EXPECT_OK(engine.Abort(ids[abort_index]));
    }
    // Tokens delivered while a later step runs: the overlap at work.
    if (engine.runner().steps_in_flight() > 0 && !out->new_tokens.empty()) {
      ++rec.steps_with_carried_tokens;
    }
    if (step > 5000) {
      ADD_FAILURE() << "no end after 5000 steps";
      return rec;
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const Request* r = engine.request(ids[i]);
    rec.tokens.push_back(r->output_tokens());
    rec.logprobs.push_back(r->logprobs);
    rec.prompt_logprobs.push_back(r->prompt_logprobs);
    rec.reasons.push_back(r->finish_reason);
    if (r->finish_reason != FinishReason::kAbort) {
      EXPECT_EQ(delivered[ids[i]], r->num_output_tokens()) << "request " << i;
    }
    EXPECT_EQ(finished[ids[i]], r->finish_reason == FinishReason::kAbort ? 0 : 1)
        << "request " << i;
  }
  rec.stats = engine.Stats();
  EXPECT_EQ(engine.kv_cache().num_free_blocks(), engine.kv_cache().num_blocks() - 1)
      << "blocks still held after the run";
  return rec;
}

// The requests: random prompts of 1-70 tokens (longer than a small token
// budget: chunked prefills), 1-12 new tokens, every third seeded sampling,
// log-probabilities of 0, 3 or kMaxTopLogprobs + 1 (the host's rows), some
// with a logit_bias, some with presence and frequency penalties (collected
// before the next launch), some with prompt log-probabilities, and,
// where `base` (a run of the same requests without stop tokens) is given,
// stop tokens taken from its outputs: one, or kMaxFeedStopIds + 1 of them
// (the device cannot check those), or one that ends nothing.
inline std::vector<RequestSpec> OverlapRequests(int n, int vocab, uint32_t seed,
                                                const LoopRecord* base) {
  std::mt19937 rng(seed), stop_rng(seed + 1);
  std::uniform_int_distribution<int> tok(0, vocab - 1), len(1, 70), max_tokens(1, 12);
  std::vector<RequestSpec> specs(n);
  for (int i = 0; i < n; ++i) {
    RequestSpec& s = specs[i];
    const int l = len(rng);
    for (int j = 0; j < l; ++j) s.prompt.push_back(tok(rng));
    s.max_tokens = max_tokens(rng);
    if (i % 3 == 2) {
      s.sampling.temperature = 0.9f;
      s.sampling.top_k = 40;
      s.sampling.seed = 1000 + i;
    }
    if (i % 5 == 1) s.sampling.logprobs = 3;
    if (i % 11 == 4) s.sampling.logprobs = kMaxTopLogprobs + 1;
    if (i % 7 == 3) {
      s.sampling.logit_bias = {{static_cast<int32_t>((i * 13) % vocab), 4.0f},
                               {static_cast<int32_t>((i * 31 + 7) % vocab), -3.5f}};
      std::sort(
          s.sampling.logit_bias.begin(), s.sampling.logit_bias.end(),
          [](const LogitAdjustment& a, const LogitAdjustment& b) { return a.token < b.token; });
      if (s.sampling.logit_bias[0].token == s.sampling.logit_bias[1].token) {
        s.sampling.logit_bias.pop_back();
      }
    }
    if (i % 6 == 5) {
      s.sampling.presence_penalty = 0.6f;
      s.sampling.frequency_penalty = i % 12 == 11 ? -0.5f : 0.4f;
    }
    if (i % 8 == 6) s.sampling.prompt_logprobs = 2;
    if (base == nullptr) continue;
    const std::vector<int32_t>& out = base->tokens[i];
    if (out.empty()) continue;
    const int32_t at = out[(i / 4) % out.size()];
    switch (i % 4) {
      case 1:
        s.stop_token_ids = {at};
        break;
      case 2:
        for (int k = 0; k < kMaxFeedStopIds; ++k) s.stop_token_ids.push_back(tok(stop_rng));
        s.stop_token_ids.push_back(at);
        break;
      case 3:
        s.stop_token_ids = {static_cast<int32_t>(vocab - 1 - i % 7)};
        break;
      default:
        break;
    }
  }
  return specs;
}

inline std::vector<int> Arrivals(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> at(0, 3 * n / 2);
  std::vector<int> arrive(n);
  for (int& a : arrive) a = at(rng);
  return arrive;
}

// What ExpectOverlapMatchesStepByStep runs and how it compares.
struct OverlapWorkload {
  // Stop tokens from the outputs of a first run. A request ended by one runs
  // a row in the step already launched, and one with more stop tokens than
  // the device checks sits out a step: the batches differ from the
  // step-by-step loop's. Without them (and without preemption, which the
  // extra rows' blocks can shift) both loops run the same batches.
  bool stop_tokens = true;
  // Log-probabilities bit for bit. The host's are batch-invariant, so they
  // are whatever the batches; CUDA's are only where the batches are the
  // same, and within `logprob_tolerance` otherwise.
  bool exact_logprobs = true;
  float logprob_tolerance = 0.0f;
};

// The overlapped loop against the step-by-step one, on engines made from
// `options` (a KV pool small enough to preempt, where wanted) with
// step_overlap "off" and "on".
inline void ExpectOverlapMatchesStepByStep(EngineOptions options, int n, uint32_t seed,
                                           const OverlapWorkload& workload = {}) {
  // Three fresh engines (a second run on one would hit its prefix cache).
  options.step_overlap = "off";
  auto off = Engine::Create(options);
  ASSERT_OK(off);
  options.step_overlap = "on";
  auto on = Engine::Create(options);
  ASSERT_OK(on);
  ASSERT_FALSE((*off)->overlapped());
  ASSERT_TRUE((*on)->overlapped());
  const int vocab = (*off)->config().vocab_size;
  const std::vector<int> arrive = Arrivals(n, seed);
  LoopRecord plain;
  if (workload.stop_tokens) {
    options.step_overlap = "off";
    auto probe = Engine::Create(options);
    ASSERT_OK(probe);
    plain = RunArrivals(**probe, OverlapRequests(n, vocab, seed, nullptr), arrive);
    ASSERT_EQ(plain.tokens.size(), static_cast<size_t>(n));
  }
  std::vector<RequestSpec> specs =
      OverlapRequests(n, vocab, seed, workload.stop_tokens ? &plain : nullptr);
  // The aborted request runs long enough to be aborted. Both loops abort it
  // once two of its tokens are delivered; the overlapped one may deliver two
  // in one Step (a step collected at once behind the one in flight), so its
  // tokens are compared as prefixes.
  const int abort_index = n / 2;
  specs[abort_index].max_tokens = 12;
  specs[abort_index].stop_token_ids.clear();
  const LoopRecord a = RunArrivals(**off, specs, arrive, abort_index);
  const LoopRecord b = RunArrivals(**on, specs, arrive, abort_index);
  ASSERT_EQ(a.tokens.size(), static_cast<size_t>(n));
  ASSERT_EQ(b.tokens.size(), static_cast<size_t>(n));
  int stops = 0, length = 0;
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    if (i == abort_index) {
      const size_t common = std::min(a.tokens[i].size(), b.tokens[i].size());
      EXPECT_GE(common, 2u);
      EXPECT_TRUE(
          std::equal(a.tokens[i].begin(), a.tokens[i].begin() + common, b.tokens[i].begin()));
      EXPECT_EQ(b.reasons[i], FinishReason::kAbort);
      continue;
    }
    EXPECT_EQ(a.tokens[i], b.tokens[i]);
    EXPECT_EQ(a.reasons[i], b.reasons[i]);
    // Prompt log-probabilities: one per prompt token after the first.
    const size_t want_prompt =
        specs[i].sampling.prompt_logprobs >= 0 ? specs[i].prompt.size() - 1 : 0;
    ASSERT_EQ(a.prompt_logprobs[i].size(), want_prompt);
    ASSERT_EQ(b.prompt_logprobs[i].size(), want_prompt);
    for (size_t t = 0; t < want_prompt; ++t) {
      const PromptLogprob &x = a.prompt_logprobs[i][t], &y = b.prompt_logprobs[i][t];
      ASSERT_EQ(x.top.size(), 2u);
      ASSERT_EQ(y.top.size(), 2u);
      if (workload.exact_logprobs) {
        EXPECT_EQ(std::memcmp(&x.logprob, &y.logprob, sizeof(float)), 0) << "prompt token " << t;
      } else {
        EXPECT_NEAR(x.logprob, y.logprob, workload.logprob_tolerance) << "prompt token " << t;
      }
    }
    if (a.tokens[i] != b.tokens[i]) continue;
    ASSERT_EQ(a.logprobs[i].size(), b.logprobs[i].size());
    for (size_t t = 0; t < a.logprobs[i].size(); ++t) {
      ASSERT_EQ(a.logprobs[i][t].size(), b.logprobs[i][t].size());
      for (size_t k = 0; k < a.logprobs[i][t].size(); ++k) {
        EXPECT_EQ(a.logprobs[i][t][k].token, b.logprobs[i][t][k].token);
        const float x = a.logprobs[i][t][k].logprob, y = b.logprobs[i][t][k].logprob;
        if (workload.exact_logprobs) {
          EXPECT_EQ(std::memcmp(&x, &y, sizeof(float)), 0)
              << "token " << t << " rank " << k << ": " << x << " vs " << y;
        } else {
          EXPECT_NEAR(x, y, workload.logprob_tolerance) << "token " << t << " rank " << k;
        }
      }
    }
    stops += a.reasons[i] == FinishReason::kStop;
    length += a.reasons[i] == FinishReason::kLength;
  }
  // The workload reaches what it is meant to.
  if (workload.stop_tokens) {
    EXPECT_GT(stops, n / 8);
  }
  EXPECT_GT(length, n / 4);
  EXPECT_EQ(a.reasons[abort_index], FinishReason::kAbort);
  EXPECT_GT(b.steps_with_carried_tokens, 0);
  EXPECT_GT(b.stats.overlapped_steps, 0);
  EXPECT_EQ(a.stats.overlapped_steps, 0);
  // Without stop tokens the overlap changes no batch (nor their number).
  if (!workload.stop_tokens) {
    EXPECT_EQ(b.stats.steps, a.stats.steps);
  }
  std::printf(
      "overlap vs step-by-step: %d requests (%d stopped, %d by length), %lld vs %lld steps, "
      "%lld overlapped, %lld vs %lld preemptions\n",
      n, stops, length, static_cast<long long>(b.stats.steps),
      static_cast<long long>(a.stats.steps), static_cast<long long>(b.stats.overlapped_steps),
      static_cast<long long>(b.stats.preemptions), static_cast<long long>(a.stats.preemptions));
}

// One request at a time, ending by a stop token at output index `at`: the
// whole KV pool afterwards is the same with and without the overlap (one
// request alone takes the same blocks either way), so the step launched
// before the stop token was seen wrote no KV for it.
inline void ExpectStopTokenWritesNoKv(EngineOptions options, int at) {
  SCOPED_TRACE(absl::StrCat("stop at output ", at));
  options.step_overlap = "off";
  options.enable_prefix_caching = false;
  auto off = Engine::Create(options);
  ASSERT_OK(off);
  options.step_overlap = "on";
  auto on = Engine::Create(options);
  ASSERT_OK(on);
  RequestSpec spec;
  std::mt19937 rng(77 + at);
  std::uniform_int_distribution<int> tok(0, (*off)->config().vocab_size - 1);
  for (int i = 0; i < 13; ++i) spec.prompt.push_back(tok(rng));
  spec.max_tokens = at + 8;
  // The free run, in a third engine: its tokens pick the stop token.
  options.step_overlap = "off";
  auto free_run = Engine::Create(options);
  ASSERT_OK(free_run);
  const LoopRecord base = RunArrivals(**free_run, {spec}, {0});
  ASSERT_EQ(base.tokens.size(), 1u);
  const std::vector<int32_t>& out = base.tokens[0];
  ASSERT_GT(out.size(), static_cast<size_t>(at));
  spec.stop_token_ids = {out[at]};
  const LoopRecord a = RunArrivals(**off, {spec}, {0});
  const LoopRecord b = RunArrivals(**on, {spec}, {0});
  ASSERT_EQ(a.reasons, std::vector<FinishReason>{FinishReason::kStop});
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.reasons, b.reasons);
  // The overlapped engine did launch past the stop token.
  EXPECT_EQ(b.stats.steps, a.stats.steps + 1);
  EXPECT_EQ((*on)->runner().KvChecksum({}).value(), (*off)->runner().KvChecksum({}).value());
}

}  // namespace mlag::testing
