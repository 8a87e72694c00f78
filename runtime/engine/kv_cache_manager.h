// Per-request KV cache bookkeeping on top of a BlockPool: each request's block
// table (block indices, in sequence order; token t of the request lives in
// block_table[t / block_size] at offset t % block_size), prefix-cache lookups
// when a request starts, caching of blocks as their KV gets computed, and
// release when the request ends or is preempted. Host-side only; no tensors.
//
// Typical use by the scheduler:
//
//   KvCacheManager kv(num_blocks, block_size, /*enable_prefix_caching=*/true);
//   int num_computed = kv.AcquireCachedPrefix(id, prompt);   // skip these
//   if (!kv.EnsureCapacity(id, num_computed + chunk)) { /* preempt someone */ }
//   ... run the model on tokens [num_computed, num_computed + chunk) ...
//   kv.CacheComputedBlocks(id, prompt, num_computed + chunk);
//   ...
//   kv.Free(id);  // finished or preempted (recompute later)
//
// Not thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "runtime/engine/block_pool.h"

namespace mlag {

class KvCacheManager {
 public:
  using RequestId = int64_t;

  // `num_blocks` includes the null block 0 (see BlockPool); `block_size` is
  // tokens per block (values below 1 are treated as 1). With
  // `enable_prefix_caching` false, nothing is ever cached or looked up.
  KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching);

  // For a request whose block table is empty (a new or preempted request):
  // finds the longest run of cached full blocks at the start of `tokens`,
  // takes a reference on each, makes them the start of the block table, and
  // returns how many tokens they hold (a multiple of block_size()). At least
  // one token is always left to compute, so a fully cached prompt of length L
  // reuses at most (L - 1) / block_size() blocks. Returns 0, touching nothing,
  // when caching is disabled or the request already has blocks. Counts
  // tokens.size() queried tokens and the result as hit tokens.
  int AcquireCachedPrefix(RequestId id, absl::Span<const int32_t> tokens);

  // Grows the request's block table (creating the request if new) to hold
  // `num_tokens` tokens, allocating from the pool. Returns false, changing
  // nothing, if the pool has too few free blocks. Never shrinks.
  bool EnsureCapacity(RequestId id, int num_tokens);

  // Caches every full block of the request whose tokens (`tokens`, the
  // request's whole sequence so far) are all computed, i.e. lie in
  // tokens[0, num_computed), and that this request has not cached yet. Blocks
  // taken by AcquireCachedPrefix count as done. A block whose content is
  // already cached elsewhere stays uncached (its twin serves later hits). No-op
  // with caching disabled or for an unknown id.
  void CacheComputedBlocks(RequestId id, absl::Span<const int32_t> tokens, int num_computed);

  // Releases the request's blocks in reverse table order, so that the tail of
  // its chain is evicted before the prefix others may share, and forgets the
  // request. No-op for an unknown id.
  void Free(RequestId id);

  // Like Free, for a request that AcquireCachedPrefix served but that could
  // not be admitted: its query is also withdrawn from the hit statistics (it
  // will be asked again when the request is retried).
  void Withdraw(RequestId id);

  // The request's block table; an empty vector for unknown ids. The reference
  // is valid until the next call that changes any request.
  const std::vector<int>& block_table(RequestId id) const;
  // Tokens the request's blocks can hold (0 for unknown ids).
  int num_tokens_capacity(RequestId id) const;

  int block_size() const { return block_size_; }
  int num_free_blocks() const { return pool_.num_free_blocks(); }
  int num_blocks() const { return pool_.num_blocks(); }
  // Prefix-cache statistics over all AcquireCachedPrefix calls that looked.
  int64_t hit_tokens() const { return hit_tokens_; }
  int64_t queried_tokens() const { return queried_tokens_; }
  // hit_tokens / queried_tokens, 0 before any query.
  double prefix_cache_hit_rate() const;
  // Sorted distinct blocks with a reference count above 0.
  std::vector<int> BlocksInUse() const;
  // Sorted blocks whose contents matter: in use, or holding a cached prefix
  // that a later request may reuse, plus the null block (0). The rest are
  // free and hold nothing anyone will read.
  std::vector<int> LiveBlocks() const;

  // The underlying pool, for inspection (tests, stats).
  const BlockPool& pool() const { return pool_; }

 private:
  struct Request {
    std::vector<int> block_table;
    // Leading blocks of block_table already handed to the cache (or taken
    // from it), and the chained hash of the last of them.
    int num_hashed_blocks = 0;
    uint64_t last_hash = BlockPool::kRootHash;
    // What AcquireCachedPrefix added to the hit statistics for this request.
    int64_t queried_tokens = 0;
    int64_t hit_tokens = 0;
  };

  BlockPool pool_;
  int block_size_;
  bool enable_prefix_caching_;
  absl::flat_hash_map<RequestId, Request> requests_;
  int64_t hit_tokens_ = 0;
  int64_t queried_tokens_ = 0;
};

}  // namespace mlag
