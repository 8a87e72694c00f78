// BlockPool and KvCacheManager: allocation, prefix-cache hits, LRU eviction,
// reference counts, misuse, and a randomized run against a reference model
// that identifies cached blocks by their full token prefix (no hashing).
#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/engine/block_pool.h"
#include "runtime/engine/kv_cache_manager.h"
#include "tests/status_matchers.h"

namespace mlag {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Key = BlockPool::BlockKey;

std::vector<int32_t> Iota(int n, int32_t start) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

// Everything observable about a pool, to check a failed call changed nothing.
struct PoolSnapshot {
  std::vector<int> refs;
  std::vector<bool> cached;
  std::vector<int> queue;
  int num_free;
  int num_cached;
  bool operator==(const PoolSnapshot& o) const {
    return refs == o.refs && cached == o.cached && queue == o.queue && num_free == o.num_free &&
           num_cached == o.num_cached;
  }
};

PoolSnapshot Snapshot(const BlockPool& pool) {
  PoolSnapshot s;
  for (int b = 0; b < pool.num_blocks(); ++b) {
    s.refs.push_back(pool.ref_count(b));
    s.cached.push_back(pool.is_cached(b));
  }
  s.queue = pool.FreeQueueOrder();
  s.num_free = pool.num_free_blocks();
  s.num_cached = pool.num_cached_blocks();
  return s;
}

TEST(BlockPoolTest, InitialStateAndAllocation) {
  BlockPool pool(8);
  EXPECT_EQ(pool.num_blocks(), 8);
  EXPECT_EQ(pool.num_free_blocks(), 7);
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(1, 2, 3, 4, 5, 6, 7));

  auto blocks = pool.Allocate(3);
  ASSERT_OK(blocks);
  EXPECT_THAT(*blocks, ElementsAre(1, 2, 3));
  for (int b : *blocks) EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(4, 5, 6, 7));

  auto none = pool.Allocate(0);
  ASSERT_OK(none);
  EXPECT_THAT(*none, IsEmpty());
  EXPECT_EQ(pool.Allocate(-1).status().code(), absl::StatusCode::kInvalidArgument);

  // Freed blocks go to the tail in the order given.
  ASSERT_OK(pool.Free({3, 1}));
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(4, 5, 6, 7, 3, 1));
  EXPECT_EQ(pool.ref_count(1), 0);
  EXPECT_EQ(pool.ref_count(2), 1);
}

TEST(BlockPoolTest, NullBlockNeverHandedOut) {
  BlockPool pool(5);
  for (int round = 0; round < 3; ++round) {
    auto blocks = pool.Allocate(4);
    ASSERT_OK(blocks);
    EXPECT_THAT(*blocks, ::testing::Not(::testing::Contains(0)));
    EXPECT_EQ(pool.num_free_blocks(), 0);
    EXPECT_EQ(pool.Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(pool.ref_count(0), 0);
    ASSERT_OK(pool.Free(*blocks));
  }
  // Block 0 can be neither cached, touched nor freed.
  pool.Cache(0, BlockPool::MakeKey(BlockPool::kRootHash, Iota(4, 0)));
  EXPECT_FALSE(pool.is_cached(0));
  pool.Touch(0);
  EXPECT_EQ(pool.ref_count(0), 0);
  EXPECT_EQ(pool.Free({0}).code(), absl::StatusCode::kInvalidArgument);

  // Through the manager: exhaust the pool; no table holds block 0.
  KvCacheManager kv(5, 2, true);
  EXPECT_TRUE(kv.EnsureCapacity(1, 5));  // 3 blocks
  EXPECT_TRUE(kv.EnsureCapacity(2, 2));  // 1 block
  EXPECT_FALSE(kv.EnsureCapacity(3, 1));
  EXPECT_EQ(kv.num_free_blocks(), 0);
  EXPECT_THAT(kv.BlocksInUse(), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(kv.block_table(1), ::testing::Not(::testing::Contains(0)));
  EXPECT_THAT(kv.block_table(2), ::testing::Not(::testing::Contains(0)));
}

TEST(BlockPoolTest, AllocateFailureLeavesStateUnchanged) {
  BlockPool pool(6);
  auto blocks = pool.Allocate(3);
  ASSERT_OK(blocks);
  pool.Cache((*blocks)[0], BlockPool::MakeKey(BlockPool::kRootHash, Iota(4, 0)));
  pool.Cache((*blocks)[1], BlockPool::MakeKey(BlockPool::kRootHash, Iota(4, 10)));
  ASSERT_OK(pool.Free({(*blocks)[1], (*blocks)[0]}));
  const PoolSnapshot before = Snapshot(pool);
  EXPECT_EQ(before.num_free, 4);
  EXPECT_EQ(before.num_cached, 2);

  auto too_many = pool.Allocate(5);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Snapshot(pool) == before);
  EXPECT_EQ(pool.Lookup(BlockPool::MakeKey(BlockPool::kRootHash, Iota(4, 0))), (*blocks)[0]);
}

TEST(BlockPoolTest, FreeMisuseChangesNothing) {
  BlockPool pool(6);
  auto blocks = pool.Allocate(2);  // {1, 2}
  ASSERT_OK(blocks);
  const PoolSnapshot before = Snapshot(pool);
  EXPECT_EQ(pool.Free({0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Free({6}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Free({-1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Free({3}).code(), absl::StatusCode::kFailedPrecondition);  // free block
  // The first release of 1 would be valid; the second is not: all or nothing.
  EXPECT_EQ(pool.Free({1, 1}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.Free({2, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Snapshot(pool) == before);

  // Two references may be released in one call.
  pool.Touch(1);
  EXPECT_EQ(pool.ref_count(1), 2);
  EXPECT_OK(pool.Free({1, 1}));
  EXPECT_EQ(pool.ref_count(1), 0);
  EXPECT_THAT(pool.FreeQueueOrder(), ElementsAre(3, 4, 5, 1));
}

TEST(BlockPoolTest, TouchAndCacheMisuseAreIgnored) {
  BlockPool pool(6);
  const Key key = BlockPool::MakeKey(BlockPool::kRootHash, Iota(4, 0));
  // A free block that holds no key cannot be touched or cached.
  pool.Touch(3);
  EXPECT_EQ(pool.ref_count(3), 0);
  pool.Cache(3, key);
  EXPECT_FALSE(pool.is_cached(3));
  pool.Touch(99);
  pool.Cache(99, key);
  EXPECT_EQ(pool.num_free_blocks(), 5);
  EXPECT_EQ(pool.num_cached_blocks(), 0);

  auto blocks = pool.Allocate(2);  // {1, 2}
  ASSERT_OK(blocks);
  pool.Cache(1, key);
  EXPECT_TRUE(pool.is_cached(1));
  // Same key again, elsewhere: no-op, the first block keeps serving it.
  pool.Cache(2, key);
  EXPECT_FALSE(pool.is_cached(2));
  EXPECT_EQ(pool.Lookup(key), 1);
  // A block that has a key keeps it.
  const Key other = BlockPool::MakeKey(BlockPool::kRootHash, Iota(4, 100));
  pool.Cache(1, other);
  EXPECT_EQ(pool.Lookup(other), -1);
  EXPECT_EQ(pool.Lookup(key), 1);
  EXPECT_EQ(pool.num_cached_blocks(), 1);
}

TEST(BlockPoolTest, HashCollisionIsAMiss) {
  BlockPool pool(8);
  auto blocks = pool.Allocate(3);  // {1, 2, 3}
  ASSERT_OK(blocks);
  // Keys built by hand with one hash but different contents.
  const Key a{42, BlockPool::kRootHash, {1, 2, 3, 4}};
  const Key b{42, BlockPool::kRootHash, {5, 6, 7, 8}};
  const Key c{42, 7, {1, 2, 3, 4}};  // a's tokens, another parent
  pool.Cache(1, a);
  EXPECT_EQ(pool.Lookup(a), 1);
  EXPECT_EQ(pool.Lookup(b), -1);
  EXPECT_EQ(pool.Lookup(c), -1);
  // The colliding contents can both be cached and found.
  pool.Cache(2, b);
  pool.Cache(3, c);
  EXPECT_EQ(pool.num_cached_blocks(), 3);
  EXPECT_EQ(pool.Lookup(a), 1);
  EXPECT_EQ(pool.Lookup(b), 2);
  EXPECT_EQ(pool.Lookup(c), 3);
  // Evicting one leaves the others findable.
  ASSERT_OK(pool.Free({2}));
  auto all = pool.Allocate(5);  // 4, 5, 6, 7, then 2 (evicted)
  ASSERT_OK(all);
  EXPECT_EQ(all->back(), 2);
  EXPECT_FALSE(pool.is_cached(2));
  EXPECT_EQ(pool.Lookup(b), -1);
  EXPECT_EQ(pool.Lookup(a), 1);
  EXPECT_EQ(pool.Lookup(c), 3);

  // Real keys: the hash covers parent and tokens.
  const Key k1 = BlockPool::MakeKey(BlockPool::kRootHash, {1, 2, 3, 4});
  const Key k2 = BlockPool::MakeKey(BlockPool::kRootHash, {1, 2, 3, 5});
  const Key k3 = BlockPool::MakeKey(k1.hash, {1, 2, 3, 4});
  EXPECT_NE(k1.hash, k2.hash);
  EXPECT_NE(k1.hash, k3.hash);
  EXPECT_EQ(k1, BlockPool::MakeKey(BlockPool::kRootHash, {1, 2, 3, 4}));
}

TEST(KvCacheManagerTest, CacheHitSharesBlocks) {
  KvCacheManager kv(16, 4, true);
  const std::vector<int32_t> prompt = Iota(10, 100);
  EXPECT_EQ(kv.AcquireCachedPrefix(1, prompt), 0);
  ASSERT_TRUE(kv.EnsureCapacity(1, 10));
  EXPECT_THAT(kv.block_table(1), ElementsAre(1, 2, 3));
  EXPECT_EQ(kv.num_tokens_capacity(1), 12);
  kv.CacheComputedBlocks(1, prompt, 10);
  EXPECT_TRUE(kv.pool().is_cached(1));
  EXPECT_TRUE(kv.pool().is_cached(2));
  EXPECT_FALSE(kv.pool().is_cached(3));  // partial block

  EXPECT_EQ(kv.AcquireCachedPrefix(2, prompt), 8);
  EXPECT_THAT(kv.block_table(2), ElementsAre(1, 2));
  ASSERT_TRUE(kv.EnsureCapacity(2, 10));
  EXPECT_THAT(kv.block_table(2), ElementsAre(1, 2, 4));
  EXPECT_EQ(kv.pool().ref_count(1), 2);
  EXPECT_EQ(kv.pool().ref_count(2), 2);
  EXPECT_EQ(kv.pool().ref_count(3), 1);
  EXPECT_EQ(kv.pool().ref_count(4), 1);
  EXPECT_EQ(kv.queried_tokens(), 20);
  EXPECT_EQ(kv.hit_tokens(), 8);
  EXPECT_DOUBLE_EQ(kv.prefix_cache_hit_rate(), 0.4);

  // A different first block misses entirely even if later tokens match.
  std::vector<int32_t> other = prompt;
  other[0] = 7;
  EXPECT_EQ(kv.AcquireCachedPrefix(3, other), 0);
  EXPECT_THAT(kv.block_table(3), IsEmpty());
}

TEST(KvCacheManagerTest, SharedPrefixReferenceCounts) {
  KvCacheManager kv(12, 2, true);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5};
  std::vector<int32_t> b = {1, 2, 3, 4, 9, 9, 9};
  kv.AcquireCachedPrefix(1, a);
  ASSERT_TRUE(kv.EnsureCapacity(1, 5));  // {1, 2, 3}
  kv.CacheComputedBlocks(1, a, 5);       // caches 1, 2
  EXPECT_EQ(kv.AcquireCachedPrefix(2, b), 4);
  ASSERT_TRUE(kv.EnsureCapacity(2, 7));  // {1, 2, 4, 5}
  kv.CacheComputedBlocks(2, b, 7);       // caches 4
  EXPECT_THAT(kv.block_table(2), ElementsAre(1, 2, 4, 5));
  EXPECT_TRUE(kv.pool().is_cached(4));
  EXPECT_FALSE(kv.pool().is_cached(5));
  EXPECT_EQ(kv.pool().ref_count(1), 2);
  EXPECT_EQ(kv.pool().ref_count(2), 2);
  EXPECT_THAT(kv.BlocksInUse(), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(kv.LiveBlocks(), ElementsAre(0, 1, 2, 3, 4, 5));

  kv.Free(1);
  EXPECT_EQ(kv.pool().ref_count(1), 1);
  EXPECT_EQ(kv.pool().ref_count(2), 1);
  EXPECT_EQ(kv.pool().ref_count(3), 0);
  EXPECT_THAT(kv.pool().FreeQueueOrder(), ElementsAre(6, 7, 8, 9, 10, 11, 3));
  EXPECT_THAT(kv.block_table(1), IsEmpty());

  kv.Free(2);  // reverse order: 5, 4, 2, 1
  EXPECT_THAT(kv.pool().FreeQueueOrder(), ElementsAre(6, 7, 8, 9, 10, 11, 3, 5, 4, 2, 1));
  EXPECT_THAT(kv.BlocksInUse(), IsEmpty());
  // Free but cached (1, 2, 4) stay live: a later prompt may reuse them.
  EXPECT_THAT(kv.LiveBlocks(), ElementsAre(0, 1, 2, 4));
  EXPECT_EQ(kv.num_free_blocks(), 11);
  kv.Free(2);  // unknown: no-op
  kv.Free(12345);
  EXPECT_EQ(kv.num_free_blocks(), 11);
}

TEST(KvCacheManagerTest, EvictionIsLruAndTailFirst) {
  // 6 usable blocks, 2 tokens each.
  KvCacheManager kv(7, 2, true);
  const std::vector<int32_t> a = {1, 1, 2, 2, 3, 3};
  const std::vector<int32_t> b = {4, 4, 5, 5};
  kv.AcquireCachedPrefix(1, a);
  ASSERT_TRUE(kv.EnsureCapacity(1, 6));  // {1, 2, 3}
  kv.CacheComputedBlocks(1, a, 6);
  kv.AcquireCachedPrefix(2, b);
  ASSERT_TRUE(kv.EnsureCapacity(2, 4));  // {4, 5}
  kv.CacheComputedBlocks(2, b, 4);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 5);
  kv.Free(1);  // queue: 6, 3, 2, 1
  kv.Free(2);  // queue: 6, 3, 2, 1, 5, 4
  EXPECT_THAT(kv.pool().FreeQueueOrder(), ElementsAre(6, 3, 2, 1, 5, 4));

  // The uncached block goes first, then a's chain tail.
  ASSERT_TRUE(kv.EnsureCapacity(3, 2));
  EXPECT_THAT(kv.block_table(3), ElementsAre(6));
  EXPECT_EQ(kv.pool().num_cached_blocks(), 5);
  ASSERT_TRUE(kv.EnsureCapacity(3, 4));
  EXPECT_THAT(kv.block_table(3), ElementsAre(6, 3));
  EXPECT_FALSE(kv.pool().is_cached(3));
  EXPECT_TRUE(kv.pool().is_cached(2));
  EXPECT_EQ(kv.pool().num_cached_blocks(), 4);

  // a's first two blocks are still there; b (freed later) is untouched.
  EXPECT_EQ(kv.AcquireCachedPrefix(4, a), 4);
  EXPECT_THAT(kv.block_table(4), ElementsAre(1, 2));
  EXPECT_THAT(kv.pool().FreeQueueOrder(), ElementsAre(5, 4));
  // Next eviction: 5, which is b's tail, not its head.
  ASSERT_TRUE(kv.EnsureCapacity(4, 6));
  EXPECT_THAT(kv.block_table(4), ElementsAre(1, 2, 5));
  EXPECT_FALSE(kv.pool().is_cached(5));
  EXPECT_TRUE(kv.pool().is_cached(4));
  EXPECT_EQ(kv.AcquireCachedPrefix(5, {4, 4, 5, 5, 6}), 2);
  EXPECT_THAT(kv.block_table(5), ElementsAre(4));
}

TEST(KvCacheManagerTest, HitOnFreeCachedBlockLeavesFreeQueue) {
  KvCacheManager kv(8, 4, true);
  const std::vector<int32_t> prompt = Iota(9, 0);
  kv.AcquireCachedPrefix(1, prompt);
  ASSERT_TRUE(kv.EnsureCapacity(1, 9));  // {1, 2, 3}
  kv.CacheComputedBlocks(1, prompt, 9);
  kv.Free(1);
  EXPECT_THAT(kv.pool().FreeQueueOrder(), ElementsAre(4, 5, 6, 7, 3, 2, 1));
  EXPECT_EQ(kv.num_free_blocks(), 7);

  EXPECT_EQ(kv.AcquireCachedPrefix(2, prompt), 8);
  EXPECT_THAT(kv.pool().FreeQueueOrder(), ElementsAre(4, 5, 6, 7, 3));
  EXPECT_EQ(kv.num_free_blocks(), 5);
  EXPECT_EQ(kv.pool().ref_count(1), 1);
  EXPECT_EQ(kv.pool().ref_count(2), 1);
}

TEST(KvCacheManagerTest, PrefixLeavesOneTokenToCompute) {
  KvCacheManager kv(16, 4, true);
  const std::vector<int32_t> prompt = Iota(8, 0);
  kv.AcquireCachedPrefix(1, prompt);
  ASSERT_TRUE(kv.EnsureCapacity(1, 8));
  kv.CacheComputedBlocks(1, prompt, 8);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 2);

  // Fully cached: (8 - 1) / 4 = 1 block.
  EXPECT_EQ(kv.AcquireCachedPrefix(2, prompt), 4);
  EXPECT_THAT(kv.block_table(2), ElementsAre(1));
  // One more token: both blocks.
  std::vector<int32_t> longer = prompt;
  longer.push_back(99);
  EXPECT_EQ(kv.AcquireCachedPrefix(3, longer), 8);
  // Shorter than a block, or empty: nothing.
  EXPECT_EQ(kv.AcquireCachedPrefix(4, Iota(4, 0)), 0);
  EXPECT_EQ(kv.AcquireCachedPrefix(5, {}), 0);
  // A request that already has blocks is not looked up again.
  EXPECT_EQ(kv.AcquireCachedPrefix(3, longer), 0);
  EXPECT_THAT(kv.block_table(3), ElementsAre(1, 2));
}

TEST(KvCacheManagerTest, CachesOnlyComputedFullBlocks) {
  KvCacheManager kv(16, 4, true);
  const std::vector<int32_t> prompt = Iota(12, 0);
  kv.AcquireCachedPrefix(1, prompt);
  ASSERT_TRUE(kv.EnsureCapacity(1, 12));
  kv.CacheComputedBlocks(1, prompt, 5);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 1);
  kv.CacheComputedBlocks(1, prompt, 7);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 1);
  kv.CacheComputedBlocks(1, prompt, 12);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 3);
  kv.CacheComputedBlocks(1, prompt, 12);  // idempotent
  EXPECT_EQ(kv.pool().num_cached_blocks(), 3);
  kv.CacheComputedBlocks(99, prompt, 12);  // unknown id
  EXPECT_EQ(kv.pool().num_cached_blocks(), 3);
  // The chained keys are the ones a lookup computes.
  EXPECT_EQ(kv.AcquireCachedPrefix(2, Iota(13, 0)), 12);
}

TEST(KvCacheManagerTest, EnsureCapacityFailureChangesNothing) {
  KvCacheManager kv(5, 4, true);
  ASSERT_TRUE(kv.EnsureCapacity(1, 8));  // {1, 2}
  EXPECT_FALSE(kv.EnsureCapacity(1, 20));
  EXPECT_THAT(kv.block_table(1), ElementsAre(1, 2));
  EXPECT_EQ(kv.num_free_blocks(), 2);
  EXPECT_FALSE(kv.EnsureCapacity(2, 13));
  EXPECT_THAT(kv.block_table(2), IsEmpty());
  EXPECT_EQ(kv.num_tokens_capacity(2), 0);
  EXPECT_TRUE(kv.EnsureCapacity(1, 16));
  EXPECT_THAT(kv.block_table(1), ElementsAre(1, 2, 3, 4));
  EXPECT_TRUE(kv.EnsureCapacity(1, 3));  // never shrinks
  EXPECT_EQ(kv.num_tokens_capacity(1), 16);
}

TEST(KvCacheManagerTest, CachingDisabled) {
  KvCacheManager kv(16, 4, false);
  const std::vector<int32_t> prompt = Iota(9, 0);
  EXPECT_EQ(kv.AcquireCachedPrefix(1, prompt), 0);
  ASSERT_TRUE(kv.EnsureCapacity(1, 9));
  kv.CacheComputedBlocks(1, prompt, 9);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 0);
  EXPECT_EQ(kv.AcquireCachedPrefix(2, prompt), 0);
  EXPECT_EQ(kv.hit_tokens(), 0);
  EXPECT_EQ(kv.prefix_cache_hit_rate(), 0.0);
}

// ---------------------------------------------------------------------------
// Randomized comparison against a reference model. The model names a cached
// block by the whole token prefix ending with it, so it needs no hashing and
// catches any chaining or verification mistake in the real pool.
class ReferenceKv {
 public:
  struct Req {
    std::vector<int32_t> tokens;
    std::vector<int> table;
    int num_hashed = 0;
  };

  ReferenceKv(int num_blocks, int block_size)
      : bs_(block_size), refs_(num_blocks, 0), key_of_(num_blocks) {
    for (int b = 1; b < num_blocks; ++b) free_.push_back(b);
  }

  int Acquire(int64_t id, const std::vector<int32_t>& tokens) {
    Req& r = reqs_[id];
    queried_ += static_cast<int64_t>(tokens.size());
    const int max_blocks = tokens.empty() ? 0 : (static_cast<int>(tokens.size()) - 1) / bs_;
    for (int i = 0; i < max_blocks; ++i) {
      auto it = cache_.find(Prefix(tokens, i + 1));
      if (it == cache_.end()) break;
      const int b = it->second;
      if (refs_[b] == 0) free_.remove(b);
      ++refs_[b];
      r.table.push_back(b);
    }
    r.num_hashed = static_cast<int>(r.table.size());
    hits_ += static_cast<int64_t>(r.table.size()) * bs_;
    return static_cast<int>(r.table.size()) * bs_;
  }

  bool Ensure(int64_t id, int num_tokens) {
    const int have = reqs_.count(id) ? static_cast<int>(reqs_[id].table.size()) : 0;
    const int need = (num_tokens + bs_ - 1) / bs_ - have;
    if (need > static_cast<int>(free_.size())) return false;
    Req& r = reqs_[id];
    for (int i = 0; i < need; ++i) {
      const int b = free_.front();
      free_.pop_front();
      if (!key_of_[b].empty()) {
        cache_.erase(key_of_[b]);
        key_of_[b].clear();
      }
      refs_[b] = 1;
      r.table.push_back(b);
    }
    return true;
  }

  void CacheComputed(int64_t id, const std::vector<int32_t>& tokens, int num_computed) {
    Req& r = reqs_.at(id);
    const int num_full = std::min(num_computed / bs_, static_cast<int>(r.table.size()));
    for (int i = r.num_hashed; i < num_full; ++i) {
      std::vector<int32_t> key = Prefix(tokens, i + 1);
      const int b = r.table[i];
      if (cache_.count(key) || !key_of_[b].empty()) continue;
      cache_[key] = b;
      key_of_[b] = key;
    }
    r.num_hashed = std::max(r.num_hashed, num_full);
  }

  void Free(int64_t id) {
    Req& r = reqs_.at(id);
    for (auto it = r.table.rbegin(); it != r.table.rend(); ++it) {
      if (--refs_[*it] == 0) free_.push_back(*it);
    }
    reqs_.erase(id);
  }

  std::vector<int32_t> Prefix(const std::vector<int32_t>& tokens, int num_blocks) const {
    return std::vector<int32_t>(tokens.begin(), tokens.begin() + num_blocks * bs_);
  }

  int bs_;
  std::vector<int> refs_;
  std::list<int> free_;
  std::map<std::vector<int32_t>, int> cache_;
  std::vector<std::vector<int32_t>> key_of_;  // empty: not cached
  std::map<int64_t, Req> reqs_;
  int64_t queried_ = 0;
  int64_t hits_ = 0;
};

void ExpectSameState(const KvCacheManager& kv, const ReferenceKv& ref, int step) {
  SCOPED_TRACE(::testing::Message() << "after operation " << step);
  const BlockPool& pool = kv.pool();
  ASSERT_EQ(pool.num_free_blocks(), static_cast<int>(ref.free_.size()));
  ASSERT_EQ(pool.FreeQueueOrder(), std::vector<int>(ref.free_.begin(), ref.free_.end()));
  int num_cached = 0;
  for (int b = 0; b < pool.num_blocks(); ++b) {
    ASSERT_EQ(pool.ref_count(b), ref.refs_[b]) << "block " << b;
    ASSERT_EQ(pool.is_cached(b), !ref.key_of_[b].empty()) << "block " << b;
    num_cached += ref.key_of_[b].empty() ? 0 : 1;
  }
  ASSERT_EQ(pool.ref_count(0), 0);
  ASSERT_FALSE(pool.is_cached(0));
  ASSERT_EQ(pool.num_cached_blocks(), num_cached);
  for (const auto& [id, r] : ref.reqs_) {
    ASSERT_EQ(kv.block_table(id), r.table) << "request " << id;
  }
  ASSERT_EQ(kv.hit_tokens(), ref.hits_);
  ASSERT_EQ(kv.queried_tokens(), ref.queried_);
}

TEST(KvCacheManagerTest, RandomizedAgainstReferenceModel) {
  constexpr int kNumBlocks = 48;
  constexpr int kBlockSize = 3;
  constexpr int kOps = 10000;
  std::mt19937 rng(20240611);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };

  // A few stems so that prompts share long prefixes; tokens from {0, 1, 2}.
  std::vector<std::vector<int32_t>> stems(4);
  for (auto& stem : stems) {
    for (int i = 0; i < 24; ++i) stem.push_back(uniform(0, 2));
  }

  KvCacheManager kv(kNumBlocks, kBlockSize, true);
  ReferenceKv ref(kNumBlocks, kBlockSize);
  struct Live {
    std::vector<int32_t> tokens;
    int num_computed;
  };
  std::map<int64_t, Live> live;
  int64_t next_id = 0;
  int num_hit_ops = 0;
  int num_evicting_allocs = 0;

  for (int step = 0; step < kOps; ++step) {
    const int op = uniform(0, 9);
    if (op < 4 || live.empty()) {
      // New request: a stem prefix plus a random tail.
      const int64_t id = next_id++;
      const std::vector<int32_t>& stem = stems[uniform(0, 3)];
      std::vector<int32_t> tokens(stem.begin(), stem.begin() + uniform(0, 24));
      for (int i = uniform(tokens.empty() ? 1 : 0, 6); i > 0; --i) tokens.push_back(uniform(0, 2));
      const int cached = kv.AcquireCachedPrefix(id, tokens);
      ASSERT_EQ(cached, ref.Acquire(id, tokens));
      num_hit_ops += cached > 0 ? 1 : 0;
      const int num_len = static_cast<int>(tokens.size());
      const int cached_before = kv.pool().num_cached_blocks();
      const bool ok = kv.EnsureCapacity(id, num_len);
      ASSERT_EQ(ok, ref.Ensure(id, num_len));
      if (!ok) {
        // As the scheduler would: give back what the lookup took.
        kv.Free(id);
        ref.Free(id);
      } else {
        num_evicting_allocs += kv.pool().num_cached_blocks() < cached_before ? 1 : 0;
        // Chunked prefill: maybe only part of the prompt is computed.
        const int num_computed = uniform(cached, num_len);
        kv.CacheComputedBlocks(id, tokens, num_computed);
        ref.CacheComputed(id, tokens, num_computed);
        live[id] = Live{tokens, num_computed};
      }
    } else if (op < 7) {
      // Extend a request by a few tokens and compute some of what is pending.
      auto it = std::next(live.begin(), uniform(0, static_cast<int>(live.size()) - 1));
      const int64_t id = it->first;
      Live& l = it->second;
      std::vector<int32_t> tokens = l.tokens;
      for (int i = uniform(1, 4); i > 0; --i) tokens.push_back(uniform(0, 2));
      const int num_len = static_cast<int>(tokens.size());
      const bool ok = kv.EnsureCapacity(id, num_len);
      ASSERT_EQ(ok, ref.Ensure(id, num_len));
      if (ok) {
        l.tokens = tokens;
        l.num_computed = uniform(l.num_computed, num_len);
        kv.CacheComputedBlocks(id, l.tokens, l.num_computed);
        ref.CacheComputed(id, l.tokens, l.num_computed);
      }
    } else {
      auto it = std::next(live.begin(), uniform(0, static_cast<int>(live.size()) - 1));
      kv.Free(it->first);
      ref.Free(it->first);
      live.erase(it);
    }
    ExpectSameState(kv, ref, step);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The run must have exercised hits and evictions, or it proved little.
  EXPECT_GT(num_hit_ops, 100);
  EXPECT_GT(num_evicting_allocs, 50);
  EXPECT_GT(kv.prefix_cache_hit_rate(), 0.0);
}

// A request served by AcquireCachedPrefix but not admitted (the pool had no
// room for the rest) gives its blocks back and its query too: retrying it
// every step must not inflate the hit statistics.
TEST(KvCacheManagerTest, WithdrawnQueryLeavesStatisticsAlone) {
  KvCacheManager kv(8, 4, true);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_EQ(kv.AcquireCachedPrefix(0, tokens), 0);
  ASSERT_TRUE(kv.EnsureCapacity(0, 9));
  kv.CacheComputedBlocks(0, tokens, 9);
  kv.Free(0);
  const int64_t queried = kv.queried_tokens(), hits = kv.hit_tokens();
  const int free_blocks = kv.num_free_blocks();
  ASSERT_EQ(kv.AcquireCachedPrefix(1, tokens), 8);
  kv.Withdraw(1);
  EXPECT_EQ(kv.queried_tokens(), queried);
  EXPECT_EQ(kv.hit_tokens(), hits);
  EXPECT_EQ(kv.num_free_blocks(), free_blocks);
  EXPECT_TRUE(kv.block_table(1).empty());
  // The cached blocks are still there for the retry.
  EXPECT_EQ(kv.AcquireCachedPrefix(1, tokens), 8);
}

}  // namespace
}  // namespace mlag
