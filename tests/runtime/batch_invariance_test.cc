// Batch invariance on the host: one request's full-vocabulary log-probs are
// bitwise the same whether it runs alone or in batches of 2 to 64 requests
// (which also chunk its prompt differently), in graph or eager mode, under
// local expert parallelism of 2 and 4 ranks, and after a prefix-cache hit;
// for every weight dtype. The kernels make this hold by construction
// (kernels/host/gemm.h, kernels/host/mla_attention.h, kernels/moe.h); this
// checks the whole engine keeps it.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/builtin_models.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/expert_parallel.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

struct Case {
  std::string model;
  std::string weight_dtype;
};

EngineOptions Options(const Case& c, GraphMode mode) {
  EngineOptions o;
  o.model = c.model;
  o.device = "host";
  o.weight_dtype = c.weight_dtype;
  o.graph_mode = mode;
  o.block_size = 16;
  o.max_num_seqs = 64;
  o.max_num_batched_tokens = 192;
  o.kv_cache_bytes = size_t{24} << 20;
  return o;
}

std::vector<int32_t> Tokens(int n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = tok(rng);
  return t;
}

// The request under test: greedy, 8 tokens, the whole vocabulary's log-probs.
RequestSpec Target(int vocab) {
  std::mt19937 rng(7);
  RequestSpec s;
  s.prompt = Tokens(45, vocab, rng);  // spans three KV blocks
  s.max_tokens = 8;
  s.sampling.logprobs = vocab;
  return s;
}

// `n` other requests of varied lengths, some sampled.
std::vector<RequestSpec> Others(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> len(1, 60);
  std::vector<RequestSpec> specs(static_cast<size_t>(n));
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].prompt = Tokens(len(rng), vocab, rng);
    specs[i].max_tokens = 2 + static_cast<int>(rng() % 10);
    if (i % 3 == 1) specs[i].sampling.temperature = 0.8f;
  }
  return specs;
}

// Runs `specs` (id = index) to completion; the result of request 0.
RequestResult RunEngine(const EngineOptions& options, const std::vector<RequestSpec>& specs,
                        EngineStats* stats = nullptr) {
  auto engine = Engine::Create(options);
  EXPECT_OK(engine);
  if (!engine.ok()) return {};
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_OK((*engine)->AddRequestWithId(specs[i], static_cast<RequestId>(i)));
  }
  int guard = 0;
  while ((*engine)->HasUnfinished() && ++guard < 10000) {
    auto step = (*engine)->Step();
    EXPECT_OK(step);
    if (!step.ok()) break;
  }
  if (stats != nullptr) *stats = (*engine)->Stats();
  return ResultOf(*(*engine)->request(0));
}

// Bitwise equality of the tokens and every log-prob.
void ExpectSameBits(const RequestResult& got, const RequestResult& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.output_tokens, want.output_tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t t = 0; t < got.logprobs.size(); ++t) {
    ASSERT_EQ(got.logprobs[t].size(), want.logprobs[t].size());
    for (size_t k = 0; k < got.logprobs[t].size(); ++k) {
      ASSERT_EQ(got.logprobs[t][k].token, want.logprobs[t][k].token) << "token " << t;
      const float a = got.logprobs[t][k].logprob, b = want.logprobs[t][k].logprob;
      ASSERT_EQ(std::memcmp(&a, &b, sizeof(float)), 0)
          << "token " << t << " rank " << k << ": " << a << " vs " << b;
    }
  }
}

class BatchInvarianceTest : public ::testing::TestWithParam<Case> {};

TEST_P(BatchInvarianceTest, LogprobsAreBitwiseTheSameInEveryBatchModeAndGroup) {
  const Case c = GetParam();
  const int vocab = BuiltinModelConfig(c.model).value().vocab_size;
  const RequestSpec target = Target(vocab);
  const RequestResult alone = RunEngine(Options(c, GraphMode::kNone), {target});
  ASSERT_EQ(alone.output_tokens.size(), 8u);
  ASSERT_EQ(alone.logprobs.size(), 8u);

  for (GraphMode mode : {GraphMode::kFullDecode, GraphMode::kNone}) {
    const char* mode_name = mode == GraphMode::kNone ? "eager" : "graph";
    ExpectSameBits(RunEngine(Options(c, mode), {target}), alone,
                   absl::StrCat(mode_name, ", alone"));
    // Batch sizes around the graph capture sizes and the largest step, and
    // a different set per mode (which keeps the test short).
    const std::vector<int> batches =
        mode == GraphMode::kNone ? std::vector<int>{3, 17, 64} : std::vector<int>{2, 33, 64};
    for (int batch : batches) {
      std::vector<RequestSpec> specs = {target};
      for (const RequestSpec& o : Others(batch - 1, vocab, 100 + batch)) specs.push_back(o);
      ExpectSameBits(RunEngine(Options(c, mode), specs), alone,
                     absl::StrCat(mode_name, ", in a batch of ", batch));
    }
  }

  // Expert parallelism: the request on rank 0 of a local group.
  for (int world : {2, 4}) {
    std::vector<RequestSpec> specs = {target};
    for (const RequestSpec& o : Others(11, vocab, 300 + world)) specs.push_back(o);
    EpOptions ep;
    ep.world = world;
    auto result = RunLocalExpertParallel(Options(c, GraphMode::kFullDecode), ep, specs);
    ASSERT_OK(result);
    ExpectSameBits(result->requests[0], alone, absl::StrCat("expert parallelism over ", world));
  }

  // A prefix-cache hit: an earlier request shares the first 32 prompt tokens
  // (two full blocks), so the target prefills only its last 13.
  RequestSpec first = target;
  first.prompt.resize(40);
  first.prompt[39] = (first.prompt[39] + 1) % vocab;
  first.sampling.logprobs = 0;
  {
    auto engine = Engine::Create(Options(c, GraphMode::kFullDecode));
    ASSERT_OK(engine);
    ASSERT_OK((*engine)->AddRequestWithId(first, 1));
    while ((*engine)->HasUnfinished()) ASSERT_OK((*engine)->Step());
    ASSERT_OK((*engine)->AddRequestWithId(target, 0));
    while ((*engine)->HasUnfinished()) ASSERT_OK((*engine)->Step());
    EXPECT_GE((*engine)->Stats().prefix_cache_hit_tokens, 32);
    ExpectSameBits(ResultOf(*(*engine)->request(0)), alone, "after a prefix-cache hit");
  }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchInvarianceTest,
                         ::testing::Values(Case{"tiny-v3", "f32"}, Case{"tiny-v3", "bf16"},
                                           Case{"tiny-v3", "fp8"}, Case{"tiny-v2", "auto"}),
                         [](const auto& info) {
                           std::string n = info.param.model + "_" + info.param.weight_dtype;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

}  // namespace
}  // namespace mlag
