#include "runtime/engine/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/core/status.h"

namespace mlag {
namespace {

// What the plan cannot size exactly. CUDA: the cuBLASLt workspace (32 MiB a
// stream), graph executables (a few MB for every captured size) and NCCL's
// channel buffers (up to ~100 MB a communicator at the default NCCL_BUFFSIZE).
// The host: thread stacks, the tokenizer, request records and the allocator's
// slack.
constexpr size_t kCudaReserveBytes = size_t{256} << 20;
constexpr size_t kHostReserveBytes = size_t{64} << 20;

// The items that do not depend on the KV cache, for max_model_len `len`.
struct FixedItems {
  std::vector<MemoryPlanItem> items;
  size_t bytes = 0;
};

absl::StatusOr<FixedItems> PlanFixed(const ModelSource& source, Device* device,
                                     const RunnerConfig& rc_in, int len, size_t weights,
                                     const MemoryPlanItem& migration, size_t address_space) {
  RunnerConfig rc = rc_in;
  rc.max_model_len = len;
  MLAG_ASSIGN_OR_RETURN(const RunnerShape shape, RunnerShape::Of(rc));
  const ModelConfig& c = source.config;
  ModelOptions mo;
  mo.max_tokens = shape.max_rows;
  mo.max_seqs = shape.max_seq_rows;
  mo.max_ep_ranks = rc.max_ep_ranks;
  mo.max_positions = len;
  const bool cuda = device->is_cuda();
  FixedItems f;
  f.items.push_back(
      {"weights", weights, absl::StrCat("--weight-dtype ", WeightFormatName(rc.weight_format))});
  f.items.push_back({"rope table", DeepseekModel::RopeTableBytes(c, mo),
                     absl::StrCat(len, " positions x ", c.qk_rope_head_dim, " f32")});
  f.items.push_back({"activations", DeepseekModel::ActivationBytes(c, *device, mo),
                     absl::StrCat(shape.max_rows, " tokens, ", shape.max_seq_rows, " sequences")});
  f.items.push_back({"static buffers",
                     shape.DeviceBufferBytes(rc, cuda) + (cuda ? 0 : shape.StagingBytes(rc, cuda)),
                     absl::StrCat("block tables of ", shape.max_blocks_per_seq, " blocks",
                                  cuda ? "" : ", two staging slots")});
  if (migration.bytes > 0) f.items.push_back(migration);
  f.items.push_back(
      {"runtime reserve", (cuda ? kCudaReserveBytes : kHostReserveBytes) + address_space,
       cuda                ? "cuBLASLt workspace, graphs, NCCL"
       : address_space > 0 ? "threads, requests; address space: stacks, arenas, alignment"
                           : "threads, requests"});
  for (const MemoryPlanItem& item : f.items) f.bytes += item.bytes;
  return f;
}

size_t KvBlockBytes(const ModelConfig& c, const RunnerConfig& rc) {
  return static_cast<size_t>(rc.block_size) * c.num_hidden_layers * c.kv_cache_row() *
         DTypeSize(rc.kv_dtype);
}

// Blocks one sequence of `len` tokens needs, the null block included.
int64_t BlocksForOneSequence(int64_t len, int block_size) {
  return (len + block_size - 1) / block_size + 1;
}

std::string Gb(size_t bytes) { return FormatBytes(static_cast<double>(bytes)); }

// "weights 14.2 GB + KV for one 163840-token sequence 10.7 GB": the largest
// items first, the small ones summed.
std::string LargestItems(std::vector<MemoryPlanItem> items) {
  std::sort(items.begin(), items.end(),
            [](const MemoryPlanItem& a, const MemoryPlanItem& b) { return a.bytes > b.bytes; });
  std::vector<std::string> parts;
  size_t rest = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i < 3) {
      parts.push_back(absl::StrCat(items[i].name, " ", Gb(items[i].bytes)));
    } else {
      rest += items[i].bytes;
    }
  }
  if (rest > 0) parts.push_back(absl::StrCat("the rest ", Gb(rest)));
  return absl::StrJoin(parts, " + ");
}

std::string UsableText(const MemoryPlan& p) {
  std::string share = p.memory_share < 1.0
                          ? absl::StrFormat(" x this rank's share %.3g", p.memory_share)
                          : std::string();
  return absl::StrFormat("%s usable (%.3g of %s available%s: %s) on %s", Gb(p.usable_bytes),
                         p.memory_utilization, Gb(p.budget.available), share, p.budget.source,
                         p.device);
}

// The ways out of a plan that does not fit: a shorter max_model_len when
// one fits (`longest_fitting` > 0), a smaller given KV cache, more of the
// memory when all of it would hold the `needed` bytes, and the weight dtypes
// with which the plan would fit (`smaller_weights`: "bf16 (4.0 GB)").
std::string Fixes(const MemoryPlan& p, int64_t longest_fitting, bool kv_given, double needed,
                  const std::vector<std::string>& smaller_weights) {
  std::vector<std::string> fixes;
  if (longest_fitting > 0 && longest_fitting < p.max_model_len) {
    fixes.push_back(absl::StrCat("lower --max-model-len (at most ", longest_fitting, " fits)"));
  }
  if (kv_given) fixes.push_back("lower --kv-cache-bytes");
  if (p.memory_utilization < 0.95 &&
      needed <= static_cast<double>(p.budget.available) * p.memory_share) {
    fixes.push_back("raise --memory-utilization");
  }
  if (!smaller_weights.empty()) {
    fixes.push_back(absl::StrCat("use --weight-dtype ", absl::StrJoin(smaller_weights, " or ")));
  }
  if (fixes.empty())
    return "nothing smaller fits: the model needs more memory than this process can use here";
  if (fixes.size() == 1) return fixes[0];
  const std::string last = fixes.back();
  fixes.pop_back();
  return absl::StrCat(absl::StrJoin(fixes, ", "), ", or ", last);
}

}  // namespace

size_t MemoryPlan::planned_bytes() const {
  size_t total = 0;
  for (const MemoryPlanItem& item : items) total += item.bytes;
  return total;
}

size_t MemoryPlan::item_bytes(const std::string& name) const {
  for (const MemoryPlanItem& item : items) {
    if (item.name == name) return item.bytes;
  }
  return 0;
}

std::vector<std::string> MemoryPlan::Lines() const {
  std::vector<std::string> lines;
  for (const MemoryPlanItem& item : items) {
    lines.push_back(absl::StrFormat("  %-16s %10s  %s", item.name, Gb(item.bytes), item.detail));
  }
  lines.push_back(
      absl::StrFormat("  %-16s %10s  of %s", "total", Gb(planned_bytes()), UsableText(*this)));
  return lines;
}

absl::StatusOr<MemoryPlan> PlanMemory(const ModelSource& source, Device* device,
                                      const MemoryPlanRequest& request) {
  const ModelConfig& c = source.config;
  const RunnerConfig& rc = request.runner;
  if (!(request.memory_utilization > 0.0 && request.memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory utilization ", request.memory_utilization, " is not in (0, 1]"));
  }
  if (!(request.memory_share > 0.0 && request.memory_share <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory share ", request.memory_share, " is not in (0, 1]"));
  }
  if (rc.max_model_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_model_len must be positive, got ", rc.max_model_len));
  }
  if (rc.max_model_len > c.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_model_len ", rc.max_model_len, " exceeds the model's ",
                     "max_position_embeddings ", c.max_position_embeddings));
  }
  MemoryPlan p;
  p.device = device->name();
  if (request.budget.has_value()) {
    p.budget = *request.budget;
  } else {
    MLAG_ASSIGN_OR_RETURN(p.budget, device->AvailableMemory());
  }
  p.memory_utilization = request.memory_utilization;
  p.memory_share = request.memory_share;
  p.usable_bytes = static_cast<size_t>(static_cast<double>(p.budget.available) *
                                       request.memory_utilization * request.memory_share);
  p.max_model_len_given = rc.max_model_len > 0;
  p.max_model_len = p.max_model_len_given ? rc.max_model_len : c.max_position_embeddings;
  p.kv_cache_given = request.kv_cache_bytes > 0;
  p.kv_block_size = rc.block_size;
  p.kv_block_bytes = KvBlockBytes(c, rc);

  ModelOptions wo;
  wo.local_experts = rc.local_experts;
  wo.weight_format = rc.weight_format;
  size_t weights_mapping = 0;
  const size_t weights =
      DeepseekModel::PlanWeightBytes(c, device, *source.weights, wo, &weights_mapping);
  // Under an address-space limit (ulimit -v), address space that holds no
  // data counts too: every thread's stack and malloc arena, and the
  // huge-page rounding and alignment of the weights, of the KV cache's
  // layers and of the other large buffers (rope table, activations, inputs,
  // staging).
  size_t address_space = 0;
  if (p.budget.address_space_bound && !device->is_cuda()) {
    const size_t large_buffer = Device::HostMappingOverhead(std::numeric_limits<size_t>::max());
    address_space = weights_mapping + (c.num_hidden_layers + 6) * large_buffer +
                    (Device::HostThreadCount() + 2) * Device::HostThreadAddressSpace();
  }
  MemoryPlanItem migration{"expert migration", 0, ""};
  if (!request.reconfiguration_expert_slots.empty()) {
    // Each move holds the old buffers and the new at once: the peak of
    // their sum over the sequence, above the buffers the weights count.
    auto buffers = [&](int slots) {
      return DeepseekModel::PlanExpertBufferBytes(c, device, *source.weights, wo, slots);
    };
    const int initial =
        rc.local_experts.empty() ? c.n_routed_experts : static_cast<int>(rc.local_experts.size());
    int held = initial;
    size_t peak = buffers(initial);
    for (int next : request.reconfiguration_expert_slots) {
      peak = std::max(peak, buffers(held) + buffers(next));
      held = next;
    }
    migration.bytes = peak - buffers(initial);
    migration.detail = absl::StrCat("old and new routed-expert buffers of ",
                                    request.reconfiguration_expert_slots.size(),
                                    " reconfigurations, at their peak");
  }
  MLAG_ASSIGN_OR_RETURN(FixedItems fixed, PlanFixed(source, device, rc, p.max_model_len, weights,
                                                    migration, address_space));

  // Whether a max_model_len of `len` fits with a KV cache that holds one
  // sequence of it (or the given KV cache).
  auto fits = [&](int64_t len) -> bool {
    absl::StatusOr<FixedItems> f =
        PlanFixed(source, device, rc, static_cast<int>(len), weights, migration, address_space);
    if (!f.ok()) return false;
    const double kv = p.kv_cache_given ? static_cast<double>(request.kv_cache_bytes)
                                       : static_cast<double>(p.kv_block_bytes) *
                                             BlocksForOneSequence(len, rc.block_size);
    return static_cast<double>(f->bytes) + kv <= static_cast<double>(p.usable_bytes);
  };
  // Weight dtypes that hold the weights in fewer bytes, for the advice.
  // Only where the weights are a large part (a quarter) of `total`.
  // The smaller weight dtypes with which `total` bytes would fit.
  auto smaller_weights = [&](double total) {
    std::vector<std::string> out;
    for (WeightFormat f : {WeightFormat::kBF16, WeightFormat::kFp8}) {
      ModelOptions o = wo;
      o.weight_format = f;
      const size_t bytes = DeepseekModel::PlanWeightBytes(c, device, *source.weights, o);
      if (bytes < weights &&
          total - static_cast<double>(weights - bytes) <= static_cast<double>(p.usable_bytes)) {
        out.push_back(absl::StrCat(WeightFormatName(f), " (weights ", Gb(bytes), ")"));
      }
    }
    return out;
  };
  // The longest max_model_len that fits (0: none), for the error's advice.
  auto longest_fitting = [&]() -> int64_t {
    int64_t lo = 0, hi = p.max_model_len;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (fits(mid)) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  };

  size_t kv_bytes = request.kv_cache_bytes;
  if (p.kv_cache_given) {
    std::vector<MemoryPlanItem> all = fixed.items;
    all.push_back({"KV cache", kv_bytes, ""});
    if (static_cast<double>(fixed.bytes) + kv_bytes > static_cast<double>(p.usable_bytes)) {
      return absl::ResourceExhaustedError(
          absl::StrCat(LargestItems(all), " exceed ", UsableText(p), "; ",
                       Fixes(p, longest_fitting(), /*kv_given=*/true,
                             static_cast<double>(fixed.bytes) + kv_bytes,
                             smaller_weights(static_cast<double>(fixed.bytes) + kv_bytes))));
    }
  } else {
    const double one_sequence = static_cast<double>(p.kv_block_bytes) *
                                BlocksForOneSequence(p.max_model_len, rc.block_size);
    const double left = static_cast<double>(p.usable_bytes) - static_cast<double>(fixed.bytes);
    if (left < one_sequence) {
      std::vector<MemoryPlanItem> all = fixed.items;
      all.push_back({absl::StrCat("KV for one ", p.max_model_len, "-token sequence"),
                     static_cast<size_t>(std::min(one_sequence, 1e19)), ""});
      return absl::ResourceExhaustedError(
          absl::StrCat(LargestItems(all), " exceed ", UsableText(p), "; ",
                       Fixes(p, longest_fitting(), /*kv_given=*/false,
                             static_cast<double>(fixed.bytes) + one_sequence,
                             smaller_weights(static_cast<double>(fixed.bytes) + one_sequence))));
    }
    kv_bytes = static_cast<size_t>(left);
  }
  const size_t blocks =
      std::min<size_t>(kv_bytes / std::max<size_t>(p.kv_block_bytes, 1), size_t{1} << 24);
  if (blocks < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache of ", kv_bytes, " bytes holds ", blocks, " blocks of ",
                     p.kv_block_bytes, " bytes; at least 2 are needed (block 0 is reserved)"));
  }
  p.kv_blocks = static_cast<int>(blocks);
  p.items = std::move(fixed.items);
  p.items.push_back({"KV cache", blocks * p.kv_block_bytes,
                     absl::StrCat(blocks - 1, " blocks of ", rc.block_size, " tokens (",
                                  p.kv_tokens(), " tokens, ", DTypeName(rc.kv_dtype),
                                  p.kv_cache_given ? ", --kv-cache-bytes" : "", ")")});
  return p;
}

}  // namespace mlag
