// The emulated cuBLASLt and NCCL keep the libraries' rules. cuBLASLt:
// matmuls against a double-precision reference (transposes, batches, bf16
// operands), no heuristic query during a capture, FP8 with Hopper's block
// scaling read in the documented layouts (and its rules: TN only, sm_90
// only, not BLK128x128 on both operands, scales required). NCCL, four thread ranks
// on four emulated GPUs: every collective against its definition (sums in
// rank order, so every rank holds the same bits), captured collectives
// replayed, groups, splits; and, broken on purpose: two ranks on one device,
// collectives in different orders, a send and a receive of different sizes,
// a send and a receive in one group (not emulated), and destroying or
// aborting a communicator that captured graphs still reference (real NCCL
// would wait for ever there). Built only with -Demulate_cuda=true.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_api.cuh"
#include "runtime/core/scalar_types.h"

namespace {

using ::testing::ExitedWithCode;
using ::testing::HasSubstr;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call
#define LT_OK(call) ASSERT_EQ((call), CUBLAS_STATUS_SUCCESS) << #call
#define NCCL_OK(call) ASSERT_EQ((call), ncclSuccess) << #call << ": " << ncclGetLastError(nullptr)

template <typename T>
T* Upload(const std::vector<T>& v) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> Download(const T* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// ---- cuBLASLt -------------------------------------------------------------------------

struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() { cublasLtMatrixLayoutDestroy(l); }
};

// D = op(A) op(B), column-major, batched, A and B of `type` (f32 or bf16),
// against the same product in double over the operands as stored.
void CheckMatmul(cudaDataType_t type, bool ta, bool tb, int m, int n, int k, int batch) {
  SCOPED_TRACE(::testing::Message() << "type " << type << " ta " << ta << " tb " << tb << " m " << m
                                    << " n " << n << " k " << k << " batch " << batch);
  const int a_rows = ta ? k : m, a_cols = ta ? m : k;
  const int b_rows = tb ? n : k, b_cols = tb ? k : n;
  const int lda = a_rows + 3, ldb = b_rows + 1, ldd = m + 2;
  const int64_t sa = int64_t{lda} * a_cols, sb = int64_t{ldb} * b_cols, sd = int64_t{ldd} * n;
  std::mt19937 rng(static_cast<unsigned>(m * 131 + n * 17 + k));
  std::uniform_real_distribution<float> u(-1, 1);
  const size_t esize = type == CUDA_R_32F ? 4 : 2;
  std::vector<char> a(static_cast<size_t>(sa * batch) * esize),
      b(static_cast<size_t>(sb * batch) * esize);
  const mlag::DType dt = type == CUDA_R_32F ? mlag::DType::kF32 : mlag::DType::kBF16;
  for (size_t i = 0; i < a.size() / esize; ++i) mlag::StoreFromF32(dt, a.data(), i, u(rng));
  for (size_t i = 0; i < b.size() / esize; ++i) mlag::StoreFromF32(dt, b.data(), i, u(rng));
  char* da = Upload(a);
  char* db = Upload(b);
  float* dd = Upload(std::vector<float>(static_cast<size_t>(sd * batch), std::nanf("")));

  cublasLtHandle_t h;
  LT_OK(cublasLtCreate(&h));
  cublasLtMatmulDesc_t desc;
  LT_OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                          opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  Layout la, lb, ld;
  LT_OK(cublasLtMatrixLayoutCreate(&la.l, type, a_rows, a_cols, lda));
  LT_OK(cublasLtMatrixLayoutCreate(&lb.l, type, b_rows, b_cols, ldb));
  LT_OK(cublasLtMatrixLayoutCreate(&ld.l, CUDA_R_32F, m, n, ldd));
  for (auto [layout, stride] : {std::pair{la.l, sa}, std::pair{lb.l, sb}, std::pair{ld.l, sd}}) {
    LT_OK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                           sizeof(batch)));
    LT_OK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                           &stride, sizeof(stride)));
  }
  cublasLtMatmulPreference_t pref;
  LT_OK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t result;
  int returned = 0;
  LT_OK(
      cublasLtMatmulAlgoGetHeuristic(h, desc, la.l, lb.l, ld.l, ld.l, pref, 1, &result, &returned));
  ASSERT_EQ(returned, 1);
  const float one = 1.0f, zero = 0.0f;
  LT_OK(cublasLtMatmul(h, desc, &one, da, la.l, db, lb.l, &zero, dd, ld.l, dd, ld.l, &result.algo,
                       nullptr, 0, nullptr));
  const std::vector<float> got = Download(dd, static_cast<size_t>(sd * batch));
  double worst = 0;
  for (int q = 0; q < batch; ++q) {
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        double want = 0;
        for (int p = 0; p < k; ++p) {
          const size_t ai = static_cast<size_t>(q * sa + (ta ? i * lda + p : p * lda + i));
          const size_t bi = static_cast<size_t>(q * sb + (tb ? p * ldb + j : j * ldb + p));
          want += double{mlag::LoadAsF32(dt, a.data(), ai)} * mlag::LoadAsF32(dt, b.data(), bi);
        }
        const float g = got[static_cast<size_t>(q * sd + j * ldd + i)];
        worst = std::max(worst, std::abs(g - want));
      }
    }
  }
  EXPECT_LT(worst, 1e-5 * k);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dd)})
    cudaFree(p);
}

TEST(EmulatedCublasLtTest, MatmulsMatchADoubleReference) {
  for (cudaDataType_t type : {CUDA_R_32F, CUDA_R_16BF}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) CheckMatmul(type, ta, tb, 7, 5, 33, 3);
    }
  }
  CheckMatmul(CUDA_R_32F, true, false, 64, 1, 130, 1);
}

// Block-scaled FP8 (TN): A stored k x m (ld lda), B k x n, each with a
// scale tensor in its mode's documented layout, the padding filled with NaN
// (a read of it poisons the result); D against the definition in double:
// sum over 128-wide K blocks of sA(i, kb) sB(j, kb) (A_kb . B_kb), written
// here from <cublasLt.h>'s index formulas. `swap`: the reference exchanges
// A's block-0 scales of rows 0 and 1 (VEC128) or of row blocks 0 and 1
// (BLK128x128), and must then disagree.
enum class Mode { kVec128, kBlk128 };

struct Fp8Operand {
  std::vector<uint8_t> q;  // k x rows, column-major (row r's k values at r * ld)
  std::vector<float> s;    // the scale tensor as laid out
  int rows, ld;
  Mode mode;
  size_t ScaleIndex(int r, int kb, int k) const {
    const int blocks = (k + 127) / 128;
    return mode == Mode::kVec128 ? static_cast<size_t>(kb * ((rows + 3) / 4 * 4) + r)
                                 : static_cast<size_t>(r / 128 * ((blocks + 3) / 4 * 4) + kb);
  }
};

Fp8Operand MakeFp8Operand(std::mt19937& rng, int rows, int k, Mode mode) {
  Fp8Operand o{{}, {}, rows, (k + 15) / 16 * 16, mode};
  std::uniform_real_distribution<float> u(-400, 400), su(0.01f, 2.0f);
  o.q.resize(static_cast<size_t>(o.ld) * rows);
  for (uint8_t& v : o.q) v = mlag::F32ToF8E4M3(u(rng));
  const int blocks = (k + 127) / 128;
  const size_t n = mode == Mode::kVec128
                       ? static_cast<size_t>(blocks * ((rows + 3) / 4 * 4))
                       : static_cast<size_t>((rows + 127) / 128 * ((blocks + 3) / 4 * 4));
  o.s.assign(n, std::nanf(""));
  for (int r = 0; r < rows; ++r) {
    for (int kb = 0; kb < blocks; ++kb) o.s[o.ScaleIndex(r, kb, k)] = su(rng);
  }
  return o;
}

cublasLtMatmulMatrixScale_t LtMode(Mode m) {
  return m == Mode::kVec128 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                            : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

void CheckBlockScaledFp8(Mode a_mode, Mode b_mode, int m, int n, int k) {
  SCOPED_TRACE(::testing::Message() << "A " << (a_mode == Mode::kVec128 ? "VEC128" : "BLK128x128")
                                    << " B " << (b_mode == Mode::kVec128 ? "VEC128" : "BLK128x128")
                                    << " m " << m << " n " << n << " k " << k);
  std::mt19937 rng(static_cast<unsigned>(m * 7 + n * 131 + k));
  const Fp8Operand a = MakeFp8Operand(rng, m, k, a_mode), b = MakeFp8Operand(rng, n, k, b_mode);
  uint8_t* da = Upload(a.q);
  uint8_t* db = Upload(b.q);
  float* dsa = Upload(a.s);
  float* dsb = Upload(b.s);
  const int ldd = m + 1;
  float* dd = Upload(std::vector<float>(static_cast<size_t>(ldd) * n, std::nanf("")));

  cublasLtHandle_t h;
  LT_OK(cublasLtCreate(&h));
  cublasLtMatmulDesc_t desc;
  LT_OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
  LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  const int32_t am = LtMode(a_mode), bm = LtMode(b_mode);
  LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof(am)));
  LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof(bm)));
  Layout la, lb, ld;
  LT_OK(cublasLtMatrixLayoutCreate(&la.l, CUDA_R_8F_E4M3, k, m, a.ld));
  LT_OK(cublasLtMatrixLayoutCreate(&lb.l, CUDA_R_8F_E4M3, k, n, b.ld));
  LT_OK(cublasLtMatrixLayoutCreate(&ld.l, CUDA_R_32F, m, n, ldd));
  cublasLtMatmulPreference_t pref;
  LT_OK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t result;
  int returned = 0;
  LT_OK(
      cublasLtMatmulAlgoGetHeuristic(h, desc, la.l, lb.l, ld.l, ld.l, pref, 1, &result, &returned));
  ASSERT_EQ(returned, 1);
  const float one = 1.0f, zero = 0.0f;
  // Scales are required with a block mode.
  EXPECT_EQ(cublasLtMatmul(h, desc, &one, da, la.l, db, lb.l, &zero, dd, ld.l, dd, ld.l,
                           &result.algo, nullptr, 0, nullptr),
            CUBLAS_STATUS_INVALID_VALUE);
  LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dsa,
                                       sizeof(dsa)));
  LT_OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dsb,
                                       sizeof(dsb)));
  LT_OK(cublasLtMatmul(h, desc, &one, da, la.l, db, lb.l, &zero, dd, ld.l, dd, ld.l, &result.algo,
                       nullptr, 0, nullptr));
  const std::vector<float> got = Download(dd, static_cast<size_t>(ldd) * n);
  // want(i, j), with A's block-0 scales of rows 0 and 1 exchanged if `swap`.
  auto want = [&](int i, int j, bool swap, double* abs_sum) {
    double acc = 0;
    *abs_sum = 0;
    for (int k0 = 0; k0 < k; k0 += 128) {
      const int kb = k0 / 128;
      const int group = a_mode == Mode::kVec128 ? 1 : 128;
      const int ai = !swap || kb != 0 || i >= 2 * group ? i : i < group ? i + group : i - group;
      const double scale = double{a.s[a.ScaleIndex(ai, kb, k)]} * b.s[b.ScaleIndex(j, kb, k)];
      for (int p = k0; p < std::min(k, k0 + 128); ++p) {
        const double prod = double{mlag::F8E4M3ToF32(a.q[static_cast<size_t>(i * a.ld + p)])} *
                            mlag::F8E4M3ToF32(b.q[static_cast<size_t>(j * b.ld + p)]) * scale;
        acc += prod;
        *abs_sum += std::abs(prod);
      }
    }
    return acc;
  };
  // f32 accumulation of k products, then the output's rounding.
  const double gamma = k * std::ldexp(1.0, -24) / (1 - k * std::ldexp(1.0, -24));
  int outside = 0, outside_swapped = 0;
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double abs_sum;
      const double w = want(i, j, false, &abs_sum);
      const double bound = gamma * abs_sum + std::abs(w) * std::ldexp(1.0, -24);
      const double g = got[static_cast<size_t>(j * ldd + i)];
      if (!(std::abs(g - w) <= bound)) ++outside;
      const double ws = want(i, j, true, &abs_sum);
      if (!(std::abs(g - ws) <= bound)) ++outside_swapped;
    }
  }
  EXPECT_EQ(outside, 0);
  if (m > (a_mode == Mode::kVec128 ? 1 : 128)) {
    EXPECT_GT(outside_swapped, 0) << "exchanged scales would go unnoticed";
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
  for (void* p : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dsa),
                  static_cast<void*>(dsb), static_cast<void*>(dd)})
    cudaFree(p);
}

TEST(EmulatedCublasLtTest, BlockScaledFp8ReadsTheDocumentedLayouts) {
  // Odd row counts (VEC128's padded leading dimension), K with a short last
  // block and block counts not a multiple of 4 (BLK128x128's padding), and
  // more than 128 rows (a second row block).
  for (auto [am, bm] :
       {std::pair{Mode::kVec128, Mode::kVec128}, std::pair{Mode::kBlk128, Mode::kVec128},
        std::pair{Mode::kVec128, Mode::kBlk128}}) {
    for (auto [m, n, k] : {std::tuple{70, 5, 300}, std::tuple{130, 3, 512}, std::tuple{2, 1, 16},
                           std::tuple{33, 17, 1040}}) {
      CheckBlockScaledFp8(am, bm, m, n, k);
    }
  }
}

// The rules of block-scaled FP8: refused, not computed some other way.
TEST(EmulatedCublasLtTest, BlockScaledFp8Rules) {
  cublasLtHandle_t h;
  LT_OK(cublasLtCreate(&h));
  cublasLtMatmulPreference_t pref;
  LT_OK(cublasLtMatmulPreferenceCreate(&pref));
  // Heuristic status of (trans A, trans B, A mode, B mode, A/B type).
  auto query = [&](cublasOperation_t opa, cublasOperation_t opb, int32_t am, int32_t bm,
                   cudaDataType_t type) {
    cublasLtMatmulDesc_t desc;
    EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof(am));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof(bm));
    Layout la, lb, ld;
    const bool ta = opa == CUBLAS_OP_T;
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&la.l, type, ta ? 256 : 64, ta ? 64 : 256, ta ? 256 : 64),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&lb.l, type, 256, 64, 256), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&ld.l, CUDA_R_32F, 64, 64, 64), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t result;
    int returned = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, desc, la.l, lb.l, ld.l, ld.l, pref,
                                                             1, &result, &returned);
    cublasLtMatmulDescDestroy(desc);
    return st;
  };
  const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const int32_t blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  EXPECT_EQ(query(CUBLAS_OP_T, CUBLAS_OP_N, blk, vec, CUDA_R_8F_E4M3), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(query(CUBLAS_OP_N, CUBLAS_OP_N, blk, vec, CUDA_R_8F_E4M3),
            CUBLAS_STATUS_NOT_SUPPORTED);  // FP8 is TN only
  EXPECT_EQ(query(CUBLAS_OP_T, CUBLAS_OP_N, blk, blk, CUDA_R_8F_E4M3), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(query(CUBLAS_OP_T, CUBLAS_OP_N, blk, vec, CUDA_R_16BF), CUBLAS_STATUS_NOT_SUPPORTED);
  // Hopper's modes: an sm_89 or sm_100 GPU has none of them.
  for (const char* cc : {"89", "100"}) {
    setenv("MLAG_EMULATED_COMPUTE_CAPABILITY", cc, 1);
    EXPECT_EQ(query(CUBLAS_OP_T, CUBLAS_OP_N, blk, vec, CUDA_R_8F_E4M3),
              CUBLAS_STATUS_NOT_SUPPORTED)
        << "compute capability " << cc;
    unsetenv("MLAG_EMULATED_COMPUTE_CAPABILITY");
  }
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtDestroy(h);
}

TEST(EmulatedCublasLtTest, NoHeuristicQueryDuringACapture) {
  cublasLtHandle_t h;
  LT_OK(cublasLtCreate(&h));
  cublasLtMatmulDesc_t desc;
  LT_OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  Layout l;
  LT_OK(cublasLtMatrixLayoutCreate(&l.l, CUDA_R_32F, 4, 4, 4));
  cublasLtMatmulPreference_t pref;
  LT_OK(cublasLtMatmulPreferenceCreate(&pref));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cublasLtMatmulHeuristicResult_t result;
  int returned = 0;
  EXPECT_EQ(
      cublasLtMatmulAlgoGetHeuristic(h, desc, l.l, l.l, l.l, l.l, pref, 1, &result, &returned),
      CUBLAS_STATUS_NOT_SUPPORTED);
  cudaGraph_t g = nullptr;
  CUDA_OK(cudaStreamEndCapture(s, &g));
  CUDA_OK(cudaGraphDestroy(g));
  EXPECT_EQ(
      cublasLtMatmulAlgoGetHeuristic(h, desc, l.l, l.l, l.l, l.l, pref, 1, &result, &returned),
      CUBLAS_STATUS_SUCCESS);
  CUDA_OK(cudaStreamDestroy(s));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
}

// ---- NCCL -------------------------------------------------------------------------------

constexpr int kRanks = 4;

// One thread per rank, rank r on device r with its own stream; `body`
// gets the communicator and the stream.
void OnRanks(const std::vector<ncclComm_t>& comms,
             const std::function<void(int, ncclComm_t, cudaStream_t)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(comms.size()); ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      cudaStream_t s;
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      body(r, comms[static_cast<size_t>(r)], s);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
    });
  }
  for (std::thread& t : threads) t.join();
}

std::vector<ncclComm_t> InitAll() {
  std::vector<ncclComm_t> comms(kRanks);
  std::vector<int> devices = {0, 1, 2, 3};
  EXPECT_EQ(ncclCommInitAll(comms.data(), kRanks, devices.data()), ncclSuccess);
  return comms;
}

void DestroyAll(const std::vector<ncclComm_t>& comms) {
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Rank r's value i: distinct per rank and element, random in the low bits.
float Value(int r, size_t i) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r) * 3.0);
}

TEST(EmulatedNcclTest, CollectivesMatchTheirDefinitions) {
  auto comms = InitAll();
  const size_t n = (size_t{1} << 19) + 7;  // more than one window per rank
  std::vector<std::vector<float>> gathered(kRanks), reduced(kRanks), scattered(kRanks),
      broadcast(kRanks), received(kRanks);
  OnRanks(comms, [&](int r, ncclComm_t c, cudaStream_t s) {
    std::vector<float> mine(n);
    for (size_t i = 0; i < n; ++i) mine[i] = Value(r, i);
    float* send = Upload(mine);
    float* all = Upload(std::vector<float>(n * kRanks, 0.0f));
    float* sum = Upload(std::vector<float>(n, 0.0f));
    float* slice = Upload(std::vector<float>(n / kRanks, 0.0f));
    float* bcast = Upload(mine);
    float* from_left = Upload(std::vector<float>(n, 0.0f));
    NCCL_OK(ncclAllGather(send, all, n, ncclFloat32, c, s));
    NCCL_OK(ncclAllReduce(send, sum, n, ncclFloat32, ncclSum, c, s));
    NCCL_OK(ncclReduceScatter(send, slice, n / kRanks, ncclFloat32, ncclSum, c, s));
    NCCL_OK(ncclBroadcast(bcast, bcast, n, ncclFloat32, 2, c, s));
    // A ring without cycles: even ranks send first.
    const int right = (r + 1) % kRanks, left = (r + kRanks - 1) % kRanks;
    if (r % 2 == 0) {
      NCCL_OK(ncclSend(send, n, ncclFloat32, right, c, s));
      NCCL_OK(ncclRecv(from_left, n, ncclFloat32, left, c, s));
    } else {
      NCCL_OK(ncclRecv(from_left, n, ncclFloat32, left, c, s));
      NCCL_OK(ncclSend(send, n, ncclFloat32, right, c, s));
    }
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    gathered[r] = Download(all, n * kRanks);
    reduced[r] = Download(sum, n);
    scattered[r] = Download(slice, n / kRanks);
    broadcast[r] = Download(bcast, n);
    received[r] = Download(from_left, n);
    for (float* p : {send, all, sum, slice, bcast, from_left}) cudaFree(p);
  });
  for (int r = 0; r < kRanks; ++r) {
    SCOPED_TRACE(r);
    int bad_gather = 0, bad_sum = 0, bad_slice = 0, bad_bcast = 0, bad_recv = 0;
    for (size_t i = 0; i < n; ++i) {
      float want = Value(0, i);  // f32 sums in rank order
      for (int q = 1; q < kRanks; ++q) want += Value(q, i);
      bad_sum += reduced[r][i] != want;
      bad_bcast += broadcast[r][i] != Value(2, i);
      bad_recv += received[r][i] != Value((r + kRanks - 1) % kRanks, i);
      for (int q = 0; q < kRanks; ++q) bad_gather += gathered[r][q * n + i] != Value(q, i);
    }
    for (size_t i = 0; i < n / kRanks; ++i) {
      const size_t g = r * (n / kRanks) + i;
      float want = Value(0, g);
      for (int q = 1; q < kRanks; ++q) want += Value(q, g);
      bad_slice += scattered[r][i] != want;
    }
    EXPECT_EQ(bad_gather + bad_sum + bad_slice + bad_bcast + bad_recv, 0)
        << bad_gather << " " << bad_sum << " " << bad_slice << " " << bad_bcast << " " << bad_recv;
  }
  DestroyAll(comms);
}

TEST(EmulatedNcclTest, CapturedAndGroupedCollectivesReplay) {
  auto comms = InitAll();
  std::vector<std::vector<int64_t>> got(kRanks);
  OnRanks(comms, [&](int r, ncclComm_t c, cudaStream_t s) {
    int64_t* send = Upload(std::vector<int64_t>{r + 1, 10 * (r + 1)});
    int64_t* max = Upload(std::vector<int64_t>(2, 0));
    int64_t* all = Upload(std::vector<int64_t>(2 * kRanks, 0));
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclAllReduce(send, max, 2, ncclInt64, ncclMax, c, s));
    NCCL_OK(ncclAllGather(send, all, 2, ncclInt64, c, s));
    NCCL_OK(ncclGroupEnd());
    cudaGraph_t g = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    cudaGraphExec_t e = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(e, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    got[r] = Download(max, 2);
    for (int64_t v : Download(all, 2 * kRanks)) got[r].push_back(v);
    ASSERT_EQ(cudaGraphExecDestroy(e), cudaSuccess);
    ASSERT_EQ(cudaGraphDestroy(g), cudaSuccess);
    for (int64_t* p : {send, max, all}) cudaFree(p);
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(got[r], (std::vector<int64_t>{4, 40, 1, 10, 2, 20, 3, 30, 4, 40})) << r;
  }
  DestroyAll(comms);  // the graphs are gone: allowed
}

TEST(EmulatedNcclTest, SplitMakesGroupsOrderedByKey) {
  auto comms = InitAll();
  std::vector<int> new_rank(kRanks, -2), new_size(kRanks, -2);
  OnRanks(comms, [&](int r, ncclComm_t c, cudaStream_t) {
    ncclComm_t sub = nullptr;
    // Even ranks form a group ordered by descending old rank; rank 3 joins none.
    NCCL_OK(ncclCommSplit(c, r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2, -r, &sub, nullptr));
    if (sub == nullptr) return;
    ncclCommUserRank(sub, &new_rank[r]);
    ncclCommCount(sub, &new_size[r]);
    EXPECT_EQ(ncclCommDestroy(sub), ncclSuccess);
  });
  EXPECT_EQ(new_rank, (std::vector<int>{1, 0, 0, -2}));
  EXPECT_EQ(new_size, (std::vector<int>{2, 1, 2, -2}));
  DestroyAll(comms);
}

TEST(EmulatedNcclTest, TwoRanksOnOneDeviceAreRefused) {
  std::vector<ncclComm_t> comms(2);
  const int devices[] = {1, 1};
  EXPECT_EQ(ncclCommInitAll(comms.data(), 2, devices), ncclInvalidUsage);
  EXPECT_THAT(ncclGetLastError(nullptr), HasSubstr("two ranks of one communicator on one device"));
}

TEST(EmulatedNcclTest, AbortUnsticksACollectiveAPeerNeverJoins) {
  auto comms = InitAll();
  cudaSetDevice(0);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float* buf = Upload(std::vector<float>(16, 1.0f));
  NCCL_OK(ncclAllReduce(buf, buf, 16, ncclFloat32, ncclSum, comms[0], s));  // the others never do
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  NCCL_OK(ncclCommAbort(comms[0]));  // returns once the collective gave up
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_EQ(ncclAllReduce(buf, buf, 16, ncclFloat32, ncclSum, comms[0], s), ncclInvalidUsage);
  for (int r = 1; r < kRanks; ++r) EXPECT_EQ(ncclCommAbort(comms[r]), ncclSuccess);
  CUDA_OK(cudaStreamDestroy(s));
  cudaFree(buf);
}

__global__ void AddKernel(float* p, float v, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] += v;
}

TEST(EmulatedNcclTest, CollectivesQueuedBehindADeviceFaultDoNotHoldDestroy) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // In a child: the fault is sticky for the process's device 0.
  auto fault_then_destroy = [] {
    alarm(60);  // a destroy that waits for ever ends the child with SIGALRM
    auto comms = InitAll();
    cudaSetDevice(0);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float* buf = Upload(std::vector<float>(16, 1.0f));
    std::vector<float> pageable(64, 0.0f);
    // Held until both are queued, so the fault comes first and the
    // collective is queued behind it (not refused at issue).
    std::promise<void> open;
    std::shared_future<void> opened = open.get_future().share();
    cudaLaunchHostFunc(
        s, [](void* f) { static_cast<std::shared_future<void>*>(f)->wait(); }, &opened);
    MLAG_LAUNCH(AddKernel, 1, 32, 0, s)(pageable.data(), 1.0f, 64);  // faults
    // Never run (and never joined by the peers).
    const bool queued =
        ncclAllReduce(buf, buf, 16, ncclFloat32, ncclSum, comms[0], s) == ncclSuccess;
    open.set_value();
    const bool faulted = cudaStreamSynchronize(s) == cudaErrorIllegalAddress;
    bool destroyed = true;
    for (ncclComm_t c : comms) destroyed &= ncclCommDestroy(c) == ncclSuccess;
    std::exit(queued && faulted && destroyed ? 0 : 1);
  };
  EXPECT_EXIT(fault_then_destroy(), ExitedWithCode(0), "is not device memory");
}

// The rules whose breach would hang or corrupt a real job end the process
// with a message naming the rule.
class EmulatedNcclRuleTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Rank 0 captures an all-reduce, then destroys (or aborts) its communicator
// with the graph alive.
void DestroyWithLiveGraph(bool abort) {
  auto comms = InitAll();
  cudaSetDevice(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float* buf = Upload(std::vector<float>(4, 1.0f));
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comms[0], s);
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(s, &g);
  if (abort) {
    ncclCommAbort(comms[0]);
  } else {
    ncclCommDestroy(comms[0]);
  }
  std::exit(0);  // not reached
}

TEST_F(EmulatedNcclRuleTest, NoDestroyWhileCapturedGraphsReferenceTheCommunicator) {
  EXPECT_DEATH(DestroyWithLiveGraph(false),
               "NCCL rule violated: ncclCommDestroy .* while 1 captured CUDA graph");
}

TEST_F(EmulatedNcclRuleTest, NoAbortWhileCapturedGraphsReferenceTheCommunicator) {
  EXPECT_DEATH(DestroyWithLiveGraph(true),
               "NCCL rule violated: ncclCommAbort .* while 1 captured CUDA graph");
}

TEST_F(EmulatedNcclRuleTest, CollectivesMustBeIssuedInTheSameOrderEverywhere) {
  auto mismatched = [] {
    auto comms = InitAll();
    OnRanks(comms, [&](int r, ncclComm_t c, cudaStream_t s) {
      float* buf = Upload(std::vector<float>(8 * (kRanks + 1), 1.0f));
      if (r == 1) {
        ncclAllReduce(buf, buf, 8, ncclFloat32, ncclSum, c, s);
      } else {
        ncclAllGather(buf, buf + 8, 8, ncclFloat32, c, s);
      }
      cudaStreamSynchronize(s);
    });
    std::exit(0);
  };
  EXPECT_DEATH(mismatched(), "collectives issued in a different order .* on different ranks");
}

TEST_F(EmulatedNcclRuleTest, ASendAndItsReceiveMustAgreeOnTheSize) {
  auto mismatched = [] {
    auto comms = InitAll();
    OnRanks(comms, [&](int r, ncclComm_t c, cudaStream_t s) {
      float* buf = Upload(std::vector<float>(64, 1.0f));
      if (r == 0) ncclSend(buf, 64, ncclFloat32, 1, c, s);
      if (r == 1) ncclRecv(buf, 32, ncclFloat32, 0, c, s);
      cudaStreamSynchronize(s);
    });
    std::exit(0);
  };
  EXPECT_DEATH(mismatched(), "rank 0 sends 256 bytes to rank 1, which receives 128");
}

// Not a rule of NCCL's but a limit of the emulation, which would hang on it.
TEST_F(EmulatedNcclRuleTest, ASendAndAReceiveInOneGroupAreRefused) {
  auto grouped = [] {
    auto comms = InitAll();
    cudaSetDevice(0);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float* buf = Upload(std::vector<float>(8, 1.0f));
    ncclGroupStart();
    ncclSend(buf, 4, ncclFloat32, 1, comms[0], s);
    ncclRecv(buf + 4, 4, ncclFloat32, 1, comms[0], s);
    ncclGroupEnd();
    std::exit(0);
  };
  EXPECT_DEATH(grouped(), "not emulated: ncclSend and ncclRecv in one group");
}

}  // namespace
