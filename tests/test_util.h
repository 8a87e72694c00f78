// Helpers shared by the tests: owned host tensors, seeded random fills,
// NaN poisoning, error measures against double-precision references and
// temporary directories.
#pragma once

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/host/gemm.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag::testing {

// A fresh directory under the test temp dir (not removed afterwards: the
// test harness owns that tree).
inline std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir();
  if (pattern.empty() || pattern.back() != '/') pattern += '/';
  pattern += "mlag_XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  const char* dir = ::mkdtemp(buf.data());
  EXPECT_NE(dir, nullptr);
  return dir == nullptr ? std::string() : std::string(dir);
}

// The process-wide host device and a stream on it.
inline Device& HostDevice() {
  static std::unique_ptr<Device> device = Device::Create("host").value();
  return *device;
}
inline Stream& HostStream() {
  static std::unique_ptr<Stream> stream = Stream::Create(&HostDevice()).value();
  return *stream;
}

// A host tensor that owns its memory.
struct Owned {
  Buffer buffer;
  Tensor t;
  template <typename T>
  T* data() const {
    return t.data_as<T>();
  }
  int64_t numel() const { return t.numel(); }
  // Element i (flat, contiguous) as f32 / stored from f32.
  float get(int64_t i) const { return LoadAsF32(t.dtype(), t.data(), i); }
  void set(int64_t i, float v) const { StoreFromF32(t.dtype(), t.data(), i, v); }
};

inline Owned Make(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor probe(nullptr, dtype, shape);
  Owned o;
  o.buffer = HostDevice().Allocate(probe.nbytes() + 64).value();
  o.t = o.buffer.AsTensor(dtype, shape);
  std::memset(o.buffer.data(), 0, o.buffer.bytes());
  return o;
}

// Uniform floats in [lo, hi), never exactly zero-filled.
inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = u(rng);
  return v;
}

// Fills a contiguous float tensor with uniform values; returns what was
// stored (after rounding to the tensor's dtype), as doubles.
inline std::vector<double> FillRandom(const Owned& o, uint32_t seed, float lo = -1.0f,
                                      float hi = 1.0f) {
  std::vector<float> v = RandomFloats(static_cast<size_t>(o.numel()), seed, lo, hi);
  std::vector<double> stored(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    o.set(static_cast<int64_t>(i), v[i]);
    stored[i] = o.get(static_cast<int64_t>(i));
  }
  return stored;
}

// Writes NaN into every element of a contiguous float tensor.
inline void PoisonNaN(const Owned& o) {
  for (int64_t i = 0; i < o.numel(); ++i) o.set(i, std::numeric_limits<float>::quiet_NaN());
}

// Number of NaN elements (an output that still holds poison was not written).
inline int64_t CountNaN(const Owned& o) {
  int64_t n = 0;
  for (int64_t i = 0; i < o.numel(); ++i) n += std::isnan(o.get(i)) ? 1 : 0;
  return n;
}

// Normwise relative error: max_i |got_i - want_i| / max(max_i |want_i|, tiny).
// NaN anywhere in `got` gives +inf.
inline double MaxRelError(const float* got, const double* want, size_t n) {
  double max_err = 0.0, max_ref = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(got[i])) return std::numeric_limits<double>::infinity();
    max_err = std::max(max_err, std::abs(static_cast<double>(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::abs(want[i]));
  }
  return max_err / std::max(max_ref, 1e-30);
}

inline double MaxRelError(const Owned& got, const std::vector<double>& want) {
  std::vector<float> g(static_cast<size_t>(got.numel()));
  for (int64_t i = 0; i < got.numel(); ++i) g[i] = got.get(i);
  return MaxRelError(g.data(), want.data(), g.size());
}

// Skips (from the calling test) when MLAG_HOST_ISA asks for a host vector ISA
// this CPU does not run (the host kernels' narrower variants, tested by
// capping the ISA). GTEST_SKIP returns from here only: the caller then
// returns if ::testing::Test::IsSkipped().
inline void SkipUnlessRequestedIsa() {
  const char* isa = std::getenv("MLAG_HOST_ISA");
  if (isa != nullptr && std::string(isa) != host::GemmIsa()) {
    GTEST_SKIP() << "MLAG_HOST_ISA=" << isa << " but this CPU runs " << host::GemmIsa();
  }
}

}  // namespace mlag::testing
