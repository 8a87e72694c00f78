// ModelRunner's diagnostics: seeded KV fills for benchmarks and the KV
// checksums that prove dummy runs and reconfigurations leave live pages
// bit-for-bit unchanged. They read or write whole cache blocks through host
// copies, so they are for step boundaries, never the hot path.
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/random.h"
#include "runtime/core/status.h"
#include "runtime/engine/model_runner.h"

namespace mlag {

absl::Status ModelRunner::FillKvCache(uint64_t seed) {
  std::vector<float> values;
  std::vector<char> stored;
  for (size_t l = 0; l < kv_caches_.size(); ++l) {
    const Tensor& cache = kv_caches_[l];
    values.resize(static_cast<size_t>(cache.numel()));
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = 2.0f * UniformFromCounter(seed + l, i) - 1.0f;
    }
    stored.resize(cache.nbytes());
    ConvertFromF32(values.data(), cache.dtype(), stored.data(), values.size());
    MLAG_RETURN_IF_ERROR(device_->CopyFromHost(cache.data(), stored.data(), stored.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> ModelRunner::BlockChecksums(
    absl::Span<const int> blocks) const {
  std::vector<uint64_t> out;
  out.reserve(blocks.size());
  std::vector<uint64_t> words;
  for (int block : blocks) {
    if (block < 0 || block >= config_.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("no KV block ", block));
    }
    // Four independent chains (words i, i+4, ...) so the mixing pipelines;
    // any change of any word still changes the result.
    uint64_t h[4];
    for (int lane = 0; lane < 4; ++lane) {
      h[lane] = Mix64(static_cast<uint64_t>(block) * 4 + static_cast<uint64_t>(lane) + 1);
    }
    for (const Tensor& cache : kv_caches_) {
      const Tensor b = cache.Select(0, block);
      words.assign((b.nbytes() + 31) / 32 * 4, 0);
      MLAG_RETURN_IF_ERROR(device_->CopyToHost(words.data(), b.data(), b.nbytes()));
      for (size_t i = 0; i < words.size(); i += 4) {
        for (int lane = 0; lane < 4; ++lane) h[lane] = Mix64(h[lane] ^ words[i + lane]);
      }
    }
    out.push_back(Mix64(h[0] ^ Mix64(h[1] ^ Mix64(h[2] ^ Mix64(h[3])))));
  }
  return out;
}

absl::StatusOr<uint64_t> ModelRunner::KvChecksum(absl::Span<const int> blocks) const {
  std::vector<int> all;
  if (blocks.empty()) {
    all.resize(config_.num_blocks);
    for (int i = 0; i < config_.num_blocks; ++i) all[i] = i;
    blocks = all;
  }
  MLAG_ASSIGN_OR_RETURN(std::vector<uint64_t> sums, BlockChecksums(blocks));
  uint64_t h = 0x6a09e667f3bcc909ull;
  for (uint64_t s : sums) h = Mix64(h ^ s);
  return h;
}

}  // namespace mlag
