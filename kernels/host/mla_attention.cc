#include "kernels/host/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/softmax_math.h"
#include "kernels/host/parallel.h"

namespace mlag::host {
namespace {

constexpr int64_t kKeyTile = 32;              // cache rows scored together
constexpr int64_t kPrefillQueryVectors = 64;  // (row, head) pairs per prefill work item

// The cache rows of one sequence: token s lives in block blocks[s / block_size]
// at offset s % block_size.
struct SeqKeys {
  const char* cache;
  DType dtype;
  int64_t esize;
  int64_t block_size;
  int64_t row;            // elements per cache row, Rkv + dr
  const int32_t* blocks;  // the sequence's block-table row (unit stride)

  const char* Row(int64_t s) const {
    const int64_t block = blocks[s / block_size];
    return cache + (block * block_size + s % block_size) * row * esize;
  }
};

// The query vectors of one work item; query q is one (token, head) pair and
// sees the cache tokens [0, limit[q]).
struct Queries {
  int64_t count;
  const float* const* latent;  // count pointers to Rkv floats
  const float* const* pe;      // count pointers to dr floats
  const int64_t* limit;
};

// Per-thread scratch, reused across calls so a work item does not allocate
// once warm. Host ops may run on any thread, so nothing here is shared.
struct Scratch {
  std::vector<float> rows;  // bf16 cache rows converted to f32, kKeyTile * row
  std::vector<const float*> row_ptr;
  std::vector<float> probs;  // count * kKeyTile: scores, then probabilities
  std::vector<OnlineSoftmaxState> state;
  std::vector<float> acc;  // count * Rkv
  std::vector<const float*> latent;
  std::vector<const float*> pe;
  std::vector<int64_t> limit;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

float Dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Folds cache tokens [key_begin, key_end) into the online softmax of every
// query: state[q] and acc[q * rkv, (q + 1) * rkv). Each cache row is loaded
// once per tile and used by all queries (MQA over the latent).
void AttendRange(const SeqKeys& keys, int64_t rkv, int64_t dr, float scale, const Queries& qs,
                 int64_t key_begin, int64_t key_end, OnlineSoftmaxState* state, float* acc,
                 Scratch& sc) {
  const int64_t nq = qs.count;
  sc.row_ptr.resize(kKeyTile);
  sc.probs.resize(static_cast<size_t>(nq * kKeyTile));
  if (keys.dtype != DType::kF32) sc.rows.resize(static_cast<size_t>(kKeyTile * keys.row));
  float* probs = sc.probs.data();
  for (int64_t t0 = key_begin; t0 < key_end; t0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, key_end - t0);
    for (int64_t j = 0; j < n; ++j) {
      const char* src = keys.Row(t0 + j);
      if (keys.dtype == DType::kF32) {
        sc.row_ptr[j] = reinterpret_cast<const float*>(src);
      } else {
        float* dst = sc.rows.data() + j * keys.row;
        ConvertToF32(keys.dtype, src, dst, static_cast<size_t>(keys.row));
        sc.row_ptr[j] = dst;
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      const float* r = sc.row_ptr[j];
      const int64_t s = t0 + j;
      for (int64_t q = 0; q < nq; ++q) {
        probs[q * kKeyTile + j] =
            s < qs.limit[q] ? scale * (Dot(qs.latent[q], r, rkv) + Dot(qs.pe[q], r + rkv, dr))
                            : -INFINITY;
      }
    }
    for (int64_t q = 0; q < nq; ++q) {
      float* p = probs + q * kKeyTile;
      float tile_max = -INFINITY;
      for (int64_t j = 0; j < n; ++j) tile_max = std::max(tile_max, p[j]);
      const float alpha = OnlineSoftmaxRescale(&state[q], tile_max);
      if (alpha != 1.0f) {
        float* a = acc + q * rkv;
        for (int64_t i = 0; i < rkv; ++i) a[i] *= alpha;
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        p[j] = ExpShifted(p[j], state[q].max);
        sum += p[j];
      }
      state[q].sum += sum;
    }
    for (int64_t j = 0; j < n; ++j) {
      const float* r = sc.row_ptr[j];
      for (int64_t q = 0; q < nq; ++q) {
        const float pj = probs[q * kKeyTile + j];
        if (pj != 0.0f) Axpy(pj, r, acc + q * rkv, rkv);
      }
    }
  }
}

// out = acc / sum and the log-sum-exp; zeros and -inf for an empty softmax.
void Finalize(const OnlineSoftmaxState& state, const float* acc, int64_t rkv, float* out,
              float* lse) {
  const float inv = OnlineSoftmaxInvSum(state);
  for (int64_t i = 0; i < rkv; ++i) out[i] = acc[i] * inv;
  *lse = OnlineSoftmaxLse(state);
}

// Every seq_len fits the block table and every block it uses is in the cache.
absl::Status CheckSequences(const Tensor& cache, const Tensor& block_table,
                            const Tensor& seq_lens) {
  const int64_t num_blocks = cache.size(0);
  const int64_t block_size = cache.size(1);
  const int64_t capacity = block_table.size(1) * block_size;
  const int32_t* lens = seq_lens.data_as<int32_t>();
  for (int64_t b = 0; b < seq_lens.size(0); ++b) {
    const int64_t len = lens[b];
    if (len < 0 || len > capacity) {
      return absl::InvalidArgumentError(absl::StrCat("seq_lens[", b, "] = ", len, " outside [0, ",
                                                     capacity,
                                                     "] (block_table width * block_size)"));
    }
    const int32_t* row = block_table.data_as<int32_t>() + b * block_table.stride(0);
    for (int64_t j = 0; j * block_size < len; ++j) {
      if (row[j] < 0 || row[j] >= num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("block_table[", b, "][", j, "] = ", row[j],
                                                       ", cache has ", num_blocks, " blocks"));
      }
    }
  }
  return absl::OkStatus();
}

SeqKeys KeysOf(const Tensor& cache, const Tensor& block_table, int64_t b) {
  SeqKeys keys;
  keys.cache = static_cast<const char*>(cache.data());
  keys.dtype = cache.dtype();
  keys.esize = static_cast<int64_t>(DTypeSize(cache.dtype()));
  keys.block_size = cache.size(1);
  keys.row = cache.size(2);
  keys.blocks = block_table.data_as<int32_t>() + b * block_table.stride(0);
  return keys;
}

const float* RowHead(const Tensor& t, int64_t n, int64_t h) {
  return t.data_as<float>() + n * t.stride(0) + h * t.stride(1);
}

}  // namespace

int64_t DecodeSplitTokens(int64_t total_tokens, int num_threads) {
  const int64_t target_items = 2 * static_cast<int64_t>(std::max(num_threads, 1));
  const int64_t per_item = (total_tokens + target_items - 1) / target_items;
  return std::max(kMinDecodeSplitTokens, per_item);
}

absl::Status MlaDecode(const Tensor& q_latent, const Tensor& q_pe, const Tensor& cache,
                       const Tensor& block_table, const Tensor& seq_lens, float scale,
                       const Tensor& out_latent, const Tensor& lse, int64_t split_tokens) {
  const absl::Status valid = CheckSequences(cache, block_table, seq_lens);
  if (!valid.ok()) return valid;
  const int64_t batch = q_latent.size(0);
  const int64_t heads = q_latent.size(1);
  const int64_t rkv = q_latent.size(2);
  const int64_t dr = q_pe.size(2);
  const int32_t* lens = seq_lens.data_as<int32_t>();
  int64_t total_tokens = 0;
  for (int64_t b = 0; b < batch; ++b) total_tokens += lens[b];
  const int64_t split =
      split_tokens > 0 ? split_tokens : DecodeSplitTokens(total_tokens, NumThreads());

  // Work items: a sequence, or one split of a long sequence. Splits write a
  // normalised partial output and its LSE, merged afterwards.
  struct Item {
    int64_t b, begin, end;
    int64_t partial;  // index of the partial slot, -1: writes the output directly
  };
  std::vector<Item> items;
  std::vector<int64_t> first_item(static_cast<size_t>(batch) + 1);
  int64_t num_partials = 0;
  for (int64_t b = 0; b < batch; ++b) {
    first_item[b] = static_cast<int64_t>(items.size());
    const int64_t len = lens[b];
    const int64_t num_splits = len <= split ? 1 : (len + split - 1) / split;
    for (int64_t k = 0; k < num_splits; ++k) {
      items.push_back({b, len * k / num_splits, len * (k + 1) / num_splits,
                       num_splits > 1 ? num_partials++ : -1});
    }
  }
  first_item[batch] = static_cast<int64_t>(items.size());
  std::vector<float> partial_out(static_cast<size_t>(num_partials * heads * rkv));
  std::vector<float> partial_lse(static_cast<size_t>(num_partials * heads));

  float* out = out_latent.data_as<float>();
  float* lse_out = lse.data_as<float>();
  ParallelForDynamic(static_cast<int64_t>(items.size()), [&](int64_t i) {
    const Item& item = items[i];
    Scratch& sc = ThreadScratch();
    sc.latent.resize(heads);
    sc.pe.resize(heads);
    sc.limit.assign(heads, lens[item.b]);
    sc.state.assign(heads, OnlineSoftmaxInit());
    sc.acc.assign(static_cast<size_t>(heads * rkv), 0.0f);
    for (int64_t h = 0; h < heads; ++h) {
      sc.latent[h] = RowHead(q_latent, item.b, h);
      sc.pe[h] = RowHead(q_pe, item.b, h);
    }
    const Queries qs{heads, sc.latent.data(), sc.pe.data(), sc.limit.data()};
    AttendRange(KeysOf(cache, block_table, item.b), rkv, dr, scale, qs, item.begin, item.end,
                sc.state.data(), sc.acc.data(), sc);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t slot = item.partial < 0 ? item.b * heads + h : item.partial * heads + h;
      float* dst = item.partial < 0 ? out : partial_out.data();
      float* dst_lse = item.partial < 0 ? lse_out : partial_lse.data();
      Finalize(sc.state[h], sc.acc.data() + h * rkv, rkv, dst + slot * rkv, dst_lse + slot);
    }
  });

  if (num_partials > 0) {
    ParallelFor(batch, [&](int64_t b) {
      const int64_t num_splits = first_item[b + 1] - first_item[b];
      if (num_splits <= 1) return;
      const int64_t p0 = items[first_item[b]].partial;
      for (int64_t h = 0; h < heads; ++h) {
        float total = -INFINITY;
        for (int64_t k = 0; k < num_splits; ++k) {
          total = LseAdd(total, partial_lse[(p0 + k) * heads + h]);
        }
        float* dst = out + (b * heads + h) * rkv;
        std::fill(dst, dst + rkv, 0.0f);
        for (int64_t k = 0; k < num_splits; ++k) {
          const float w = LseMergeWeight(partial_lse[(p0 + k) * heads + h], total);
          if (w != 0.0f) Axpy(w, partial_out.data() + ((p0 + k) * heads + h) * rkv, dst, rkv);
        }
        lse_out[b * heads + h] = total;
      }
    });
  }
  return absl::OkStatus();
}

absl::Status MlaPrefill(const Tensor& q_latent, const Tensor& q_pe, const Tensor& cache,
                        const Tensor& block_table, const Tensor& seq_lens,
                        const Tensor& query_start_loc, float scale, const Tensor& out_latent,
                        const Tensor& lse) {
  const int64_t num_rows = q_latent.size(0);
  const int64_t heads = q_latent.size(1);
  const int64_t rkv = q_latent.size(2);
  const int64_t dr = q_pe.size(2);
  const int64_t batch = seq_lens.size(0);
  const int32_t* lens = seq_lens.data_as<int32_t>();
  const int32_t* qsl = query_start_loc.data_as<int32_t>();
  if (qsl[0] < 0) {
    return absl::InvalidArgumentError(absl::StrCat("query_start_loc[0] = ", qsl[0], " < 0"));
  }
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q_len = static_cast<int64_t>(qsl[b + 1]) - qsl[b];
    if (q_len < 0) {
      return absl::InvalidArgumentError(absl::StrCat("query_start_loc: decreases at ", b + 1, " (",
                                                     qsl[b], " -> ", qsl[b + 1], ")"));
    }
    if (q_len > lens[b]) {
      return absl::InvalidArgumentError(absl::StrCat("query_start_loc: sequence ", b, " has ",
                                                     q_len, " query rows but seq_lens[", b,
                                                     "] = ", lens[b]));
    }
  }
  if (qsl[batch] > num_rows) {
    return absl::InvalidArgumentError(absl::StrCat("query_start_loc[", batch, "] = ", qsl[batch],
                                                   " exceeds q_latent's ", num_rows, " rows"));
  }
  const absl::Status valid = CheckSequences(cache, block_table, seq_lens);
  if (!valid.ok()) return valid;

  float* out = out_latent.data_as<float>();
  float* lse_out = lse.data_as<float>();
  // Rows owned by no sequence (padding) produce zeros and -inf.
  auto clear_rows = [&](int64_t r0, int64_t r1) {
    std::fill(out + r0 * heads * rkv, out + r1 * heads * rkv, 0.0f);
    std::fill(lse_out + r0 * heads, lse_out + r1 * heads, -INFINITY);
  };
  clear_rows(0, qsl[0]);
  clear_rows(qsl[batch], num_rows);

  // Work items: up to rows_per_item consecutive query rows of one sequence,
  // all heads; they share every cache row they read.
  const int64_t rows_per_item =
      std::max<int64_t>(1, kPrefillQueryVectors / std::max<int64_t>(heads, 1));
  struct Item {
    int64_t b, r0, r1;
  };
  std::vector<Item> items;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t r0 = qsl[b]; r0 < qsl[b + 1]; r0 += rows_per_item) {
      items.push_back({b, r0, std::min<int64_t>(r0 + rows_per_item, qsl[b + 1])});
    }
  }
  ParallelForDynamic(static_cast<int64_t>(items.size()), [&](int64_t i) {
    const Item& item = items[i];
    const int64_t q_len = qsl[item.b + 1] - qsl[item.b];
    const int64_t context = lens[item.b] - q_len;  // cached tokens before the first new row
    const int64_t nq = (item.r1 - item.r0) * heads;
    Scratch& sc = ThreadScratch();
    sc.latent.resize(nq);
    sc.pe.resize(nq);
    sc.limit.resize(nq);
    sc.state.assign(nq, OnlineSoftmaxInit());
    sc.acc.assign(static_cast<size_t>(nq * rkv), 0.0f);
    for (int64_t r = item.r0; r < item.r1; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t q = (r - item.r0) * heads + h;
        sc.latent[q] = RowHead(q_latent, r, h);
        sc.pe[q] = RowHead(q_pe, r, h);
        sc.limit[q] = context + (r - qsl[item.b]) + 1;  // causal: up to itself
      }
    }
    const Queries qs{nq, sc.latent.data(), sc.pe.data(), sc.limit.data()};
    const int64_t key_end = context + (item.r1 - qsl[item.b]);
    AttendRange(KeysOf(cache, block_table, item.b), rkv, dr, scale, qs, 0, key_end, sc.state.data(),
                sc.acc.data(), sc);
    for (int64_t q = 0; q < nq; ++q) {
      const int64_t slot = item.r0 * heads + q;
      Finalize(sc.state[q], sc.acc.data() + q * rkv, rkv, out + slot * rkv, lse_out + slot);
    }
  });
  return absl::OkStatus();
}

}  // namespace mlag::host
