// The DeepSeek model on the host: checkpoints round-trip, malformed
// checkpoints are rejected by name, prefill / chunked prefill / decode agree,
// and every MLA layer records kv_update immediately before mla.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/builtin_models.h"
#include "runtime/checkpoint/model_loader.h"
#include "runtime/checkpoint/safetensors.h"
#include "tests/model/model_harness.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

using testing::ModelHarness;
using testing::RelDiff;

std::string TempDir(const std::string& name) {
  std::string dir =
      ::testing::TempDir() + "mlag_model_test_" + name + "_" + std::to_string(::getpid());
  std::string cmd = "rm -rf '" + dir + "'";
  (void)std::system(cmd.c_str());
  return dir;
}

std::vector<int> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(0, vocab - 1);
  std::vector<int> t(n);
  for (int& x : t) x = u(rng);
  return t;
}

std::unique_ptr<ModelHarness> Harness(ModelSource& source, int max_tokens = 64) {
  ModelHarness::Options o;
  o.max_tokens = max_tokens;
  auto h = ModelHarness::Create(source, o);
  EXPECT_OK(h);
  return h.ok() ? std::move(*h) : nullptr;
}

// Logits of the last token of `prompt` fed in chunks of the given sizes.
std::vector<float> LogitsInChunks(ModelSource& source, const std::vector<int>& prompt,
                                  const std::vector<int>& chunks) {
  SCOPED_TRACE(absl::StrCat("LogitsInChunks: ", prompt.size(), " tokens in chunks ",
                            absl::StrJoin(chunks, ",")));
  auto h = Harness(source);
  if (!h) return {};
  size_t pos = 0;
  std::vector<float> last;
  for (int n : chunks) {
    std::vector<int> piece(prompt.begin() + pos, prompt.begin() + pos + n);
    pos += n;
    auto out = h->Step({0}, {piece});
    EXPECT_OK(out);
    if (!out.ok()) return {};
    last = (*out)[0];
  }
  EXPECT_EQ(pos, prompt.size());
  return last;
}

class ModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelTest, ExportThenLoadGivesIdenticalLogits) {
  auto builtin = OpenModel(GetParam());
  ASSERT_OK(builtin);
  const std::string dir = TempDir(GetParam() + "_export");
  ASSERT_OK(ExportModel(builtin->config, *builtin->weights, dir));

  auto loaded = OpenModel(dir);
  ASSERT_OK(loaded);
  std::vector<int> prompt = RandomTokens(13, builtin->config.vocab_size, 5);
  auto fresh = OpenModel(GetParam());
  ASSERT_OK(fresh);
  std::vector<float> a = LogitsInChunks(*fresh, prompt, {13});
  std::vector<float> b = LogitsInChunks(*loaded, prompt, {13});
  ASSERT_EQ(a.size(), static_cast<size_t>(builtin->config.vocab_size));
  ASSERT_EQ(a.size(), b.size());
  // The built-in weights are bf16-exact, so a bf16 export is lossless.
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_GT(RelDiff(a, std::vector<float>(a.size(), 0.0f)), 0.0);
}

TEST_P(ModelTest, ChunkedPrefillAndDecodeMatchOneShotPrefill) {
  auto source = OpenModel(GetParam());
  ASSERT_OK(source);
  std::vector<int> prompt = RandomTokens(24, source->config.vocab_size, 11);
  std::vector<float> once = LogitsInChunks(*source, prompt, {24});
  std::vector<float> chunked = LogitsInChunks(*source, prompt, {10, 14});
  std::vector<int> decode_steps(24, 1);
  decode_steps[0] = 1;
  std::vector<float> decoded = LogitsInChunks(*source, prompt, decode_steps);
  ASSERT_FALSE(once.empty());
  double chunk_err = RelDiff(chunked, once), decode_err = RelDiff(decoded, once);
  std::printf("%s: chunked 10+14 rel_err %.3g, 1 + 23 decodes rel_err %.3g\n", GetParam().c_str(),
              chunk_err, decode_err);
  EXPECT_LT(chunk_err, 1e-4);
  EXPECT_LT(decode_err, 1e-4);
}

TEST_P(ModelTest, EveryLayerRecordsKvUpdateThenMla) {
  auto source = OpenModel(GetParam());
  ASSERT_OK(source);
  auto h = Harness(*source);
  ASSERT_TRUE(h);
  AttentionMetadata meta = h->BuildMetadata({0, 1}, {{1}, {2}});
  Stream& stream = testing::HostStream();
  ASSERT_OK(stream.BeginCapture());
  ASSERT_OK(h->model().Forward(stream, meta));
  auto graph = stream.EndCapture();
  ASSERT_OK(graph);
  const auto& nodes = (*graph)->nodes();
  for (int l = 0; l < source->config.num_hidden_layers; ++l) {
    const std::string kv = "layers." + std::to_string(l) + ".attn.kv_update";
    const std::string mla = "layers." + std::to_string(l) + ".attn.mla";
    int found = 0;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].name != kv) continue;
      ++found;
      ASSERT_LT(i + 1, nodes.size());
      EXPECT_EQ(nodes[i + 1].name, mla) << "layer " << l;
      EXPECT_EQ(nodes[i].kind, OpKind::kKernel);
    }
    EXPECT_EQ(found, 1) << kv;
  }
  EXPECT_EQ(nodes.front().name, "embed");
  EXPECT_EQ(nodes.back().name, "lm_head");
  EXPECT_EQ(nodes.back().kind, OpKind::kGemm);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ModelTest, ::testing::Values("tiny-v3", "tiny-v2"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

// ---- Malformed checkpoints ---------------------------------------------------------

class MalformedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto src = OpenModel("tiny-v2");
    ASSERT_OK(src);
    good_ = TempDir("good");
    ASSERT_OK(ExportModel(src->config, *src->weights, good_));
  }

  // Copies the good checkpoint into `dir`, applying `edit` to the writer's
  // tensor list (name -> (shape, bytes)).
  void Rewrite(const std::string& dir,
               const std::function<bool(std::string&, std::vector<int64_t>&)>& keep) {
    auto ckpt = Checkpoint::Open(good_);
    ASSERT_OK(ckpt);
    SafetensorsWriter w;
    for (const std::string& name : (*ckpt)->names()) {
      const SafetensorsTensor* t = (*ckpt)->Find(name);
      std::string n = name;
      std::vector<int64_t> shape = t->shape;
      if (!keep(n, shape)) continue;
      if (shape != t->shape) {
        // Same bytes would not fit: make a fresh zero tensor of the new shape.
        int64_t numel = 1;
        for (int64_t s : shape) numel *= s;
        std::vector<uint8_t> zeros(numel * DTypeSize(t->dtype), 0);
        ASSERT_OK(w.Add(n, t->dtype, shape, zeros.data()));
      } else {
        ASSERT_OK(w.Add(n, t->dtype, shape, t->data));
      }
    }
    ASSERT_EQ(
        std::system(
            ("mkdir -p '" + dir + "' && cp '" + good_ + "/config.json' '" + dir + "/'").c_str()),
        0);
    ASSERT_OK(w.Write(dir + "/model.safetensors"));
  }

  absl::Status Load(const std::string& dir) {
    MLAG_ASSIGN_OR_RETURN(ModelSource src, OpenModel(dir));
    ModelOptions o;
    o.max_tokens = 8;
    o.max_seqs = 2;
    return BuildModel(src, &testing::HostDevice(), o).status();
  }

  std::string good_;
};

TEST_F(MalformedCheckpointTest, GoodCheckpointLoads) { EXPECT_OK(Load(good_)); }

TEST_F(MalformedCheckpointTest, WrongShapeIsNamed) {
  const std::string dir = TempDir("shape");
  const std::string victim = "model.layers.2.self_attn.kv_b_proj.weight";
  Rewrite(dir, [&](std::string& n, std::vector<int64_t>& shape) {
    if (n == victim) shape[0] += 1;
    return true;
  });
  absl::Status s = Load(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(victim), std::string::npos) << s;
  EXPECT_NE(s.message().find("shape"), std::string::npos) << s;
}

TEST_F(MalformedCheckpointTest, MissingTensorIsNamed) {
  const std::string dir = TempDir("missing");
  const std::string victim = "model.layers.1.mlp.experts.7.down_proj.weight";
  Rewrite(dir, [&](std::string& n, std::vector<int64_t>&) { return n != victim; });
  absl::Status s = Load(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(victim), std::string::npos) << s;
}

TEST_F(MalformedCheckpointTest, UnexpectedTensorIsNamed) {
  const std::string dir = TempDir("unexpected");
  Rewrite(dir, [&](std::string& n, std::vector<int64_t>&) {
    if (n == "model.norm.weight") {
      n = "model.layers.0.self_attn.q_a_proj.weight";  // tiny-v2 has no q LoRA
      return true;
    }
    return true;
  });
  absl::Status s = Load(dir);
  ASSERT_FALSE(s.ok());
  // model.norm.weight is now missing, which is reported first.
  EXPECT_NE(s.message().find("model.norm.weight"), std::string::npos) << s;
}

TEST_F(MalformedCheckpointTest, TruncatedFileIsNamed) {
  const std::string dir = TempDir("truncated");
  ASSERT_EQ(std::system(("cp -r '" + good_ + "' '" + dir + "'").c_str()), 0);
  const std::string file = dir + "/model.safetensors";
  const auto size = static_cast<off_t>(std::filesystem::file_size(file));
  ASSERT_EQ(::truncate(file.c_str(), size / 2), 0);
  absl::Status s = Load(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s;
}

TEST(ModelSourceTest, MissingDirectoryAndBadConfigAreNamed) {
  auto s = OpenModel("/nonexistent/model");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("/nonexistent/model"), std::string::npos);
}

}  // namespace
}  // namespace mlag
