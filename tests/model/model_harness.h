// A minimal driver for model tests: per-sequence block tables over a paged
// cache (blocks handed out in shuffled order, block 0 never used), metadata
// built on the host, one Forward per Step. The real KV cache manager and
// scheduler live in runtime/; this stays small on purpose so model tests do
// not depend on them.
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "layers/deepseek_model.h"
#include "runtime/checkpoint/model_loader.h"
#include "runtime/core/status.h"
#include "tests/test_util.h"

namespace mlag::testing {

class ModelHarness {
 public:
  struct Options {
    int max_tokens = 64;
    int max_seqs = 8;
    int block_size = 16;
    int num_blocks = 64;
    int max_blocks_per_seq = 16;
    uint32_t shuffle_seed = 1;
  };

  static absl::StatusOr<std::unique_ptr<ModelHarness>> Create(ModelSource& source,
                                                              const Options& options) {
    auto h = std::unique_ptr<ModelHarness>(new ModelHarness(options));
    ModelOptions mo;
    mo.max_tokens = options.max_tokens;
    mo.max_seqs = options.max_seqs;
    MLAG_ASSIGN_OR_RETURN(h->model_, BuildModel(source, &HostDevice(), mo));
    const ModelConfig& c = h->model_->config();
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      h->caches_.push_back(
          Make(DType::kF32, {options.num_blocks, options.block_size, c.kv_cache_row()}));
      h->model_->BindKvCache(l, h->caches_.back().t);
    }
    h->free_blocks_.resize(options.num_blocks - 1);
    std::iota(h->free_blocks_.begin(), h->free_blocks_.end(), 1);
    std::shuffle(h->free_blocks_.begin(), h->free_blocks_.end(),
                 std::mt19937(options.shuffle_seed));
    const int T = options.max_tokens, B = options.max_seqs;
    h->ids_ = Make(DType::kI32, {T});
    h->positions_ = Make(DType::kI32, {T});
    h->slots_ = Make(DType::kI64, {T});
    h->block_table_ = Make(DType::kI32, {B, options.max_blocks_per_seq});
    h->seq_lens_ = Make(DType::kI32, {B});
    h->qsl_ = Make(DType::kI32, {B + 1});
    h->logits_idx_ = Make(DType::kI32, {B});
    return h;
  }

  // Feeds new_tokens[i] to sequence seq_ids[i] (positions continue from what
  // the sequence already holds) and returns, per sequence, the logits of its
  // last new token.
  absl::StatusOr<std::vector<std::vector<float>>> Step(
      const std::vector<int>& seq_ids, const std::vector<std::vector<int>>& new_tokens) {
    const int B = static_cast<int>(seq_ids.size());
    AttentionMetadata meta = BuildMetadata(seq_ids, new_tokens);
    MLAG_RETURN_IF_ERROR(model_->Forward(HostStream(), meta));
    const int V = model_->config().vocab_size;
    Tensor logits = model_->logits(B);
    std::vector<std::vector<float>> out(B, std::vector<float>(V));
    for (int b = 0; b < B; ++b) {
      std::copy_n(logits.data_as<float>() + int64_t{b} * V, V, out[b].begin());
    }
    return out;
  }

  // Builds the metadata for one step and advances the sequences' lengths.
  AttentionMetadata BuildMetadata(const std::vector<int>& seq_ids,
                                  const std::vector<std::vector<int>>& new_tokens) {
    const int B = static_cast<int>(seq_ids.size());
    const int bs = options_.block_size, mb = options_.max_blocks_per_seq;
    int t = 0;
    bool decode_only = true;
    std::fill_n(block_table_.data<int32_t>(), options_.max_seqs * mb, 0);
    qsl_.data<int32_t>()[0] = 0;
    for (int b = 0; b < B; ++b) {
      Seq& s = seqs_[seq_ids[b]];
      decode_only &= new_tokens[b].size() == 1;
      for (int tok : new_tokens[b]) {
        if (s.len % bs == 0) {
          s.blocks.push_back(free_blocks_.back());
          free_blocks_.pop_back();
        }
        ids_.data<int32_t>()[t] = tok;
        positions_.data<int32_t>()[t] = s.len;
        slots_.data<int64_t>()[t] = int64_t{s.blocks[s.len / bs]} * bs + s.len % bs;
        ++s.len;
        ++t;
      }
      for (size_t j = 0; j < s.blocks.size(); ++j)
        block_table_.data<int32_t>()[b * mb + j] = s.blocks[j];
      seq_lens_.data<int32_t>()[b] = s.len;
      qsl_.data<int32_t>()[b + 1] = t;
      logits_idx_.data<int32_t>()[b] = t - 1;
    }
    AttentionMetadata meta;
    meta.num_tokens = t;
    meta.num_seqs = B;
    meta.decode_only = decode_only;
    meta.input_ids = Rows(ids_.t, t);
    meta.positions = Rows(positions_.t, t);
    meta.slot_mapping = Rows(slots_.t, t);
    meta.block_table = Rows(block_table_.t, B);
    meta.seq_lens = Rows(seq_lens_.t, B);
    meta.query_start_loc = Rows(qsl_.t, B + 1);
    meta.logits_indices = Rows(logits_idx_.t, B);
    return meta;
  }

  DeepseekModel& model() { return *model_; }
  const std::vector<Owned>& caches() const { return caches_; }

 private:
  struct Seq {
    int len = 0;
    std::vector<int> blocks;
  };
  explicit ModelHarness(const Options& o) : options_(o) {}

  Options options_;
  std::unique_ptr<DeepseekModel> model_;
  std::vector<Owned> caches_;
  std::vector<int> free_blocks_;
  std::map<int, Seq> seqs_;
  Owned ids_, positions_, slots_, block_table_, seq_lens_, qsl_, logits_idx_;
};

// Normwise relative difference of two logit vectors.
inline double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(double{a[i]} - double{b[i]}));
    den = std::max(den, std::abs(double{b[i]}));
  }
  return num / std::max(den, 1e-30);
}

}  // namespace mlag::testing
