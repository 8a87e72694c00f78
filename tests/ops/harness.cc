#include "tests/ops/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "runtime/core/fp8_blocks.h"
#include "tests/status_matchers.h"

namespace mlag::ops_test {

// ---- Backends -------------------------------------------------------------------------

Backend& Backend::Host() {
  static Backend* host = [] {
    auto device = Device::Create("host").value();
    auto stream = Stream::Create(device.get()).value();
    return new Backend("host", std::move(device), std::move(stream));
  }();
  return *host;
}

Backend* Backend::Cuda() {
  static Backend* cuda = []() -> Backend* {
    if (Device::CudaDeviceCount() == 0) return nullptr;
    auto device = Device::Create("cuda");
    if (!device.ok()) return nullptr;
    auto stream = Stream::Create(device->get());
    if (!stream.ok()) return nullptr;
    return new Backend("cuda", std::move(*device), std::move(*stream));
  }();
  return cuda;
}

// ---- Buffers -------------------------------------------------------------------------

// Buffer index of each element of the view `offset`/`shape`/`strides`, in
// row-major order.
static std::vector<int64_t> ViewElementsOf(int64_t offset, const std::vector<int64_t>& shape,
                                           const std::vector<int64_t>& strides) {
  std::vector<int64_t> out;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  out.reserve(static_cast<size_t>(n));
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = offset;
    for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
    out.push_back(off);
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < shape[static_cast<size_t>(d)]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
  return out;
}

double LoadElement(DType dtype, const uint8_t* base, int64_t i) {
  switch (dtype) {
    case DType::kI32:
      return reinterpret_cast<const int32_t*>(base)[i];
    case DType::kI64:
      return static_cast<double>(reinterpret_cast<const int64_t*>(base)[i]);
    case DType::kU8:
      return base[i];
    default:
      return LoadAsF32(dtype, base, static_cast<size_t>(i));
  }
}

void StoreElement(DType dtype, uint8_t* base, int64_t i, double v) {
  switch (dtype) {
    case DType::kI32:
      reinterpret_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      break;
    case DType::kI64:
      reinterpret_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      break;
    case DType::kU8:
      base[i] = static_cast<uint8_t>(v);
      break;
    default:
      StoreFromF32(dtype, base, static_cast<size_t>(i), static_cast<float>(v));
  }
}

namespace {

// Distance in ulps of two 16-bit floats (sign-magnitude bit order).
int Ulps16(uint16_t a, uint16_t b) {
  auto ordered = [](uint16_t x) {
    return (x & 0x8000u) ? -static_cast<int>(x & 0x7fffu) : static_cast<int>(x);
  };
  return std::abs(ordered(a) - ordered(b));
}

}  // namespace

double Buf::Value(int64_t i) const {
  const std::vector<int64_t>& elems = ViewElements();
  return LoadElement(dtype, host.data(), elems[static_cast<size_t>(i)]);
}

std::vector<double> Buf::Values() const {
  std::vector<double> out;
  for (int64_t e : ViewElements()) out.push_back(LoadElement(dtype, host.data(), e));
  return out;
}

void Buf::Set(int64_t i, double v) {
  const std::vector<int64_t>& elems = ViewElements();
  StoreElement(dtype, host.data(), elems[static_cast<size_t>(i)], v);
}

double RoundTo(DType dtype, double v) {
  const float f = static_cast<float>(v);
  switch (dtype) {
    case DType::kBF16:
      return Bf16ToF32(F32ToBf16(f));
    case DType::kF16:
      return F16ToF32(F32ToF16(f));
    case DType::kF32:
      return f;
    default:
      return v;
  }
}

// ---- Context -------------------------------------------------------------------------

Buf& Context::Make(const std::string& name, DType dtype, std::vector<int64_t> shape, int64_t pad,
                   int64_t offset, int64_t tail) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[static_cast<size_t>(d)] =
        strides[static_cast<size_t>(d) + 1] * shape[static_cast<size_t>(d) + 1] + pad;
  }
  return MakeStrided(name, dtype, std::move(shape), std::move(strides), offset, tail);
}

Buf& Context::MakeStrided(const std::string& name, DType dtype, std::vector<int64_t> shape,
                          std::vector<int64_t> strides, int64_t offset, int64_t tail) {
  auto b = std::make_unique<Buf>();
  b->name = name;
  b->dtype = dtype;
  b->offset = offset;
  int64_t last = 0;
  bool empty = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    empty |= shape[d] == 0;
    last += (shape[d] - 1) * strides[d];
  }
  b->span = offset + (empty ? 0 : last + 1) + tail;
  b->shape = shape;
  b->strides = strides;
  b->elements = ViewElementsOf(offset, shape, strides);
  b->host.assign(static_cast<size_t>(b->span) * b->esize(), 0xff);
  b->device_buffer = backend_.device().Allocate(std::max<size_t>(b->host.size(), 1)).value();
  b->t = Tensor::Strided(static_cast<uint8_t*>(b->device_buffer.data()) + offset * b->esize(),
                         dtype, shape, strides, backend_.device().kind());
  bufs_.push_back(std::move(b));
  Buf& out = *bufs_.back();
  Poison(out);
  return out;
}

Buf& Context::Output(const std::string& name, DType dtype, std::vector<int64_t> shape, int64_t pad,
                     int64_t offset, int64_t tail) {
  return Make(name, dtype, std::move(shape), pad, offset, tail);  // Make poisons
}

void Context::Randomize(Buf& b, double lo, double hi) {
  std::mt19937 rng(NextSeed());
  std::uniform_real_distribution<double> u(lo, hi);
  for (int64_t i = 0; i < b.span; ++i) StoreElement(b.dtype, b.host.data(), i, u(rng));
  Upload(b);
}

void Context::Upload(Buf& b) {
  SCOPED_TRACE(b.name);
  ASSERT_OK(backend_.device().CopyFromHost(b.device_buffer.data(), b.host.data(), b.host.size()));
}

void Context::Poison(Buf& b) {
  std::fill(b.host.begin(), b.host.end(), 0xff);
  Upload(b);
}

std::vector<uint8_t> Context::Download(const Buf& b) {
  std::vector<uint8_t> out(b.host.size());
  EXPECT_OK(stream().Synchronize());
  EXPECT_OK(backend_.device().CopyToHost(out.data(), b.device_buffer.data(), out.size()));
  return out;
}

std::vector<double> Context::DeviceValues(const Buf& b) {
  const std::vector<uint8_t> bytes = Download(b);
  std::vector<double> out;
  for (int64_t e : b.ViewElements()) out.push_back(LoadElement(b.dtype, bytes.data(), e));
  return out;
}

void Context::RunOp(std::initializer_list<Buf*> outputs,
                    const std::function<absl::Status(Stream&)>& op, bool graph,
                    std::initializer_list<Buf*> in_place) {
  std::vector<std::pair<Buf*, std::vector<uint8_t>>> before;
  for (Buf* b : in_place) before.emplace_back(b, Download(*b));
  ASSERT_OK(op(stream())) << "eager run";
  ASSERT_OK(stream().Synchronize());
  if (!graph) return;
  std::vector<std::vector<uint8_t>> eager;
  for (Buf* b : outputs) eager.push_back(Download(*b));
  auto reset = [&] {
    for (Buf* b : outputs) {
      bool restored = false;
      for (auto& [buf, bytes] : before) {
        if (buf == b) {
          ASSERT_OK(
              backend_.device().CopyFromHost(b->device_buffer.data(), bytes.data(), bytes.size()));
          restored = true;
        }
      }
      if (!restored) {
        Tensor bytes(b->device_buffer.data(), DType::kU8, {static_cast<int64_t>(b->host.size())},
                     backend_.device().kind());
        ASSERT_OK(Fill(stream(), bytes, 255.0));
      }
    }
    ASSERT_OK(stream().Synchronize());
  };
  reset();
  ASSERT_OK(stream().BeginCapture());
  const absl::Status recorded = op(stream());
  absl::StatusOr<std::unique_ptr<Graph>> g = stream().EndCapture();
  ASSERT_OK(recorded) << "captured run";
  ASSERT_OK(g);
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE(absl::StrCat("graph replay ", replay));
    reset();
    ASSERT_OK((*g)->Replay(stream()));
    ASSERT_OK(stream().Synchronize());
    size_t i = 0;
    for (Buf* b : outputs) {
      EXPECT_TRUE(Download(*b) == eager[i++]) << b->name << ": graph replay differs from eager";
    }
  }
}

void Context::ExpectOutsideUnchanged(const Buf& out, const std::vector<uint8_t>& bytes) {
  std::vector<bool> in_view(static_cast<size_t>(out.span), false);
  for (int64_t e : out.ViewElements()) in_view[static_cast<size_t>(e)] = true;
  int64_t changed = 0;
  for (int64_t i = 0; i < out.span; ++i) {
    if (in_view[static_cast<size_t>(i)]) continue;
    const size_t at = static_cast<size_t>(i) * out.esize();
    changed += std::memcmp(bytes.data() + at, out.host.data() + at, out.esize()) != 0;
  }
  EXPECT_EQ(changed, 0) << out.name << ": " << changed << " elements outside the view changed";
}

void Context::ExpectClose(const Buf& out, const std::vector<double>& want, const Tolerance& tol) {
  SCOPED_TRACE(absl::StrCat(out.name, " (", DTypeName(out.dtype), ")"));
  const std::vector<uint8_t> bytes = Download(out);
  const std::vector<int64_t>& elems = out.ViewElements();
  ASSERT_EQ(elems.size(), want.size());
  int64_t unwritten = 0, nan_mismatch = 0, over = 0, flipped = 0;
  double max_err = 0, max_ref = 0;
  int worst_ulps = 0;
  for (double w : want) {
    if (std::isfinite(w)) max_ref = std::max(max_ref, std::abs(w));
  }
  const double scale = std::max(max_ref, 1e-30);
  for (size_t k = 0; k < elems.size(); ++k) {
    const double got = LoadElement(out.dtype, bytes.data(), elems[k]);
    if (std::isnan(got) || std::isnan(want[k])) {
      if (std::isnan(got) && !std::isnan(want[k])) ++unwritten;
      if (std::isnan(got) != std::isnan(want[k])) ++nan_mismatch;
      continue;
    }
    if (out.dtype == DType::kBF16 || out.dtype == DType::kF16) {
      uint16_t g, w;
      std::memcpy(&g, bytes.data() + elems[k] * 2, 2);
      w = out.dtype == DType::kBF16 ? F32ToBf16(static_cast<float>(want[k]))
                                    : F32ToF16(static_cast<float>(want[k]));
      const int u = Ulps16(g, w);
      worst_ulps = std::max(worst_ulps, u);
      over += u > tol.ulps;
    } else {
      if (std::isinf(want[k]) || std::isinf(got)) {
        over += got != want[k];
        continue;
      }
      const double err = std::abs(got - want[k]);
      if (tol.flip_fraction > 0 && err > tol.f32 * scale) {
        ++flipped;  // allowed within flip_error, for a few elements
        over += err > tol.flip_error * scale;
        continue;
      }
      max_err = std::max(max_err, err);
    }
  }
  EXPECT_EQ(unwritten, 0) << "elements left unwritten (still poison)";
  EXPECT_EQ(nan_mismatch, 0) << "NaN where the reference has none, or the reverse";
  if (out.dtype == DType::kBF16 || out.dtype == DType::kF16) {
    EXPECT_EQ(over, 0) << "elements beyond " << tol.ulps << " ulps (worst " << worst_ulps << ")";
  } else {
    EXPECT_LE(max_err / scale, tol.f32) << "normwise relative error";
    EXPECT_EQ(over, 0) << "elements beyond the rounding-flip bound, or infinities that differ";
    EXPECT_LE(flipped,
              1 + static_cast<int64_t>(tol.flip_fraction * static_cast<double>(elems.size())))
        << "elements moved by a bf16 rounding flip";
  }
  ExpectOutsideUnchanged(out, bytes);
}

void Context::ExpectInts(const Buf& out, const std::vector<int64_t>& want) {
  SCOPED_TRACE(absl::StrCat(out.name, " (", DTypeName(out.dtype), ")"));
  const std::vector<uint8_t> bytes = Download(out);
  const std::vector<int64_t>& elems = out.ViewElements();
  ASSERT_EQ(elems.size(), want.size());
  int64_t differ = 0;
  std::string first;
  for (size_t k = 0; k < elems.size(); ++k) {
    const int64_t got = static_cast<int64_t>(LoadElement(out.dtype, bytes.data(), elems[k]));
    if (got != want[k]) {
      if (differ++ == 0) first = absl::StrCat("element ", k, ": ", got, ", want ", want[k]);
    }
  }
  EXPECT_EQ(differ, 0) << first;
  ExpectOutsideUnchanged(out, bytes);
}

double GammaBound(int64_t n, double unit) { return n * unit / (1.0 - n * unit); }

double TensorCoreDotBound(DType dtype, int64_t n, double abs_sum) {
  const double f32 = std::ldexp(1.0, -24);
  if (dtype == DType::kBF16) return GammaBound(n + 1, std::ldexp(1.0, -23)) * abs_sum;
  // Within each 128-block (<= 4 mmas of 32), then blocks scaled (2 products)
  // and summed in f32, in one chain or in K slices summed afterwards (at
  // most one more addition per block).
  const double in_block = GammaBound(kFp8BlockSize + 1, std::ldexp(1.0, -14));
  return (in_block + GammaBound(2 * Fp8Blocks(n) + 3, f32) * (1.0 + in_block)) * abs_sum;
}

int64_t OutsideBound(const std::vector<double>& got, const BoundedRef& ref, std::string* what,
                     int show) {
  int64_t outside = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - ref.want[i]);
    if (err <= ref.bound[i]) continue;
    if (outside++ < show && what != nullptr) {
      absl::StrAppend(what, " [", i, "] got ", got[i], " want ", ref.want[i], " bound ",
                      ref.bound[i], ";");
    }
  }
  return outside;
}

}  // namespace mlag::ops_test

// ---- Registration: every case on every backend ------------------------------------------

namespace {

using mlag::ops_test::Backend;
using mlag::ops_test::CaseList;
using mlag::ops_test::Context;
using mlag::ops_test::OpCase;

class OpCaseTest : public ::testing::Test {
 public:
  OpCaseTest(std::string backend, const OpCase* c) : backend_(std::move(backend)), case_(c) {}
  void TestBody() override {
    Backend* b = backend_ == "host" ? &Backend::Host() : Backend::Cuda();
    if (b == nullptr) GTEST_SKIP() << "no " << backend_ << " backend here";
    SCOPED_TRACE(backend_ + "/" + case_->op + "." + case_->name);
    // The same seeds on every backend: the same inputs.
    Context ctx(*b, static_cast<uint32_t>(std::hash<std::string>()(case_->op + case_->name)));
    case_->run(ctx);
  }

 private:
  std::string backend_;
  const OpCase* case_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  static CaseList cases;
  mlag::ops_test::AddBasicCases(cases);
  mlag::ops_test::AddLinearCases(cases);
  mlag::ops_test::AddMlaCases(cases);
  mlag::ops_test::AddMoeCases(cases);
  mlag::ops_test::AddSamplingCases(cases);
  for (const char* backend : {"host", "cuda"}) {
    for (const OpCase& c : cases.cases()) {
      std::string name = c.name;
      std::replace_if(
          name.begin(), name.end(),
          [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)); }, '_');
      ::testing::RegisterTest(
          (std::string(backend) + "/" + c.op).c_str(), name.c_str(), nullptr, nullptr, __FILE__,
          __LINE__, [backend, &c]() -> ::testing::Test* { return new OpCaseTest(backend, &c); });
    }
  }
  const int rc = RUN_ALL_TESTS();
  // Asked for the CUDA cases only (the gpu suite) on a machine without a
  // device: every one skipped, so report the run as skipped (exit 77).
  const std::string filter = GTEST_FLAG_GET(filter);
  if (rc == 0 && Backend::Cuda() == nullptr && filter.rfind("cuda/", 0) == 0) {
    std::printf("op harness: no CUDA device, the cuda cases were skipped\n");
    return 77;
  }
  return rc;
}
