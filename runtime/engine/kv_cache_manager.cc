#include "runtime/engine/kv_cache_manager.h"

#include <algorithm>
#include <utility>

namespace mlag {

KvCacheManager::KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching)
    : pool_(num_blocks),
      block_size_(std::max(block_size, 1)),
      enable_prefix_caching_(enable_prefix_caching) {}

int KvCacheManager::AcquireCachedPrefix(RequestId id, absl::Span<const int32_t> tokens) {
  if (!enable_prefix_caching_) return 0;
  Request& request = requests_[id];
  if (!request.block_table.empty()) return 0;
  queried_tokens_ += static_cast<int64_t>(tokens.size());

  // Leave at least one token to compute: the model must run on something to
  // produce the next token's logits.
  const size_t max_blocks = tokens.empty() ? 0 : (tokens.size() - 1) / block_size_;
  uint64_t parent = BlockPool::kRootHash;
  std::vector<int> hits;
  for (size_t i = 0; i < max_blocks; ++i) {
    BlockPool::BlockKey key =
        BlockPool::MakeKey(parent, tokens.subspan(i * block_size_, block_size_));
    const int block = pool_.Lookup(key);
    if (block < 0) break;
    hits.push_back(block);
    parent = key.hash;
  }
  for (int block : hits) pool_.Touch(block);

  request.block_table = hits;
  request.num_hashed_blocks = static_cast<int>(hits.size());
  request.last_hash = parent;
  const int num_cached_tokens = static_cast<int>(hits.size()) * block_size_;
  hit_tokens_ += num_cached_tokens;
  request.queried_tokens = static_cast<int64_t>(tokens.size());
  request.hit_tokens = num_cached_tokens;
  return num_cached_tokens;
}

void KvCacheManager::Withdraw(RequestId id) {
  auto it = requests_.find(id);
  if (it != requests_.end()) {
    queried_tokens_ -= it->second.queried_tokens;
    hit_tokens_ -= it->second.hit_tokens;
  }
  Free(id);
}

bool KvCacheManager::EnsureCapacity(RequestId id, int num_tokens) {
  auto it = requests_.find(id);
  const int have = it == requests_.end() ? 0 : static_cast<int>(it->second.block_table.size());
  const int need = (std::max(num_tokens, 0) + block_size_ - 1) / block_size_ - have;
  if (need <= 0) {
    if (it == requests_.end()) requests_.emplace(id, Request{});
    return true;
  }
  absl::StatusOr<std::vector<int>> blocks = pool_.Allocate(need);
  if (!blocks.ok()) return false;
  std::vector<int>& table = requests_[id].block_table;
  table.insert(table.end(), blocks->begin(), blocks->end());
  return true;
}

void KvCacheManager::CacheComputedBlocks(RequestId id, absl::Span<const int32_t> tokens,
                                         int num_computed) {
  if (!enable_prefix_caching_) return;
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& request = it->second;
  const size_t computed = std::min(tokens.size(), static_cast<size_t>(std::max(num_computed, 0)));
  const int num_full = std::min(static_cast<int>(computed / block_size_),
                                static_cast<int>(request.block_table.size()));
  for (int i = request.num_hashed_blocks; i < num_full; ++i) {
    BlockPool::BlockKey key = BlockPool::MakeKey(
        request.last_hash, tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_));
    request.last_hash = key.hash;
    pool_.Cache(request.block_table[i], std::move(key));
  }
  request.num_hashed_blocks = std::max(request.num_hashed_blocks, num_full);
}

void KvCacheManager::Free(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  std::vector<int> reversed(it->second.block_table.rbegin(), it->second.block_table.rend());
  // Every block in a table holds one reference for it, so this cannot fail;
  // if it ever did, the pool has already refused the call unchanged.
  pool_.Free(reversed).IgnoreError();
  requests_.erase(it);
}

const std::vector<int>& KvCacheManager::block_table(RequestId id) const {
  static const std::vector<int>* const kEmpty = new std::vector<int>();
  auto it = requests_.find(id);
  return it == requests_.end() ? *kEmpty : it->second.block_table;
}

int KvCacheManager::num_tokens_capacity(RequestId id) const {
  return static_cast<int>(block_table(id).size()) * block_size_;
}

double KvCacheManager::prefix_cache_hit_rate() const {
  if (queried_tokens_ == 0) return 0.0;
  return static_cast<double>(hit_tokens_) / static_cast<double>(queried_tokens_);
}

std::vector<int> KvCacheManager::BlocksInUse() const {
  std::vector<int> blocks;
  for (int b = 1; b < pool_.num_blocks(); ++b) {
    if (pool_.ref_count(b) > 0) blocks.push_back(b);
  }
  return blocks;
}

std::vector<int> KvCacheManager::LiveBlocks() const {
  std::vector<int> blocks = {0};
  for (int b = 1; b < pool_.num_blocks(); ++b) {
    if (pool_.ref_count(b) > 0 || pool_.is_cached(b)) blocks.push_back(b);
  }
  return blocks;
}

}  // namespace mlag
