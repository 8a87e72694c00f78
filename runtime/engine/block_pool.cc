#include "runtime/engine/block_pool.h"

#include <algorithm>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace mlag {
namespace {

// What a block's hash covers: the parent's hash and the block's token ids.
struct ChainedBlock {
  uint64_t parent_hash;
  absl::Span<const int32_t> tokens;

  template <typename H>
  friend H AbslHashValue(H h, const ChainedBlock& b) {
    h = H::combine(std::move(h), b.parent_hash);
    h = H::combine_contiguous(std::move(h), b.tokens.data(), b.tokens.size());
    return H::combine(std::move(h), b.tokens.size());
  }
};

}  // namespace

BlockPool::BlockKey BlockPool::MakeKey(uint64_t parent_hash, absl::Span<const int32_t> tokens) {
  BlockKey key;
  key.hash = static_cast<uint64_t>(absl::Hash<ChainedBlock>{}(ChainedBlock{parent_hash, tokens}));
  key.parent_hash = parent_hash;
  key.tokens.assign(tokens.begin(), tokens.end());
  return key;
}

BlockPool::BlockPool(int num_blocks)
    : num_blocks_(std::max(num_blocks, 1)),
      ref_count_(num_blocks_, 0),
      prev_(num_blocks_, kNone),
      next_(num_blocks_, kNone),
      in_queue_(num_blocks_, false),
      keys_(num_blocks_) {
  for (int b = 1; b < num_blocks_; ++b) PushTail(b);
}

void BlockPool::PushTail(int block) {
  prev_[block] = tail_;
  next_[block] = kNone;
  if (tail_ == kNone) {
    head_ = block;
  } else {
    next_[tail_] = block;
  }
  tail_ = block;
  in_queue_[block] = true;
  ++num_free_;
}

void BlockPool::Unlink(int block) {
  const int p = prev_[block];
  const int n = next_[block];
  if (p == kNone) {
    head_ = n;
  } else {
    next_[p] = n;
  }
  if (n == kNone) {
    tail_ = p;
  } else {
    prev_[n] = p;
  }
  prev_[block] = kNone;
  next_[block] = kNone;
  in_queue_[block] = false;
  --num_free_;
}

void BlockPool::Evict(int block) {
  if (!keys_[block].has_value()) return;
  auto it = by_hash_.find(keys_[block]->hash);
  if (it != by_hash_.end()) {
    std::vector<int>& blocks = it->second;
    blocks.erase(std::remove(blocks.begin(), blocks.end(), block), blocks.end());
    if (blocks.empty()) by_hash_.erase(it);
  }
  keys_[block].reset();
  --num_cached_;
}

absl::StatusOr<std::vector<int>> BlockPool::Allocate(int n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("Allocate: negative count ", n));
  if (n > num_free_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Allocate: ", n, " blocks requested, ", num_free_, " free"));
  }
  std::vector<int> blocks;
  blocks.reserve(n);
  for (int i = 0; i < n; ++i) {
    const int b = head_;
    Unlink(b);
    Evict(b);
    ref_count_[b] = 1;
    blocks.push_back(b);
  }
  return blocks;
}

int BlockPool::Lookup(const BlockKey& key) const {
  auto it = by_hash_.find(key.hash);
  if (it == by_hash_.end()) return -1;
  for (int b : it->second) {
    if (*keys_[b] == key) return b;
  }
  return -1;
}

void BlockPool::Touch(int block) {
  if (!IsUsable(block)) return;
  if (ref_count_[block] == 0) {
    if (!keys_[block].has_value()) return;
    Unlink(block);
  }
  ++ref_count_[block];
}

void BlockPool::Cache(int block, BlockKey key) {
  if (!IsUsable(block) || ref_count_[block] == 0 || keys_[block].has_value()) return;
  if (Lookup(key) != -1) return;
  by_hash_[key.hash].push_back(block);
  keys_[block] = std::move(key);
  ++num_cached_;
}

absl::Status BlockPool::Free(absl::Span<const int> blocks) {
  // Check the whole call first so that misuse changes nothing.
  absl::flat_hash_map<int, int> releases;
  for (int b : blocks) {
    if (!IsUsable(b)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Free: block ", b, " is not a usable block (usable: 1..", num_blocks_ - 1, ")"));
    }
    if (++releases[b] > ref_count_[b]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Free: block ", b, " released more often than its ", ref_count_[b], " references"));
    }
  }
  for (int b : blocks) {
    if (--ref_count_[b] == 0) PushTail(b);
  }
  return absl::OkStatus();
}

int BlockPool::ref_count(int block) const { return IsUsable(block) ? ref_count_[block] : 0; }

bool BlockPool::is_cached(int block) const { return IsUsable(block) && keys_[block].has_value(); }

std::vector<int> BlockPool::FreeQueueOrder() const {
  std::vector<int> order;
  order.reserve(num_free_);
  for (int b = head_; b != kNone; b = next_[b]) order.push_back(b);
  return order;
}

}  // namespace mlag
