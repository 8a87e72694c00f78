// A libFuzzer-compatible driver without libFuzzer: runs every seed, then
// `-runs=N` (default 10000) inputs made by mutating seeds and earlier inputs
// (byte flips, interesting integers and digits spliced in, insertions,
// deletions, truncations, crossovers), from a fixed random seed (`-seed=S`),
// so a failure reproduces. Not coverage-guided: a cheap, deterministic sweep
// for every CI build; libFuzzer does the open-ended search.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

namespace {

const char* const kTokens[] = {"0",
                               "-1",
                               "2147483647",
                               "2147483648",
                               "4294967296",
                               "1e300",
                               "-1e300",
                               "1e39",
                               "NaN",
                               "null",
                               "[]",
                               "{}",
                               "\"\"",
                               "true",
                               "0.5",
                               "9223372036854775807",
                               "18446744073709551616",
                               ",",
                               ":",
                               "\"",
                               "{",
                               "}",
                               "[",
                               "]",
                               "-0",
                               "1e-45"};

void Mutate(std::string& s, std::mt19937_64& rng, const std::vector<std::string>& pool) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (!s.empty()) s[pos % s.size()] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:  // a random byte
        if (!s.empty()) s[pos % s.size()] = static_cast<char>(rng());
        break;
      case 2: {  // an interesting token over a few bytes
        const std::string t = kTokens[rng() % (sizeof(kTokens) / sizeof(kTokens[0]))];
        const size_t len = std::min<size_t>(s.size() - std::min(pos, s.size()), rng() % 8);
        s.replace(std::min(pos, s.size()), len, t);
        break;
      }
      case 3:  // delete a run
        if (!s.empty()) s.erase(pos % s.size(), 1 + rng() % 16);
        break;
      case 4:  // duplicate a run
        if (!s.empty()) {
          const size_t from = rng() % s.size();
          s.insert(pos, s.substr(from, 1 + rng() % 32));
        }
        break;
      case 5:  // truncate
        s.resize(pos);
        break;
      default: {  // splice in part of another input
        const std::string& other = pool[rng() % pool.size()];
        if (!other.empty()) {
          const size_t from = rng() % other.size();
          s.insert(pos, other.substr(from, 1 + rng() % 64));
        }
        break;
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  long runs = 10000;
  unsigned long long seed = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "-runs=", 6) == 0) runs = std::atol(argv[i] + 6);
    if (std::strncmp(argv[i], "-seed=", 6) == 0) seed = std::strtoull(argv[i] + 6, nullptr, 10);
  }
  std::vector<std::string> pool = mlag::fuzz::FuzzSeeds();
  if (pool.empty()) {
    std::fprintf(stderr, "fuzz: no seeds\n");
    return 1;
  }
  for (const std::string& s : pool) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::mt19937_64 rng(seed);
  const size_t seeds = pool.size();
  for (long r = 0; r < runs; ++r) {
    // Mostly from a seed (stays near valid input), sometimes from an earlier mutant.
    std::string input = pool[rng() % 4 == 0 ? rng() % pool.size() : rng() % seeds];
    Mutate(input, rng, pool);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    if (pool.size() < 256) pool.push_back(std::move(input));
  }
  std::printf("fuzz: %zu seeds and %ld mutated inputs, seed %llu: no crash\n", seeds, runs, seed);
  return 0;
}
