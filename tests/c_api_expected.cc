// Writes the reference for tests/c_api_test.c: the engine settings, and eight
// greedy requests with the tokens the C++ engine (mlag::Engine) generates for
// them. The C test runs the same requests through the C API and must get the
// same tokens. Run by meson at build time: c_api_expected OUTPUT_FILE.
//
// Format (whitespace-separated; the C test parses it with fscanf):
//   engine MODEL DEVICE BLOCK_SIZE MAX_NUM_SEQS MAX_NUM_BATCHED_TOKENS KV_CACHE_BYTES
//   max_tokens N
//   requests R
//   then R lines: PROMPT_LEN t_0 ... t_{PROMPT_LEN-1} NUM_OUT o_0 ... o_{NUM_OUT-1}
#include <cstdint>
#include <cstdio>
#include <vector>

#include "runtime/engine/engine.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_FILE\n", argv[0]);
    return 2;
  }
  mlag::EngineOptions o;
  o.model = "tiny-v3";
  o.device = "host";
  o.block_size = 16;
  o.max_num_seqs = 64;
  o.max_num_batched_tokens = 256;
  o.kv_cache_bytes = size_t{16} << 20;
  o.graph_mode = mlag::GraphMode::kFullDecode;
  const int max_tokens = 6;

  auto engine = mlag::Engine::Create(o);
  if (!engine.ok()) {
    std::fprintf(stderr, "c_api_expected: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  const int vocab = (*engine)->config().vocab_size;

  // Eight prompts of different lengths (one block boundary straddled), tokens
  // from a fixed LCG so they are spread over the vocabulary.
  const int lengths[] = {1, 2, 5, 9, 16, 17, 31, 48};
  uint32_t state = 12345u;
  std::vector<mlag::RequestSpec> specs;
  for (int len : lengths) {
    mlag::RequestSpec s;
    for (int j = 0; j < len; ++j) {
      state = state * 1664525u + 1013904223u;
      s.prompt.push_back(static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(vocab)));
    }
    s.max_tokens = max_tokens;
    specs.push_back(s);
  }
  std::vector<mlag::RequestId> ids;
  for (const mlag::RequestSpec& s : specs) {
    auto id = (*engine)->AddRequest(s);
    if (!id.ok()) {
      std::fprintf(stderr, "c_api_expected: %s\n", id.status().ToString().c_str());
      return 1;
    }
    ids.push_back(*id);
  }
  while ((*engine)->HasUnfinished()) {
    auto step = (*engine)->Step();
    if (!step.ok()) {
      std::fprintf(stderr, "c_api_expected: %s\n", step.status().ToString().c_str());
      return 1;
    }
  }

  std::FILE* f = std::fopen(argv[1], "w");
  if (f == nullptr) {
    std::perror(argv[1]);
    return 1;
  }
  std::fprintf(f, "engine %s %s %d %d %d %zu\n", o.model.c_str(), o.device.c_str(), o.block_size,
               o.max_num_seqs, o.max_num_batched_tokens, o.kv_cache_bytes);
  std::fprintf(f, "max_tokens %d\n", max_tokens);
  std::fprintf(f, "requests %zu\n", specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    std::fprintf(f, "%zu", specs[i].prompt.size());
    for (int32_t t : specs[i].prompt) std::fprintf(f, " %d", t);
    const std::vector<int32_t> out = (*engine)->request(ids[i])->output_tokens();
    std::fprintf(f, "  %zu", out.size());
    for (int32_t t : out) std::fprintf(f, " %d", t);
    std::fprintf(f, "\n");
  }
  if (std::fclose(f) != 0) {
    std::perror(argv[1]);
    return 1;
  }
  return 0;
}
