// The interface of the fuzz targets in tests/fuzz/: each defines
// LLVMFuzzerTestOneInput (libFuzzer's entry point: it must return 0 and
// never crash, whatever the bytes) and FuzzSeeds (valid inputs to mutate).
//
// Built two ways:
//   - in every build (tests/meson.build, suite "fuzz"), linked with
//     fuzz_driver.cc: a fixed number of seeded random mutations of the seeds,
//     so CI's sanitizer build runs them on every change;
//   - with libFuzzer, for open-ended coverage-guided runs:
//       clang++ -std=c++17 -fsanitize=fuzzer,address,undefined -I. -Ibuild ...
//     (see tests/fuzz/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace mlag::fuzz {

// Valid inputs the driver starts from.
std::vector<std::string> FuzzSeeds();

}  // namespace mlag::fuzz
