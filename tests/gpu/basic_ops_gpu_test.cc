// GPU tests of the basic ops: every CUDA kernel against its host kernel on
// the same random inputs (kernels/{rms_norm,activation,embedding,rope,
// sampling}.h), and a CUDA graph of several of them replayed against eager
// launches. Compiled always; the fixture skips without a CUDA device.
//
// Every buffer lives twice, on the host and on the device, with the same
// layout; views into them may be strided, and the bytes around a view must
// come back untouched. Device outputs are poisoned with 0xff bytes
// (cudaMemsetAsync through Fill on a u8 view: NaN in f32, bf16 and f16, -1
// in i32) before a run, so an element left unwritten shows up as NaN.
//
// Tolerances (the host result is the reference):
//   rms_norm / add_rms_norm: the same operations in the same precisions (sum
//     of squares in double, then f32), only the order of the double sum
//     differs: f32 outputs within 1e-5 normwise, bf16 outputs within one bf16
//     ulp per element, the updated residual bit for bit.
//   silu_and_mul: expf differs from the host's by an ulp or two: f32 within
//     1e-5 normwise, bf16 within one ulp.
//   gather_rows / embedding: bit for bit (copies and the shared conversions).
//   rope: the shared pair rotation with unfused products: within 1e-6
//     normwise (bit for bit expected), rows at out-of-range positions bit for
//     bit unchanged.
//   sample: the identical token in every row, greedy and sampled.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A tensor view that exists on the host and on the device with the same
// layout: `span` elements starting at the buffer start, the view at element
// `offset` with the given strides.
struct Twin {
  DType dtype = DType::kF32;
  int64_t span = 0;
  Buffer host_buf, dev_buf;
  Tensor h, d;
  std::vector<uint8_t> pristine;  // host bytes before the run

  size_t esize() const { return DTypeSize(dtype); }
  size_t bytes() const { return static_cast<size_t>(span) * esize(); }
  uint8_t* host_bytes() const { return static_cast<uint8_t*>(host_buf.data()); }

  // Buffer element index of every element of the view, in row-major order.
  std::vector<int64_t> ViewElements() const {
    std::vector<int64_t> out;
    const int64_t base = (static_cast<const uint8_t*>(h.data()) - host_bytes()) /
                         static_cast<int64_t>(esize());
    std::vector<int64_t> idx(h.ndim(), 0);
    const int64_t n = h.numel();
    for (int64_t e = 0; e < n; ++e) {
      int64_t off = base;
      for (int dim = 0; dim < h.ndim(); ++dim) off += idx[dim] * h.stride(dim);
      out.push_back(off);
      for (int dim = h.ndim() - 1; dim >= 0; --dim) {
        if (++idx[dim] < h.size(dim)) break;
        idx[dim] = 0;
      }
    }
    return out;
  }
};

float LoadAt(DType dtype, const uint8_t* base, int64_t i) { return LoadAsF32(dtype, base, i); }

// Distance in ulps between two 16-bit floats of the same format (bf16 or
// f16: both are sign-magnitude with the order of their bit patterns).
int Ulps16(uint16_t a, uint16_t b) {
  auto ordered = [](uint16_t x) {
    return (x & 0x8000u) ? -static_cast<int>(x & 0x7fffu) : static_cast<int>(x);
  };
  return std::abs(ordered(a) - ordered(b));
}

class BasicOpsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    device_ = Device::Create("cuda").value();
    stream_ = Stream::Create(device_.get()).value();
  }

  Stream& host() { return testing::HostStream(); }

  // A twin of `shape` with row-major strides padded by `pad` elements on
  // every dimension's stride but the last, starting `offset` elements into
  // its buffer, with `tail` more elements after the view.
  std::unique_ptr<Twin> Make(DType dtype, std::vector<int64_t> shape, int64_t pad = 0,
                             int64_t offset = 0, int64_t tail = 0) {
    std::vector<int64_t> strides(shape.size(), 1);
    for (int dim = static_cast<int>(shape.size()) - 2; dim >= 0; --dim) {
      strides[dim] = strides[dim + 1] * shape[dim + 1] + pad;
    }
    return MakeStrided(dtype, shape, strides, offset, tail);
  }

  std::unique_ptr<Twin> MakeStrided(DType dtype, const std::vector<int64_t>& shape,
                                    const std::vector<int64_t>& strides, int64_t offset,
                                    int64_t tail) {
    auto t = std::make_unique<Twin>();
    t->dtype = dtype;
    int64_t last = 0;
    bool empty = false;
    for (size_t dim = 0; dim < shape.size(); ++dim) {
      empty |= shape[dim] == 0;
      last += (shape[dim] - 1) * strides[dim];
    }
    t->span = offset + (empty ? 0 : last + 1) + tail;
    t->host_buf = testing::HostDevice().Allocate(std::max<size_t>(t->bytes(), 1)).value();
    t->dev_buf = device_->Allocate(std::max<size_t>(t->bytes(), 1)).value();
    uint8_t* hb = t->host_bytes() + offset * t->esize();
    uint8_t* db = static_cast<uint8_t*>(t->dev_buf.data()) + offset * t->esize();
    t->h = Tensor::Strided(hb, dtype, shape, strides, DeviceKind::kHost);
    t->d = Tensor::Strided(db, dtype, shape, strides, DeviceKind::kCuda);
    std::memset(t->host_bytes(), 0xff, t->bytes());
    return t;
  }

  // Random floats in [lo, hi) over the whole buffer (padding included).
  void FillRandom(Twin& t, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v = testing::RandomFloats(static_cast<size_t>(t.span), seed, lo, hi);
    for (int64_t i = 0; i < t.span; ++i) StoreFromF32(t.dtype, t.host_bytes(), i, v[i]);
  }

  // Host bytes -> device, and remembers them as the pristine contents.
  // cudaMemcpy from pageable memory may return before its DMA lands, and
  // stream_ does not wait for the legacy stream the copy runs on; a
  // device-to-host copy on that stream is ordered after it and returns only
  // once done, so the 1-byte read back fences the upload.
  void Upload(Twin& t) {
    t.pristine.assign(t.host_bytes(), t.host_bytes() + t.bytes());
    ASSERT_OK(device_->CopyFromHost(t.dev_buf.data(), t.host_bytes(), t.bytes()));
    uint8_t fence;
    ASSERT_OK(device_->CopyToHost(&fence, t.dev_buf.data(), 1));
  }

  // Output: 0xff on both sides (the device through cudaMemsetAsync).
  void Poison(Twin& t) {
    std::memset(t.host_bytes(), 0xff, t.bytes());
    t.pristine.assign(t.host_bytes(), t.host_bytes() + t.bytes());
    Tensor bytes(t.dev_buf.data(), DType::kU8, {static_cast<int64_t>(t.bytes())},
                 DeviceKind::kCuda);
    ASSERT_OK(Fill(*stream_, bytes, 255.0));
  }

  std::vector<uint8_t> Download(const Twin& t) {
    std::vector<uint8_t> out(t.bytes());
    EXPECT_OK(stream_->Synchronize());
    EXPECT_OK(device_->CopyToHost(out.data(), t.dev_buf.data(), t.bytes()));
    return out;
  }

  // Compares the device result of float view `t` with the host result:
  // every view element written (not NaN where the host's is not), f32 within
  // `f32_tol` normwise, 16-bit floats within `max_ulps`, and the bytes
  // around the view as they were before the run on both sides. Returns the
  // f32 normwise error (0 for 16-bit outputs).
  double ExpectMatchesHost(const Twin& t, const std::string& what, double f32_tol, int max_ulps) {
    const std::vector<uint8_t> dev = Download(t);
    const std::vector<int64_t> elems = t.ViewElements();
    std::vector<bool> in_view(static_cast<size_t>(t.span), false);
    for (int64_t e : elems) in_view[e] = true;
    double max_err = 0.0, max_ref = 0.0;
    int worst_ulps = 0;
    int64_t unwritten = 0, nan_mismatch = 0, bitwise_equal = 0;
    for (int64_t e : elems) {
      const float hv = LoadAt(t.dtype, t.host_bytes(), e);
      const float dv = LoadAt(t.dtype, dev.data(), e);
      bitwise_equal += std::memcmp(t.host_bytes() + e * t.esize(), dev.data() + e * t.esize(),
                                   t.esize()) == 0 ? 1 : 0;
      if (std::isnan(hv) || std::isnan(dv)) {
        if (!std::isnan(hv)) ++unwritten;
        if (std::isnan(hv) != std::isnan(dv)) ++nan_mismatch;
        continue;
      }
      if (t.dtype == DType::kF32) {
        max_err = std::max(max_err, std::abs(static_cast<double>(dv) - hv));
        max_ref = std::max(max_ref, std::abs(static_cast<double>(hv)));
      } else {
        uint16_t a, b;
        std::memcpy(&a, t.host_bytes() + e * 2, 2);
        std::memcpy(&b, dev.data() + e * 2, 2);
        worst_ulps = std::max(worst_ulps, Ulps16(a, b));
      }
    }
    EXPECT_EQ(unwritten, 0) << what << ": elements left unwritten (still poison)";
    EXPECT_EQ(nan_mismatch, 0) << what << ": NaN on one backend only";
    int64_t padding_changed_dev = 0, padding_changed_host = 0;
    for (int64_t i = 0; i < t.span; ++i) {
      if (in_view[i]) continue;
      const size_t at = static_cast<size_t>(i) * t.esize();
      padding_changed_dev += std::memcmp(dev.data() + at, t.pristine.data() + at, t.esize()) != 0;
      padding_changed_host +=
          std::memcmp(t.host_bytes() + at, t.pristine.data() + at, t.esize()) != 0;
    }
    EXPECT_EQ(padding_changed_dev, 0) << what << ": CUDA wrote outside the view";
    EXPECT_EQ(padding_changed_host, 0) << what << ": host wrote outside the view";
    const double err = max_err / std::max(max_ref, 1e-30);
    if (t.dtype == DType::kF32) {
      EXPECT_LE(err, f32_tol) << what;
    } else {
      EXPECT_LE(worst_ulps, max_ulps) << what;
    }
    std::printf("%-48s %s: normwise %.3g, max %d ulps, %lld/%zu bitwise equal\n", what.c_str(),
                std::string(DTypeName(t.dtype)).c_str(), err, worst_ulps,
                static_cast<long long>(bitwise_equal), elems.size());
    return err;
  }

  // Bitwise equality of the device result and the host result over the view.
  void ExpectBitwise(const Twin& t, const std::string& what) {
    const std::vector<uint8_t> dev = Download(t);
    int64_t differ = 0;
    for (int64_t e : t.ViewElements()) {
      differ += std::memcmp(t.host_bytes() + e * t.esize(), dev.data() + e * t.esize(),
                            t.esize()) != 0;
    }
    EXPECT_EQ(differ, 0) << what;
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
};

std::string Name(const char* op, std::initializer_list<int64_t> dims, const char* extra = "") {
  std::string s = op;
  s += " [";
  bool first = true;
  for (int64_t d : dims) {
    s += (first ? "" : ",") + std::to_string(d);
    first = false;
  }
  return s + "]" + extra;
}

// ---- RmsNorm / AddRmsNorm ------------------------------------------------------

struct NormCase {
  int64_t rows, dim;
  DType x, w, y;
  int64_t pad;    // extra elements per row of x and y
  bool in_place;  // y is x
};

TEST_F(BasicOpsGpuTest, RmsNormMatchesHost) {
  const std::vector<NormCase> cases = {
      {1, 7, DType::kF32, DType::kF32, DType::kF32, 0, false},
      {3, 64, DType::kF32, DType::kF32, DType::kF32, 5, false},
      {5, 513, DType::kBF16, DType::kBF16, DType::kBF16, 3, false},
      {17, 2048, DType::kBF16, DType::kF32, DType::kF32, 0, false},
      {4, 7168, DType::kF32, DType::kBF16, DType::kBF16, 0, false},
      {9, 1536, DType::kBF16, DType::kBF16, DType::kBF16, 0, true},
      {6, 333, DType::kF32, DType::kF32, DType::kF32, 2, true},
      {300, 96, DType::kBF16, DType::kBF16, DType::kF32, 1, false},
  };
  uint32_t seed = 100;
  for (const NormCase& c : cases) {
    auto x = Make(c.x, {c.rows, c.dim}, c.pad, 1, 2);
    auto w = Make(c.w, {c.dim});
    FillRandom(*x, seed++, -3.0f, 3.0f);
    FillRandom(*w, seed++, 0.5f, 1.5f);
    Upload(*x);
    Upload(*w);
    std::unique_ptr<Twin> y_own;
    Twin* y = x.get();
    if (!c.in_place) {
      y_own = Make(c.y, {c.rows, c.dim}, c.pad + 1);
      y = y_own.get();
      Poison(*y);
    }
    const float eps = 1e-6f;
    ASSERT_OK(RmsNorm(host(), x->h, w->h, eps, y->h));
    ASSERT_OK(RmsNorm(*stream_, x->d, w->d, eps, y->d));
    ExpectMatchesHost(*y, Name("rms_norm", {c.rows, c.dim}, c.in_place ? " in place" : ""), 1e-5,
                      1);
  }
}

TEST_F(BasicOpsGpuTest, AddRmsNormMatchesHost) {
  const std::vector<NormCase> cases = {
      {1, 7, DType::kF32, DType::kF32, DType::kF32, 0, false},
      {3, 64, DType::kBF16, DType::kF32, DType::kF32, 5, false},
      {5, 513, DType::kBF16, DType::kBF16, DType::kBF16, 3, false},
      {4, 7168, DType::kBF16, DType::kBF16, DType::kBF16, 0, true},
      {33, 2048, DType::kF32, DType::kBF16, DType::kBF16, 1, false},
      {6, 333, DType::kF32, DType::kF32, DType::kF32, 2, true},
  };
  uint32_t seed = 200;
  for (const NormCase& c : cases) {
    // The residual takes the other float dtype in half of the cases.
    const DType other = c.x == DType::kF32 ? DType::kBF16 : DType::kF32;
    const DType res_dtype = (seed % 2 == 0) ? c.x : other;
    auto x = Make(c.x, {c.rows, c.dim}, c.pad, 2, 1);
    auto residual = Make(res_dtype, {c.rows, c.dim}, c.pad + 2, 0, 3);
    auto w = Make(c.w, {c.dim});
    FillRandom(*x, seed++, -2.0f, 2.0f);
    FillRandom(*residual, seed++, -2.0f, 2.0f);
    FillRandom(*w, seed++, 0.5f, 1.5f);
    Upload(*x);
    Upload(*residual);
    Upload(*w);
    std::unique_ptr<Twin> y_own;
    Twin* y = x.get();
    if (!c.in_place) {
      y_own = Make(c.y, {c.rows, c.dim}, c.pad);
      y = y_own.get();
      Poison(*y);
    }
    const float eps = 1e-6f;
    ASSERT_OK(AddRmsNorm(host(), x->h, residual->h, w->h, eps, y->h));
    ASSERT_OK(AddRmsNorm(*stream_, x->d, residual->d, w->d, eps, y->d));
    const std::string name =
        Name("add_rms_norm", {c.rows, c.dim}, c.in_place ? " in place" : "");
    ExpectMatchesHost(*residual, name + " residual", 0.0, 0);
    ExpectBitwise(*residual, name + " residual");
    ExpectMatchesHost(*y, name + " y", 1e-5, 1);
  }
}

// ---- SiluAndMul ------------------------------------------------------------------

TEST_F(BasicOpsGpuTest, SiluAndMulMatchesHost) {
  struct Case {
    int64_t rows, inter;
    DType in, out;
    int64_t pad;
  };
  const std::vector<Case> cases = {
      {1, 5, DType::kF32, DType::kF32, 0},       {7, 112, DType::kBF16, DType::kBF16, 3},
      {33, 1408, DType::kF32, DType::kBF16, 0},  {2, 9000, DType::kBF16, DType::kF32, 1},
      {129, 96, DType::kF32, DType::kF32, 7},
  };
  uint32_t seed = 300;
  for (const Case& c : cases) {
    auto gate_up = Make(c.in, {c.rows, 2 * c.inter}, c.pad, 1, 1);
    auto out = Make(c.out, {c.rows, c.inter}, c.pad + 2, 3);
    FillRandom(*gate_up, seed++, -8.0f, 8.0f);
    // The sigmoid's tails: e^-z overflowing and vanishing.
    StoreFromF32(c.in, gate_up->h.data(), 0, -120.0f);
    if (c.inter > 1) StoreFromF32(c.in, gate_up->h.data(), 1, 95.0f);
    Upload(*gate_up);
    Poison(*out);
    ASSERT_OK(SiluAndMul(host(), gate_up->h, out->h));
    ASSERT_OK(SiluAndMul(*stream_, gate_up->d, out->d));
    ExpectMatchesHost(*out, Name("silu_and_mul", {c.rows, c.inter}), 1e-5, 1);
  }
}

// ---- GatherRows / Embedding ------------------------------------------------------

TEST_F(BasicOpsGpuTest, GatherRowsAndEmbeddingMatchHostBitForBit) {
  struct Case {
    int64_t table_rows, dim, num;
    DType table, out, index;
    int64_t pad;
    bool embedding;
  };
  const std::vector<Case> cases = {
      {50, 7, 9, DType::kF32, DType::kF32, DType::kI32, 0, true},
      {1024, 256, 33, DType::kBF16, DType::kBF16, DType::kI32, 4, true},
      {129, 1001, 17, DType::kBF16, DType::kF32, DType::kI64, 3, false},
      {77, 130, 40, DType::kF32, DType::kBF16, DType::kI64, 0, false},
      {64, 65, 12, DType::kF16, DType::kF32, DType::kI32, 1, false},
      {64, 66, 12, DType::kF32, DType::kF16, DType::kI32, 2, false},
      {31, 300, 70000, DType::kF16, DType::kF16, DType::kI32, 0, true},  // rows > grid.y
  };
  uint32_t seed = 400;
  for (const Case& c : cases) {
    auto table = Make(c.table, {c.table_rows, c.dim}, c.pad);
    auto out = Make(c.out, {c.num, c.dim}, c.pad + 1, 2);
    auto idx = MakeStrided(c.index, {c.num}, {2}, 1, 1);  // strided indices
    FillRandom(*table, seed++, -4.0f, 4.0f);
    // A signalling NaN with a payload in row 0: equal dtypes copy its bits.
    if (c.table == DType::kF32) {
      const uint32_t snan = 0x7fa00001u;
      std::memcpy(table->h.data(), &snan, 4);
    }
    std::mt19937 rng(seed++);
    const std::vector<int64_t> elems = idx->ViewElements();
    for (size_t t = 0; t < elems.size(); ++t) {
      int64_t id = static_cast<int64_t>(rng() % c.table_rows);
      if (t % 7 == 3) id = -1;                 // out of range: zeros
      if (t % 11 == 5) id = c.table_rows;      // out of range: zeros
      if (t % 13 == 6) id = c.table_rows + 1000000;
      if (c.index == DType::kI32) {
        reinterpret_cast<int32_t*>(idx->host_bytes())[elems[t]] = static_cast<int32_t>(id);
      } else {
        reinterpret_cast<int64_t*>(idx->host_bytes())[elems[t]] = id;
      }
    }
    Upload(*table);
    Upload(*idx);
    Poison(*out);
    if (c.embedding) {
      ASSERT_OK(Embedding(host(), idx->h, table->h, out->h));
      ASSERT_OK(Embedding(*stream_, idx->d, table->d, out->d));
    } else {
      ASSERT_OK(GatherRows(host(), idx->h, table->h, out->h));
      ASSERT_OK(GatherRows(*stream_, idx->d, table->d, out->d));
    }
    const std::string name =
        Name(c.embedding ? "embedding" : "gather_rows", {c.table_rows, c.dim, c.num});
    ExpectMatchesHost(*out, name, 0.0, 0);
    ExpectBitwise(*out, name);
  }
}

// ---- ApplyRope -----------------------------------------------------------------------

TEST_F(BasicOpsGpuTest, ApplyRopeMatchesHost) {
  struct Case {
    int64_t tokens, heads, dr;
    bool yarn;
  };
  const std::vector<Case> cases = {
      {1, 1, 2, false}, {5, 3, 16, true}, {33, 16, 64, true}, {7, 128, 64, true},
      {200, 2, 32, false},
  };
  uint32_t seed = 500;
  for (const Case& c : cases) {
    RopeParams params;
    params.rotary_dim = static_cast<int>(c.dr);
    params.yarn = c.yarn;
    params.factor = 40.0;
    params.mscale = 0.707;
    params.mscale_all_dim = 0.707;
    const int64_t P = 300;
    auto table = Make(DType::kF32, {P, c.dr}, 0);
    ASSERT_OK(FillRopeTable(params, table->h));
    // q_pe: the rope part of q [T, H, dn + dr]; k_pe: the rope part of the
    // latent row [T, Rkv + dr] (both strided views, as in MLA).
    const int64_t dn = 24, rkv = 40;
    auto q = MakeStrided(DType::kF32, {c.tokens, c.heads, c.dr},
                         {c.heads * (dn + c.dr), dn + c.dr, 1}, dn, 0);
    auto k = MakeStrided(DType::kF32, {c.tokens, c.dr}, {rkv + c.dr, 1}, rkv, 0);
    auto pos = MakeStrided(DType::kI32, {c.tokens}, {3}, 2, 0);
    FillRandom(*q, seed++, -2.0f, 2.0f);
    FillRandom(*k, seed++, -2.0f, 2.0f);
    std::mt19937 rng(seed++);
    const std::vector<int64_t> pe = pos->ViewElements();
    std::vector<bool> in_range(c.tokens);
    for (int64_t t = 0; t < c.tokens; ++t) {
      int32_t p = static_cast<int32_t>(rng() % P);
      if (t % 5 == 2) p = (t % 2) ? -1 : static_cast<int32_t>(P + t);  // left unchanged
      in_range[t] = p >= 0 && p < P;
      reinterpret_cast<int32_t*>(pos->host_bytes())[pe[t]] = p;
    }
    Upload(*table);
    Upload(*q);
    Upload(*k);
    Upload(*pos);
    ASSERT_OK(ApplyRope(host(), pos->h, table->h, q->h, k->h));
    ASSERT_OK(ApplyRope(*stream_, pos->d, table->d, q->d, k->d));
    const std::string name = Name("rope", {c.tokens, c.heads, c.dr}, c.yarn ? " yarn" : "");
    ExpectMatchesHost(*q, name + " q_pe", 1e-6, 0);
    ExpectMatchesHost(*k, name + " k_pe", 1e-6, 0);
    // Out-of-range positions: the rows are bit for bit what they were.
    const std::vector<uint8_t> qd = Download(*q), kd = Download(*k);
    for (int64_t t = 0; t < c.tokens; ++t) {
      if (in_range[t]) continue;
      for (int64_t h = 0; h < c.heads; ++h) {
        const int64_t at = (dn + t * q->h.stride(0) + h * q->h.stride(1)) * 4;
        EXPECT_EQ(std::memcmp(qd.data() + at, q->pristine.data() + at, c.dr * 4), 0) << t;
      }
      const int64_t at = (rkv + t * k->h.stride(0)) * 4;
      EXPECT_EQ(std::memcmp(kd.data() + at, k->pristine.data() + at, c.dr * 4), 0) << t;
    }
  }
}

// ---- Sample ----------------------------------------------------------------------------

TEST_F(BasicOpsGpuTest, SampleMatchesHostTokenForToken) {
  struct Case {
    int64_t rows, vocab;
  };
  const std::vector<Case> cases = {{16, 1}, {64, 7}, {512, 1000}, {128, 32000}, {64, 102400},
                                   {48, 129280}};
  uint32_t seed = 600;
  int64_t total_rows = 0, sampled_rows = 0;
  for (const Case& c : cases) {
    const int64_t B = c.rows, V = c.vocab;
    auto logits = Make(DType::kF32, {B, V}, 5, 3);  // strided rows
    auto temp = Make(DType::kF32, {B});
    auto top_k = Make(DType::kI32, {B});
    auto top_p = Make(DType::kF32, {B});
    auto seeds = Make(DType::kI64, {B});
    auto steps = Make(DType::kI64, {B});
    auto out = Make(DType::kI32, {B}, 0, 1, 1);
    std::mt19937 rng(seed++);
    for (int64_t r = 0; r < B; ++r) {
      float* l = static_cast<float*>(logits->h.data()) + r * logits->h.stride(0);
      const int shape = static_cast<int>(r % 6);
      std::normal_distribution<float> normal(0.0f, 1.0f + static_cast<float>(r % 4));
      for (int64_t v = 0; v < V; ++v) {
        float x = normal(rng);
        if (shape == 1) x = std::round(x * 2.0f) / 2.0f;                   // heavy ties
        if (shape == 2) x = static_cast<float>(rng() % 3);                // three levels
        if (shape == 3 && rng() % 4 == 0) x = -kInf;                      // masked
        if (shape == 4 && rng() % 97 == 0) x = kNaN;                      // stray NaNs
        if (shape == 5 && rng() % 3 == 0) x = (rng() % 2) ? 0.0f : -0.0f;  // signed zeros
        l[v] = x;
      }
      const int tk = static_cast<int>(rng() % 8);
      static_cast<float*>(temp->h.data())[r] =
          tk == 0 ? 0.0f : tk == 1 ? 1e-4f : tk == 2 ? 20.0f : 0.3f + (rng() % 100) / 50.0f;
      const int kk = static_cast<int>(rng() % 5);
      static_cast<int32_t*>(top_k->h.data())[r] =
          kk == 0 ? 0 : kk == 1 ? 1 : kk == 2 ? 50 : 1 + static_cast<int32_t>(rng() % (V + 3));
      const int pk = static_cast<int>(rng() % 4);
      static_cast<float*>(top_p->h.data())[r] =
          pk == 0 ? 1.0f : pk == 1 ? 0.0f : static_cast<float>(rng() % 1000) / 1000.0f;
      static_cast<int64_t*>(seeds->h.data())[r] = static_cast<int64_t>(rng());
      static_cast<int64_t*>(steps->h.data())[r] = static_cast<int64_t>(rng() % 100000);
      sampled_rows += static_cast<float*>(temp->h.data())[r] > 0.0f ? 1 : 0;
    }
    for (Twin* t : {logits.get(), temp.get(), top_k.get(), top_p.get(), seeds.get(),
                    steps.get()}) {
      Upload(*t);
    }
    Poison(*out);
    ASSERT_OK(Sample(host(), logits->h, temp->h, top_k->h, top_p->h, seeds->h, steps->h,
                       out->h)
                    );
    ASSERT_OK(Sample(*stream_, logits->d, temp->d, top_k->d, top_p->d, seeds->d, steps->d,
                       out->d)
                    );
    const std::vector<uint8_t> dev = Download(*out);
    const std::vector<int64_t> elems = out->ViewElements();
    int64_t mismatches = 0;
    for (int64_t r = 0; r < B; ++r) {
      int32_t got, want;
      std::memcpy(&got, dev.data() + elems[r] * 4, 4);
      std::memcpy(&want, out->host_bytes() + elems[r] * 4, 4);
      ASSERT_GE(want, 0);
      EXPECT_GE(got, 0) << "row " << r << " not written";
      EXPECT_LT(got, V);
      if (got != want && ++mismatches <= 5) {
        ADD_FAILURE() << "V " << V << " row " << r << ": cuda " << got << ", host " << want
                      << " (T " << static_cast<float*>(temp->h.data())[r] << ", top_k "
                      << static_cast<int32_t*>(top_k->h.data())[r] << ", top_p "
                      << static_cast<float*>(top_p->h.data())[r] << ")";
      }
    }
    EXPECT_EQ(mismatches, 0) << "V " << V;
    // The padding around the output stays poison.
    EXPECT_EQ(std::memcmp(dev.data(), out->pristine.data(), 4), 0);
    EXPECT_EQ(std::memcmp(dev.data() + (B + 1) * 4, out->pristine.data() + (B + 1) * 4, 4), 0);
    std::printf("sample V=%lld: %lld rows, %lld token mismatches\n", static_cast<long long>(V),
                static_cast<long long>(B), static_cast<long long>(mismatches));
    total_rows += B;
  }
  EXPECT_GT(sampled_rows, total_rows / 2);
}

// ---- Graph capture -----------------------------------------------------------------

// embedding -> add_rms_norm -> silu_and_mul -> rope -> sample as one CUDA
// graph; replays must equal eager launches bit for bit, and read new inputs
// through the captured buffers.
TEST_F(BasicOpsGpuTest, GraphReplayEqualsEager) {
  const int64_t T = 6, N = 300, D = 96, I = 40, H = 3, dr = 16, P = 64, V = 5000;
  auto ids = Make(DType::kI32, {T});
  auto table = Make(DType::kBF16, {N, D});
  auto h = Make(DType::kBF16, {T, D});
  auto residual = Make(DType::kF32, {T, D});
  auto w = Make(DType::kBF16, {D});
  auto normed = Make(DType::kBF16, {T, D});
  auto gate_up = Make(DType::kF32, {T, 2 * I});
  auto act = Make(DType::kBF16, {T, I});
  auto pos = Make(DType::kI32, {T});
  auto rope_table = Make(DType::kF32, {P, dr});
  auto q = Make(DType::kF32, {T, H, dr});
  auto k = Make(DType::kF32, {T, dr});
  auto logits = Make(DType::kF32, {T, V});
  auto temp = Make(DType::kF32, {T});
  auto top_k = Make(DType::kI32, {T});
  auto top_p = Make(DType::kF32, {T});
  auto seeds = Make(DType::kI64, {T});
  auto steps = Make(DType::kI64, {T});
  auto tokens = Make(DType::kI32, {T});
  RopeParams params;
  params.rotary_dim = static_cast<int>(dr);
  ASSERT_OK(FillRopeTable(params, rope_table->h));
  FillRandom(*table, 700);
  FillRandom(*w, 701, 0.5f, 1.5f);
  Upload(*table);
  Upload(*w);
  Upload(*rope_table);

  // Inputs of round `round` (0, 1): fresh host contents, uploaded.
  auto set_inputs = [&](uint32_t round) {
    std::mt19937 rng(800 + round);
    for (int64_t t = 0; t < T; ++t) {
      static_cast<int32_t*>(ids->h.data())[t] = static_cast<int32_t>(rng() % N);
      static_cast<int32_t*>(pos->h.data())[t] = static_cast<int32_t>(rng() % P);
      static_cast<float*>(temp->h.data())[t] = t == 0 ? 0.0f : 0.8f;
      static_cast<int32_t*>(top_k->h.data())[t] = t % 2 ? 40 : 0;
      static_cast<float*>(top_p->h.data())[t] = t % 3 ? 0.9f : 1.0f;
      static_cast<int64_t*>(seeds->h.data())[t] = 17 + t;
      static_cast<int64_t*>(steps->h.data())[t] = round;
    }
    FillRandom(*residual, 810 + round);
    FillRandom(*gate_up, 820 + round, -4.0f, 4.0f);
    FillRandom(*q, 830 + round);
    FillRandom(*k, 840 + round);
    FillRandom(*logits, 850 + round, -5.0f, 5.0f);
    for (Twin* t : {ids.get(), pos.get(), temp.get(), top_k.get(), top_p.get(), seeds.get(),
                    steps.get(), residual.get(), gate_up.get(), q.get(), k.get(),
                    logits.get()}) {
      Upload(*t);
    }
    for (Twin* t : {h.get(), normed.get(), act.get(), tokens.get()}) Poison(*t);
  };
  auto launch = [&]() -> absl::Status {
    {
      NodeScope s(*stream_, "test.embed", OpKind::kKernel);
      if (auto st = Embedding(*stream_, ids->d, table->d, h->d); !st.ok()) return st;
    }
    {
      NodeScope s(*stream_, "test.norm", OpKind::kKernel);
      if (auto st = AddRmsNorm(*stream_, h->d, residual->d, w->d, 1e-6f, normed->d); !st.ok()) {
        return st;
      }
    }
    {
      NodeScope s(*stream_, "test.act", OpKind::kKernel);
      if (auto st = SiluAndMul(*stream_, gate_up->d, act->d); !st.ok()) return st;
    }
    {
      NodeScope s(*stream_, "test.rope", OpKind::kKernel);
      if (auto st = ApplyRope(*stream_, pos->d, rope_table->d, q->d, k->d); !st.ok()) return st;
    }
    NodeScope s(*stream_, "test.sample", OpKind::kKernel);
    return Sample(*stream_, logits->d, temp->d, top_k->d, top_p->d, seeds->d, steps->d,
                  tokens->d);
  };
  const std::vector<Twin*> outputs = {h.get(), residual.get(), normed.get(), act.get(),
                                      q.get(), k.get(), tokens.get()};
  auto snapshot = [&]() {
    std::vector<std::vector<uint8_t>> s;
    for (Twin* t : outputs) s.push_back(Download(*t));
    return s;
  };

  std::vector<std::vector<uint8_t>> eager[2];
  for (uint32_t round = 0; round < 2; ++round) {
    set_inputs(round);
    ASSERT_OK(launch());
    eager[round] = snapshot();
  }
  EXPECT_NE(eager[0], eager[1]);  // the rounds' inputs matter

  set_inputs(0);
  ASSERT_OK(stream_->BeginCapture());
  ASSERT_OK(launch());
  auto graph = stream_->EndCapture();
  ASSERT_OK(graph);
  const auto& nodes = (*graph)->nodes();
  ASSERT_EQ(nodes.size(), 5u);
  EXPECT_EQ(nodes[0].name, "test.embed");
  EXPECT_EQ(nodes[4].name, "test.sample");
  // Capturing ran nothing: the outputs still hold their poison.
  EXPECT_EQ(Download(*h), h->pristine);
  EXPECT_EQ(Download(*tokens), tokens->pristine);

  ASSERT_OK((*graph)->Replay(*stream_));
  EXPECT_EQ(snapshot(), eager[0]);
  set_inputs(1);  // new contents in the captured buffers
  ASSERT_OK((*graph)->Replay(*stream_));
  const auto replayed = snapshot();
  for (size_t i = 0; i < outputs.size(); ++i) {
    EXPECT_EQ(replayed[i], eager[1][i]) << "output " << i;
  }
}

}  // namespace
}  // namespace mlag
