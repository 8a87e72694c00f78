// Counter-based random numbers shared by host and CUDA sampling: a draw is a
// pure function of (seed, counter), so it does not depend on batch layout,
// thread count or backend.
#pragma once

#include <cstdint>

#include "runtime/core/host_device.h"

namespace mlag {

// SplitMix64 finaliser: a bijective 64-bit mix.
MLAG_HD uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 random bits, from (seed, counter).
MLAG_HD float UniformFromCounter(uint64_t seed, uint64_t counter) {
  uint64_t z = Mix64(seed * 0x9e3779b97f4a7c15ull + Mix64(counter + 0x632be59bd9b4e019ull));
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace mlag
