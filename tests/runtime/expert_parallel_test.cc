// Expert parallelism on the local backend (thread ranks): equivalence with
// the single-rank engine, live reconfiguration 4 -> 2 -> 3 that leaves every
// KV page alone, expert weights after migration equal to a fresh load, and a
// rank failing mid-run failing the whole group at once.
#include "runtime/engine/expert_parallel.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "comm/local_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/host/gemm.h"
#include "runtime/checkpoint/builtin_models.h"
#include "tests/runtime/ep_failure_checks.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

EngineOptions Options(const std::string& model) {
  EngineOptions o;
  o.model = model;
  o.device = "host";
  o.block_size = 16;
  o.max_num_seqs = 4;  // admissions spread over many steps
  o.max_num_batched_tokens = 128;
  o.kv_cache_bytes = size_t{8} << 20;
  // An f32 cache (the default, pinned here): the logits comparison below
  // measures the expert reduction's order (partial sums per rank), which a
  // bf16 cache would amplify into a rounding flip of a cached latent now and
  // then.
  o.kv_cache_dtype = "f32";
  return o;
}

std::vector<RequestSpec> Requests(int n, int vocab, uint32_t seed, int shared_prefix,
                                  int logprobs) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::uniform_int_distribution<int> len(shared_prefix + 3, shared_prefix + 30);
  std::vector<int32_t> prefix(shared_prefix);
  for (int32_t& t : prefix) t = tok(rng);
  std::vector<RequestSpec> specs(n);
  for (RequestSpec& s : specs) {
    s.prompt = prefix;
    const int l = len(rng);
    while (static_cast<int>(s.prompt.size()) < l) s.prompt.push_back(tok(rng));
    s.max_tokens = 6 + static_cast<int>(rng() % 10);  // uneven: ranks go idle at different times
    s.sampling.logprobs = logprobs;
  }
  return specs;
}

// The single-rank reference: the same requests through one Engine.
EpRunResult RunSingle(const EngineOptions& options, const std::vector<RequestSpec>& specs) {
  auto engine = Engine::Create(options).value();
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_OK(engine->AddRequestWithId(specs[i], static_cast<RequestId>(i)));
  }
  while (engine->HasUnfinished()) EXPECT_OK(engine->Step());
  EpRunResult r;
  for (size_t i = 0; i < specs.size(); ++i) {
    r.requests.push_back(ResultOf(*engine->request(static_cast<RequestId>(i))));
  }
  return r;
}

// Normwise relative difference between two full log-probability rows.
double LogprobRelDiff(const std::vector<TokenLogprob>& a, const std::vector<TokenLogprob>& b) {
  std::vector<double> va(a.size()), vb(b.size());
  for (const TokenLogprob& t : a) va[t.token] = t.logprob;
  for (const TokenLogprob& t : b) vb[t.token] = t.logprob;
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    num = std::max(num, std::abs(va[i] - vb[i]));
    den = std::max(den, std::abs(vb[i]));
  }
  return num / std::max(den, 1e-30);
}

class ExpertParallelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ExpertParallelTest, SameTokensAndLogitsAsOneRank) {
  const EngineOptions options = Options(GetParam());
  const int vocab = BuiltinModelConfig(GetParam()).value().vocab_size;
  // 7 requests: with 4 ranks, rank 3 gets one and idles for most steps.
  // Full-vocabulary log-probabilities stand in for the logits (log-softmax
  // of them): comparing them compares the logits up to the per-row LSE.
  const std::vector<RequestSpec> specs = Requests(7, vocab, 17, 0, vocab);
  const EpRunResult single = RunSingle(options, specs);
  for (int world : {1, 2, 4}) {
    EpOptions ep;
    ep.world = world;
    auto result = RunLocalExpertParallel(options, ep, specs);
    ASSERT_OK(result);
    ASSERT_EQ(result->requests.size(), specs.size());
    double worst = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const RequestResult& got = result->requests[i];
      ASSERT_EQ(got.id, static_cast<RequestId>(i));
      EXPECT_EQ(got.output_tokens, single.requests[i].output_tokens) << "world " << world;
      ASSERT_EQ(got.logprobs.size(), single.requests[i].logprobs.size());
      for (size_t t = 0; t < got.logprobs.size(); ++t) {
        worst = std::max(worst, LogprobRelDiff(got.logprobs[t], single.requests[i].logprobs[t]));
      }
    }
    std::printf("%s ep=%d: max logits rel diff %.3g, %lld dummy steps\n", GetParam().c_str(), world,
                worst, static_cast<long long>(result->dummy_steps));
    EXPECT_LT(worst, 1e-5) << "world " << world;
    if (world == 4) {
      EXPECT_GT(result->dummy_steps, 0) << "some rank should idle while others work";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ExpertParallelTest, ::testing::Values("tiny-v3", "tiny-v2"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(ExpertParallelReconfigureTest, FourToTwoToThreeKeepsTokensAndKvPages) {
  const EngineOptions options = Options("tiny-v2");
  const int vocab = BuiltinModelConfig("tiny-v2").value().vocab_size;
  // A shared 32-token prefix (two full blocks): later admissions hit blocks
  // cached before the reconfigurations.
  const std::vector<RequestSpec> specs = Requests(20, vocab, 5, 32, 0);
  EpOptions plain;
  plain.world = 4;
  auto base = RunLocalExpertParallel(options, plain, specs);
  ASSERT_OK(base);

  EpOptions ep = plain;
  ep.reconfigure = {{4, 2}, {9, 3}};
  auto result = RunLocalExpertParallel(options, ep, specs);
  ASSERT_OK(result);
  ASSERT_EQ(result->reconfigurations.size(), 2u);
  EXPECT_EQ(result->reconfigurations[0].from, 4);
  EXPECT_EQ(result->reconfigurations[0].to, 2);
  EXPECT_EQ(result->reconfigurations[1].to, 3);
  for (const ReconfigurationReport& r : result->reconfigurations) {
    EXPECT_TRUE(r.kv_pages_unchanged) << "step " << r.step;
  }
  ASSERT_EQ(result->requests.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(result->requests[i].output_tokens, base->requests[i].output_tokens) << i;
    EXPECT_EQ(result->requests[i].output_tokens.size(), static_cast<size_t>(specs[i].max_tokens));
  }
  // Prefix-cache entries made before the last reconfiguration still hit.
  EXPECT_GT(result->prefix_hit_tokens, result->reconfigurations[1].prefix_hit_tokens_before);
  std::printf("reconfigure 4->2->3: prefix hits %lld (%lld before the second), tokens equal\n",
              static_cast<long long>(result->prefix_hit_tokens),
              static_cast<long long>(result->reconfigurations[1].prefix_hit_tokens_before));
}

// A migration that would not fit a rank's memory plan (the KV cache took
// all that was left, and no reconfiguration was given up front) is refused
// on every rank before anything moves; given up front, the plan holds its
// buffers back ("expert migration") and the same move runs.
TEST(ExpertParallelReconfigureTest, AMigrationBeyondThePlanIsRefusedBeforeAnythingMoves) {
  for (bool given_up_front : {false, true}) {
    SCOPED_TRACE(given_up_front ? "given up front" : "not planned");
    EngineOptions options = Options("tiny-v3");
    options.kv_cache_bytes = 0;         // what the plan leaves
    options.memory_utilization = 0.02;  // of the host's available memory
    EpOptions ep;
    ep.world = 2;
    if (given_up_front) ep.reconfigure = {{5, 1}};
    auto comms = LocalCommunicator::CreateGroup(2);
    std::vector<absl::Status> status(2);
    std::vector<size_t> reserved(2), expected_reserve(2);
    std::vector<std::vector<int>> experts_after(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        auto rank = EpRank::Create(comms[r].get(), options, ep);
        if (!rank.ok()) {
          status[r] = rank.status();
          return;
        }
        reserved[r] = (*rank)->engine().memory_plan().item_bytes("expert migration");
        // Rank 0 ends with every expert, rank 1 with a one-slot placeholder:
        // the new buffers, held beside the old.
        const ModelConfig& c = (*rank)->engine().config();
        expected_reserve[r] =
            (*rank)->engine().runner().model().ExpertBufferBytes(r == 0 ? c.n_routed_experts : 0);
        status[r] = (*rank)->Reconfigure(0, 1).status();
        const Moe* moe = (*rank)->engine().runner().model().moe(1);
        experts_after[r] = moe->local_experts();
      });
    }
    for (auto& t : threads) t.join();
    const ModelConfig config = BuiltinModelConfig("tiny-v3").value();
    const ExpertPlacement two = EvenPlacement(config.n_routed_experts, 2);
    if (given_up_front) {
      for (int r = 0; r < 2; ++r) {
        EXPECT_GT(reserved[r], 0u);
        EXPECT_EQ(reserved[r], expected_reserve[r]) << "rank " << r;
      }
      for (int r = 0; r < 2; ++r) ASSERT_OK(status[r]) << "rank " << r;
      EXPECT_EQ(experts_after[0].size(), static_cast<size_t>(config.n_routed_experts));
    } else {
      EXPECT_EQ(reserved[0], 0u);
      EXPECT_THAT(status[0],
                  ::mlag::testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                            ::testing::HasSubstr("expert migration to 1 ranks")));
      EXPECT_THAT(status[1],
                  ::mlag::testing::StatusIs(absl::StatusCode::kResourceExhausted,
                                            ::testing::HasSubstr("expert migration to 1 ranks")));
      // Nothing moved.
      for (int r = 0; r < 2; ++r) EXPECT_EQ(experts_after[r], two.ExpertsOf(r)) << "rank " << r;
    }
  }
}

TEST(ExpertParallelReconfigureTest, MigratedExpertsEqualAFreshLoad) {
  const EngineOptions options = Options("tiny-v3");
  const ModelConfig config = BuiltinModelConfig("tiny-v3").value();
  EpOptions ep;
  ep.world = 4;
  auto comms = LocalCommunicator::CreateGroup(4);
  std::vector<absl::Status> status(4);
  std::vector<std::unique_ptr<EpRank>> ranks(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      auto rank = EpRank::Create(comms[r].get(), options, ep);
      if (!rank.ok()) {
        status[r] = rank.status();
        return;
      }
      ranks[r] = std::move(*rank);
      for (int size : {2, 3}) {
        auto report = ranks[r]->Reconfigure(0, size);
        if (!report.ok()) {
          status[r] = report.status();
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) ASSERT_OK(status[r]) << "rank " << r;

  const ExpertPlacement placement = EvenPlacement(config.n_routed_experts, 3);
  GeneratedWeights fresh(config);
  const int64_t D = config.hidden_size, I = config.moe_intermediate_size;
  std::vector<float> gate(I * D), up(I * D), down(D * I);
  int checked = 0;
  for (int r = 0; r < 4; ++r) {
    DeepseekModel& model = ranks[r]->engine().runner().model();
    for (int l = 0; l < config.num_hidden_layers; ++l) {
      const Moe* moe = model.moe(l);
      if (moe == nullptr) continue;
      const std::vector<int> expected = r < 3 ? placement.ExpertsOf(r) : std::vector<int>();
      ASSERT_EQ(moe->local_experts(), expected) << "rank " << r << " layer " << l;
      for (size_t slot = 0; slot < expected.size(); ++slot) {
        const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts." +
                              std::to_string(expected[slot]) + ".";
        ASSERT_OK(fresh.ReadF32(p + "gate_proj.weight", {I, D}, gate.data()));
        ASSERT_OK(fresh.ReadF32(p + "up_proj.weight", {I, D}, up.data()));
        ASSERT_OK(fresh.ReadF32(p + "down_proj.weight", {D, I}, down.data()));
        // As rows: the host keeps its experts packed (PackForLinear).
        auto rows_of = [](const LinearWeight& w) {
          const int64_t out = w.values.size(0), in = w.values.size(1);
          std::vector<float> v(w.values.data_as<const float>(),
                               w.values.data_as<const float>() + out * in);
          if (w.host_row_groups) host::UnpackGemmRowGroups(v.data(), DType::kF32, out, in);
          return v;
        };
        const std::vector<float> gu_rows = rows_of(moe->expert_gate_up(static_cast<int>(slot)));
        const std::vector<float> dn_rows = rows_of(moe->expert_down(static_cast<int>(slot)));
        const float* gu = gu_rows.data();
        const float* dn = dn_rows.data();
        EXPECT_EQ(std::memcmp(gu, gate.data(), gate.size() * 4), 0);
        EXPECT_EQ(std::memcmp(gu + I * D, up.data(), up.size() * 4), 0);
        EXPECT_EQ(std::memcmp(dn, down.data(), down.size() * 4), 0);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, config.n_routed_experts * 3);  // 3 MoE layers, every expert once

  // The re-captured graphs of a group rank hold the MoE collectives as comm
  // nodes around the experts.
  ModelRunner& runner = ranks[0]->engine().runner();
  ASSERT_GT(runner.num_graphs(), 0);
  const Graph* g = runner.graph(runner.capture_sizes().front());
  ASSERT_NE(g, nullptr);
  const auto& nodes = g->nodes();
  auto at = std::find_if(nodes.begin(), nodes.end(),
                         [](const GraphNode& n) { return n.name == "layers.1.moe.dispatch"; });
  ASSERT_NE(at, nodes.end());
  ASSERT_LT(at + 2, nodes.end());
  EXPECT_EQ(at->kind, OpKind::kComm);
  EXPECT_EQ((at + 1)->name, "layers.1.moe.experts");
  EXPECT_EQ((at + 2)->name, "layers.1.moe.combine");
  EXPECT_EQ((at + 2)->kind, OpKind::kComm);
  // The rank outside the group holds no graphs.
  EXPECT_EQ(ranks[3]->engine().runner().num_graphs(), 0);
}

// Forwards to a communicator of the local backend, except that the
// `fail_at`-th AllGather this rank launches (counted over this communicator
// and the groups split from it) fails, as a rank's step fails when, say, an
// allocation does: its peers are then already waiting in that collective.
class FailingCommunicator final : public Communicator {
 public:
  FailingCommunicator(std::unique_ptr<Communicator> inner, std::shared_ptr<std::atomic<int>> count,
                      int fail_at)
      : inner_(std::move(inner)), count_(std::move(count)), fail_at_(fail_at) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::string_view backend() const override { return inner_->backend(); }
  absl::Status AllGather(Stream& stream, const Tensor& send, const Tensor& recv) override {
    if (++*count_ == fail_at_) return absl::ResourceExhaustedError("injected allocation failure");
    return inner_->AllGather(stream, send, recv);
  }
  absl::Status ReduceScatter(Stream& stream, const Tensor& send, const Tensor& recv) override {
    return inner_->ReduceScatter(stream, send, recv);
  }
  absl::Status AllReduce(Stream& stream, const Tensor& send, const Tensor& recv,
                         ReduceOp op) override {
    return inner_->AllReduce(stream, send, recv, op);
  }
  absl::Status Broadcast(Stream& stream, const Tensor& buffer, int root) override {
    return inner_->Broadcast(stream, buffer, root);
  }
  absl::Status Send(Stream& stream, const Tensor& buffer, int peer) override {
    return inner_->Send(stream, buffer, peer);
  }
  absl::Status Recv(Stream& stream, const Tensor& buffer, int peer) override {
    return inner_->Recv(stream, buffer, peer);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  absl::Status Barrier(absl::Duration timeout) override { return inner_->Barrier(timeout); }
  absl::Status Health() override { return inner_->Health(); }
  absl::StatusOr<int64_t> AllReduceScalar(int64_t value, ReduceOp op) override {
    return inner_->AllReduceScalar(value, op);
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    absl::StatusOr<std::unique_ptr<Communicator>> sub = inner_->Split(color, key);
    if (!sub.ok() || *sub == nullptr) return sub;
    return std::unique_ptr<Communicator>(
        new FailingCommunicator(std::move(*sub), count_, fail_at_));
  }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }

 private:
  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<std::atomic<int>> count_;
  int fail_at_;
};

// Rank 1 fails in the middle of the run (eager steps, so every step calls
// the communicator). Its peers were waiting in a collective with the
// default 60 s timeout: the abort must end the whole run in a few seconds,
// and the error must name the rank and the cause.
TEST(ExpertParallelFailureTest, OneRankFailingMidRunFailsTheGroupAtOnce) {
  EngineOptions options = Options("tiny-v3");
  options.graph_mode = GraphMode::kNone;
  const ModelConfig config = BuiltinModelConfig("tiny-v3").value();
  const std::vector<RequestSpec> specs = Requests(8, config.vocab_size, 5, 0, 0);
  EpOptions ep;
  ep.world = 3;
  std::vector<std::unique_ptr<Communicator>> locals = LocalCommunicator::CreateGroup(3);
  std::vector<std::unique_ptr<Communicator>> owned;
  std::vector<Communicator*> worlds;
  for (int r = 0; r < 3; ++r) {
    // Rank 1 launches 136 AllGathers in this run without the failure: its
    // 68th fails, half-way.
    owned.push_back(std::make_unique<FailingCommunicator>(
        std::move(locals[r]), std::make_shared<std::atomic<int>>(0), r == 1 ? 68 : -1));
    worlds.push_back(owned.back().get());
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<EpRunResult> result = RunThreadedExpertParallel(
      options, ep, specs, worlds, {}, std::vector<std::string>(3, "host"));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "rank 1")) << result.status();
  EXPECT_TRUE(absl::StrContains(result.status().message(), "injected allocation failure"))
      << result.status();
  EXPECT_LT(took, absl::Seconds(20)) << "the peers waited for the timeout instead";
  std::printf("  %s after %s\n", result.status().ToString().c_str(),
              absl::FormatDuration(took).c_str());
}

}  // namespace
}  // namespace mlag

namespace mlag {
namespace {

TEST(ExpertParallelFailureTest, AFailedAndAHungRankEndEveryRankWithANamedError) {
  EngineOptions options = Options("tiny-v3");
  const ModelConfig config = BuiltinModelConfig("tiny-v3").value();
  const std::vector<RequestSpec> specs = Requests(8, config.vocab_size, 5, 0, 0);
  EpOptions ep;
  ep.world = 4;
  ep.peer_timeout = absl::Seconds(2);
  ep.faults = {ParseEpFault("fail:1:5").value(), ParseEpFault("hang:2:5:3").value()};
  std::vector<absl::Status> ranks;
  const absl::Time start = absl::Now();
  absl::StatusOr<EpRunResult> result =
      RunExpertParallel(options, ep, EpBackend::kLocal, specs, nullptr, &ranks);
  const absl::Duration took = absl::Now() - start;
  // Host thread ranks start in well under a second; the run then waits for
  // the hang (3 s).
  ::mlag::testing::ExpectEveryRankEndsNamed(result, ranks, took, absl::Seconds(30));
}

// Only a hang: the ranks waiting on it give up after the timeout with the
// classified peer fault, which names the rank that waited, the hung one
// (the local group knows who did not arrive) and the step, and abort the
// group; the hung rank, back, finds it aborted with that reason. The 2 s
// timeout is far above a healthy wait of host thread ranks, loaded or not.
TEST(ExpertParallelFailureTest, AHungRankTimesOutItsPeers) {
  EngineOptions options = Options("tiny-v3");
  const ModelConfig config = BuiltinModelConfig("tiny-v3").value();
  const std::vector<RequestSpec> specs = Requests(8, config.vocab_size, 5, 0, 0);
  EpOptions ep;
  ep.world = 3;
  ep.peer_timeout = absl::Seconds(2);
  ep.faults = {ParseEpFault("hang:2:4:4").value()};
  std::vector<absl::Status> ranks;
  const absl::Time start = absl::Now();
  absl::StatusOr<EpRunResult> result =
      RunExpertParallel(options, ep, EpBackend::kLocal, specs, nullptr, &ranks);
  const absl::Duration took = absl::Now() - start;
  std::printf("  run: %s after %s\n", result.status().ToString().c_str(),
              absl::FormatDuration(took).c_str());
  EXPECT_TRUE(IsPeerTimeout(result.status())) << result.status();
  EXPECT_THAT(result, ::mlag::testing::StatusIs(
                          absl::StatusCode::kDeadlineExceeded,
                          ::testing::MatchesRegex("peer dead or hung: rank [01] of 3 waited "
                                                  "[0-9.]+s in local .* for rank 2, at step 4")));
  ASSERT_EQ(ranks.size(), 3u);
  for (size_t r = 0; r < ranks.size(); ++r) {
    SCOPED_TRACE(r);
    std::printf("  rank %zu: %s\n", r, ranks[r].ToString().c_str());
    // The waiting ranks time out themselves or are aborted by one that did;
    // the hung rank finds the group aborted with that reason.
    EXPECT_TRUE(::mlag::testing::NamesAPeerFault(ranks[r])) << ranks[r];
    EXPECT_THAT(ranks[r].message(), ::testing::HasSubstr("for rank 2, at step 4"));
  }
  // The hang (4 s) is what the run waits for last.
  EXPECT_LT(took, absl::Seconds(30));
}

}  // namespace
}  // namespace mlag
