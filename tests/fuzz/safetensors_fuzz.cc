// Fuzz target: a safetensors file. SafetensorsFile::Open must return a
// status for any bytes (header JSON, offsets, dtypes, shapes), and reading
// every tensor it accepts must stay inside the file.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "runtime/checkpoint/safetensors.h"
#include "runtime/core/file.h"
#include "tests/fuzz/fuzz_target.h"

namespace {

// One file per process, rewritten for every input.
const std::string& InputPath() {
  static const std::string path = "/tmp/mlag_safetensors_fuzz." + std::to_string(::getpid());
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(InputPath().c_str(), "wb");
  if (f == nullptr) return 0;
  const bool written = std::fwrite(data, 1, size, f) == size;
  std::fclose(f);
  if (!written) return 0;
  absl::StatusOr<std::unique_ptr<mlag::SafetensorsFile>> file =
      mlag::SafetensorsFile::Open(InputPath());
  if (file.ok()) {
    unsigned sum = 0;
    for (const mlag::SafetensorsTensor& t : (*file)->tensors()) {
      const auto* bytes = static_cast<const unsigned char*>(t.data);
      for (size_t i = 0; i < t.nbytes; ++i) sum += bytes[i];  // every byte must be mapped
    }
    (void)sum;
  }
  std::remove(InputPath().c_str());
  return 0;
}

namespace mlag::fuzz {

std::vector<std::string> FuzzSeeds() {
  // Two small files written by the project's own writer, read back as bytes.
  std::vector<std::string> seeds;
  const std::string path = InputPath() + ".seed";
  const float f32[6] = {1, 2, 3, 4, 5, 6};
  const uint16_t bf16[4] = {0x3f80, 0x4000, 0xbf80, 0};
  for (int variant = 0; variant < 2; ++variant) {
    SafetensorsWriter w;
    (void)w.Add("a.weight", DType::kF32, {2, 3}, f32);
    if (variant == 1) {
      (void)w.Add("b.weight", DType::kBF16, {4}, bf16);
      w.SetMetadata("note", "seed");
    }
    if (w.Write(path).ok()) {
      absl::StatusOr<std::string> bytes = ReadFile(path);
      if (bytes.ok()) seeds.push_back(*bytes);
    }
  }
  std::remove(path.c_str());
  return seeds;
}

}  // namespace mlag::fuzz
