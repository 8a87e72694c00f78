// The memory plan: every buffer an engine will hold, sized before anything is
// allocated, against the memory the process can actually have.
//
// The plan counts, on the engine's device:
//   weights          the parameters in the dtypes they will be held in
//                    (DeepseekModel::PlanWeightBytes, exact);
//   rope table       f32 [max_model_len, qk_rope_head_dim];
//   activations      the activation workspace for the largest captured
//                    batch and the prefill chunk, and (CUDA) the split-KV
//                    decode scratch;
//   static buffers   the runner's inputs (block tables for max_model_len),
//                    sampled tokens and, on the host, its two staging slots;
//   expert migration (expert parallelism with reconfigurations) the new
//                    routed-expert buffers of the largest expert set a
//                    reconfiguration gives this rank, held beside the old;
//   runtime reserve  what the plan cannot count exactly: CUDA's cuBLASLt
//                    workspace, graph executables and NCCL channels, or the
//                    host's thread stacks and request records; under an
//                    address-space limit also the address space that holds
//                    no data (stacks, malloc arenas, huge-page alignment);
//   KV cache         --kv-cache-bytes, or else (as vLLM's
//                    --gpu-memory-utilization) everything the rest leaves
//                    of the usable memory, in whole blocks.
// Usable memory is memory_utilization (0.9) of what the device has
// available (Device::AvailableMemory: MemAvailable, a cgroup limit, ulimit -v
// or cudaMemGetInfo), times the engine's share of it (expert-parallel ranks
// that share one host's memory each plan for their part).
//
// max_model_len is --max-model-len, or the config's max_position_embeddings
// when not given. The plan refuses, before anything is allocated and naming
// the largest items and a fix, when the items exceed the usable memory or a
// planned KV cache cannot hold one max_model_len sequence.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/model_loader.h"
#include "runtime/core/device.h"
#include "runtime/engine/model_runner.h"

namespace mlag {

inline constexpr double kDefaultMemoryUtilization = 0.9;

struct MemoryPlanRequest {
  // max_model_len 0 (the default here): the config's
  // max_position_embeddings; num_blocks is the plan's output and ignored.
  RunnerConfig runner = [] {
    RunnerConfig c;
    c.max_model_len = 0;
    return c;
  }();
  size_t kv_cache_bytes = 0;                              // 0: what the rest leaves
  double memory_utilization = kDefaultMemoryUtilization;  // in (0, 1]
  double memory_share = 1.0;                              // in (0, 1]
  // Expert parallelism: the routed experts a layer this rank holds after
  // each reconfiguration given up front, in order (0: it leaves, keeping a
  // one-slot placeholder). Migration allocates the new buffers before it
  // frees the old ones, so the plan holds back the most that any step of
  // the sequence needs above the start ("expert migration").
  std::vector<int> reconfiguration_expert_slots;
  // The memory to plan within; nullopt: what the device has now
  // (Device::AvailableMemory). Tests that plan twice pin it, as the
  // machine's free memory moves between calls.
  std::optional<MemoryBudget> budget;
};

struct MemoryPlanItem {
  std::string name;  // "weights", "rope table", ..., "KV cache"
  size_t bytes = 0;
  std::string detail;  // what sizes it, e.g. "4096 positions x 64"
};

struct MemoryPlan {
  std::string device;  // Device::name()
  MemoryBudget budget;
  double memory_utilization = kDefaultMemoryUtilization;
  double memory_share = 1.0;
  size_t usable_bytes = 0;  // budget.available * utilization * share
  // In allocation order; the KV cache last.
  std::vector<MemoryPlanItem> items;
  int max_model_len = 0;
  bool max_model_len_given = false;  // by the request, not the config
  bool kv_cache_given = false;       // --kv-cache-bytes, not what was left
  int kv_blocks = 0;                 // including the reserved null block 0
  size_t kv_block_bytes = 0;         // one block over every layer
  int kv_block_size = 0;             // tokens per block

  size_t planned_bytes() const;  // the sum of the items
  size_t item_bytes(const std::string& name) const;
  // Tokens the KV cache holds (the null block excluded).
  int64_t kv_tokens() const { return int64_t{kv_blocks - 1} * kv_block_size; }
  // The plan as text, one item a line, then the total against the usable
  // memory and its source: for `mlag info` and the start-up report.
  std::vector<std::string> Lines() const;
};

// Plans `request` for the model `source` on `device`. InvalidArgument for a
// bad request (utilization or share outside (0, 1], max_model_len above the
// config's max_position_embeddings, a KV cache of fewer than 2 blocks);
// ResourceExhausted naming the largest items and a fix when the plan does not
// fit. Reads no weight and allocates nothing.
absl::StatusOr<MemoryPlan> PlanMemory(const ModelSource& source, Device* device,
                                      const MemoryPlanRequest& request);

}  // namespace mlag
