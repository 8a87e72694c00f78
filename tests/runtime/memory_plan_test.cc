// The memory plan: the host's budget from /proc and cgroup files, the plan's
// items against what the engine then allocates, the KV cache getting what is
// left, and refusals that name the items and a fix that works.
#include "runtime/engine/memory_plan.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/engine/engine.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::StatusIs;

constexpr size_t kKiB = 1024;

// A directory standing in for "/": proc/meminfo, proc/self/*, sys/fs/cgroup.
class FakeRoot {
 public:
  FakeRoot() {
    root_ = std::filesystem::temp_directory_path() /
            absl::StrCat("mlag_memory_root_", getpid(), "_", counter_++);
    std::filesystem::remove_all(root_);
  }
  ~FakeRoot() { std::filesystem::remove_all(root_); }
  void Write(const std::string& path, const std::string& text) {
    const std::filesystem::path p = root_ / path;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string path() const { return root_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path root_;
};

const char kMeminfo[] =
    "MemTotal:       24000000 kB\n"
    "MemFree:         1000000 kB\n"
    "MemAvailable:   20000000 kB\n"
    "Cached:          9000000 kB\n";

TEST(HostMemoryBudgetTest, MemAvailableWithoutOtherBounds) {
  FakeRoot root;
  root.Write("proc/meminfo", kMeminfo);
  root.Write("proc/self/status", "Name: mlag\nVmSize:   100000 kB\n");
  ASSERT_OK_AND_ASSIGN(HostMemoryFacts facts, ReadHostMemoryFacts(root.path()));
  EXPECT_EQ(facts.mem_total, 24000000 * kKiB);
  EXPECT_EQ(facts.mem_available, 20000000 * kKiB);
  EXPECT_EQ(facts.address_space_used, 100000 * kKiB);
  EXPECT_FALSE(facts.cgroup_limit.has_value());
  const MemoryBudget b = HostBudgetFrom(facts);
  EXPECT_EQ(b.available, 20000000 * kKiB);
  EXPECT_EQ(b.source, "MemAvailable");
  EXPECT_FALSE(b.address_space_bound);
}

TEST(HostMemoryBudgetTest, OldKernelFallsBackToFreePlusCached) {
  FakeRoot root;
  root.Write("proc/meminfo", "MemTotal: 8000 kB\nMemFree: 1000 kB\nCached: 500 kB\n");
  ASSERT_OK_AND_ASSIGN(HostMemoryFacts facts, ReadHostMemoryFacts(root.path()));
  const MemoryBudget b = HostBudgetFrom(facts);
  EXPECT_EQ(b.available, 1500 * kKiB);
  EXPECT_EQ(b.source, "MemFree + Cached");
}

TEST(HostMemoryBudgetTest, TightestCgroupV2LevelWinsAndPageCacheIsNotUsed) {
  FakeRoot root;
  root.Write("proc/meminfo", kMeminfo);
  root.Write("proc/self/cgroup", "0::/job/step\n");
  // The parent: 3 GB limit, 1 GB used of which 0.5 GB inactive page cache:
  // 2.5 GB of room. The child: 4 GB limit, 0.2 GB used: 3.8 GB. The parent
  // bounds.
  root.Write("sys/fs/cgroup/job/memory.max", "3000000000\n");
  root.Write("sys/fs/cgroup/job/memory.current", "1000000000\n");
  root.Write("sys/fs/cgroup/job/memory.stat", "anon 500000000\ninactive_file 500000000\n");
  root.Write("sys/fs/cgroup/job/step/memory.max", "4000000000\n");
  root.Write("sys/fs/cgroup/job/step/memory.current", "200000000\n");
  root.Write("sys/fs/cgroup/memory.max", "max\n");
  ASSERT_OK_AND_ASSIGN(HostMemoryFacts facts, ReadHostMemoryFacts(root.path()));
  ASSERT_TRUE(facts.cgroup_limit.has_value());
  EXPECT_EQ(*facts.cgroup_limit, 3000000000u);
  EXPECT_EQ(facts.cgroup_used, 500000000u);
  const MemoryBudget b = HostBudgetFrom(facts);
  EXPECT_EQ(b.available, 2500000000u);
  EXPECT_EQ(b.total, 3000000000u);
  EXPECT_THAT(b.source, HasSubstr("cgroup /job (v2)"));
}

TEST(HostMemoryBudgetTest, CgroupV1UnlimitedIsNoBoundAndContainerPathFallsBack) {
  FakeRoot root;
  root.Write("proc/meminfo", kMeminfo);
  // The host's path does not exist inside the container's mount: the
  // mount's own files (the container's cgroup) bound.
  root.Write("proc/self/cgroup", "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n");
  root.Write("sys/fs/cgroup/memory/memory.limit_in_bytes", "2147483648\n");
  root.Write("sys/fs/cgroup/memory/memory.usage_in_bytes", "147483648\n");
  root.Write("sys/fs/cgroup/memory/memory.stat", "total_inactive_file 0\n");
  ASSERT_OK_AND_ASSIGN(HostMemoryFacts facts, ReadHostMemoryFacts(root.path()));
  const MemoryBudget b = HostBudgetFrom(facts);
  EXPECT_EQ(b.available, 2000000000u);
  EXPECT_THAT(b.source, HasSubstr("(v1)"));

  FakeRoot unlimited;
  unlimited.Write("proc/meminfo", kMeminfo);
  unlimited.Write("proc/self/cgroup", "4:memory:/\n");
  unlimited.Write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  ASSERT_OK_AND_ASSIGN(HostMemoryFacts open, ReadHostMemoryFacts(unlimited.path()));
  EXPECT_FALSE(open.cgroup_limit.has_value());
  EXPECT_EQ(HostBudgetFrom(open).source, "MemAvailable");
}

TEST(HostMemoryBudgetTest, AddressSpaceLimitCountsWhatIsMapped) {
  HostMemoryFacts f;
  f.mem_total = 24'000'000'000;
  f.mem_available = 20'000'000'000;
  f.address_space_limit = 2'000'000'000;
  f.address_space_used = 300'000'000;
  const MemoryBudget b = HostBudgetFrom(f);
  EXPECT_EQ(b.available, 1'700'000'000u);
  EXPECT_EQ(b.source, "ulimit -v 2.0 GB");
  EXPECT_TRUE(b.address_space_bound);    // the plan reserves stacks, arenas, alignment
  f.address_space_used = 3'000'000'000;  // more mapped than the limit: nothing left
  EXPECT_EQ(HostBudgetFrom(f).available, 0u);
}

TEST(HostMemoryBudgetTest, MissingMeminfoIsANamedError) {
  FakeRoot root;
  root.Write("proc/self/cgroup", "0::/\n");
  EXPECT_THAT(ReadHostMemoryFacts(root.path()).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("meminfo")));
}

// ---- the plan ---------------------------------------------------------------

MemoryPlanRequest TinyRequest() {
  MemoryPlanRequest r;
  r.runner.max_num_seqs = 16;
  r.runner.max_num_batched_tokens = 64;
  r.runner.block_size = 16;
  r.runner.kv_dtype = DType::kF32;
  return r;
}

// What PlanWeightBytes says against what the loaded model holds, for every
// format (and, for an fp8 checkpoint, the mix auto keeps).
void ExpectWeightsPlannedExactly(const std::string& model) {
  auto device = Device::Create("host");
  ASSERT_OK(device);
  for (WeightFormat format :
       {WeightFormat::kAuto, WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kFp8}) {
    SCOPED_TRACE(absl::StrCat(model, " ", WeightFormatName(format)));
    ASSERT_OK_AND_ASSIGN(ModelSource source, OpenModel(model));
    ModelOptions o;
    o.max_tokens = 32;
    o.max_seqs = 8;
    o.weight_format = format;
    o.max_positions = 100;
    const size_t planned =
        DeepseekModel::PlanWeightBytes(source.config, device->get(), *source.weights, o);
    ASSERT_OK_AND_ASSIGN(auto built, BuildModel(source, device->get(), o));
    EXPECT_EQ(planned, built->weight_bytes());
    EXPECT_EQ(DeepseekModel::RopeTableBytes(source.config, o), built->rope_table_bytes());
    EXPECT_EQ(built->rope_table_bytes(), 100u * source.config.qk_rope_head_dim * sizeof(float));
    EXPECT_EQ(DeepseekModel::ActivationBytes(source.config, **device, o),
              built->activation_bytes());
  }
}

TEST(MemoryPlanTest, WeightsArePlannedToTheByte) {
  ExpectWeightsPlannedExactly("tiny-v3");
  ExpectWeightsPlannedExactly("tiny-v2");
}

TEST(MemoryPlanTest, WeightsOfAnFp8CheckpointArePlannedToTheByte) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("mlag_plan_fp8_", getpid())).string();
  ASSERT_OK_AND_ASSIGN(ModelSource tiny, OpenModel("tiny-v3"));
  ASSERT_OK(ExportModel(tiny.config, *tiny.weights, dir, DType::kF8E4M3));
  ExpectWeightsPlannedExactly(dir);
  std::filesystem::remove_all(dir);
}

// Each planned item is what the engine then holds; the KV cache is what the
// rest leaves of the usable memory, in whole blocks.
TEST(MemoryPlanTest, EngineHoldsWhatThePlanSaysAndTheKvCacheGetsTheRest) {
  EngineOptions o;
  o.model = "tiny-v3";
  o.device = "host";
  o.block_size = 16;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 64;
  o.memory_utilization = 0.05;  // a small pool: the test touches none of it
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(o));
  const MemoryPlan& p = engine->memory_plan();
  EXPECT_EQ(p.max_model_len, engine->config().max_position_embeddings);
  EXPECT_FALSE(p.max_model_len_given);
  EXPECT_FALSE(p.kv_cache_given);
  for (const auto& [item, bytes] : engine->runner().AllocatedBytes()) {
    SCOPED_TRACE(item);
    EXPECT_EQ(p.item_bytes(item), bytes);
  }
  EXPECT_GT(p.item_bytes("runtime reserve"), 0u);
  EXPECT_LE(p.planned_bytes(), p.usable_bytes);
  EXPECT_LT(p.usable_bytes - p.planned_bytes(), p.kv_block_bytes);  // whole blocks: less than one
  EXPECT_EQ(p.kv_block_bytes, 16u * engine->runner().kv_bytes_per_token());
  const EngineStats s = engine->Stats();
  EXPECT_EQ(s.kv_blocks_total, p.kv_blocks - 1);
  EXPECT_EQ(s.memory_planned_bytes, p.planned_bytes());
  EXPECT_EQ(s.memory_allocated_bytes, p.planned_bytes() - p.item_bytes("runtime reserve"));
  // The plan's share of what was available.
  EXPECT_NEAR(static_cast<double>(p.usable_bytes), 0.05 * p.budget.available, 1.0);
}

TEST(MemoryPlanTest, UtilizationMovesOnlyTheKvCache) {
  ASSERT_OK_AND_ASSIGN(ModelSource source, OpenModel("tiny-v3"));
  auto device = Device::Create("host");
  ASSERT_OK(device);
  MemoryPlanRequest r = TinyRequest();
  r.memory_utilization = 0.02;
  ASSERT_OK_AND_ASSIGN(MemoryPlan low, PlanMemory(source, device->get(), r));
  r.memory_utilization = 0.04;
  ASSERT_OK_AND_ASSIGN(MemoryPlan high, PlanMemory(source, device->get(), r));
  for (const MemoryPlanItem& item : low.items) {
    if (item.name != "KV cache") EXPECT_EQ(item.bytes, high.item_bytes(item.name)) << item.name;
  }
  EXPECT_GT(high.item_bytes("KV cache"), low.item_bytes("KV cache"));
  // Expert-parallel host ranks share the host: half each of two.
  EngineOptions eo;
  eo.device = "host";
  eo.max_ep_ranks = 2;
  eo.memory_utilization = 0.04;
  ASSERT_OK_AND_ASSIGN(MemoryPlanRequest shared, MemoryPlanRequestFor(eo, **device));
  EXPECT_EQ(shared.memory_share, 0.5);
  ASSERT_OK_AND_ASSIGN(MemoryPlan rank, PlanMemory(source, device->get(), shared));
  EXPECT_NEAR(static_cast<double>(rank.usable_bytes), 0.02 * rank.budget.available, 1.0);
}

TEST(MemoryPlanTest, ALongContextIsRefusedWithALengthThatFits) {
  ASSERT_OK_AND_ASSIGN(ModelSource source, OpenModel("tiny-v3"));
  source.config.max_position_embeddings = 200'000'000;
  auto device = Device::Create("host");
  ASSERT_OK(device);
  MemoryPlanRequest r = TinyRequest();
  r.memory_utilization = 0.01;
  // One budget for every plan below: "fits" and "fits + 1" are compared
  // against the same memory, whatever else the machine does meanwhile.
  ASSERT_OK_AND_ASSIGN(r.budget, (*device)->AvailableMemory());
  absl::StatusOr<MemoryPlan> refused = PlanMemory(source, device->get(), r);
  ASSERT_THAT(refused.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                         HasSubstr("KV for one 200000000-token sequence")));
  const std::string message(refused.status().message());
  EXPECT_THAT(message, HasSubstr("rope table"));
  EXPECT_THAT(message, HasSubstr("usable (0.01 of"));
  // The advice is a length that fits, and the next one does not.
  const size_t at = message.find("at most ");
  ASSERT_NE(at, std::string::npos) << message;
  const int fits = std::atoi(message.c_str() + at + 8);
  ASSERT_GT(fits, 0);
  r.runner.max_model_len = fits;
  ASSERT_OK_AND_ASSIGN(MemoryPlan ok, PlanMemory(source, device->get(), r));
  EXPECT_EQ(ok.max_model_len, fits);
  EXPECT_GE(ok.kv_tokens(), fits);
  EXPECT_EQ(ok.item_bytes("rope table"), static_cast<size_t>(fits) * 16 * sizeof(float));
  r.runner.max_model_len = fits + 1;
  const absl::Status just_over = PlanMemory(source, device->get(), r).status();
  EXPECT_THAT(just_over, StatusIs(absl::StatusCode::kResourceExhausted));
  // All of the memory would hold one more token: more of it is advice.
  EXPECT_THAT(std::string(just_over.message()), HasSubstr("raise --memory-utilization"));
  // A short context runs, its rope table sized by it.
  r.runner.max_model_len = 4096;
  ASSERT_OK_AND_ASSIGN(MemoryPlan short_plan, PlanMemory(source, device->get(), r));
  EXPECT_EQ(short_plan.item_bytes("rope table"), 4096u * 16 * sizeof(float));
  // KV for 200,000,000 tokens (1,280 bytes each) needs more than all of
  // this machine's memory: more of it is no advice.
  if (short_plan.budget.available < size_t{200'000'000} * 1280) {
    EXPECT_THAT(message, Not(HasSubstr("raise --memory-utilization")));
  }
}

// The weight dtypes the advice names are those with which the plan fits,
// and taking the advice plans; where none would, it names none.
TEST(MemoryPlanTest, WeightDtypeAdviceNamesOnlyDtypesThatFit) {
  ASSERT_OK_AND_ASSIGN(ModelSource source, OpenModel("small"));
  auto device = Device::Create("host");
  ASSERT_OK(device);
  MemoryPlanRequest r = TinyRequest();
  r.runner.max_model_len = 1024;
  r.memory_utilization = 0.01;
  // The memory available, as every plan here sees it.
  ASSERT_OK_AND_ASSIGN(ModelSource tiny_source, OpenModel("tiny-v3"));
  ASSERT_OK_AND_ASSIGN(MemoryPlan tiny, PlanMemory(tiny_source, device->get(), TinyRequest()));
  const double available = static_cast<double>(tiny.budget.available);
  r.budget = tiny.budget;
  auto weights = [&](WeightFormat f) {
    ModelOptions o;
    o.weight_format = f;
    return static_cast<double>(
        DeepseekModel::PlanWeightBytes(source.config, device->get(), *source.weights, o));
  };
  const double f32 = weights(WeightFormat::kF32), bf16 = weights(WeightFormat::kBF16),
               fp8 = weights(WeightFormat::kFp8);
  ASSERT_LT(fp8, bf16);
  if (available < f32 + (bf16 - fp8)) GTEST_SKIP() << "too little memory to plan small in f32";
  // Room for fp8's weights and a little more, not for bf16's.
  r.memory_utilization = (fp8 + (bf16 - fp8) / 2) / available;
  const absl::Status refused = PlanMemory(source, device->get(), r).status();
  ASSERT_THAT(refused, StatusIs(absl::StatusCode::kResourceExhausted));
  const std::string message(refused.message());
  EXPECT_THAT(message, HasSubstr("--weight-dtype fp8"));
  EXPECT_THAT(message, Not(HasSubstr("bf16")));
  r.runner.weight_format = WeightFormat::kFp8;
  EXPECT_OK(PlanMemory(source, device->get(), r).status());
  // Room for none of them: more of the memory is the advice.
  r.runner.weight_format = WeightFormat::kAuto;
  r.memory_utilization = fp8 / 4 / available;
  const absl::Status none = PlanMemory(source, device->get(), r).status();
  EXPECT_THAT(none, StatusIs(absl::StatusCode::kResourceExhausted,
                             HasSubstr("raise --memory-utilization")));
  EXPECT_THAT(std::string(none.message()), Not(HasSubstr("--weight-dtype")));
}

// Each reconfiguration holds the old and the new expert buffers at once:
// the plan holds back the peak of their sum over the sequence, above the
// buffers the weights already count.
TEST(MemoryPlanTest, ExpertMigrationHoldsBackThePeakOfTheSequence) {
  ASSERT_OK_AND_ASSIGN(ModelSource source, OpenModel("tiny-v3"));
  auto device = Device::Create("host");
  ASSERT_OK(device);
  const int E = source.config.n_routed_experts;
  ASSERT_GE(E, 4);
  MemoryPlanRequest r = TinyRequest();
  r.memory_utilization = 0.01;
  r.runner.local_experts = {0, 1};
  ASSERT_OK_AND_ASSIGN(MemoryPlan none, PlanMemory(source, device->get(), r));
  EXPECT_EQ(none.item_bytes("expert migration"), 0u);
  r.reconfiguration_expert_slots = {E, 3, 0};  // all, then 3, then leave
  ASSERT_OK_AND_ASSIGN(MemoryPlan p, PlanMemory(source, device->get(), r));
  ModelOptions o;
  o.local_experts = r.runner.local_experts;
  auto buffers = [&](int slots) {
    return DeepseekModel::PlanExpertBufferBytes(source.config, device->get(), *source.weights, o,
                                                slots);
  };
  const size_t peak =
      std::max({buffers(2) + buffers(E), buffers(E) + buffers(3), buffers(3) + buffers(0)});
  EXPECT_EQ(p.item_bytes("expert migration"), peak - buffers(2));
  // It adds to the weights' own buffers, which stay as loaded.
  EXPECT_EQ(p.item_bytes("weights"), none.item_bytes("weights"));
}

TEST(MemoryPlanTest, BadRequestsAreNamed) {
  ASSERT_OK_AND_ASSIGN(ModelSource source, OpenModel("tiny-v3"));
  auto device = Device::Create("host");
  ASSERT_OK(device);
  MemoryPlanRequest r = TinyRequest();
  r.memory_utilization = 1.5;
  EXPECT_THAT(PlanMemory(source, device->get(), r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("memory utilization")));
  r = TinyRequest();
  r.runner.max_model_len = source.config.max_position_embeddings + 1;
  EXPECT_THAT(PlanMemory(source, device->get(), r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_position_embeddings")));
  // A given KV cache beyond the memory names itself and the flag.
  r = TinyRequest();
  r.kv_cache_bytes = size_t{1} << 50;
  absl::Status too_big = PlanMemory(source, device->get(), r).status();
  EXPECT_THAT(too_big, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("KV cache")));
  EXPECT_THAT(std::string(too_big.message()), HasSubstr("--kv-cache-bytes"));
  // One that cannot hold two blocks.
  r.kv_cache_bytes = 1;
  EXPECT_THAT(PlanMemory(source, device->get(), r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 2")));
}

}  // namespace
}  // namespace mlag
