// The KV block pool: host-side bookkeeping of which paged-KV blocks are in use,
// which hold a cached prefix, and which are free, following vLLM v1's block
// pool. Blocks are indices into the device KV tensors (never pointers), so a
// captured graph that reads a block table stays valid; this class owns no
// tensor memory.
//
// Block 0 is the null block: it is never allocated, freed or cached, and
// unused block-table entries point at it. Blocks 1..num_blocks()-1 are usable.
//
// Each usable block has a reference count (the number of requests whose block
// table holds it). Blocks with count 0 sit in the free queue, a doubly linked
// list in LRU order: Allocate pops from the head, Free appends to the tail. A
// freed block keeps its cached key (its KV stays valid) until Allocate pops it
// and evicts the key, so a later request with the same prefix can take it back
// with Lookup + Touch, which also removes it from the middle of the queue.
//
// Not thread-safe; the scheduler owns one pool.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mlag {

class BlockPool {
 public:
  // Identity of a full block of tokens: its chained hash plus what the hash
  // was computed from. Two keys are the same block content only if parent_hash
  // and tokens are equal; `hash` alone only narrows the search, so a 64-bit
  // hash collision cannot produce a false hit.
  struct BlockKey {
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    std::vector<int32_t> tokens;

    friend bool operator==(const BlockKey& a, const BlockKey& b) {
      return a.hash == b.hash && a.parent_hash == b.parent_hash && a.tokens == b.tokens;
    }
    friend bool operator!=(const BlockKey& a, const BlockKey& b) { return !(a == b); }
  };

  // The parent hash of a request's first block.
  static constexpr uint64_t kRootHash = 0x6d6c616772617068ull;  // "mlagraph"

  // The key of the block holding `tokens` whose predecessor in the sequence
  // has hash `parent_hash` (kRootHash for the first block). The hash is
  // absl::Hash of (parent_hash, tokens): stable within a process only, which
  // is all a process-local cache needs.
  //
  //   uint64_t parent = BlockPool::kRootHash;
  //   for (each full block b of the prompt) {
  //     BlockPool::BlockKey key = BlockPool::MakeKey(parent, b_tokens);
  //     ...
  //     parent = key.hash;
  //   }
  static BlockKey MakeKey(uint64_t parent_hash, absl::Span<const int32_t> tokens);

  // A pool of `num_blocks` blocks including the null block (values below 1
  // are treated as 1: a pool with nothing to hand out). Every usable block
  // starts free, uncached, and in the free queue in index order.
  explicit BlockPool(int num_blocks);

  // Pops `n` blocks from the head of the free queue, evicting any cached key
  // they held, and gives each a reference count of 1. The result is in pop
  // order. ResourceExhausted, with nothing changed, when fewer than `n` blocks
  // are free; InvalidArgument for a negative `n`.
  absl::StatusOr<std::vector<int>> Allocate(int n);

  // The block holding exactly `key` (hash, parent hash and tokens all equal),
  // or -1. The block may be in use or free.
  int Lookup(const BlockKey& key) const;

  // Takes one more reference on `block`, a block returned by Lookup (or one
  // already in use). A block whose count was 0 leaves the free queue. Ignores
  // the null block, out-of-range ids and free blocks that hold no key (taking
  // one of those would be an allocation that skipped eviction order).
  void Touch(int block);

  // Records `key` as the content of `block`, a full in-use block whose KV has
  // been computed. No-op if `key` is already cached in some block, if `block`
  // already has a key, or if `block` is the null block, out of range, or free.
  // The key is kept until Allocate evicts the block.
  void Cache(int block, BlockKey key);

  // Drops one reference per listed block, in the given order; blocks reaching
  // 0 are appended to the free-queue tail in that order and keep their keys.
  // A block may be listed more than once if it holds that many references.
  // Misuse — the null block, an out-of-range id, or more releases of a block
  // than it has references — returns InvalidArgument / FailedPrecondition and
  // changes nothing (the whole call is checked before any block is released).
  absl::Status Free(absl::Span<const int> blocks);

  // Reference count of `block` (0 for free blocks, the null block and
  // out-of-range ids).
  int ref_count(int block) const;
  // Whether `block` holds a cached key (false for invalid ids).
  bool is_cached(int block) const;
  // Blocks with reference count 0, cached or not (the null block excluded).
  int num_free_blocks() const { return num_free_; }
  // Total blocks including the null block.
  int num_blocks() const { return num_blocks_; }
  // Blocks holding a cached key, in use or free.
  int num_cached_blocks() const { return num_cached_; }
  // The free queue from head (next to be allocated) to tail. For tests and
  // debugging: O(num_free_blocks()).
  std::vector<int> FreeQueueOrder() const;

 private:
  static constexpr int kNone = -1;

  bool IsUsable(int block) const { return block >= 1 && block < num_blocks_; }
  void PushTail(int block);
  void Unlink(int block);
  void Evict(int block);

  int num_blocks_;
  int num_free_ = 0;
  int num_cached_ = 0;
  std::vector<int> ref_count_;
  // Free queue links; kNone at the ends and for blocks not in the queue.
  std::vector<int> prev_;
  std::vector<int> next_;
  std::vector<bool> in_queue_;
  int head_ = kNone;
  int tail_ = kNone;
  // keys_[b] is the cached key of block b, if any.
  std::vector<std::optional<BlockKey>> keys_;
  // hash -> blocks whose key has that hash (almost always one; more only on a
  // 64-bit collision between different contents).
  absl::flat_hash_map<uint64_t, std::vector<int>> by_hash_;
};

}  // namespace mlag
