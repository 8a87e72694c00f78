// DeepSeek-V3's fp8 checkpoint layout: export writes it (names, dtypes,
// block-scale shapes, quantization_config, scales computed from the
// weights); an fp8 checkpoint runs with exactly the tokens and log-probs of
// the same weights dequantized to f32; malformed fp8 tensors are refused
// with errors that name them; the multi-token-prediction layer is skipped.
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint/builtin_models.h"
#include "runtime/checkpoint/hf_layout.h"
#include "runtime/checkpoint/model_loader.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/core/device.h"
#include "runtime/core/fp8_blocks.h"
#include "runtime/core/status.h"
#include "runtime/engine/engine.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag {
namespace {

using ::mlag::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

using ::mlag::testing::MakeTempDir;

// tiny-v3 exported as fp8 once for the whole suite.
const std::string& Fp8Dir() {
  static const std::string dir = [] {
    const std::string d = MakeTempDir() + "/tiny-v3-fp8";
    ModelSource source = OpenModel("tiny-v3").value();
    EXPECT_OK(ExportModel(source.config, *source.weights, d, DType::kF8E4M3));
    return d;
  }();
  return dir;
}

TEST(Fp8ExportTest, WritesTheOfficialLayoutWithScalesFromTheWeights) {
  const ModelConfig config = BuiltinModelConfig("tiny-v3").value();
  GeneratedWeights generated(config);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(Fp8Dir()));
  int quantized = 0;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    SCOPED_TRACE(spec.name);
    const SafetensorsTensor* t = ckpt->Find(spec.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->shape, spec.shape);
    const SafetensorsTensor* s = ckpt->Find(spec.name + "_scale_inv");
    if (!QuantizedInFp8Checkpoints(spec)) {
      EXPECT_EQ(t->dtype, spec.role == TensorRole::kCorrectionBias ? DType::kF32 : DType::kBF16);
      EXPECT_EQ(s, nullptr);
      continue;
    }
    ++quantized;
    ASSERT_EQ(t->dtype, DType::kF8E4M3);
    ASSERT_NE(s, nullptr);
    const int64_t rows = spec.shape[0], cols = spec.shape[1];
    ASSERT_EQ(s->dtype, DType::kF32);
    ASSERT_EQ(s->shape, (std::vector<int64_t>{(rows + 127) / 128, (cols + 127) / 128}));
    // Each scale is its block's largest magnitude / 448, and every value
    // dequantizes to within e4m3's rounding of the weight it came from.
    std::vector<float> w(static_cast<size_t>(rows * cols));
    ASSERT_OK(generated.ReadF32(spec.name, spec.shape, w.data()));
    std::vector<float> scales(static_cast<size_t>(s->numel()));
    std::memcpy(scales.data(), s->data, s->nbytes);
    const auto* q = static_cast<const uint8_t*>(t->data);
    for (int64_t br = 0; br < s->shape[0]; ++br) {
      for (int64_t bc = 0; bc < s->shape[1]; ++bc) {
        float amax = 0.0f;
        for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r) {
          for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c) {
            amax = std::max(amax, std::fabs(w[r * cols + c]));
          }
        }
        ASSERT_EQ(scales[br * s->shape[1] + bc], amax / 448.0f) << "block " << br << "," << bc;
      }
    }
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float scale = scales[(i / cols / 128) * s->shape[1] + (i % cols) / 128];
      const double deq = static_cast<double>(F8E4M3ToF32(q[i])) * scale;
      const double bound = std::max(std::fabs(w[i]) / 16.0, scale / 1024.0) * 1.0001;
      ASSERT_LE(std::fabs(deq - w[i]), bound) << "element " << i;
    }
  }
  EXPECT_GT(quantized, 50);
  // config.json says what the released V3 checkpoints say.
  std::ifstream in(Fp8Dir() + "/config.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["quantization_config"],
            nlohmann::json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": [128, 128]})"));
  ASSERT_OK_AND_ASSIGN(ModelSource reopened, OpenModel(Fp8Dir()));
  EXPECT_TRUE(reopened.config.fp8_block_quantized);
}

// Runs `specs` on model `model` with weights held as `weight_dtype`; every
// request's result by id.
std::vector<RequestResult> RunModel(const std::string& model, const std::string& weight_dtype,
                                    const std::vector<RequestSpec>& specs) {
  EngineOptions o;
  o.model = model;
  o.device = "host";
  o.weight_dtype = weight_dtype;
  o.block_size = 16;
  o.kv_cache_bytes = size_t{8} << 20;
  auto engine = Engine::Create(o);
  EXPECT_OK(engine);
  if (!engine.ok()) return {};
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_OK((*engine)->AddRequestWithId(specs[i], static_cast<RequestId>(i)));
  }
  while ((*engine)->HasUnfinished()) {
    auto step = (*engine)->Step();
    EXPECT_OK(step);
    if (!step.ok()) break;
  }
  std::vector<RequestResult> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    out.push_back(ResultOf(*(*engine)->request(static_cast<RequestId>(i))));
  }
  return out;
}

TEST(Fp8CheckpointTest, RunsBitwiseLikeItsDequantizedCopy) {
  // The same weights dequantized to f32 (Fp8Dequantize), as a second
  // checkpoint.
  const std::string f32_dir = MakeTempDir() + "/dequantized";
  {
    ASSERT_OK_AND_ASSIGN(ModelSource fp8, OpenModel(Fp8Dir()));
    ASSERT_OK(ExportModel(fp8.config, *fp8.weights, f32_dir, DType::kF32));
  }
  const int vocab = BuiltinModelConfig("tiny-v3").value().vocab_size;
  std::vector<RequestSpec> specs(6);
  for (size_t i = 0; i < specs.size(); ++i) {
    for (int t = 0; t < 5 + 7 * static_cast<int>(i); ++t) {
      specs[i].prompt.push_back(static_cast<int32_t>((131 * i + 17 * t) % vocab));
    }
    specs[i].max_tokens = 8;
    specs[i].sampling.logprobs = vocab;
    if (i % 2 == 1) specs[i].sampling.temperature = 0.7f;
  }
  const std::vector<RequestResult> want = RunModel(f32_dir, "auto", specs);
  for (const char* dtype : {"auto", "fp8", "f32"}) {
    SCOPED_TRACE(dtype);
    const std::vector<RequestResult> got = RunModel(Fp8Dir(), dtype, specs);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].output_tokens, want[i].output_tokens) << "request " << i;
      ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
      for (size_t t = 0; t < got[i].logprobs.size(); ++t) {
        for (size_t k = 0; k < got[i].logprobs[t].size(); ++k) {
          const float a = got[i].logprobs[t][k].logprob, b = want[i].logprobs[t][k].logprob;
          ASSERT_EQ(std::memcmp(&a, &b, sizeof(float)), 0) << "request " << i << " token " << t;
        }
      }
    }
  }
}

// The built-in weights are bf16 values, so holding them in bf16 loses
// nothing, and the GEMM sums bf16 and f32 weights in the same order: the
// same bits. A sharded copy of the fp8 checkpoint runs as the single file.
TEST(WeightDtypeTest, Bf16BuiltinAndShardedFp8GiveTheSameBits) {
  std::vector<RequestSpec> specs(3);
  for (size_t i = 0; i < specs.size(); ++i) {
    for (int t = 0; t < 9 + 11 * static_cast<int>(i); ++t) {
      specs[i].prompt.push_back(static_cast<int32_t>((71 * i + 13 * t) % 1024));
    }
    specs[i].max_tokens = 6;
    specs[i].sampling.logprobs = 1024;
  }
  auto same = [](const std::vector<RequestResult>& a, const std::vector<RequestResult>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].output_tokens, b[i].output_tokens);
      for (size_t t = 0; t < a[i].logprobs.size(); ++t) {
        for (size_t k = 0; k < a[i].logprobs[t].size(); ++k) {
          ASSERT_EQ(a[i].logprobs[t][k].logprob, b[i].logprobs[t][k].logprob);
        }
      }
    }
  };
  same(RunModel("tiny-v3", "bf16", specs), RunModel("tiny-v3", "f32", specs));
  const std::string sharded = MakeTempDir() + "/sharded";
  {
    auto ckpt = Checkpoint::Open(Fp8Dir()).value();
    SafetensorsWriter writer;
    for (const std::string& name : ckpt->names()) {
      const SafetensorsTensor* t = ckpt->Find(name);
      ASSERT_OK(writer.Add(name, t->dtype, t->shape, t->data));
    }
    ASSERT_OK(writer.WriteSharded(sharded, size_t{1} << 20));
    std::ifstream in(Fp8Dir() + "/config.json");
    std::ofstream(sharded + "/config.json") << in.rdbuf();
  }
  same(RunModel(sharded, "auto", specs), RunModel(Fp8Dir(), "auto", specs));
}

// A copy of the checkpoint at `from` (the fp8 one by default) with its
// tensors passed through `edit` (which may change them or add more) and its
// config.json through `edit_config`.
using Edit = std::function<void(const SafetensorsTensor&, SafetensorsWriter&)>;
using EditConfig = std::function<void(nlohmann::json&)>;
std::string EditedCopy(const Edit& edit, const EditConfig& edit_config = nullptr,
                       const std::string& from = Fp8Dir()) {
  const std::string dir = MakeTempDir();
  nlohmann::json config = nlohmann::json::parse(std::ifstream(from + "/config.json"));
  if (edit_config) edit_config(config);
  std::ofstream(dir + "/config.json") << config.dump(2);
  auto ckpt = Checkpoint::Open(from).value();
  SafetensorsWriter writer;
  for (const std::string& name : ckpt->names()) edit(*ckpt->Find(name), writer);
  EXPECT_OK(writer.Write(dir + "/model.safetensors"));
  return dir;
}

void Keep(const SafetensorsTensor& t, SafetensorsWriter& w) {
  EXPECT_OK(w.Add(t.name, t.dtype, t.shape, t.data));
}

absl::Status Build(const std::string& dir, const std::string& weight_dtype = "auto") {
  auto device = Device::Create("host");
  MLAG_RETURN_IF_ERROR(device.status());
  MLAG_ASSIGN_OR_RETURN(ModelSource source, OpenModel(dir));
  ModelOptions options;
  MLAG_ASSIGN_OR_RETURN(options.weight_format, ParseWeightFormat(weight_dtype));
  return BuildModel(source, device->get(), options).status();
}

constexpr char kWeight[] = "model.layers.1.mlp.experts.3.down_proj.weight";

TEST(Fp8CheckpointTest, RefusesMalformedFp8TensorsNamingThem) {
  // No block scales.
  const std::string no_scales = EditedCopy([](const SafetensorsTensor& t, SafetensorsWriter& w) {
    if (t.name != std::string(kWeight) + "_scale_inv") Keep(t, w);
  });
  EXPECT_THAT(Build(no_scales), StatusIs(absl::StatusCode::kNotFound, HasSubstr(kWeight)));
  // Scales of the wrong shape.
  const std::string bad_shape = EditedCopy([](const SafetensorsTensor& t, SafetensorsWriter& w) {
    if (t.name != std::string(kWeight) + "_scale_inv") return Keep(t, w);
    std::vector<float> s(8, 1.0f);
    EXPECT_OK(w.Add(t.name, DType::kF32, {2, 4}, s.data()));
  });
  EXPECT_THAT(Build(bad_shape), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr(std::string(kWeight) + "_scale_inv")));
  // A scale that is not a finite positive number at most kFp8MaxScale.
  for (float bad : {0.0f, -1.0f, INFINITY, NAN, 1e6f}) {
    const std::string dir = EditedCopy([bad](const SafetensorsTensor& t, SafetensorsWriter& w) {
      if (t.name != std::string(kWeight) + "_scale_inv") return Keep(t, w);
      std::vector<float> s(static_cast<size_t>(t.numel()));
      std::memcpy(s.data(), t.data, t.nbytes);
      s.back() = bad;
      EXPECT_OK(w.Add(t.name, t.dtype, t.shape, s.data()));
    });
    EXPECT_THAT(Build(dir), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scale")))
        << bad;
  }
  // A NaN value (e4m3 has no infinity; 0x7f and 0xff are NaN), in either
  // weight dtype it is loaded as.
  const std::string nan = EditedCopy([](const SafetensorsTensor& t, SafetensorsWriter& w) {
    if (t.name != kWeight) return Keep(t, w);
    std::vector<uint8_t> q(static_cast<const uint8_t*>(t.data),
                           static_cast<const uint8_t*>(t.data) + t.nbytes);
    q[q.size() / 2] = 0xff;
    EXPECT_OK(w.Add(t.name, t.dtype, t.shape, q.data()));
  });
  EXPECT_THAT(Build(nan), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(kWeight)));
  EXPECT_THAT(Build(nan, "f32"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(kWeight)));
}

// Adds to the writer a multi-token-prediction layer `layer` after tiny-v3's
// four decoder layers, shaped as DeepSeek-V3 stores one: its own tensors
// (eh_proj in fp8 with block scales), a decoder layer's, and `extra`.
void AddMtpLayer(SafetensorsWriter& w, int layer, const std::vector<std::string>& extra = {}) {
  const ModelConfig c = BuiltinModelConfig("tiny-v3").value();
  const int64_t D = c.hidden_size;
  const std::string l = absl::StrCat("model.layers.", layer, ".");
  static const std::vector<uint8_t> fp8(static_cast<size_t>(2 * D * D), 0x38);  // 1.0
  static const std::vector<float> ones(static_cast<size_t>(8 * D), 1.0f);
  EXPECT_OK(w.Add(l + "eh_proj.weight", DType::kF8E4M3, {D, 2 * D}, fp8.data()));
  EXPECT_OK(w.Add(l + "eh_proj.weight_scale_inv", DType::kF32, {Fp8Blocks(D), Fp8Blocks(2 * D)},
                  ones.data()));
  for (const char* norm : {"enorm.weight", "hnorm.weight", "shared_head.norm.weight",
                           "input_layernorm.weight", "post_attention_layernorm.weight"}) {
    EXPECT_OK(w.Add(l + norm, DType::kF32, {D}, ones.data()));
  }
  EXPECT_OK(w.Add(l + "mlp.experts.3.down_proj.weight", DType::kF32, {D, 4}, ones.data()));
  for (const std::string& name : extra) EXPECT_OK(w.Add(l + name, DType::kF32, {D}, ones.data()));
}

TEST(Fp8CheckpointTest, SkipsTheMultiTokenPredictionLayerAndRefusesOtherExtras) {
  auto with_mtp = [](std::vector<std::string> extra = {}) {
    return [extra](const SafetensorsTensor& t, SafetensorsWriter& w) {
      Keep(t, w);
      if (t.name == kWeight) AddMtpLayer(w, 4, extra);
    };
  };
  auto nextn = [](int n) { return [n](nlohmann::json& j) { j["num_nextn_predict_layers"] = n; }; };
  // V3 checkpoints carry model.layers.<num_hidden_layers>.* (MTP), fp8 too:
  // skipped, and info's SortUnreadTensors names the layer.
  const std::string mtp = EditedCopy(with_mtp(), nextn(1));
  {
    auto device = Device::Create("host");
    ASSERT_OK(device.status());
    ModelSource source = OpenModel(mtp).value();
    ASSERT_OK(BuildModel(source, device->get(), ModelOptions()).status());
    const UnreadTensors unread = SortUnreadTensors(source.config, source.weights->Unread());
    EXPECT_THAT(unread.unexpected, ::testing::IsEmpty());
    ASSERT_EQ(unread.mtp_layers.size(), 1u);
    EXPECT_EQ(unread.mtp_layers[0], std::make_pair(4, 8));
  }
  // Not when the config says there is none.
  EXPECT_THAT(
      Build(EditedCopy(with_mtp(), nextn(0))),
      StatusIs(absl::StatusCode::kInvalidArgument, AllOf(HasSubstr("model.layers.4.eh_proj.weight"),
                                                         HasSubstr("num_nextn_predict_layers 0"))));
  // Nor with a tensor no MTP layer holds.
  EXPECT_THAT(Build(EditedCopy(with_mtp({"totally_bogus.weight"}), nextn(1))),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.layers.4.totally_bogus.weight")));
  // A config that gives fewer layers than the checkpoint holds: the last
  // decoder layer is no MTP layer (no eh_proj), so it is not skipped.
  EXPECT_THAT(Build(EditedCopy(Keep,
                               [](nlohmann::json& j) {
                                 j["num_hidden_layers"] = 3;
                                 j["num_nextn_predict_layers"] = 1;
                               })),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("model.layers.3."), HasSubstr("num_hidden_layers 3"))));
  // Any other extra tensor.
  const std::string extra = EditedCopy([](const SafetensorsTensor& t, SafetensorsWriter& w) {
    Keep(t, w);
    if (t.name == kWeight) {
      EXPECT_OK(w.Add("model.layers.1.mlp.extra.weight", t.dtype, t.shape, t.data));
    }
  });
  EXPECT_THAT(Build(extra), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("model.layers.1.mlp.extra.weight")));
}

// config.json and the tensors must agree on fp8: a mislabelled checkpoint is
// refused, not run (or reported) as what it is not.
TEST(Fp8CheckpointTest, RefusesAConfigThatDisagreesWithTheTensorsOnFp8) {
  EXPECT_THAT(Build(EditedCopy(Keep, [](nlohmann::json& j) { j.erase("quantization_config"); })),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("F8_E4M3"), HasSubstr("no quantization_config"))));
  const std::string bf16 = MakeTempDir() + "/tiny-v3-bf16";
  {
    ModelSource source = OpenModel("tiny-v3").value();
    ASSERT_OK(ExportModel(source.config, *source.weights, bf16, DType::kBF16));
  }
  EXPECT_OK(Build(bf16));
  const std::string labelled = EditedCopy(
      Keep,
      [](nlohmann::json& j) {
        j["quantization_config"] =
            nlohmann::json::parse(std::ifstream(Fp8Dir() + "/config.json"))["quantization_config"];
      },
      bf16);
  EXPECT_THAT(Build(labelled), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("no tensor is stored as F8_E4M3")));
}

}  // namespace
}  // namespace mlag
