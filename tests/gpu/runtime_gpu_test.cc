// The runtime on a GPU: CUDA graph replay against eager execution, top
// log-probabilities against the host's on the same logits, dummy replays
// against live KV pages, and expert-parallel reconfiguration over
// NCCL when several GPUs are present. Compiled always; skipped without a
// device.
#include <cmath>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/host/sampling.h"
#include "kernels/sampling.h"
#include "mlag_config.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/expert_parallel.h"
#include "tests/runtime/ep_failure_checks.h"
#include "tests/runtime/overlap_checks.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

class RuntimeGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

EngineOptions GpuOptions(GraphMode mode) {
  EngineOptions o;
  o.model = "tiny-v3";
  o.device = "cuda";
  o.graph_mode = mode;
  o.block_size = 16;
  o.max_num_seqs = 32;
  o.max_num_batched_tokens = 256;
  o.kv_cache_bytes = size_t{16} << 20;
  // The checks below read each step's logits as it is collected: the last
  // step launched. The overlapped loop has its own checks.
  o.step_overlap = "off";
  return o;
}

std::vector<RequestSpec> Requests(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::uniform_int_distribution<int> len(1, 40);
  std::vector<RequestSpec> specs(n);
  for (RequestSpec& s : specs) {
    const int l = len(rng);
    for (int i = 0; i < l; ++i) s.prompt.push_back(tok(rng));
    s.max_tokens = 6;
  }
  return specs;
}

struct Record {
  std::vector<RequestId> ids;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<std::vector<TokenLogprob>>> logprobs;  // per request, per token
  std::map<std::pair<int64_t, int>, std::vector<float>> logits;
};

Record RunAll(Engine& engine, const std::vector<RequestSpec>& specs) {
  SCOPED_TRACE(absl::StrCat("RunAll over ", specs.size(), " requests"));
  Record rec;
  std::vector<RequestId> ids;
  for (const RequestSpec& s : specs) ids.push_back(engine.AddRequest(s).value());
  const int V = engine.config().vocab_size;
  std::vector<float> row(V);
  int step = 0;
  while (engine.HasUnfinished()) {
    SCOPED_TRACE(absl::StrCat("step ", ++step));
    auto out = engine.Step();
    EXPECT_OK(out);
    if (!out.ok()) break;
    const Tensor logits = engine.runner().last_logits();
    for (size_t i = 0; i < out->new_tokens.size(); ++i) {
      const RequestId id = out->new_tokens[i].first;
      EXPECT_OK(engine.device().CopyToHost(
          row.data(), logits.data_as<float>() + int64_t{out->logits_rows[i]} * V,
          V * sizeof(float)));
      rec.logits[{id, engine.request(id)->num_output_tokens() - 1}] = row;
    }
  }
  for (RequestId id : ids) {
    rec.tokens.push_back(engine.request(id)->output_tokens());
    rec.logprobs.push_back(engine.request(id)->logprobs);
  }
  rec.ids = ids;
  return rec;
}

TEST_F(RuntimeGpuTest, CudaGraphReplayMatchesEagerBitForBit) {
  auto graphs = Engine::Create(GpuOptions(GraphMode::kFullDecode));
  ASSERT_OK(graphs);
  auto eager = Engine::Create(GpuOptions(GraphMode::kNone));
  ASSERT_OK(eager);
  ASSERT_TRUE((*graphs)->device().is_cuda());
  const auto specs = Requests(32, (*graphs)->config().vocab_size, 3);
  const Record a = RunAll(**graphs, specs);
  const Record b = RunAll(**eager, specs);
  EXPECT_EQ(a.tokens, b.tokens);
  int differing = 0;
  for (const auto& [key, row] : a.logits) {
    differing += std::memcmp(row.data(), b.logits.at(key).data(), row.size() * 4) != 0;
  }
  EXPECT_EQ(differing, 0) << "of " << a.logits.size();
  int64_t replays = 0;
  for (const auto& [size, n] : (*graphs)->Stats().graph_replays) replays += n;
  EXPECT_GT(replays, 0);
  // The CUDA graphs carry the op names: kv_update right before mla.
  const Graph* g = (*graphs)->runner().graph(8);
  ASSERT_NE(g, nullptr);
  bool found = false;
  for (size_t i = 0; i + 1 < g->nodes().size(); ++i) {
    if (g->nodes()[i].name == "layers.1.attn.kv_update") {
      found = true;
      EXPECT_EQ(g->nodes()[i + 1].name, "layers.1.attn.mla");
    }
  }
  EXPECT_TRUE(found);
}

// Top log-probabilities on the GPU: rows asking for at most kMaxTopLogprobs
// come from the device kernel, larger ones from a copy of the row, in the
// same batches. Either way they must be host::TopLogprobs of the logits the
// step produced: the same tokens, log-probabilities within a float ulp or
// two (the double sum's order differs).
TEST_F(RuntimeGpuTest, TopLogprobsAreTheHostsOnTheSameLogits) {
  auto engine = Engine::Create(GpuOptions(GraphMode::kFullDecode));
  ASSERT_OK(engine);
  const int V = (*engine)->config().vocab_size;
  ASSERT_GT(V, kMaxTopLogprobs + 1);
  const int ks[] = {0, 1, 5, 20, kMaxTopLogprobs, kMaxTopLogprobs + 1, V};
  std::vector<RequestSpec> specs = Requests(14, V, 5);
  for (size_t i = 0; i < specs.size(); ++i) {
    specs[i].sampling.logprobs = ks[i % std::size(ks)];
    if (i % 3 == 1) specs[i].sampling.temperature = 0.8f;
  }
  const Record rec = RunAll(**engine, specs);
  int64_t compared = 0;
  std::vector<int32_t> tokens(V);
  std::vector<float> logprobs(V);
  for (size_t r = 0; r < specs.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("request ", r, ", logprobs ", specs[r].sampling.logprobs));
    const int k = specs[r].sampling.logprobs;
    ASSERT_EQ(rec.logprobs[r].size(), k > 0 ? rec.tokens[r].size() : 0u);
    for (size_t t = 0; t < rec.logprobs[r].size(); ++t) {
      const std::vector<float>& row = rec.logits.at({rec.ids[r], static_cast<int>(t)});
      ASSERT_EQ(host::TopLogprobs(row.data(), V, k, tokens.data(), logprobs.data()), k);
      const std::vector<TokenLogprob>& got = rec.logprobs[r][t];
      ASSERT_EQ(got.size(), static_cast<size_t>(k));
      for (int i = 0; i < k; ++i) {
        ASSERT_EQ(got[i].token, tokens[i]) << "token " << t << " rank " << i;
        EXPECT_NEAR(got[i].logprob, logprobs[i], std::ldexp(std::abs(logprobs[i]), -22) + 1e-12)
            << "token " << t << " rank " << i;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 0);
}

TEST_F(RuntimeGpuTest, DummyReplaysLeaveEveryKvPageUnchanged) {
  EngineOptions o = GpuOptions(GraphMode::kFullDecode);
  o.max_num_seqs = 16;
  auto engine = Engine::Create(o).value();
  const auto specs = Requests(6, engine->config().vocab_size, 9);
  for (const RequestSpec& s : specs) {
    RequestSpec long_run = s;
    long_run.max_tokens = 30;
    ASSERT_OK(engine->AddRequest(long_run));
  }
  for (int i = 0; i < 5; ++i) ASSERT_OK(engine->Step());
  ModelRunner& runner = engine->runner();
  const uint64_t before = runner.KvChecksum({}).value();
  ASSERT_OK(runner.CaptureGraphs());
  for (int size : runner.capture_sizes()) {
    for (int i = 0; i < 20; ++i) ASSERT_OK(runner.DummyStep(size));
  }
  ASSERT_OK(runner.stream().Synchronize());
  EXPECT_EQ(runner.KvChecksum({}).value(), before);
  while (engine->HasUnfinished()) ASSERT_OK(engine->Step());
}

// The overlapped loop on CUDA (on by default there): the host plans and
// stages step N+1 while N runs, N's sampled tokens reach N+1 on the device.
// CUDA's arithmetic depends on the batch (padded sizes, GEMM shapes), so:
// where both loops run the same batches (no stop tokens, a pool with room),
// everything matches bit for bit; with stop tokens, preemption (12 KV blocks
// for 14 requests), chunked prefills and an abort, the tokens and finish
// reasons match, on an f32 cache (a bf16 one would now and then round a
// latent computed in another batch the other way and flip a near-tied
// token), and log-probabilities within 1e-4.
TEST_F(RuntimeGpuTest, OverlappedLoopMatchesStepByStep) {
  EngineOptions o = GpuOptions(GraphMode::kFullDecode);
  o.max_num_batched_tokens = 48;
  o.max_num_seqs = 16;
  o.capture_sizes = {1, 2, 4, 8, 16};  // fewer sizes to warm up on the emulation
  EngineOptions auto_overlap = o;
  auto_overlap.step_overlap = "auto";
  EXPECT_TRUE(Engine::Create(auto_overlap).value()->overlapped());
  testing::OverlapWorkload same_batches;
  same_batches.stop_tokens = false;
  testing::ExpectOverlapMatchesStepByStep(o, 8, 5, same_batches);
  o.kv_cache_dtype = "f32";
  o.kv_cache_bytes = 13 * 16 * 4 * 80 * 4;
  testing::OverlapWorkload shifted;
  shifted.exact_logprobs = false;
  shifted.logprob_tolerance = 1e-4f;
  testing::ExpectOverlapMatchesStepByStep(o, 14, 11, shifted);
}

TEST_F(RuntimeGpuTest, OverlappedLoopWritesNoKvForAStopToken) {
  EngineOptions o = GpuOptions(GraphMode::kFullDecode);
  o.capture_sizes = {1, 2};  // one request at a time
  for (int at : {0, 2}) testing::ExpectStopTokenWritesNoKv(o, at);
}

// Thread ranks over NCCL, one GPU each, through two reconfigurations: the
// tokens of one rank alone, and every live KV page unchanged. An f32 cache
// here: the ranks sum their experts' partial results in another order than
// one rank does, and a bf16 cache would now and then round a cached latent
// the other way and flip a near-tied token.
TEST_F(RuntimeGpuTest, ReconfigurationOverNcclOnSeveralGpus) {
#if MLAG_HAVE_NCCL
  const int gpus = Device::CudaDeviceCount();
  if (gpus < 2) GTEST_SKIP() << "needs 2 or more GPUs, found " << gpus;
  const int world = std::min(gpus, 4);
  EngineOptions o = GpuOptions(GraphMode::kFullDecode);
  o.max_num_seqs = 4;
  o.kv_cache_dtype = "f32";
  const auto specs = Requests(12, 1024, 5);
  auto single = Engine::Create(o).value();
  const Record base = RunAll(*single, specs);
  EpOptions ep;
  ep.world = world;
  ep.reconfigure = {{4, 1}, {8, world}};
  auto result = RunExpertParallel(o, ep, EpBackend::kNccl, specs);
  ASSERT_OK(result);
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(result->requests[i].output_tokens, base.tokens[i]) << i;
  }
  ASSERT_EQ(result->reconfigurations.size(), 2u);
  for (const ReconfigurationReport& r : result->reconfigurations) EXPECT_TRUE(r.kv_pages_unchanged);
#else
  GTEST_SKIP() << "built without NCCL";
#endif
}

// Over NCCL on four GPUs, rank 1 fails and rank 2 hangs at step 5: every
// rank ends with an error naming what happened (rank 1's failure, passed on
// through the control group, or a peer timeout from the stream watchdog).
TEST_F(RuntimeGpuTest, AFailedAndAHungNcclRankEndEveryRankWithANamedError) {
#if MLAG_HAVE_NCCL
  if (Device::CudaDeviceCount() < 4) GTEST_SKIP() << "needs 4 GPUs";
  EngineOptions o = GpuOptions(GraphMode::kFullDecode);
  o.max_num_seqs = 4;
  EpOptions ep;
  ep.world = 4;
  // 10 s, not the host test's 2 s: on the emulation the watchdog's wait
  // includes the rank's own step, which for four emulated ranks sharing two
  // busy cores can itself take 1.5 s, and a healthy wait must not time out.
  ep.peer_timeout = absl::Seconds(10);
  ep.faults = {ParseEpFault("fail:1:5").value(), ParseEpFault("hang:2:5:6").value()};
  std::vector<absl::Status> ranks;
  const absl::Time start = absl::Now();
  auto result = RunExpertParallel(o, ep, EpBackend::kNccl, Requests(8, 1024, 5), nullptr, &ranks);
  const absl::Duration took = absl::Now() - start;
  // Start-up of four emulated ranks takes up to ~15 s on a loaded 2-core
  // machine; after it the run waits for the hang (6 s), and at worst one
  // timeout (10 s) and the grace for a peer's report.
  ::mlag::testing::ExpectEveryRankEndsNamed(result, ranks, took, absl::Seconds(60));
#else
  GTEST_SKIP() << "built without NCCL";
#endif
}

}  // namespace
}  // namespace mlag
