// The executor on the host: graphs vs eager, per-size graphs, dummy runs that
// leave live KV pages alone, padding, prefix caching, preemption, validation.
#include "runtime/engine/engine.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/runtime/overlap_checks.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

std::vector<int32_t> RandomTokens(int n, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> u(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = u(rng);
  return t;
}

EngineOptions TinyOptions(GraphMode mode) {
  EngineOptions o;
  o.model = "tiny-v3";
  o.device = "host";
  o.graph_mode = mode;
  o.block_size = 16;
  o.max_num_seqs = 64;
  o.max_num_batched_tokens = 256;
  o.kv_cache_bytes = size_t{16} << 20;
  return o;
}

// Everything one run produced: tokens per request and the logits row behind
// every generated token.
struct RunRecord {
  std::vector<std::vector<int32_t>> tokens;
  std::map<std::pair<int64_t, int>, std::vector<float>> logits;  // (request, index) -> row
  EngineStats stats;
};

RunRecord RunAll(Engine& engine, const std::vector<RequestSpec>& specs) {
  SCOPED_TRACE(absl::StrCat("RunAll over ", specs.size(), " requests"));
  RunRecord rec;
  std::vector<RequestId> ids;
  for (const RequestSpec& s : specs) {
    auto id = engine.AddRequest(s);
    EXPECT_OK(id);
    ids.push_back(*id);
  }
  const int V = engine.config().vocab_size;
  int guard = 0;
  while (engine.HasUnfinished() && ++guard < 10000) {
    SCOPED_TRACE(absl::StrCat("step ", guard));
    auto out = engine.Step();
    EXPECT_OK(out);
    if (!out.ok()) break;
    Tensor logits = engine.runner().last_logits();
    for (size_t i = 0; i < out->new_tokens.size(); ++i) {
      const RequestId id = out->new_tokens[i].first;
      const float* row = logits.data_as<float>() + int64_t{out->logits_rows[i]} * V;
      int index = engine.request(id)->num_output_tokens() - 1;
      rec.logits[{id, index}] = std::vector<float>(row, row + V);
    }
  }
  for (RequestId id : ids) rec.tokens.push_back(engine.request(id)->output_tokens());
  rec.stats = engine.Stats();
  return rec;
}

std::vector<RequestSpec> MixedRequests(int n, int vocab, uint32_t seed, int max_tokens) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> len(1, 40);
  std::vector<RequestSpec> specs(n);
  for (RequestSpec& s : specs) {
    s.prompt = RandomTokens(len(rng), vocab, rng);
    s.max_tokens = max_tokens;
  }
  return specs;
}

TEST(EngineTest, GraphReplayMatchesEagerBitForBit) {
  auto graphs = Engine::Create(TinyOptions(GraphMode::kFullDecode));
  auto eager = Engine::Create(TinyOptions(GraphMode::kNone));
  ASSERT_OK(graphs);
  ASSERT_OK(eager);
  auto specs = MixedRequests(64, (*graphs)->config().vocab_size, 3, 6);
  RunRecord a = RunAll(**graphs, specs);
  RunRecord b = RunAll(**eager, specs);
  EXPECT_EQ(a.tokens, b.tokens);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  int differing = 0;
  for (const auto& [key, row] : a.logits) {
    const std::vector<float>& other = b.logits.at(key);
    if (std::memcmp(row.data(), other.data(), row.size() * sizeof(float)) != 0) ++differing;
  }
  EXPECT_EQ(differing, 0) << "of " << a.logits.size() << " logits rows";
  int64_t replays = 0;
  for (const auto& [size, count] : a.stats.graph_replays) replays += count;
  EXPECT_GT(replays, 0);
  EXPECT_TRUE(b.stats.graph_replays.empty());
  std::printf("graph vs eager: %zu logits rows compared, %lld replays, capture %.3f s\n",
              a.logits.size(), static_cast<long long>(replays), a.stats.capture_seconds);
}

TEST(EngineTest, Bf16KvCacheGraphMatchesEager) {
  EngineOptions g = TinyOptions(GraphMode::kFullDecode);
  g.kv_cache_dtype = "bf16";
  EngineOptions e = g;
  e.graph_mode = GraphMode::kNone;
  auto graphs = Engine::Create(g).value();
  auto eager = Engine::Create(e).value();
  auto specs = MixedRequests(12, graphs->config().vocab_size, 8, 5);
  RunRecord a = RunAll(*graphs, specs);
  RunRecord b = RunAll(*eager, specs);
  EXPECT_EQ(a.tokens, b.tokens);
  int differing = 0;
  for (const auto& [key, row] : a.logits) {
    differing += std::memcmp(row.data(), b.logits.at(key).data(), row.size() * 4) != 0;
  }
  EXPECT_EQ(differing, 0);
  EXPECT_EQ(a.stats.kv_bytes_per_token, size_t{4} * 80 * 2);  // 4 layers x 80 bf16 values
}

TEST(EngineTest, OneGraphPerCaptureSizeWithKvUpdateBeforeMla) {
  auto engine = Engine::Create(TinyOptions(GraphMode::kFullDecode));
  ASSERT_OK(engine);
  ModelRunner& runner = (*engine)->runner();
  const std::vector<int> expected = DefaultCaptureSizes(64, 256);
  EXPECT_EQ(runner.capture_sizes(), expected);
  EXPECT_EQ(runner.num_graphs(), static_cast<int>(expected.size()));
  const int layers = (*engine)->config().num_hidden_layers;
  for (int size : expected) {
    const Graph* g = runner.graph(size);
    ASSERT_NE(g, nullptr) << size;
    for (int l = 0; l < layers; ++l) {
      const std::string kv = "layers." + std::to_string(l) + ".attn.kv_update";
      auto it = std::find_if(g->nodes().begin(), g->nodes().end(),
                             [&](const GraphNode& n) { return n.name == kv; });
      ASSERT_NE(it, g->nodes().end()) << size << " " << kv;
      ASSERT_NE(it + 1, g->nodes().end());
      EXPECT_EQ((it + 1)->name, "layers." + std::to_string(l) + ".attn.mla");
    }
    EXPECT_EQ(g->nodes().back().name, "sample");
  }
}

TEST(EngineTest, DefaultCaptureSizes) {
  std::vector<int> s = DefaultCaptureSizes(256, 8192);
  EXPECT_EQ(s.size(), 51u);
  EXPECT_EQ(s.front(), 1);
  EXPECT_EQ(s[3], 8);
  EXPECT_EQ(s.back(), 512);
  EXPECT_EQ(DefaultCaptureSizes(4, 8192), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(DefaultCaptureSizes(64, 20).back(), 16);
}

// Drives `engine` for `steps` steps over `specs` (added up front).
std::vector<RequestId> StartRequests(Engine& engine, const std::vector<RequestSpec>& specs,
                                     int steps) {
  std::vector<RequestId> ids;
  for (const RequestSpec& s : specs) ids.push_back(engine.AddRequest(s).value());
  for (int i = 0; i < steps; ++i) EXPECT_OK(engine.Step()) << "step " << i + 1 << " of " << steps;
  return ids;
}

TEST(EngineTest, DummyRunsLeaveEveryLiveKvPageUnchanged) {
  EngineOptions o = TinyOptions(GraphMode::kFullDecode);
  o.max_num_seqs = 16;
  auto engine = Engine::Create(o).value();
  auto twin = Engine::Create(o).value();
  std::mt19937 rng(9);
  std::vector<RequestSpec> specs;
  // Two short requests finish early, leaving cached-but-free blocks behind;
  // the others stay live mid-decode.
  for (int i = 0; i < 6; ++i) {
    RequestSpec s;
    s.prompt = RandomTokens(20 + 7 * i, engine->config().vocab_size, rng);
    s.max_tokens = i < 2 ? 2 : 30;
    specs.push_back(s);
  }
  StartRequests(*engine, specs, 6);
  StartRequests(*twin, specs, 6);
  ASSERT_TRUE(engine->HasUnfinished());
  ASSERT_GT(engine->kv_cache().pool().num_cached_blocks(), 0);

  ModelRunner& runner = engine->runner();
  const std::vector<int> in_use = engine->kv_cache().BlocksInUse();
  ASSERT_FALSE(in_use.empty());
  const auto before = runner.BlockChecksums(in_use).value();
  const uint64_t pool_before = runner.KvChecksum({}).value();

  ASSERT_OK(runner.CaptureGraphs());
  for (int size : runner.capture_sizes()) {
    for (int i = 0; i < 100; ++i) ASSERT_OK(runner.DummyStep(size));
  }
  // A dummy step above the largest captured size runs eagerly.
  ASSERT_OK(runner.DummyStep(runner.capture_sizes().back() - 3));

  EXPECT_EQ(runner.BlockChecksums(in_use).value(), before);
  EXPECT_EQ(runner.KvChecksum({}).value(), pool_before);

  // The next step gives the same logits as a twin engine that ran no dummies.
  auto a = engine->Step().value();
  auto b = twin->Step().value();
  ASSERT_EQ(a.new_tokens, b.new_tokens);
  const int V = engine->config().vocab_size;
  Tensor la = engine->runner().last_logits(), lb = twin->runner().last_logits();
  for (size_t i = 0; i < a.new_tokens.size(); ++i) {
    EXPECT_EQ(std::memcmp(la.data_as<float>() + int64_t{a.logits_rows[i]} * V,
                          lb.data_as<float>() + int64_t{b.logits_rows[i]} * V, V * sizeof(float)),
              0);
  }
}

TEST(EngineTest, PaddedRowsWriteNoKvAndAreDropped) {
  auto engine = Engine::Create(TinyOptions(GraphMode::kFullDecode)).value();
  std::mt19937 rng(4);
  std::vector<RequestSpec> specs(5);
  for (RequestSpec& s : specs) {
    s.prompt = RandomTokens(9, engine->config().vocab_size, rng);
    s.max_tokens = 4;
  }
  std::vector<RequestId> ids = StartRequests(*engine, specs, 1);  // prefill (eager)
  ModelRunner& runner = engine->runner();
  const int num_blocks = runner.config().num_blocks;
  std::vector<int> all(num_blocks);
  for (int i = 0; i < num_blocks; ++i) all[i] = i;
  // Blocks of the 5 requests change (their new token is written); every other
  // block, the null block 0 included, must not.
  std::vector<int> own;
  for (RequestId id : ids) {
    for (int b : engine->kv_cache().block_table(id)) own.push_back(b);
  }
  std::vector<int> others;
  for (int b : all) {
    if (std::find(own.begin(), own.end(), b) == own.end()) others.push_back(b);
  }
  const auto others_before = runner.BlockChecksums(others).value();
  const int64_t replays_before =
      runner.stats().graph_replays.count(8) ? runner.stats().graph_replays.at(8) : 0;
  auto out = engine->Step().value();
  EXPECT_TRUE(out.replayed);
  EXPECT_EQ(out.padded_size, 8);
  EXPECT_EQ(runner.stats().graph_replays.at(8), replays_before + 1);
  EXPECT_EQ(out.new_tokens.size(), 5u);  // the 3 padded rows are dropped
  for (RequestId id : ids) EXPECT_EQ(engine->request(id)->num_output_tokens(), 2);
  EXPECT_EQ(runner.BlockChecksums(others).value(), others_before);
}

TEST(EngineTest, PrefixCacheHitsAndKeepsTokens) {
  auto run = [](bool caching, int64_t* hit_tokens) {
    EngineOptions o = TinyOptions(GraphMode::kFullDecode);
    o.enable_prefix_caching = caching;
    auto engine = Engine::Create(o).value();
    std::mt19937 rng(21);
    std::vector<int32_t> prefix = RandomTokens(48, engine->config().vocab_size, rng);
    std::vector<std::vector<int32_t>> outputs;
    for (int i = 0; i < 2; ++i) {
      RequestSpec s;
      s.prompt = prefix;
      std::vector<int32_t> tail = RandomTokens(5 + i, engine->config().vocab_size, rng);
      s.prompt.insert(s.prompt.end(), tail.begin(), tail.end());
      s.max_tokens = 8;
      RequestId id = engine->AddRequest(s).value();
      while (engine->HasUnfinished()) EXPECT_OK(engine->Step());
      outputs.push_back(engine->request(id)->output_tokens());
      if (i == 0) *hit_tokens = engine->kv_cache().hit_tokens();
    }
    *hit_tokens = engine->kv_cache().hit_tokens() - *hit_tokens;
    return outputs;
  };
  int64_t hits_on = 0, hits_off = 0;
  auto with = run(true, &hits_on);
  auto without = run(false, &hits_off);
  EXPECT_EQ(hits_on, 48);  // 3 blocks of 16
  EXPECT_EQ(hits_off, 0);
  EXPECT_EQ(with, without);
}

TEST(EngineTest, PreemptionCompletesEveryRequestWithTheSameTokens) {
  EngineOptions big = TinyOptions(GraphMode::kFullDecode);
  EngineOptions small = big;
  // 12 blocks of 16 tokens: each request needs up to 3, twelve requests do not fit.
  const size_t block_bytes = 16 * 4 * 80 * sizeof(float);
  small.kv_cache_bytes = 13 * block_bytes;
  auto a = Engine::Create(big).value();
  auto b = Engine::Create(small).value();
  std::mt19937 rng(5);
  std::vector<RequestSpec> specs(12);
  for (RequestSpec& s : specs) {
    s.prompt = RandomTokens(20, a->config().vocab_size, rng);
    s.max_tokens = 20;
  }
  RunRecord ra = RunAll(*a, specs);
  RunRecord rb = RunAll(*b, specs);
  EXPECT_EQ(ra.tokens, rb.tokens);
  for (const auto& t : rb.tokens) EXPECT_EQ(t.size(), 20u);
  EXPECT_GT(rb.stats.preemptions, 0);
  EXPECT_EQ(ra.stats.preemptions, 0);
  std::printf("preemption: %lld preemptions, all %zu requests complete\n",
              static_cast<long long>(rb.stats.preemptions), rb.tokens.size());
}

TEST(EngineTest, InvalidRequestsAreRejectedAlone) {
  auto engine = Engine::Create(TinyOptions(GraphMode::kFullDecode)).value();
  const int V = engine->config().vocab_size;
  RequestSpec empty;
  EXPECT_NE(engine->AddRequest(empty).status().message().find("empty prompt"), std::string::npos);
  RequestSpec bad;
  bad.prompt = {1, 2, V};
  auto s = engine->AddRequest(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("vocabulary"), std::string::npos) << s;
  RequestSpec too_long;
  too_long.prompt = std::vector<int32_t>(200, 1);
  too_long.max_tokens = 100;
  EXPECT_NE(engine->AddRequest(too_long).status().message().find("max_model_len"),
            std::string::npos);
  RequestSpec zero;
  zero.prompt = {1};
  zero.max_tokens = 0;
  EXPECT_FALSE(engine->AddRequest(zero).ok());

  RequestSpec good;
  good.prompt = {1, 2, 3};
  good.max_tokens = 3;
  RequestId id = engine->AddRequest(good).value();
  while (engine->HasUnfinished()) ASSERT_OK(engine->Step());
  EXPECT_EQ(engine->request(id)->num_output_tokens(), 3);
  EXPECT_EQ(engine->request(id)->finish_reason, FinishReason::kLength);
}

TEST(EngineTest, AbortAndStopTokens) {
  auto engine = Engine::Create(TinyOptions(GraphMode::kFullDecode)).value();
  RequestSpec s;
  s.prompt = {5, 6, 7, 8};
  s.max_tokens = 10;
  RequestId a = engine->AddRequest(s).value();
  RequestId b = engine->AddRequest(s).value();
  ASSERT_OK(engine->Step());
  ASSERT_OK(engine->Abort(a));
  EXPECT_EQ(engine->request(a)->finish_reason, FinishReason::kAbort);
  while (engine->HasUnfinished()) ASSERT_OK(engine->Step());
  const std::vector<int32_t> full = engine->request(b)->output_tokens();
  ASSERT_EQ(full.size(), 10u);
  EXPECT_EQ(engine->kv_cache().num_free_blocks(), engine->kv_cache().num_blocks() - 1);

  // Stopping at the third generated token's id ends the request there.
  RequestSpec stop = s;
  stop.stop_token_ids = {full[2]};
  RequestId c = engine->AddRequest(stop).value();
  while (engine->HasUnfinished()) ASSERT_OK(engine->Step());
  const Request* rc = engine->request(c);
  EXPECT_EQ(rc->finish_reason, FinishReason::kStop);
  const size_t first = std::find(full.begin(), full.end(), full[2]) - full.begin();
  EXPECT_EQ(rc->output_tokens(), std::vector<int32_t>(full.begin(), full.begin() + first + 1));
}

// The overlapped loop on the host (whose stream runs each launch at once,
// so the loop's bookkeeping is what is checked): the step-by-step loop's
// tokens, log-probabilities and finish reasons, with 12 blocks of KV for 40
// requests (preemption) and a 48-token budget (chunked prefills).
TEST(EngineTest, OverlappedLoopMatchesStepByStep) {
  EngineOptions o = TinyOptions(GraphMode::kFullDecode);
  o.kv_cache_bytes = 13 * 16 * 4 * 80 * sizeof(float);
  o.max_num_batched_tokens = 48;
  o.max_num_seqs = 16;
  testing::ExpectOverlapMatchesStepByStep(o, 40, 11);
}

TEST(EngineTest, OverlappedLoopWritesNoKvForAStopToken) {
  for (int at : {0, 1, 2, 3})
    testing::ExpectStopTokenWritesNoKv(TinyOptions(GraphMode::kFullDecode), at);
}

TEST(EngineTest, StepOverlapOptionIsChecked) {
  EngineOptions o = TinyOptions(GraphMode::kFullDecode);
  EXPECT_FALSE(Engine::Create(o).value()->overlapped());  // auto: off on the host
  o.step_overlap = "sometimes";
  auto bad = Engine::Create(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("step overlap 'sometimes'"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace mlag
