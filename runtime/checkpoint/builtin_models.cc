#include "runtime/checkpoint/builtin_models.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/common/random.h"
#include "kernels/host/parallel.h"
#include "runtime/core/scalar_types.h"

namespace mlag {
namespace {

// tiny-v3: every dimension distinct and every V3 path taken (q LoRA, sigmoid
// noaux_tc routing with groups, YaRN rope).
ModelConfig TinyV3() {
  ModelConfig c;
  c.model_type = "deepseek_v3";
  c.vocab_size = 1024;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.moe_intermediate_size = 112;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.q_lora_rank = 96;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 24;
  c.n_routed_experts = 16;
  c.num_experts_per_tok = 4;
  c.n_group = 4;
  c.topk_group = 2;
  c.n_shared_experts = 1;
  c.routed_scaling_factor = 2.5f;
  c.scoring_func = ScoringFunc::kSigmoid;
  c.topk_method = TopkMethod::kNoauxTc;
  c.norm_topk_prob = true;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1;
  c.rms_norm_eps = 1e-6f;
  c.max_position_embeddings = 256;
  c.rope.rotary_dim = 16;
  c.rope.theta = 100.0;
  c.rope.yarn = true;
  c.rope.factor = 4.0;
  c.rope.original_max_position = 64;
  c.rope.beta_fast = 32.0;
  c.rope.beta_slow = 1.0;
  c.rope.mscale = 0.707;
  c.rope.mscale_all_dim = 0.707;
  return c;
}

// Variant B: as A but the V2 path.
ModelConfig TinyV2() {
  ModelConfig c = TinyV3();
  c.model_type = "deepseek_v2";
  c.q_lora_rank = 0;
  c.scoring_func = ScoringFunc::kSoftmax;
  c.topk_method = TopkMethod::kGroupLimitedGreedy;
  c.norm_topk_prob = false;
  c.routed_scaling_factor = 1.5f;
  c.n_shared_experts = 2;
  return c;
}

// V2-Lite widths, 4 layers, vocabulary 32000. max_position_embeddings is
// 8192 rather than V2-Lite's 163840 to keep the rope table small; the YaRN
// parameters are V2-Lite's.
ModelConfig Small() {
  ModelConfig c;
  c.model_type = "deepseek_v2";
  c.vocab_size = 32000;
  c.hidden_size = 2048;
  c.intermediate_size = 10944;
  c.moe_intermediate_size = 1408;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 16;
  c.q_lora_rank = 0;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  c.n_routed_experts = 64;
  c.num_experts_per_tok = 6;
  c.n_group = 1;
  c.topk_group = 1;
  c.n_shared_experts = 2;
  c.routed_scaling_factor = 1.0f;
  c.scoring_func = ScoringFunc::kSoftmax;
  c.topk_method = TopkMethod::kGreedy;
  c.norm_topk_prob = false;
  c.first_k_dense_replace = 1;
  c.moe_layer_freq = 1;
  c.rms_norm_eps = 1e-6f;
  c.max_position_embeddings = 8192;
  c.rope.rotary_dim = 64;
  c.rope.theta = 10000.0;
  c.rope.yarn = true;
  c.rope.factor = 40.0;
  c.rope.original_max_position = 4096;
  c.rope.beta_fast = 32.0;
  c.rope.beta_slow = 1.0;
  c.rope.mscale = 0.707;
  c.rope.mscale_all_dim = 0.707;
  return c;
}

// DeepSeek-V2-Lite's shapes and routing (vocabulary 102400, 64 routed experts
// top-6, 2 shared, YaRN 40x) with 8 of its 27 layers: a GPU benchmark model
// that builds in seconds.
ModelConfig V2Lite8Layers() {
  ModelConfig c = Small();
  c.vocab_size = 102400;
  c.num_hidden_layers = 8;
  c.max_position_embeddings = 163840;
  return c;
}

// A near-normal value of mean 0 and variance 1 from one counter: the sum of
// the four 16-bit quarters of a 64-bit hash (Irwin-Hall, |v| < 3.47). One
// hash per weight keeps building `small` (1.9 G weights) to a few seconds.
inline float NearNormal(uint64_t key, uint64_t counter) {
  const uint64_t z = Mix64(key ^ (counter * 0x9e3779b97f4a7c15ull));
  const int64_t sum = static_cast<int64_t>(z & 0xffff) + static_cast<int64_t>((z >> 16) & 0xffff) +
                      static_cast<int64_t>((z >> 32) & 0xffff) + static_cast<int64_t>(z >> 48);
  // Mean 2 * 65535, variance 4 * (65536^2 - 1) / 12.
  constexpr float kScale = 1.7320508f / 65536.0f;
  return static_cast<float>(sum - 2 * 65535) * kScale;
}

// FNV-1a of a tensor name: stable across runs and platforms (absl::Hash is
// deliberately not).
inline uint64_t NameHash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

inline float RoundBf16(float v) { return Bf16ToF32(F32ToBf16(v)); }

// dst[i] = RoundBf16(offset + scale * NearNormal(key, first + i)), i < kFillBlock.
// A fixed trip count with no branches, so the compiler vectorises it.
constexpr int64_t kFillBlock = 16;
template <typename = void>
__attribute__((always_inline)) inline void FillNormalBlock(uint64_t key, uint64_t first,
                                                           float offset, float scale, float* dst) {
  for (int64_t i = 0; i < kFillBlock; ++i) {
    // RoundBf16 without its NaN case (the values are finite).
    uint32_t u = F32Bits(offset + scale * NearNormal(key, first + static_cast<uint64_t>(i)));
    u += 0x7fffu + ((u >> 16) & 1u);
    dst[i] = F32FromBits(u & 0xffff0000u);
  }
}

using FillFn = void (*)(uint64_t, uint64_t, float, float, float*, int64_t);

// n values from counter `first` on: whole blocks, then one at a time (the
// same values either way).
template <typename = void>
__attribute__((always_inline)) inline void FillNormal(uint64_t key, uint64_t first, float offset,
                                                      float scale, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + kFillBlock <= n; i += kFillBlock) {
    FillNormalBlock(key, first + static_cast<uint64_t>(i), offset, scale, dst + i);
  }
  for (; i < n; ++i) {
    dst[i] = RoundBf16(offset + scale * NearNormal(key, first + static_cast<uint64_t>(i)));
  }
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512dq"))) void FillNormalAvx512(uint64_t key, uint64_t first,
                                                                  float offset, float scale,
                                                                  float* dst, int64_t n) {
  FillNormal(key, first, offset, scale, dst, n);
}
#endif
void FillNormalBase(uint64_t key, uint64_t first, float offset, float scale, float* dst,
                    int64_t n) {
  FillNormal(key, first, offset, scale, dst, n);
}

FillFn ChooseFill() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")) {
    return FillNormalAvx512;
  }
#endif
  return FillNormalBase;
}

}  // namespace

std::vector<std::string> BuiltinModelNames() {
  return {"tiny-v3", "tiny-v2", "small", "v2-lite-8l"};
}

bool IsBuiltinModel(absl::string_view name) {
  auto names = BuiltinModelNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

absl::StatusOr<ModelConfig> BuiltinModelConfig(absl::string_view name) {
  if (name == "tiny-v3") return TinyV3();
  if (name == "tiny-v2") return TinyV2();
  if (name == "small") return Small();
  if (name == "v2-lite-8l") return V2Lite8Layers();
  return absl::NotFoundError(absl::StrCat(
      "no built-in model '", name, "' (built-in: ", absl::StrJoin(BuiltinModelNames(), ", "), ")"));
}

GeneratedWeights::GeneratedWeights(const ModelConfig& config, uint64_t seed)
    : seed_(seed), specs_(ExpectedTensors(config)) {
  for (size_t i = 0; i < specs_.size(); ++i) index_[specs_[i].name] = i;
}

bool GeneratedWeights::Has(absl::string_view name) const {
  return index_.contains(std::string(name));
}

std::vector<std::string> GeneratedWeights::Unread() const {
  std::vector<std::string> out;
  for (const TensorSpec& s : specs_) {
    if (!read_.contains(s.name)) out.push_back(s.name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status GeneratedWeights::ReadF32(absl::string_view name, absl::Span<const int64_t> shape,
                                       float* dst) {
  auto it = index_.find(std::string(name));
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("built-in model has no tensor '", name, "'"));
  }
  const TensorSpec& spec = specs_[it->second];
  if (!std::equal(spec.shape.begin(), spec.shape.end(), shape.begin(), shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape [",
                                                   absl::StrJoin(spec.shape, ", "), "], expected [",
                                                   absl::StrJoin(shape, ", "), "]"));
  }
  read_.insert(spec.name);
  int64_t n = 1;
  for (int64_t s : spec.shape) n *= s;
  const uint64_t key = Mix64(seed_ ^ NameHash(spec.name));
  const int64_t in = spec.shape.size() == 2 ? spec.shape[1] : 1;
  float scale = 1.0f, offset = 0.0f;
  switch (spec.role) {
    case TensorRole::kLinear:
      scale = 1.0f / std::sqrt(static_cast<float>(in));
      break;
    case TensorRole::kRouterGate:
      scale = 4.0f / std::sqrt(static_cast<float>(in));
      break;
    case TensorRole::kNorm:
      scale = 0.2f, offset = 1.0f;
      break;
    case TensorRole::kEmbedding:
      scale = 1.0f;
      break;
    case TensorRole::kCorrectionBias:
      break;
  }
  constexpr int64_t kChunk = 1 << 16;  // elements per work item
  const bool uniform = spec.role == TensorRole::kCorrectionBias;
  static const FillFn fill = ChooseFill();
  host::ParallelFor((n + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    if (!uniform) {
      fill(key, static_cast<uint64_t>(begin), offset, scale, dst + begin, end - begin);
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      dst[i] = RoundBf16(0.5f * UniformFromCounter(key, static_cast<uint64_t>(i)));
    }
  });
  return absl::OkStatus();
}

}  // namespace mlag
