#include "layers/deepseek_model.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "runtime/core/status.h"

namespace mlag {

namespace {

int RopePositions(const ModelConfig& c, const ModelOptions& options) {
  return options.max_positions > 0 ? options.max_positions : c.max_position_embeddings;
}

}  // namespace

DeepseekModel::DeepseekModel(const ModelConfig& config, Device* device, const ModelOptions& options)
    : config_(config), device_(device), options_(options), arena_(device, options.weight_format) {}

absl::StatusOr<std::unique_ptr<DeepseekModel>> DeepseekModel::Create(const ModelConfig& config,
                                                                     Device* device,
                                                                     WeightSource& source,
                                                                     const ModelOptions& options) {
  if (options.max_tokens < 1 || options.max_seqs < 1) {
    return absl::InvalidArgumentError("max_tokens and max_seqs must be positive");
  }
  // The least this model takes, checked before anything is allocated.
  const size_t weights = PlanWeightBytes(config, device, source, options);
  const size_t rope = RopeTableBytes(config, options);
  MLAG_ASSIGN_OR_RETURN(const MemoryBudget budget, device->AvailableMemory());
  if (static_cast<double>(weights) + static_cast<double>(rope) > budget.available) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "weights ", FormatBytes(weights), " (--weight-dtype ",
        WeightFormatName(options.weight_format), ") + rope table ", FormatBytes(rope), " for ",
        RopePositions(config, options), " positions exceed the ", FormatBytes(budget.available),
        " available on ", device->name(), " (", budget.source, ")"));
  }
  std::unique_ptr<DeepseekModel> model(new DeepseekModel(config, device, options));
  MLAG_RETURN_IF_ERROR(model->Load(source));
  return model;
}

size_t DeepseekModel::PlanWeightBytes(const ModelConfig& c, Device* device,
                                      const WeightSource& source, const ModelOptions& options,
                                      size_t* mapping_overhead) {
  // Load's walk, tensor by tensor, on layers that are built but not loaded.
  const WeightArena arena(device, options.weight_format);
  WeightPlan plan(arena, source);
  const int64_t D = c.hidden_size, V = c.vocab_size;
  plan.Add({V, D});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    plan.Add({D});
    plan.Add({D});
    MlaBlock(i, c).PlanWeights(plan);
    if (c.IsMoeLayer(i)) {
      Moe(i, c, options.local_experts).PlanWeights(plan);
    } else {
      Mlp(absl::StrCat("layers.", i, ".mlp"), absl::StrCat("model.layers.", i, ".mlp."),
          c.hidden_size, c.intermediate_size)
          .PlanWeights(plan);
    }
  }
  plan.Add({D});
  if (!c.tie_word_embeddings || source.Has("lm_head.weight")) {
    plan.AddLinear("lm_head.weight", {V, D}, /*allow_fp8=*/false);
  }
  if (mapping_overhead != nullptr) *mapping_overhead = plan.mapping_overhead();
  return plan.bytes();
}

size_t DeepseekModel::PlanExpertBufferBytes(const ModelConfig& c, Device* device,
                                            const WeightSource& source, const ModelOptions& options,
                                            int slots) {
  const WeightArena arena(device, options.weight_format);
  size_t bytes = 0;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.IsMoeLayer(i)) continue;
    const Moe moe(i, c, options.local_experts);
    const int first = moe.local_experts().empty() ? 0 : moe.local_experts()[0];
    const DType dtype = arena.LinearDType(
        source, absl::StrCat("model.layers.", i, ".mlp.experts.", first, ".gate_proj.weight"));
    bytes += moe.ExpertLayout(slots, dtype).total;
  }
  return bytes;
}

size_t DeepseekModel::ExpertBufferBytes(int slots) const {
  size_t bytes = 0;
  for (const auto& moe : moes_) {
    if (moe) bytes += moe->ExpertLayout(slots, moe->expert_dtype()).total;
  }
  return bytes;
}

size_t DeepseekModel::RopeTableBytes(const ModelConfig& c, const ModelOptions& options) {
  return static_cast<size_t>(RopePositions(c, options)) * c.qk_rope_head_dim * sizeof(float);
}

size_t DeepseekModel::ActivationBytes(const ModelConfig& c, const Device& device,
                                      const ModelOptions& options) {
  const size_t decode =
      device.is_cuda()
          ? MlaDecodeWorkspace::CudaBytes(options.max_seqs, c.num_attention_heads, c.kv_lora_rank)
          : 0;
  return decode +
         ActivationBuffers::Bytes(c, options.max_tokens, options.max_seqs, options.max_ep_ranks);
}

absl::Status DeepseekModel::Load(WeightSource& source) {
  const ModelConfig& c = config_;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  // On a failed load, copies may still be queued into buffers the layers own
  // (the routed experts'), which are freed before the arena: land them first.
  auto land_uploads = absl::MakeCleanup([this] { arena_.FinishLoading().IgnoreError(); });
  MLAG_ASSIGN_OR_RETURN(embed_, arena_.Load(source, "model.embed_tokens.weight", {V, D}));
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    MLAG_ASSIGN_OR_RETURN(Tensor in, arena_.Load(source, p + "input_layernorm.weight", {D}));
    MLAG_ASSIGN_OR_RETURN(Tensor post,
                          arena_.Load(source, p + "post_attention_layernorm.weight", {D}));
    input_norm_.push_back(in);
    post_attn_norm_.push_back(post);
    blocks_.push_back(std::make_unique<MlaBlock>(i, config_));
    MLAG_RETURN_IF_ERROR(blocks_.back()->Load(arena_, source));
    if (c.IsMoeLayer(i)) {
      mlps_.push_back(nullptr);
      moes_.push_back(std::make_unique<Moe>(i, config_, options_.local_experts));
      MLAG_RETURN_IF_ERROR(moes_.back()->Load(arena_, source));
    } else {
      moes_.push_back(nullptr);
      mlps_.push_back(std::make_unique<Mlp>(absl::StrCat("layers.", i, ".mlp"), p + "mlp.",
                                            c.hidden_size, c.intermediate_size));
      MLAG_RETURN_IF_ERROR(mlps_.back()->Load(arena_, source));
    }
  }
  MLAG_ASSIGN_OR_RETURN(final_norm_, arena_.Load(source, "model.norm.weight", {D}));
  if (c.tie_word_embeddings && !source.Has("lm_head.weight")) {
    lm_head_ = embed_;
  } else {
    MLAG_ASSIGN_OR_RETURN(lm_head_, arena_.LoadLinear(source, "lm_head.weight", {V, D},
                                                      /*allow_fp8=*/false));
  }

  // Rope table, for max_positions: built in place on the host, on the host
  // and uploaded on CUDA.
  const int64_t P = RopePositions(c, options_), dr = c.qk_rope_head_dim;
  MLAG_ASSIGN_OR_RETURN(rope_table_buffer_, device_->Allocate(RopeTableBytes(c, options_)));
  rope_table_ = rope_table_buffer_.AsTensor(DType::kF32, {P, dr});
  if (device_->is_cuda()) {
    std::vector<float> table(static_cast<size_t>(P * dr));
    MLAG_RETURN_IF_ERROR(FillRopeTable(c.rope, Tensor(table.data(), DType::kF32, {P, dr})));
    MLAG_RETURN_IF_ERROR(arena_.Upload(table, rope_table_));
  } else {
    MLAG_RETURN_IF_ERROR(FillRopeTable(c.rope, rope_table_));
  }

  // The CUDA decode kernel's split-KV scratch, sized for the largest batch and
  // shared by every layer and every captured graph.
  if (device_->is_cuda()) {
    MLAG_ASSIGN_OR_RETURN(decode_workspace_,
                          MlaDecodeWorkspace::Create(*device_, options_.max_seqs,
                                                     c.num_attention_heads, c.kv_lora_rank));
    for (auto& block : blocks_) block->attention().SetDecodeWorkspace(&decode_workspace_);
  }

  // Activation buffers for the largest batch, allocated once.
  MLAG_ASSIGN_OR_RETURN(Buffer ws,
                        device_->Allocate(ActivationBuffers::Bytes(
                            c, options_.max_tokens, options_.max_seqs, options_.max_ep_ranks)));
  workspace_ = Workspace(std::move(ws));
  MLAG_ASSIGN_OR_RETURN(acts_,
                        ActivationBuffers::Allocate(c, options_.max_tokens, options_.max_seqs,
                                                    options_.max_ep_ranks, workspace_));
  std::move(land_uploads).Cancel();
  return arena_.FinishLoading();
}

DeepseekModel::WeightBytes DeepseekModel::weight_breakdown() const {
  WeightBytes w;
  w.total = weight_bytes();
  w.embedding = embed_.nbytes();
  w.rope_table = rope_table_.nbytes();
  for (const auto& moe : moes_) {
    if (!moe) continue;
    ++w.routed_layers;
    w.routed_expert = moe->expert_bytes();
    w.local_experts = static_cast<int>(moe->local_experts().size());
  }
  return w;
}

absl::Status DeepseekModel::SetExpertGroup(Communicator* group) {
  if (group != nullptr && group->size() > options_.max_ep_ranks) {
    return absl::InvalidArgumentError(absl::StrCat("expert-parallel group of ", group->size(),
                                                   " ranks; the model was built for at most ",
                                                   options_.max_ep_ranks));
  }
  ep_group_ = group;
  return absl::OkStatus();
}

absl::Status DeepseekModel::MigrateExperts(Stream& stream, Communicator& world,
                                           const ExpertPlacement& from, const ExpertPlacement& to) {
  for (auto& moe : moes_) {
    if (moe) MLAG_RETURN_IF_ERROR(moe->MigrateExperts(stream, world, from, to));
  }
  return absl::OkStatus();
}

size_t DeepseekModel::weight_bytes() const {
  size_t bytes = arena_.bytes();
  for (const auto& moe : moes_) {
    if (moe) bytes += moe->expert_buffer_bytes();
  }
  return bytes;
}

double DeepseekModel::weight_huge_page_share() const {
  const size_t total = weight_bytes();
  if (total == 0 || device_->is_cuda()) return 0.0;
  double huge = arena_.huge_page_bytes();
  for (const auto& moe : moes_) {
    if (moe) huge += moe->expert_huge_page_bytes();
  }
  return std::min(1.0, huge / static_cast<double>(total));
}

std::map<DType, size_t> DeepseekModel::weight_bytes_by_dtype() const {
  std::map<DType, size_t> bytes = arena_.bytes_by_dtype();
  for (const auto& moe : moes_) {
    if (!moe) continue;
    const size_t values = moe->expert_gate_up(0).values.nbytes() * moe->local_experts().size() +
                          moe->expert_down(0).values.nbytes() * moe->local_experts().size();
    bytes[moe->expert_dtype()] += values;
    bytes[DType::kF32] += moe->expert_buffer_bytes() - std::min(values, moe->expert_buffer_bytes());
  }
  return bytes;
}

void DeepseekModel::BindKvCache(int layer, const Tensor& cache) {
  blocks_[layer]->attention().BindCache(cache);
}

absl::Status DeepseekModel::Forward(Stream& stream, const AttentionMetadata& meta) {
  const ModelConfig& c = config_;
  const int64_t T = meta.num_tokens, B = meta.num_seqs;
  if (T < 1 || T > options_.max_tokens || B < 1 || B > options_.max_seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forward over ", T, " tokens / ", B, " sequences; the model was built for at most ",
        options_.max_tokens, " tokens / ", options_.max_seqs, " sequences"));
  }
  if (meta.decode_only && T != B) {
    return absl::InvalidArgumentError("decode_only metadata needs one token per sequence");
  }
  const Tensor residual = Rows(acts_.residual, T);
  const Tensor normed = Rows(acts_.normed, T);
  const Tensor attn_out = Rows(acts_.attn_out, T);
  const Tensor ffn_out = Rows(acts_.ffn_out, T);
  {
    NodeScope s(stream, "embed", OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(Embedding(stream, Rows(meta.input_ids, T), embed_, residual));
  }
  {
    NodeScope s(stream, "layers.0.input_norm", OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(RmsNorm(stream, residual, input_norm_[0], c.rms_norm_eps, normed));
  }
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    MLAG_RETURN_IF_ERROR(blocks_[i]->Forward(stream, meta, rope_table_, acts_, normed, attn_out));
    {
      NodeScope s(stream, absl::StrCat("layers.", i, ".post_attn_norm"), OpKind::kKernel);
      MLAG_RETURN_IF_ERROR(
          AddRmsNorm(stream, attn_out, residual, post_attn_norm_[i], c.rms_norm_eps, normed));
    }
    if (moes_[i]) {
      std::vector<int32_t>* record = nullptr;
      if (routing_sink_ != nullptr) {
        routing_sink_->resize(c.num_hidden_layers);
        record = &(*routing_sink_)[i];
      }
      MLAG_RETURN_IF_ERROR(moes_[i]->Forward(stream, acts_, normed, ffn_out, record, ep_group_));
    } else {
      MLAG_RETURN_IF_ERROR(mlps_[i]->Forward(stream, normed, acts_.gate_up, acts_.act, ffn_out));
    }
    // The residual add of the FFN is fused with the next norm.
    const bool last = i + 1 == c.num_hidden_layers;
    NodeScope s(stream,
                last ? std::string("final_norm") : absl::StrCat("layers.", i + 1, ".input_norm"),
                OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(AddRmsNorm(stream, ffn_out, residual,
                                    last ? final_norm_ : input_norm_[i + 1], c.rms_norm_eps,
                                    normed));
  }
  const Tensor last_hidden = Rows(acts_.last_hidden, B);
  {
    NodeScope s(stream, "gather_last", OpKind::kKernel);
    MLAG_RETURN_IF_ERROR(GatherRows(stream, Rows(meta.logits_indices, B), normed, last_hidden));
  }
  NodeScope s(stream, "lm_head", OpKind::kGemm);
  return Linear(stream, last_hidden, lm_head_, Rows(acts_.logits, B));
}

absl::Status DeepseekModel::LogitsOfRows(Stream& stream, const Tensor& token_rows) {
  const int64_t n = token_rows.numel();
  if (n < 1 || n > options_.max_seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logits of ", n, " rows; the model was built for at most ", options_.max_seqs));
  }
  // Forward left the final norm's output in acts_.normed, every token row.
  const Tensor hidden = Rows(acts_.last_hidden, n);
  MLAG_RETURN_IF_ERROR(GatherRows(stream, token_rows, acts_.normed, hidden));
  return Linear(stream, hidden, lm_head_, Rows(acts_.logits, n));
}

}  // namespace mlag
