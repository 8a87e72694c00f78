// The DeepSeek-V2/V3 model: embedding, decoder layers (MLA block plus a dense
// MLP or MoE), final norm and lm_head (computed for the last token of each
// sequence only). One Forward serves prefill, chunked prefill, decode and
// dummy runs alike; what differs is the AttentionMetadata.
//
// Graph node names: embed, layers.<i>.input_norm, layers.<i>.attn.*,
// layers.<i>.post_attn_norm, layers.<i>.mlp.* or layers.<i>.moe.*, final_norm,
// gather_last, lm_head.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "layers/activation_buffers.h"
#include "layers/attention_metadata.h"
#include "layers/mla_block.h"
#include "layers/mlp.h"
#include "layers/model_config.h"
#include "layers/moe.h"
#include "layers/weight_arena.h"

namespace mlag {

struct ModelOptions {
  int max_tokens = 256;  // most tokens in one forward (the per-step token budget)
  int max_seqs = 64;     // most sequences in one forward
  // Global ids of the routed experts held by this model instance (empty: all).
  std::vector<int> local_experts;
  // The largest expert-parallel group this model will run in (sizes the
  // dispatch/combine buffers).
  int max_ep_ranks = 1;
  // How projection weights are held (layers/weight_arena.h); kAuto keeps the
  // checkpoint's bf16 or fp8.
  WeightFormat weight_format = WeightFormat::kAuto;
  // Rows of the rope table: the longest sequence the model will run, the
  // engine's max_model_len (0: the config's max_position_embeddings).
  int max_positions = 0;
};

class DeepseekModel {
 public:
  // Builds the model on `device` and loads every weight from `source`.
  // ResourceExhausted before anything is allocated when the weights and the
  // rope table exceed the memory `device` has available (the engine's
  // memory plan, runtime/engine/memory_plan.h, refuses earlier and counts
  // everything else too).

  // The bytes of parameters Create will hold on `device` for `source`: the
  // arena's tensors and the routed experts, in the dtypes `options` and the
  // device decide (WeightPlan), rope table excluded. Reads and allocates
  // nothing. weight_bytes() of the built model is this figure.
  // `mapping_overhead` (optional): the address space those allocations
  // take beyond their bytes on the host (WeightPlan::mapping_overhead).
  static size_t PlanWeightBytes(const ModelConfig& config, Device* device,
                                const WeightSource& source, const ModelOptions& options,
                                size_t* mapping_overhead = nullptr);
  // The routed-expert buffers of every MoE layer for `slots` local experts
  // each (Moe::ExpertLayout), in the dtype Create would hold them in.
  static size_t PlanExpertBufferBytes(const ModelConfig& config, Device* device,
                                      const WeightSource& source, const ModelOptions& options,
                                      int slots);
  // The same for the built model.
  size_t ExpertBufferBytes(int slots) const;
  // The rope table's bytes: f32 [positions, qk_rope_head_dim].
  static size_t RopeTableBytes(const ModelConfig& config, const ModelOptions& options);
  // The activation buffers and (CUDA) the decode workspace Create allocates.
  static size_t ActivationBytes(const ModelConfig& config, const Device& device,
                                const ModelOptions& options);

  static absl::StatusOr<std::unique_ptr<DeepseekModel>> Create(const ModelConfig& config,
                                                               Device* device, WeightSource& source,
                                                               const ModelOptions& options);

  // The expert-parallel group the MoE layers dispatch over (nullptr or a
  // group of one: every routed expert computed here). Its size must not
  // exceed options().max_ep_ranks.
  absl::Status SetExpertGroup(Communicator* group);

  // Moves the routed experts of every MoE layer from placement `from` to `to`
  // over `world` (see Moe::MigrateExperts). Graphs captured before hold the
  // old weight addresses and must be captured again.
  absl::Status MigrateExperts(Stream& stream, Communicator& world, const ExpertPlacement& from,
                              const ExpertPlacement& to);
  // The MoE block of layer `layer`, or nullptr for a dense layer.
  const Moe* moe(int layer) const { return moes_[layer].get(); }

  // Points layer `layer` at its KV cache [num_blocks, block_size, Rkv + dr].
  void BindKvCache(int layer, const Tensor& cache);

  // Runs the model over `meta` on `stream`; afterwards logits(meta.num_seqs)
  // holds one row of vocabulary logits per sequence.
  absl::Status Forward(Stream& stream, const AttentionMetadata& meta);

  // After a Forward and before the next: the logits of its token rows
  // `token_rows` (i32 [n] on the device, n <= max_seqs) into logits(n),
  // through the same final hidden states and LM head as Forward's. For
  // prompt log-probabilities; eager only.
  absl::Status LogitsOfRows(Stream& stream, const Tensor& token_rows);

  // f32 [num_seqs, V]: the logits of the last Forward's sequences.
  Tensor logits(int num_seqs) const { return Rows(acts_.logits, num_seqs); }

  // While set, eager forwards copy each MoE layer's chosen expert ids into
  // (*sink)[layer] (empty for dense layers). For benchmarks that count the
  // expert weights a batch touches. nullptr stops recording.
  void RecordRouting(std::vector<std::vector<int32_t>>* sink) { routing_sink_ = sink; }

  // Bytes of parameters by what a decode step reads of them.
  struct WeightBytes {
    size_t total = 0;          // everything held
    size_t embedding = 0;      // the embedding table (a step reads only its rows)
    size_t rope_table = 0;     // the cos/sin table (a step reads only its rows)
    size_t routed_expert = 0;  // one routed expert of one layer
    int routed_layers = 0;     // MoE layers
    int local_experts = 0;     // routed experts held per MoE layer
  };
  WeightBytes weight_breakdown() const;

  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  MlaAttention& attention(int layer) { return blocks_[layer]->attention(); }
  Device& device() const { return *device_; }
  // Bytes of every parameter held (the arena plus the routed experts; the
  // rope table is not a parameter).
  size_t weight_bytes() const;
  size_t rope_table_bytes() const { return rope_table_buffer_.bytes(); }
  // The activation workspace and (CUDA) the decode scratch, as allocated.
  size_t activation_bytes() const { return workspace_.capacity() + decode_workspace_.bytes(); }
  // Bytes of weights by dtype (fp8 scales count as f32).
  std::map<DType, size_t> weight_bytes_by_dtype() const;
  // Host: the share (0 to 1) of weight_bytes() that Linux holds on
  // transparent huge pages. Weights on 4 KiB pages stream slower (TLB misses,
  // prefetchers stopped at every page): what mlag bench shows beside the
  // bandwidth probe's own share.
  double weight_huge_page_share() const;

 private:
  DeepseekModel(const ModelConfig& config, Device* device, const ModelOptions& options);
  absl::Status Load(WeightSource& source);

  ModelConfig config_;
  Device* device_;
  ModelOptions options_;
  WeightArena arena_;
  Workspace workspace_;
  ActivationBuffers acts_;
  Buffer rope_table_buffer_;
  Tensor rope_table_;                    // [max_positions, dr]
  MlaDecodeWorkspace decode_workspace_;  // CUDA split-KV scratch (empty on the host)
  Tensor embed_, final_norm_;
  LinearWeight lm_head_;  // bf16 where the projections are fp8, as DeepSeek-V3 keeps it
  std::vector<Tensor> input_norm_, post_attn_norm_;
  std::vector<std::unique_ptr<MlaBlock>> blocks_;
  std::vector<std::unique_ptr<Mlp>> mlps_;  // null for MoE layers
  std::vector<std::unique_ptr<Moe>> moes_;  // null for dense layers
  std::vector<std::vector<int32_t>>* routing_sink_ = nullptr;
  Communicator* ep_group_ = nullptr;
};

}  // namespace mlag
