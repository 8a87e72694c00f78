// The attention block of a DeepSeek decoder layer around MlaAttention: the
// query path (q_a_proj -> q_a_layernorm -> q_b_proj, or q_proj without q
// LoRA), kv_a_proj_with_mqa and kv_a_layernorm, rope, the absorbed attention,
// and o_proj (DeepseekV2Attention in the Hugging Face modeling_deepseek.py).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "layers/activation_buffers.h"
#include "layers/attention_metadata.h"
#include "layers/mla_attention.h"
#include "layers/model_config.h"
#include "layers/weight_arena.h"

namespace mlag {

class MlaBlock {
 public:
  MlaBlock(int layer, const ModelConfig& config);

  // Reads model.layers.<i>.self_attn.* from `source`.
  absl::Status Load(WeightArena& arena, WeightSource& source);
  // The bytes Load leaves in the arena (WeightPlan), without loading.
  void PlanWeights(WeightPlan& plan) const;

  // out[0:T] = Attention(x[0:T]) for the T = meta.num_tokens tokens of `meta`.
  // x: [>=T, D] normed hidden states; rope_table from FillRopeTable; scratch
  // buffers from `acts`.
  absl::Status Forward(Stream& stream, const AttentionMetadata& meta, const Tensor& rope_table,
                       const ActivationBuffers& acts, const Tensor& x, const Tensor& out) const;

  MlaAttention& attention() { return *attention_; }
  const MlaAttention& attention() const { return *attention_; }

 private:
  std::string Node(const char* op) const;

  int layer_;
  const ModelConfig& config_;
  std::unique_ptr<MlaAttention> attention_;
  LinearWeight w_q_a_, w_q_b_;  // q LoRA path
  Tensor w_q_a_norm_;
  LinearWeight w_q_;  // without q LoRA
  LinearWeight w_kv_a_, w_o_;
  Tensor w_kv_a_norm_;
};

}  // namespace mlag
