// An independent double-precision reference forward of the DeepSeek-V2/V3
// model (the math of the Hugging Face modeling_deepseek.py: MLA, YaRN rope, MoE
// routing, RMSNorm), written entirely in this test, checked against
// the runtime's model run through ModelHarness (paged cache, absorbed MLA,
// batched f32 kernels).
//
// The reference uses no mlagraph kernel or layer: only BuiltinModelConfig for
// the config (every dimension and behaviour is read from the ModelConfig) and
// GeneratedWeights::ReadF32 for the weights, by Hugging Face name and the
// shape this file derives from the config. Everything else is done here, per
// token, in double: RMSNorm, the YaRN inverse frequencies and interleaved-pair
// rope, naive MLA with per-head k_nope = W_UK^h c_kv and v = W_UV^h c_kv from
// kv_b_proj (not the absorbed form), no paging, the routing (softmax greedy,
// softmax group_limited_greedy, sigmoid noaux_tc), dense MLP / MoE with shared
// experts, final norm and lm_head.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "layers/model_config.h"
#include "runtime/checkpoint/builtin_models.h"
#include "runtime/checkpoint/model_loader.h"
#include "tests/model/model_harness.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag::testing {
namespace {

using Vec = std::vector<double>;

constexpr double kTolerance = 1e-4;
constexpr double kPi = 3.14159265358979323846;
// q_a_layernorm and kv_a_layernorm use this eps whatever rms_norm_eps says.
constexpr double kLatentNormEps = 1e-6;

// ---------------------------------------------------------------------------
// The reference model.

// A weight matrix [rows, cols], row-major, in double.
struct Mat {
  int64_t rows = 0, cols = 0;
  Vec w;
  // y = W[row0 : row0 + n) x.
  Vec MulRows(const Vec& x, int64_t row0, int64_t n) const {
    Vec y(static_cast<size_t>(n), 0.0);
    for (int64_t r = 0; r < n; ++r) {
      const double* wr = w.data() + (row0 + r) * cols;
      double acc = 0.0;
      for (int64_t c = 0; c < cols; ++c) acc += wr[c] * x[c];
      y[r] = acc;
    }
    return y;
  }
  Vec Mul(const Vec& x) const { return MulRows(x, 0, rows); }
};

struct Expert {  // f(x) = W_down (silu(W_gate x) * (W_up x))
  Mat gate, up, down;
  Vec operator()(const Vec& x) const {
    Vec g = gate.Mul(x), u = up.Mul(x);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    return down.Mul(g);
  }
};

struct Layer {
  Vec input_norm, post_norm;
  // Attention.
  Mat q_a, q_b, q;  // q_a/q_b with q LoRA, else q
  Vec q_a_norm;
  Mat kv_a, kv_b, o;
  Vec kv_a_norm;
  // FFN.
  bool moe = false;
  Expert dense;
  Mat router;
  Vec correction_bias;  // noaux_tc only
  std::vector<Expert> experts;
  bool has_shared = false;
  Expert shared;
};

Vec RmsNorm(const Vec& x, const Vec& w, double eps) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * (x[i] * r);
  return y;
}

// yarn_get_mscale(F, m) of modeling_deepseek.py.
double YarnG(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

// inv_freq[i], i < dr/2, from modeling_deepseek.py's YaRN formulas.
Vec ReferenceInvFreq(const ModelConfig& c) {
  const int dr = c.qk_rope_head_dim;
  const double base = c.rope.theta;
  Vec inv(dr / 2);
  for (int i = 0; i < dr / 2; ++i) inv[i] = std::pow(base, -2.0 * i / dr);
  if (!c.rope.yarn) return inv;
  const double L = c.rope.original_max_position, F = c.rope.factor;
  auto corr = [&](double r) { return dr * std::log(L / (2.0 * kPi * r)) / (2.0 * std::log(base)); };
  double lo = std::max(std::floor(corr(c.rope.beta_fast)), 0.0);
  double hi = std::min(std::ceil(corr(c.rope.beta_slow)), static_cast<double>(dr - 1));
  if (lo == hi) hi += 0.001;
  for (int i = 0; i < dr / 2; ++i) {
    const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
    inv[i] = inv[i] * (1.0 - ramp) + (inv[i] / F) * ramp;
  }
  return inv;
}

double ReferenceCosSinScale(const ModelConfig& c) {
  if (!c.rope.yarn) return 1.0;
  return YarnG(c.rope.factor, c.rope.mscale) / YarnG(c.rope.factor, c.rope.mscale_all_dim);
}

double ReferenceSoftmaxScale(const ModelConfig& c) {
  double s = 1.0 / std::sqrt(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim));
  if (c.rope.yarn) {
    const double g = YarnG(c.rope.factor, c.rope.mscale_all_dim);
    s *= g * g;
  }
  return s;
}

// Rotates interleaved pairs (x[2i], x[2i+1]) of x[off, off + dr) by p*inv[i].
void Rope(double* x, int64_t p, const Vec& inv, double cs_scale) {
  for (size_t i = 0; i < inv.size(); ++i) {
    const double a = static_cast<double>(p) * inv[i];
    const double cs = std::cos(a) * cs_scale, sn = std::sin(a) * cs_scale;
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = x0 * cs - x1 * sn;
    x[2 * i + 1] = x0 * sn + x1 * cs;
  }
}

// Indices of the k largest of `score` (entries equal to -inf are never
// picked), best first, ties to the lower index. `margin`, when given, is
// lowered to the relative gap between the k-th pick and the best non-pick
// (relative, since f32 softmax probabilities are accurate relatively).
std::vector<int> TopK(const Vec& score, int k, double* margin) {
  std::vector<int> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return score[a] > score[b]; });
  if (margin != nullptr && static_cast<size_t>(k) < idx.size() &&
      score[idx[k]] != -std::numeric_limits<double>::infinity()) {
    const double a = score[idx[k - 1]], b = score[idx[k]];
    *margin = std::min(*margin, (a - b) / std::max({std::abs(a), std::abs(b), 1e-300}));
  }
  idx.resize(static_cast<size_t>(k));
  return idx;
}

struct Routing {
  std::vector<int> ids;
  Vec weights;
};

// MoEGate of modeling_deepseek.py, on the router logits l (computed in double).
Routing Route(const ModelConfig& c, const Vec& l, const Vec& bias, double* margin) {
  const int E = c.n_routed_experts, K = c.num_experts_per_tok;
  const double ninf = -std::numeric_limits<double>::infinity();
  Vec s(E);
  Vec choice(E);  // what selection is made on
  if (c.scoring_func == ScoringFunc::kSoftmax) {
    const double m = *std::max_element(l.begin(), l.end());
    double sum = 0.0;
    for (int e = 0; e < E; ++e) sum += (s[e] = std::exp(l[e] - m));
    for (int e = 0; e < E; ++e) s[e] /= sum;
    choice = s;
  } else {
    for (int e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-l[e]));
    for (int e = 0; e < E; ++e)
      choice[e] = s[e] + (c.topk_method == TopkMethod::kNoauxTc ? bias[e] : 0.0);
  }
  if (c.topk_method == TopkMethod::kGroupLimitedGreedy || c.topk_method == TopkMethod::kNoauxTc) {
    const int G = c.n_group, per = E / G;
    Vec gscore(G);
    for (int g = 0; g < G; ++g) {
      Vec in_group(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(in_group.begin(), in_group.end(), std::greater<double>());
      if (c.topk_method == TopkMethod::kGroupLimitedGreedy) {
        gscore[g] = in_group[0];  // max s in the group
      } else {
        gscore[g] = in_group[0] + (per > 1 ? in_group[1] : 0.0);  // sum of the top 2
      }
    }
    std::vector<int> keep = TopK(gscore, c.topk_group, margin);
    std::vector<bool> kept(G, false);
    for (int g : keep) kept[g] = true;
    for (int e = 0; e < E; ++e) {
      if (!kept[e / per]) choice[e] = ninf;
    }
  }
  Routing r;
  r.ids = TopK(choice, K, margin);
  double sum = 0.0;
  for (int e : r.ids) {
    r.weights.push_back(s[e]);
    sum += s[e];
  }
  const double rsf = c.routed_scaling_factor;
  if (c.scoring_func == ScoringFunc::kSoftmax) {
    for (double& w : r.weights) w = c.norm_topk_prob ? w / sum : w * rsf;
  } else {
    for (double& w : r.weights) w = (c.norm_topk_prob ? w / (sum + 1e-20) : w) * rsf;
  }
  return r;
}

class ReferenceModel {
 public:
  explicit ReferenceModel(const std::string& name) {
    c_ = BuiltinModelConfig(name).value();
    GeneratedWeights src(c_);
    const int64_t D = c_.hidden_size, V = c_.vocab_size, H = c_.num_attention_heads;
    const int64_t R = c_.kv_lora_rank, dr = c_.qk_rope_head_dim;
    const int64_t dq = c_.qk_nope_head_dim + c_.qk_rope_head_dim;
    auto vec = [&](const std::string& n, int64_t len) {
      std::vector<float> f(static_cast<size_t>(len));
      absl::Status st = src.ReadF32(n, {len}, f.data());
      EXPECT_OK(st);
      return Vec(f.begin(), f.end());
    };
    auto mat = [&](const std::string& n, int64_t rows, int64_t cols) {
      Mat m;
      m.rows = rows;
      m.cols = cols;
      std::vector<float> f(static_cast<size_t>(rows * cols));
      absl::Status st = src.ReadF32(n, {rows, cols}, f.data());
      EXPECT_OK(st);
      m.w.assign(f.begin(), f.end());
      return m;
    };
    auto expert = [&](const std::string& p, int64_t width) {
      Expert e;
      e.gate = mat(p + "gate_proj.weight", width, D);
      e.up = mat(p + "up_proj.weight", width, D);
      e.down = mat(p + "down_proj.weight", D, width);
      return e;
    };
    embed_ = mat("model.embed_tokens.weight", V, D);
    for (int i = 0; i < c_.num_hidden_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      const std::string a = p + "self_attn.";
      Layer L;
      L.input_norm = vec(p + "input_layernorm.weight", D);
      L.post_norm = vec(p + "post_attention_layernorm.weight", D);
      if (c_.q_lora_rank > 0) {
        L.q_a = mat(a + "q_a_proj.weight", c_.q_lora_rank, D);
        L.q_a_norm = vec(a + "q_a_layernorm.weight", c_.q_lora_rank);
        L.q_b = mat(a + "q_b_proj.weight", H * dq, c_.q_lora_rank);
      } else {
        L.q = mat(a + "q_proj.weight", H * dq, D);
      }
      L.kv_a = mat(a + "kv_a_proj_with_mqa.weight", R + dr, D);
      L.kv_a_norm = vec(a + "kv_a_layernorm.weight", R);
      L.kv_b = mat(a + "kv_b_proj.weight", H * (c_.qk_nope_head_dim + c_.v_head_dim), R);
      L.o = mat(a + "o_proj.weight", D, H * c_.v_head_dim);
      L.moe =
          i >= c_.first_k_dense_replace && i % c_.moe_layer_freq == 0 && c_.n_routed_experts > 0;
      if (L.moe) {
        const int64_t E = c_.n_routed_experts, Im = c_.moe_intermediate_size;
        L.router = mat(p + "mlp.gate.weight", E, D);
        if (c_.topk_method == TopkMethod::kNoauxTc) {
          L.correction_bias = vec(p + "mlp.gate.e_score_correction_bias", E);
        }
        for (int64_t e = 0; e < E; ++e) {
          L.experts.push_back(expert(p + "mlp.experts." + std::to_string(e) + ".", Im));
        }
        if (c_.n_shared_experts > 0) {
          L.has_shared = true;
          L.shared = expert(p + "mlp.shared_experts.", int64_t{c_.n_shared_experts} * Im);
        }
      } else {
        L.dense = expert(p + "mlp.", c_.intermediate_size);
      }
      layers_.push_back(std::move(L));
    }
    final_norm_ = vec("model.norm.weight", D);
    if (c_.tie_word_embeddings && !src.Has("lm_head.weight")) {
      lm_head_ = embed_;
    } else {
      lm_head_ = mat("lm_head.weight", V, D);
    }
    inv_freq_ = ReferenceInvFreq(c_);
    cs_scale_ = ReferenceCosSinScale(c_);
    softmax_scale_ = ReferenceSoftmaxScale(c_);
  }

  const ModelConfig& config() const { return c_; }
  // Smallest relative routing gap seen (k-th pick vs best non-pick, for
  // experts and for groups) over every Forward so far.
  double min_routing_margin() const { return min_margin_; }

  // Logits of every position of `tokens` (positions 0..T-1, one sequence).
  std::vector<Vec> Forward(const std::vector<int>& tokens) {
    const ModelConfig& c = c_;
    const int64_t T = static_cast<int64_t>(tokens.size());
    const int64_t D = c.hidden_size, H = c.num_attention_heads, R = c.kv_lora_rank;
    const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
    const int64_t dq = dn + dr;
    const double eps = c.rms_norm_eps;
    std::vector<Vec> h(T);
    for (int64_t t = 0; t < T; ++t) {
      h[t].assign(embed_.w.begin() + tokens[t] * D, embed_.w.begin() + (tokens[t] + 1) * D);
    }
    for (const Layer& L : layers_) {
      // MLA, naive form.
      std::vector<Vec> q(T), k_pe(T);
      std::vector<std::vector<Vec>> k_nope(T, std::vector<Vec>(H)), v(T, std::vector<Vec>(H));
      for (int64_t t = 0; t < T; ++t) {
        const Vec x = RmsNorm(h[t], L.input_norm, eps);
        if (c.q_lora_rank > 0) {
          q[t] = L.q_b.Mul(RmsNorm(L.q_a.Mul(x), L.q_a_norm, kLatentNormEps));
        } else {
          q[t] = L.q.Mul(x);
        }
        const Vec kva = L.kv_a.Mul(x);
        const Vec c_kv = RmsNorm(Vec(kva.begin(), kva.begin() + R), L.kv_a_norm, kLatentNormEps);
        k_pe[t].assign(kva.begin() + R, kva.end());
        for (int64_t hd = 0; hd < H; ++hd) {
          k_nope[t][hd] = L.kv_b.MulRows(c_kv, hd * (dn + dv), dn);
          v[t][hd] = L.kv_b.MulRows(c_kv, hd * (dn + dv) + dn, dv);
          Rope(q[t].data() + hd * dq + dn, t, inv_freq_, cs_scale_);
        }
        Rope(k_pe[t].data(), t, inv_freq_, cs_scale_);
      }
      for (int64_t t = 0; t < T; ++t) {
        Vec concat(static_cast<size_t>(H * dv), 0.0);
        for (int64_t hd = 0; hd < H; ++hd) {
          const double* qh = q[t].data() + hd * dq;
          Vec score(t + 1);
          for (int64_t s = 0; s <= t; ++s) {
            double acc = 0.0;
            for (int64_t i = 0; i < dn; ++i) acc += qh[i] * k_nope[s][hd][i];
            for (int64_t i = 0; i < dr; ++i) acc += qh[dn + i] * k_pe[s][i];
            score[s] = softmax_scale_ * acc;
          }
          const double m = *std::max_element(score.begin(), score.end());
          double sum = 0.0;
          for (double& sc : score) sum += (sc = std::exp(sc - m));
          for (int64_t s = 0; s <= t; ++s) {
            const double p = score[s] / sum;
            for (int64_t i = 0; i < dv; ++i) concat[hd * dv + i] += p * v[s][hd][i];
          }
        }
        const Vec out = L.o.Mul(concat);
        for (int64_t i = 0; i < D; ++i) h[t][i] += out[i];
      }
      // FFN.
      for (int64_t t = 0; t < T; ++t) {
        const Vec x = RmsNorm(h[t], L.post_norm, eps);
        Vec y(static_cast<size_t>(D), 0.0);
        if (!L.moe) {
          y = L.dense(x);
        } else {
          const Routing r = Route(c, L.router.Mul(x), L.correction_bias, &min_margin_);
          for (size_t k = 0; k < r.ids.size(); ++k) {
            const Vec f = L.experts[r.ids[k]](x);
            for (int64_t i = 0; i < D; ++i) y[i] += r.weights[k] * f[i];
          }
          if (L.has_shared) {
            const Vec f = L.shared(x);
            for (int64_t i = 0; i < D; ++i) y[i] += f[i];
          }
        }
        for (int64_t i = 0; i < D; ++i) h[t][i] += y[i];
      }
    }
    std::vector<Vec> logits(T);
    for (int64_t t = 0; t < T; ++t) logits[t] = lm_head_.Mul(RmsNorm(h[t], final_norm_, eps));
    return logits;
  }

 private:
  ModelConfig c_;
  Mat embed_, lm_head_;
  Vec final_norm_;
  std::vector<Layer> layers_;
  Vec inv_freq_;
  double cs_scale_ = 1.0, softmax_scale_ = 1.0;
  double min_margin_ = std::numeric_limits<double>::infinity();
};

// One reference model per name, built once per process.
ReferenceModel& Reference(const std::string& name) {
  static std::map<std::string, std::unique_ptr<ReferenceModel>> models;
  auto& m = models[name];
  if (!m) m = std::make_unique<ReferenceModel>(name);
  return *m;
}

std::vector<int> RandomPrompt(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(0, vocab - 1);
  std::vector<int> p(static_cast<size_t>(n));
  for (int& t : p) t = u(rng);
  return p;
}

double RelErr(const std::vector<float>& got, const Vec& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  return MaxRelError(got.data(), want.data(), want.size());
}

std::unique_ptr<ModelHarness> MakeHarness(const std::string& name) {
  absl::StatusOr<ModelSource> source = OpenModel(name);
  EXPECT_OK(source);
  if (!source.ok()) return nullptr;
  ModelHarness::Options options;
  options.max_tokens = 64;  // >= the 24 + 9 tokens of the batched step
  absl::StatusOr<std::unique_ptr<ModelHarness>> h = ModelHarness::Create(*source, options);
  EXPECT_OK(h);
  return h.ok() ? std::move(*h) : nullptr;
}

void ReportMargin(const std::string& name, ReferenceModel& ref) {
  std::printf("reference_forward %s min relative routing margin %.3g\n", name.c_str(),
              ref.min_routing_margin());
  // f32 runtime vs double reference could route differently below ~1e-5.
  EXPECT_GT(ref.min_routing_margin(), 1e-5)
      << name << ": a routing decision is nearly tied; a mismatch may be a routing flip";
}

// ---------------------------------------------------------------------------
// Self-checks of the reference against tiny-v3's YaRN numbers, computed once
// in Python from modeling_deepseek.py's formulas.

TEST(ReferenceForwardSelfCheck, YarnMatchesSpecForTinyModels) {
  for (const char* name : {"tiny-v3", "tiny-v2"}) {
    const ModelConfig c = BuiltinModelConfig(name).value();
    const Vec inv = ReferenceInvFreq(c);
    const Vec want = {1, 0.47799, 0.221359, 0.097805, 0.04, 0.014059, 0.007906, 0.004446};
    ASSERT_EQ(inv.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(inv[i], want[i], 2e-6) << name << " " << i;
    EXPECT_NEAR(ReferenceSoftmaxScale(c), 0.174017, 1e-6) << name;
    EXPECT_DOUBLE_EQ(ReferenceCosSinScale(c), 1.0) << name;
  }
}

TEST(ReferenceForwardSelfCheck, RoutingTiesGoToLowerIndex) {
  ModelConfig c = BuiltinModelConfig("tiny-v2").value();
  c.topk_method = TopkMethod::kGreedy;
  c.n_group = 1;
  c.topk_group = 1;
  Vec l(c.n_routed_experts, 0.0);
  l[7] = l[3] = l[11] = l[5] = l[9] = 1.0;
  double margin = 1.0;
  const Routing r = Route(c, l, {}, &margin);
  EXPECT_EQ(r.ids, (std::vector<int>{3, 5, 7, 9}));
  EXPECT_EQ(margin, 0.0);
}

// ---------------------------------------------------------------------------
// Runtime vs reference.

class ReferenceForwardTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceForwardTest, PrefillOneSequence) {
  const std::string name = GetParam();
  ReferenceModel& ref = Reference(name);
  const int V = ref.config().vocab_size;
  const std::vector<int> prompt = RandomPrompt(24, V, 1234);
  const std::vector<Vec> want = ref.Forward(prompt);

  std::unique_ptr<ModelHarness> h = MakeHarness(name);
  ASSERT_NE(h, nullptr);
  auto got = h->Step({0}, {prompt});
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 1u);
  const double err = RelErr((*got)[0], want[23]);
  std::printf("reference_forward %s rel_err %.3g\n", name.c_str(), err);
  ReportMargin(name, ref);
  EXPECT_LT(err, kTolerance) << name << ": prefill of 24 tokens, logits of position 23";
}

TEST_P(ReferenceForwardTest, TwoSequencesThenDecode) {
  const std::string name = GetParam();
  ReferenceModel& ref = Reference(name);
  const int V = ref.config().vocab_size;
  const std::vector<int> a = RandomPrompt(25, V, 1234);  // 24 prefilled + 1 decoded
  const std::vector<int> b = RandomPrompt(10, V, 777);   // 9 prefilled + 1 decoded
  const std::vector<Vec> want_a = ref.Forward(a);        // causal: every position's logits
  const std::vector<Vec> want_b = ref.Forward(b);

  std::unique_ptr<ModelHarness> h = MakeHarness(name);
  ASSERT_NE(h, nullptr);
  // Both prompts in one prefill step.
  auto got = h->Step({0, 1}, {std::vector<int>(a.begin(), a.begin() + 24),
                              std::vector<int>(b.begin(), b.begin() + 9)});
  ASSERT_OK(got);
  ASSERT_EQ(got->size(), 2u);
  const double err_a = RelErr((*got)[0], want_a[23]);
  const double err_b = RelErr((*got)[1], want_b[8]);
  std::printf("reference_forward %s batched-prefill seq0 (24 tok) rel_err %.3g\n", name.c_str(),
              err_a);
  std::printf("reference_forward %s batched-prefill seq1 (9 tok) rel_err %.3g\n", name.c_str(),
              err_b);
  EXPECT_LT(err_a, kTolerance) << name << ": batched prefill, sequence 0, position 23";
  EXPECT_LT(err_b, kTolerance) << name << ": batched prefill, sequence 1, position 8";

  // One decode step for both sequences (positions 24 and 9).
  auto dec = h->Step({0, 1}, {{a[24]}, {b[9]}});
  ASSERT_OK(dec);
  ASSERT_EQ(dec->size(), 2u);
  const double err_da = RelErr((*dec)[0], want_a[24]);
  const double err_db = RelErr((*dec)[1], want_b[9]);
  std::printf("reference_forward %s decode seq0 (pos 24) rel_err %.3g\n", name.c_str(), err_da);
  std::printf("reference_forward %s decode seq1 (pos 9) rel_err %.3g\n", name.c_str(), err_db);
  EXPECT_LT(err_da, kTolerance) << name << ": decode, sequence 0, position 24";
  EXPECT_LT(err_db, kTolerance) << name << ": decode, sequence 1, position 9";
  ReportMargin(name, ref);
}

INSTANTIATE_TEST_SUITE_P(Tiny, ReferenceForwardTest, ::testing::Values("tiny-v3", "tiny-v2"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace mlag::testing
