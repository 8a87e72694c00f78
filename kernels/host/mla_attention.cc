#include "kernels/host/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/softmax_math.h"
#include "kernels/host/attention_softmax.h"
#include "kernels/host/gemm.h"
#include "kernels/host/parallel.h"

namespace mlag::host {
namespace {

constexpr int64_t kKeyTile = 32;              // cache rows scored together
constexpr int64_t kPrefillQueryVectors = 64;  // (row, head) pairs per prefill work item
// The transposed queries are padded to a multiple of the softmax's lanes.
constexpr int64_t kQueryLanes = kSoftmaxLanes;

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
  // Rows s, s + 1, ... to the end of s's block lie one row apart.
  int64_t ContiguousFrom(int64_t s) const { return block_size - s % block_size; }
};

// The query vectors of one work item; query q is one (token, head) pair and
// sees the cache tokens [0, limit[q]).
struct Queries {
  int64_t count;
  const float* const* latent;  // count pointers to Rkv floats
  const float* const* pe;      // count pointers to dr floats
  const int64_t* limit;
  // The same queries already transposed (TransposeQueries), or null.
  // When set, latent and pe may be null.
  const float* transposed = nullptr;
};

// Queries padded to a multiple of the softmax lanes.
int64_t QueryLanes(int64_t count) { return (count + kQueryLanes - 1) / kQueryLanes * kQueryLanes; }

// out[p * QueryLanes(count) + q]: element p of query q's [latent | pe], as a
// cache row holds [latent | pe]; zeros in the padding lanes.
void TransposeQueries(const Queries& qs, int64_t rkv, int64_t dr, float* out) {
  const int64_t nq = qs.count;
  const int64_t ldq = QueryLanes(nq);
  for (int64_t q = 0; q < nq; ++q) {  // each query read in order
    const float* latent = qs.latent[q];
    const float* pe = qs.pe[q];
    for (int64_t p = 0; p < rkv; ++p) out[p * ldq + q] = latent[p];
    for (int64_t p = 0; p < dr; ++p) out[(rkv + p) * ldq + q] = pe[p];
  }
  if (nq < ldq) {
    for (int64_t p = 0; p < rkv + dr; ++p) std::fill_n(out + p * ldq + nq, ldq - nq, 0.0f);
  }
}

// Per-thread scratch, reused across calls so a work item does not allocate
// once warm. Host ops may run on any thread, so nothing here is shared.
struct Scratch {
  std::vector<float> rows;  // bf16 cache rows converted to f32, kKeyTile * row
  std::vector<const float*> row_ptr;
  std::vector<float> queries_t;          // (Rkv + dr) * padded count: the queries transposed
  std::vector<const float*> query_rows;  // its rows
  std::vector<float> scores_t;           // kKeyTile * padded count: the scores, key-major
  std::vector<float> probs;              // count * kKeyTile: the probabilities
  std::vector<OnlineSoftmaxState> state;
  std::vector<float> lane_max, lane_sum;  // the softmax by query lane (SoftmaxLanes)
  std::vector<int32_t> lane_limit;
  std::vector<float> acc;  // count * Rkv
  std::vector<const float*> latent;
  std::vector<const float*> pe;
  std::vector<int64_t> limit;
  std::vector<float> split_out;  // prefill: per (query, split) partial outputs
  std::vector<float> split_lse;
};

// Grows `v` (never shrinks it) to at least n elements.
void GrowTo(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Folds cache tokens [key_begin, key_end) into the online softmax of every
// query: state[q] and acc[q * rkv, (q + 1) * rkv). Each tile of cache rows
// is scored and accumulated by every query as two small GEMMs (MQA over the
// latent), both GemmNNAccumulate: a score is one multiply-add chain over the
// key's rkv + dr elements in order (the queries transposed, one lane each),
// and an output element one chain over the tile's keys in order. Between
// them, the tile's online softmax runs over all queries at once, one vector
// lane each (SoftmaxTile). A query's bits depend only on its own vectors,
// the keys and the tile boundaries (kKeyTile from key_begin), not on the
// other queries. qs.transposed, when set, holds the queries as
// TransposeQueries writes them.
void AttendRange(const SeqKeys& keys, int64_t rkv, int64_t dr, float scale, const Queries& qs,
                 int64_t key_begin, int64_t key_end, OnlineSoftmaxState* state, float* acc,
                 Scratch& sc) {
  const int64_t nq = qs.count;
  const int64_t dim = rkv + dr;
  const int64_t ldq = QueryLanes(nq);
  const float* queries_t = qs.transposed;
  if (queries_t == nullptr) {
    GrowTo(sc.queries_t, dim * ldq);
    TransposeQueries(qs, rkv, dr, sc.queries_t.data());
    queries_t = sc.queries_t.data();
  }
  sc.query_rows.resize(static_cast<size_t>(dim));
  for (int64_t p = 0; p < dim; ++p) sc.query_rows[p] = queries_t + p * ldq;
  // The running softmax by lane; the padding lanes see no key.
  sc.lane_max.resize(static_cast<size_t>(ldq));
  sc.lane_sum.resize(static_cast<size_t>(ldq));
  sc.lane_limit.resize(static_cast<size_t>(ldq));
  for (int64_t q = 0; q < ldq; ++q) {
    sc.lane_max[q] = q < nq ? state[q].max : -INFINITY;
    sc.lane_sum[q] = q < nq ? state[q].sum : 0.0f;
    sc.lane_limit[q] = q < nq ? static_cast<int32_t>(qs.limit[q]) : 0;  // seq_lens are int32
  }
  const SoftmaxLanes lanes{ldq, sc.lane_max.data(), sc.lane_sum.data(), sc.lane_limit.data()};
  sc.row_ptr.resize(kKeyTile);
  GrowTo(sc.scores_t, kKeyTile * ldq);
  sc.probs.resize(static_cast<size_t>(nq * kKeyTile));
  if (keys.dtype != DType::kF32) sc.rows.resize(static_cast<size_t>(kKeyTile * keys.row));
  float* scores_t = sc.scores_t.data();
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
    // The next tile's first run of contiguous cache rows (the whole tile
    // unless it crosses a cache block), prefetched while this tile is scored:
    // the scores are the first to read a tile, and a row is too short a
    // stream for the hardware prefetcher to reach ahead of them.
    const char* next = nullptr;
    int64_t next_bytes = 0;
    if (t0 + n < key_end) {
      const int64_t rows = std::min({kKeyTile, key_end - t0 - n, keys.ContiguousFrom(t0 + n)});
      next = keys.Row(t0 + n);
      next_bytes = rows * keys.row * keys.esize;
    }
    // scores_t[j * ldq + q] = key j . query q, per run of keys contiguous in
    // the cache (one row stride).
    std::fill(scores_t, scores_t + n * ldq, 0.0f);
    for (int64_t j0 = 0; j0 < n;) {
      int64_t j1 = j0 + 1;
      while (j1 < n && sc.row_ptr[j1] == sc.row_ptr[j1 - 1] + keys.row) ++j1;
      GemmNNAccumulate(j1 - j0, ldq, dim, sc.row_ptr[j0], keys.row, sc.query_rows.data(),
                       scores_t + j0 * ldq, ldq, j0 == 0 ? next : nullptr,
                       j0 == 0 ? next_bytes : 0);
      j0 = j1;
    }
    // The online softmax of the tile, all queries at once (their lanes).
    SoftmaxTile(lanes, nq, n, t0, scale, scores_t, probs, kKeyTile, acc, rkv);
    // acc[q] += sum_j p[q][j] * row_j[0, rkv): masked keys have p = 0.
    GemmNNAccumulate(nq, rkv, n, probs, kKeyTile, sc.row_ptr.data(), acc, rkv);
  }
  for (int64_t q = 0; q < nq; ++q) state[q] = {sc.lane_max[q], sc.lane_sum[q]};
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

// Merges the normalised partial outputs of one query's splits, in split
// order: partial k is at partial_out + k * out_stride (rkv floats) with LSE
// partial_lse[k * lse_stride].
void MergeSplits(const float* partial_out, int64_t out_stride, const float* partial_lse,
                 int64_t lse_stride, int64_t num_splits, int64_t rkv, float* out, float* lse) {
  float total = -INFINITY;
  for (int64_t k = 0; k < num_splits; ++k) total = LseAdd(total, partial_lse[k * lse_stride]);
  std::fill(out, out + rkv, 0.0f);
  for (int64_t k = 0; k < num_splits; ++k) {
    const float w = LseMergeWeight(partial_lse[k * lse_stride], total);
    if (w != 0.0f) Axpy(w, partial_out + k * out_stride, out, rkv);
  }
  *lse = total;
}

int64_t NumSplits(int64_t len, int64_t split) {
  return len <= split ? 1 : (len + split - 1) / split;
}

}  // namespace

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
  const int64_t split = split_tokens > 0 ? split_tokens : kAttentionSplitTokens;

  // Work items: one split of a sequence (the whole sequence when it fits one
  // split) for a group of heads. Splits write a normalised partial output and
  // its LSE, merged afterwards. Head groups only spread a small batch over the
  // threads: each (query, split) is computed alone whatever the grouping. A
  // group's heads are the lanes of its score products (padded to
  // kQueryLanes), so a group keeps at least kMinGroupHeads of them.
  constexpr int64_t kMinGroupHeads = 8;
  int64_t ranges = 0;
  for (int64_t b = 0; b < batch; ++b) ranges += NumSplits(lens[b], split);
  const int64_t groups =
      std::clamp<int64_t>((NumThreads() + ranges - 1) / std::max<int64_t>(ranges, 1), 1,
                          std::max<int64_t>(1, heads / kMinGroupHeads));
  const int64_t heads_per_group = (heads + groups - 1) / std::max<int64_t>(groups, 1);
  struct Item {
    int64_t b, begin, end, h0, h1;
    int64_t partial;  // first partial slot of the sequence, -1: writes the output directly
  };
  std::vector<Item> items;
  std::vector<int64_t> first_partial(static_cast<size_t>(batch), -1);
  int64_t num_partials = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lens[b];
    const int64_t num_splits = NumSplits(len, split);
    if (num_splits > 1) first_partial[b] = num_partials;
    for (int64_t k = 0; k < num_splits; ++k) {
      for (int64_t h0 = 0; h0 < heads; h0 += heads_per_group) {
        items.push_back({b, k * split, std::min(len, (k + 1) * split), h0,
                         std::min(heads, h0 + heads_per_group),
                         num_splits > 1 ? num_partials + k : -1});
      }
    }
    if (num_splits > 1) num_partials += num_splits;
  }
  // Kept per thread and only grown (fresh megabytes every step would be
  // page-faulted and zeroed by the kernel).
  // (Local references: the worker threads must see this thread's buffers,
  // not their own thread_local ones.)
  thread_local std::vector<float> partial_out_buf, partial_lse_buf, queries_t_buf;
  std::vector<float>& partial_out = partial_out_buf;
  std::vector<float>& partial_lse = partial_lse_buf;
  GrowTo(partial_out, num_partials * heads * rkv);
  GrowTo(partial_lse, num_partials * heads);
  // The queries of each (sequence, head group), transposed once for all of
  // the sequence's splits.
  const int64_t num_groups =
      heads_per_group > 0 ? (heads + heads_per_group - 1) / heads_per_group : 0;
  const int64_t group_floats = (rkv + dr) * QueryLanes(heads_per_group);
  std::vector<float>& queries_t = queries_t_buf;
  GrowTo(queries_t, batch * num_groups * group_floats);
  auto transposed_of = [&](int64_t b, int64_t h0) {
    return queries_t.data() + (b * num_groups + h0 / heads_per_group) * group_floats;
  };
  ParallelFor(batch * num_groups, [&](int64_t i) {
    const int64_t b = i / num_groups, h0 = i % num_groups * heads_per_group;
    const int64_t h1 = std::min(heads, h0 + heads_per_group);
    Scratch& sc = ThreadScratch();
    sc.latent.resize(h1 - h0);
    sc.pe.resize(h1 - h0);
    for (int64_t h = h0; h < h1; ++h) {
      sc.latent[h - h0] = RowHead(q_latent, b, h);
      sc.pe[h - h0] = RowHead(q_pe, b, h);
    }
    TransposeQueries(Queries{h1 - h0, sc.latent.data(), sc.pe.data(), nullptr}, rkv, dr,
                     transposed_of(b, h0));
  });

  float* out = out_latent.data_as<float>();
  float* lse_out = lse.data_as<float>();
  ParallelForDynamic(static_cast<int64_t>(items.size()), [&](int64_t i) {
    const Item& item = items[i];
    const int64_t nh = item.h1 - item.h0;
    Scratch& sc = ThreadScratch();
    sc.limit.assign(nh, lens[item.b]);
    sc.state.assign(nh, OnlineSoftmaxInit());
    sc.acc.assign(static_cast<size_t>(nh * rkv), 0.0f);
    // The work item's queries, transposed above.
    const Queries qs{nh, nullptr, nullptr, sc.limit.data(), transposed_of(item.b, item.h0)};
    AttendRange(KeysOf(cache, block_table, item.b), rkv, dr, scale, qs, item.begin, item.end,
                sc.state.data(), sc.acc.data(), sc);
    for (int64_t h = item.h0; h < item.h1; ++h) {
      const int64_t slot = item.partial < 0 ? item.b * heads + h : item.partial * heads + h;
      float* dst = item.partial < 0 ? out : partial_out.data();
      float* dst_lse = item.partial < 0 ? lse_out : partial_lse.data();
      Finalize(sc.state[h - item.h0], sc.acc.data() + (h - item.h0) * rkv, rkv, dst + slot * rkv,
               dst_lse + slot);
    }
  });

  if (num_partials > 0) {
    ParallelFor(batch, [&](int64_t b) {
      if (first_partial[b] < 0) return;
      const int64_t p0 = first_partial[b];
      for (int64_t h = 0; h < heads; ++h) {
        MergeSplits(partial_out.data() + (p0 * heads + h) * rkv, heads * rkv,
                    partial_lse.data() + p0 * heads + h, heads, NumSplits(lens[b], split), rkv,
                    out + (b * heads + h) * rkv, lse_out + b * heads + h);
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
  // Each query attends its keys in the splits decode would use for the same
  // position (kAttentionSplitTokens, aligned at 0), merged in the same way:
  // prefill and decode give the same bits for the same token.
  const int64_t split = kAttentionSplitTokens;
  ParallelForDynamic(static_cast<int64_t>(items.size()), [&](int64_t i) {
    const Item& item = items[i];
    const int64_t q_len = qsl[item.b + 1] - qsl[item.b];
    const int64_t context = lens[item.b] - q_len;  // cached tokens before the first new row
    const int64_t nq = (item.r1 - item.r0) * heads;
    const int64_t key_end = context + (item.r1 - qsl[item.b]);
    const int64_t max_splits = NumSplits(key_end, split);
    Scratch& sc = ThreadScratch();
    sc.latent.resize(nq);
    sc.pe.resize(nq);
    sc.limit.resize(nq);
    for (int64_t r = item.r0; r < item.r1; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t q = (r - item.r0) * heads + h;
        sc.latent[q] = RowHead(q_latent, r, h);
        sc.pe[q] = RowHead(q_pe, r, h);
        sc.limit[q] = context + (r - qsl[item.b]) + 1;  // causal: up to itself
      }
    }
    std::vector<float>& partial_out = sc.split_out;
    std::vector<float>& partial_lse = sc.split_lse;
    GrowTo(partial_out, nq * max_splits * rkv);
    GrowTo(partial_lse, nq * max_splits);
    for (int64_t k = 0; k < max_splits; ++k) {
      // Queries whose keys reach into split k: a suffix in row order.
      int64_t first = 0;
      while (first < nq && sc.limit[first] <= k * split) ++first;
      const int64_t n = nq - first;
      sc.state.assign(n, OnlineSoftmaxInit());
      sc.acc.assign(static_cast<size_t>(n * rkv), 0.0f);
      const Queries qs{n, sc.latent.data() + first, sc.pe.data() + first, sc.limit.data() + first};
      AttendRange(KeysOf(cache, block_table, item.b), rkv, dr, scale, qs, k * split,
                  std::min(key_end, (k + 1) * split), sc.state.data(), sc.acc.data(), sc);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t q = first + j;
        if (NumSplits(sc.limit[q], split) == 1) {
          const int64_t slot = item.r0 * heads + q;
          Finalize(sc.state[j], sc.acc.data() + j * rkv, rkv, out + slot * rkv, lse_out + slot);
        } else {
          const int64_t part = q * max_splits + k;
          Finalize(sc.state[j], sc.acc.data() + j * rkv, rkv, partial_out.data() + part * rkv,
                   partial_lse.data() + part);
        }
      }
    }
    for (int64_t q = 0; q < nq; ++q) {
      const int64_t num_splits = NumSplits(sc.limit[q], split);
      if (num_splits == 1) continue;
      const int64_t slot = item.r0 * heads + q;
      MergeSplits(partial_out.data() + q * max_splits * rkv, rkv,
                  partial_lse.data() + q * max_splits, 1, num_splits, rkv, out + slot * rkv,
                  lse_out + slot);
    }
  });
  return absl::OkStatus();
}

}  // namespace mlag::host
