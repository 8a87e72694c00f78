// logit_bias, presence and frequency penalties, and prompt log-probabilities
// (OpenAI's echo) on the host, against a reference built from plain
// requests: the model's full log-probability row at every position, read
// from a separate engine that runs the prefix alone (max_tokens 1, logprobs
// over the whole vocabulary). The adjustments are then applied to that row in
// double, as SamplingParams documents them, and the engine's greedy tokens
// and reported log-probabilities must follow. The prefix run computes its
// last position in a prefill where the engine under test decoded it, so the
// comparison allows float rounding (1e-4) and checks a greedy choice only
// where the reference's top two differ by more than that.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

constexpr double kTolerance = 1e-4;

EngineOptions Options() {
  EngineOptions o;
  o.model = "tiny-v3";
  o.device = "host";
  o.block_size = 16;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 24;  // prompts of 40 run in chunks
  o.kv_cache_bytes = size_t{16} << 20;
  return o;
}

// The model's log-probability of every token after `prefix` (double).
std::vector<double> ReferenceRow(Engine& ref, const std::vector<int32_t>& prefix) {
  const int V = ref.config().vocab_size;
  RequestSpec s;
  s.prompt = prefix;
  s.max_tokens = 1;
  s.sampling.logprobs = V;
  auto id = ref.AddRequest(s);
  EXPECT_OK(id);
  while (ref.HasUnfinished()) EXPECT_OK(ref.Step());
  std::vector<double> row(V, -INFINITY);
  const Request* r = ref.request(*id);
  EXPECT_EQ(r->logprobs.size(), 1u);
  for (const TokenLogprob& t : r->logprobs[0]) row[t.token] = t.logprob;
  EXPECT_OK(ref.Release(*id));
  return row;
}

// log_softmax(row + delta) in double.
std::vector<double> Adjusted(std::vector<double> row, const std::map<int32_t, double>& delta) {
  for (const auto& [t, d] : delta) row[t] += d;
  double max = -INFINITY;
  for (double x : row) max = std::max(max, x);
  double sum = 0;
  for (double x : row) sum += std::exp(x - max);
  const double lse = max + std::log(sum);
  for (double& x : row) x -= lse;
  return row;
}

// Checks request `r`'s greedy tokens and top log-probabilities against the
// reference, position by position; returns how many greedy choices were
// decisive (top two apart by more than the tolerance).
int ExpectFollowsReference(Engine& ref, const RequestSpec& spec, const Request& r) {
  const SamplingParams& sp = spec.sampling;
  const std::vector<int32_t> out = r.output_tokens();
  EXPECT_EQ(static_cast<int>(out.size()), spec.max_tokens);
  EXPECT_EQ(r.logprobs.size(), out.size());
  int decisive = 0;
  std::vector<int32_t> prefix = spec.prompt;
  std::map<int32_t, int> counts;
  for (size_t j = 0; j < out.size() && j < r.logprobs.size(); ++j) {
    SCOPED_TRACE(absl::StrCat("output token ", j));
    std::map<int32_t, double> delta;
    for (const LogitAdjustment& b : sp.logit_bias) delta[b.token] += b.delta;
    for (const auto& [t, c] : counts) {
      delta[t] -= double{sp.presence_penalty} + double{sp.frequency_penalty} * c;
    }
    const std::vector<double> want = Adjusted(ReferenceRow(ref, prefix), delta);
    std::vector<int32_t> order(want.size());
    for (size_t t = 0; t < order.size(); ++t) order[t] = static_cast<int32_t>(t);
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](int32_t a, int32_t b) { return want[a] > want[b]; });
    if (want[order[0]] - want[order[1]] > kTolerance) {
      EXPECT_EQ(out[j], order[0]);
      ++decisive;
    }
    // The reported top log-probabilities are the adjusted distribution's.
    for (const TokenLogprob& t : r.logprobs[j]) {
      EXPECT_NEAR(t.logprob, want[t.token], kTolerance) << "token " << t.token;
    }
    if (r.logprobs[j].empty()) {
      ADD_FAILURE() << "no log-probabilities";
      break;
    }
    EXPECT_NEAR(r.logprobs[j][0].logprob, want[order[0]], kTolerance);
    prefix.push_back(out[j]);
    ++counts[out[j]];
  }
  return decisive;
}

std::vector<int32_t> RandomPrompt(int n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = tok(rng);
  return p;
}

// Runs `specs` together (one batch) and returns their requests' ids.
std::vector<RequestId> RunTogether(Engine& engine, const std::vector<RequestSpec>& specs) {
  std::vector<RequestId> ids;
  for (const RequestSpec& s : specs) {
    auto id = engine.AddRequest(s);
    EXPECT_OK(id);
    ids.push_back(*id);
  }
  while (engine.HasUnfinished()) EXPECT_OK(engine.Step());
  return ids;
}

TEST(SamplingParamsTest, BiasAndPenaltiesFollowTheReference) {
  auto engine = Engine::Create(Options()).value();
  auto ref = Engine::Create(Options()).value();
  const int V = engine->config().vocab_size;
  std::mt19937 rng(5);
  // The plain greedy continuation, to aim the bias at its tokens.
  RequestSpec plain;
  plain.prompt = RandomPrompt(9, V, rng);
  plain.max_tokens = 10;
  plain.sampling.logprobs = 4;
  const std::vector<int32_t> free_run =
      engine->request(RunTogether(*engine, {plain})[0])->output_tokens();

  std::vector<RequestSpec> specs;
  RequestSpec bias = plain;  // bans the free run's first token, favours another
  bias.sampling.logit_bias = {{free_run[0], -100.0f}, {static_cast<int32_t>(V / 3), 2.5f}};
  std::sort(bias.sampling.logit_bias.begin(), bias.sampling.logit_bias.end(),
            [](const LogitAdjustment& a, const LogitAdjustment& b) { return a.token < b.token; });
  specs.push_back(bias);
  RequestSpec penalties = plain;  // favours repeats: the free run has none
  penalties.sampling.presence_penalty = -2.0f;
  penalties.sampling.frequency_penalty = 0.25f;
  specs.push_back(penalties);
  RequestSpec both = plain;
  both.prompt = RandomPrompt(30, V, rng);  // a chunked prefill
  both.sampling.logit_bias = {{static_cast<int32_t>(V - 1), 3.0f}};
  both.sampling.presence_penalty = -0.5f;  // negative: favours repeats
  both.sampling.frequency_penalty = 2.0f;
  specs.push_back(both);
  RequestSpec other = plain;  // a plain neighbour in the batch
  other.prompt = RandomPrompt(17, V, rng);
  specs.push_back(other);

  const std::vector<RequestId> ids = RunTogether(*engine, specs);
  int decisive = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    decisive += ExpectFollowsReference(*ref, specs[i], *engine->request(ids[i]));
  }
  std::printf("bias and penalties: %d of 40 greedy choices decisive, all the reference's\n",
              decisive);
  EXPECT_GT(decisive, 30);  // of 40 greedy choices
  // The adjustments changed what was generated.
  EXPECT_NE(engine->request(ids[0])->output_tokens()[0], free_run[0]);
  EXPECT_NE(engine->request(ids[1])->output_tokens(), free_run);
}

// Prompt log-probabilities: entry j - 1 is prompt token j's log-probability
// given tokens [0, j), with the top alternatives there; the prompt runs in
// chunks, and a second run of the same prompt (which would hit the prefix
// cache) computes them all again.
TEST(SamplingParamsTest, PromptLogprobsFollowTheReference) {
  auto engine = Engine::Create(Options()).value();
  auto ref = Engine::Create(Options()).value();
  const int V = engine->config().vocab_size;
  std::mt19937 rng(11);
  RequestSpec echo;
  echo.prompt = RandomPrompt(41, V, rng);
  echo.max_tokens = 2;
  echo.sampling.prompt_logprobs = 3;
  RequestSpec plain;
  plain.prompt = RandomPrompt(12, V, rng);
  plain.max_tokens = 4;
  std::vector<RequestId> ids = RunTogether(*engine, {echo, plain});
  const Request& r = *engine->request(ids[0]);
  ASSERT_EQ(r.prompt_logprobs.size(), echo.prompt.size() - 1);
  EXPECT_TRUE(engine->request(ids[1])->prompt_logprobs.empty());
  for (size_t j = 1; j < echo.prompt.size(); ++j) {
    SCOPED_TRACE(absl::StrCat("prompt token ", j));
    const std::vector<double> want =
        ReferenceRow(*ref, std::vector<int32_t>(echo.prompt.begin(), echo.prompt.begin() + j));
    const PromptLogprob& e = r.prompt_logprobs[j - 1];
    EXPECT_NEAR(e.logprob, want[echo.prompt[j]], kTolerance);
    ASSERT_EQ(e.top.size(), 3u);
    for (const TokenLogprob& t : e.top) EXPECT_NEAR(t.logprob, want[t.token], kTolerance);
    EXPECT_NEAR(e.top[0].logprob, *std::max_element(want.begin(), want.end()), kTolerance);
  }
  // Again, with the prompt's blocks in the prefix cache: all computed again,
  // bit for bit.
  const std::vector<RequestId> again = RunTogether(*engine, {echo});
  const Request& r2 = *engine->request(again[0]);
  ASSERT_EQ(r2.prompt_logprobs.size(), r.prompt_logprobs.size());
  for (size_t j = 0; j < r.prompt_logprobs.size(); ++j) {
    EXPECT_EQ(r2.prompt_logprobs[j].logprob, r.prompt_logprobs[j].logprob) << j;
  }
  EXPECT_EQ(r2.output_tokens(), r.output_tokens());
}

// Batch invariance holds with the adjustments: each request alone gives the
// tokens and log-probabilities (prompt ones too) it gives in a batch, bit for
// bit, with graphs or eager.
TEST(SamplingParamsTest, AdjustedRequestsAreBatchInvariant) {
  std::mt19937 rng(23);
  EngineOptions eager = Options();
  eager.graph_mode = GraphMode::kNone;
  auto batched = Engine::Create(Options()).value();
  const int V = batched->config().vocab_size;
  std::vector<RequestSpec> specs(6);
  for (size_t i = 0; i < specs.size(); ++i) {
    RequestSpec& s = specs[i];
    s.prompt = RandomPrompt(5 + 7 * static_cast<int>(i), V, rng);
    s.max_tokens = 8;
    s.sampling.logprobs = 3;
    s.sampling.temperature = i % 2 ? 0.8f : 0.0f;
    s.sampling.seed = 40 + i;
    s.sampling.logit_bias = {{static_cast<int32_t>((17 * i + 3) % V), 5.0f}};
    s.sampling.presence_penalty = i % 3 == 0 ? 0.0f : 0.9f;
    s.sampling.frequency_penalty = i % 3 == 1 ? 0.0f : 0.6f;
    s.sampling.prompt_logprobs = i % 2 ? 2 : -1;
  }
  const std::vector<RequestId> together = RunTogether(*batched, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("request ", i));
    auto alone = Engine::Create(eager).value();
    const Request& a = *alone->request(RunTogether(*alone, {specs[i]})[0]);
    const Request& b = *batched->request(together[i]);
    EXPECT_EQ(a.output_tokens(), b.output_tokens());
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
    for (size_t t = 0; t < a.logprobs.size(); ++t) {
      ASSERT_EQ(a.logprobs[t].size(), b.logprobs[t].size());
      for (size_t k = 0; k < a.logprobs[t].size(); ++k) {
        EXPECT_EQ(a.logprobs[t][k].token, b.logprobs[t][k].token);
        EXPECT_EQ(a.logprobs[t][k].logprob, b.logprobs[t][k].logprob) << t << " " << k;
      }
    }
    ASSERT_EQ(a.prompt_logprobs.size(), b.prompt_logprobs.size());
    for (size_t j = 0; j < a.prompt_logprobs.size(); ++j) {
      EXPECT_EQ(a.prompt_logprobs[j].logprob, b.prompt_logprobs[j].logprob) << j;
    }
  }
}

TEST(SamplingParamsTest, BadParametersAreRefusedByName) {
  auto engine = Engine::Create(Options()).value();
  const int V = engine->config().vocab_size;
  auto refused = [&](const RequestSpec& s, const std::string& want) {
    const absl::Status st = engine->AddRequest(s).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(want), std::string::npos) << st;
  };
  RequestSpec base;
  base.prompt = {1, 2, 3};
  base.max_tokens = 4;
  RequestSpec s = base;
  s.sampling.logit_bias = {{V, 1.0f}};
  refused(s, "logit_bias token");
  s.sampling.logit_bias = {{1, 100.5f}};
  refused(s, "[-100, 100]");
  s.sampling.logit_bias = {{1, NAN}};
  refused(s, "[-100, 100]");
  s.sampling.logit_bias = {{4, 1.0f}, {4, 2.0f}};
  refused(s, "twice");
  s.sampling.logit_bias.assign(kMaxLogitBias + 1, {1, 0.0f});
  refused(s, "at most 300");
  s = base;
  s.sampling.presence_penalty = 2.5f;
  refused(s, "presence_penalty");
  s = base;
  s.sampling.frequency_penalty = -INFINITY;
  refused(s, "frequency_penalty");
  s = base;
  s.sampling.prompt_logprobs = -2;
  refused(s, "prompt_logprobs");
  // And a good one still runs.
  s = base;
  s.sampling.logit_bias = {{7, 1.0f}};
  s.sampling.presence_penalty = 0.5f;
  RequestId id = engine->AddRequest(s).value();
  while (engine->HasUnfinished()) ASSERT_OK(engine->Step());
  EXPECT_EQ(engine->request(id)->num_output_tokens(), 4);
}

}  // namespace
}  // namespace mlag
