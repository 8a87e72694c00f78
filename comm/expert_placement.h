// Which rank of an expert-parallel group holds each routed expert, and in
// which local slot. Shared experts and every non-expert weight are on every
// rank.
#pragma once

#include <vector>

namespace mlag {

struct ExpertPlacement {
  int num_experts = 0;
  int world = 1;           // ranks in the group
  std::vector<int> owner;  // global expert -> rank
  std::vector<int> slot;   // global expert -> slot on its owner

  // Global ids held by `rank`, in slot order.
  std::vector<int> ExpertsOf(int rank) const {
    std::vector<int> out;
    for (int e = 0; e < num_experts; ++e) {
      if (owner[e] == rank) out.push_back(e);
    }
    return out;
  }

  bool operator==(const ExpertPlacement& o) const {
    return num_experts == o.num_experts && world == o.world && owner == o.owner && slot == o.slot;
  }
};

// The default even split: rank r holds the contiguous range
// [r * E / N, (r + 1) * E / N) (sizes differ by at most one).
inline ExpertPlacement EvenPlacement(int num_experts, int world) {
  ExpertPlacement p;
  p.num_experts = num_experts;
  p.world = world < 1 ? 1 : world;
  p.owner.resize(num_experts);
  p.slot.resize(num_experts);
  for (int r = 0; r < p.world; ++r) {
    const int begin = static_cast<int>(static_cast<long long>(num_experts) * r / p.world);
    const int end = static_cast<int>(static_cast<long long>(num_experts) * (r + 1) / p.world);
    for (int e = begin; e < end; ++e) {
      p.owner[e] = r;
      p.slot[e] = e - begin;
    }
  }
  return p;
}

}  // namespace mlag
