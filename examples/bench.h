// mlag bench: decode step latency and tokens/s per batch size with graphs and
// eagerly, prefill tokens/s, and achieved bytes/s against a memory-bandwidth
// ceiling measured in the same run.
#pragma once

#include <string>
#include <vector>

namespace mlag {

struct BenchFlags {
  std::string model;
  std::string device = "auto";
  std::vector<int> batch_sizes = {1, 2, 4, 8, 16, 32};
  // Cached tokens per decode sequence; 0: 512, or less when the model's
  // max_position_embeddings is smaller.
  int context_len = 0;
  int steps = 8;          // timed decode steps per batch size and mode
  int prefill_len = 128;  // tokens of the prefill measurement (capped like context_len)
  double bandwidth_gib = 2.0;
  bool json = false;
};

// Runs the benchmark; returns the process exit code.
int RunBench(const BenchFlags& flags);

}  // namespace mlag
