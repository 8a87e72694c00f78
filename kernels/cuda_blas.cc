#include "kernels/cuda_blas.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/fp8_gemm.cuh"
#include "kernels/cuda/linear.cuh"
#include "runtime/core/cuda_status.h"
#include "runtime/core/device.h"
#include "runtime/core/status.h"

namespace mlag::cuda_blas {
namespace {

// Status for a cuBLAS(Lt) return code: Internal naming the call and where.
absl::Status LtStatus(cublasStatus_t status, const char* call, const char* where) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed with ", cublasLtGetStatusName(status),
                                          " (", static_cast<int>(status),
                                          "): ", cublasLtGetStatusString(status), " at ", where));
}

#define MLAG_CUBLAS_RETURN_IF_ERROR(call) MLAG_RETURN_IF_ERROR(LtStatus((call), #call, MLAG_WHERE_))

// cuBLASLt's column-major problem D[m, n] = op(A)[m, k] * op(B)[k, n], with
// everything an algorithm choice depends on. Row-major callers pass their
// transposes (see Linear and HeadMatmul below).
struct GemmKey {
  bool trans_a = false;
  bool trans_b = false;
  bool bf16_ab = false;  // A and B in bf16 (C f32); else all f32
  // A and B in e4m3 (C f32), A scaled per 128x128 block, B per 128 along K
  // (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F / VEC128_32F): LinearFp8's
  // form, TN only.
  bool fp8_block = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int32_t batch = 1;  // strides are 0 when batch == 1
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  // Largest power of two (4..256 bytes) dividing the pointer, the leading
  // dimension and (batched) the batch stride, in bytes: what the algorithm
  // may assume about every matrix it touches.
  uint32_t align_a = 0, align_b = 0, align_c = 0;

  auto Tie() const {
    return std::tie(trans_a, trans_b, bf16_ab, fp8_block, m, n, k, lda, ldb, ldc, batch, stride_a,
                    stride_b, stride_c, align_a, align_b, align_c);
  }
  friend bool operator==(const GemmKey& a, const GemmKey& b) { return a.Tie() == b.Tie(); }
  template <typename H>
  friend H AbslHashValue(H h, const GemmKey& key) {
    return H::combine(std::move(h), key.Tie());
  }

  std::string ToString() const {
    return absl::StrCat("m=", m, " n=", n, " k=", k, " transa=", trans_a ? "T" : "N",
                        " transb=", trans_b ? "T" : "N", bf16_ab ? " bf16 A,B" : "",
                        fp8_block ? " e4m3 A,B block-scaled" : "", " lda=", lda, " ldb=", ldb,
                        " ldc=", ldc, " batch=", batch, " strides=", stride_a, "/", stride_b, "/",
                        stride_c, " align=", align_a, "/", align_b, "/", align_c);
  }
};

uint32_t Alignment(const void* p, int64_t ld, int32_t batch, int64_t batch_stride,
                   size_t element_bytes = sizeof(float)) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(ld) * element_bytes;
  if (batch > 1) bits |= static_cast<uint64_t>(batch_stride) * element_bytes;
  uint32_t align = 256;
  while (align > element_bytes && bits % align != 0) align /= 2;
  return align;
}

// Descriptors and the chosen algorithm of one GemmKey. Created once, in an
// eager launch; used by every later launch of the shape, captured or not.
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};

  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    // Destroy calls only free host memory; their status carries nothing to act on.
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

// A column-major layout of `type` elements, rows x cols with leading
// dimension ld, batched with the given stride when batch > 1.
absl::Status MakeLayout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, int64_t rows,
                        int64_t cols, int64_t ld, int32_t batch, int64_t stride) {
  MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(layout, type, static_cast<uint64_t>(rows),
                                                         static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
        *layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
        *layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return absl::OkStatus();
}

// Preference descriptor owner (destroyed on every path).
struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  ~Preference() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  }
};

absl::StatusOr<std::unique_ptr<GemmPlan>> MakePlan(cublasLtHandle_t handle, const GemmKey& key,
                                                   size_t workspace_bytes) {
  auto plan = std::make_unique<GemmPlan>();
  MLAG_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  MLAG_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  MLAG_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (key.fp8_block) {
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
    MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
  }
  // Layouts describe the matrices as stored: a transposed A is k x m.
  const cudaDataType_t ab = key.fp8_block ? CUDA_R_8F_E4M3 : key.bf16_ab ? CUDA_R_16BF : CUDA_R_32F;
  MLAG_RETURN_IF_ERROR(MakeLayout(&plan->a, ab, key.trans_a ? key.k : key.m,
                                  key.trans_a ? key.m : key.k, key.lda, key.batch, key.stride_a));
  MLAG_RETURN_IF_ERROR(MakeLayout(&plan->b, ab, key.trans_b ? key.n : key.k,
                                  key.trans_b ? key.k : key.n, key.ldb, key.batch, key.stride_b));
  MLAG_RETURN_IF_ERROR(
      MakeLayout(&plan->c, CUDA_R_32F, key.m, key.n, key.ldc, key.batch, key.stride_c));

  Preference pref;
  MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref.pref));
  const uint64_t max_workspace = workspace_bytes;
  MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace)));
  MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_a, sizeof(key.align_a)));
  MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_b, sizeof(key.align_b)));
  MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_c, sizeof(key.align_c)));
  MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_c, sizeof(key.align_c)));

  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(
      handle, plan->desc, plan->a, plan->b, plan->c, plan->c, pref.pref, 1, &result, &returned));
  if (returned < 1) {
    return absl::InternalError(
        absl::StrCat("cublasLtMatmulAlgoGetHeuristic found no algorithm for ", key.ToString()));
  }
  plan->algo = result.algo;
  return plan;
}

// The per-stream context (see the header). Used only by its stream's one
// user thread (see Stream), so it takes no lock.
class Context {
 public:
  static absl::StatusOr<std::unique_ptr<Context>> Create(Stream& stream) {
    std::unique_ptr<Context> ctx(new Context());
    MLAG_RETURN_IF_ERROR(stream.device().MakeCurrent());
    MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&ctx->handle_));
    MLAG_ASSIGN_OR_RETURN(ctx->workspace_, stream.device().Allocate(kWorkspaceBytes));
    return ctx;
  }

  ~Context() {
    plans_.clear();  // descriptors before the handle
    if (handle_ != nullptr) cublasLtDestroy(handle_);
  }

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_.data(); }
  size_t workspace_bytes() const { return workspace_.bytes(); }

  // The plan of `key`: cached, or chosen now when not capturing.
  absl::StatusOr<const GemmPlan*> Plan(const GemmKey& key, bool capturing, absl::string_view op,
                                       absl::string_view shape) {
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second.get();
    if (capturing) {
      return absl::FailedPreconditionError(absl::StrCat(
          op, ": no cuBLASLt algorithm cached for ", shape, " (", key.ToString(),
          ") during a graph capture; run this shape eagerly on the stream before capturing it "
          "(the model runner warms up every batch size before capture)"));
    }
    MLAG_ASSIGN_OR_RETURN(std::unique_ptr<GemmPlan> plan,
                          MakePlan(handle_, key, workspace_.bytes()));
    const GemmPlan* p = plan.get();
    plans_.emplace(key, std::move(plan));
    return p;
  }

  // Plan for a shape cuBLASLt may not support (LinearFp8's block-scaled
  // form: sm_90 only): nullptr when the library found no algorithm, which is
  // remembered, so the caller's fallback is chosen once, eagerly.
  absl::StatusOr<const GemmPlan*> TryPlan(const GemmKey& key, bool capturing, absl::string_view op,
                                          absl::string_view shape) {
    if (unsupported_.contains(key)) return nullptr;
    if (plans_.contains(key) || capturing) return Plan(key, capturing, op, shape);
    absl::StatusOr<std::unique_ptr<GemmPlan>> plan = MakePlan(handle_, key, workspace_.bytes());
    if (!plan.ok()) {
      unsupported_.insert(key);
      return nullptr;
    }
    const GemmPlan* p = plan->get();
    plans_.emplace(key, *std::move(plan));
    return p;
  }

  size_t plan_count() const { return plans_.size(); }
  size_t fp8_matmuls = 0;  // LinearFp8 launches through cuBLASLt, for tests

  absl::StatusOr<void*> Scratch(Stream& stream, size_t bytes, absl::string_view user) {
    if (bytes <= scratch_.bytes()) return bytes == 0 ? nullptr : scratch_.data();
    if (stream.capturing()) {
      return absl::FailedPreconditionError(absl::StrCat(
          user, ": needs ", bytes, " bytes of per-stream scratch during a graph capture, ",
          scratch_.bytes(),
          " allocated; run this shape eagerly before capturing it, or pass a workspace"));
    }
    const size_t grown = std::max(bytes, 2 * scratch_.bytes());
    MLAG_ASSIGN_OR_RETURN(Buffer fresh, stream.device().Allocate(grown));
    // Graphs captured earlier may point into the old buffer: keep it.
    if (scratch_.bytes() > 0) retired_scratch_.push_back(std::move(scratch_));
    scratch_ = std::move(fresh);
    return scratch_.data();
  }

 private:
  Context() = default;

  cublasLtHandle_t handle_ = nullptr;
  Buffer workspace_;
  absl::flat_hash_map<GemmKey, std::unique_ptr<GemmPlan>> plans_;
  absl::flat_hash_set<GemmKey> unsupported_;
  Buffer scratch_;
  std::vector<Buffer> retired_scratch_;
};

// The key of the context among the stream's attachments.
const char kContextKey = 0;

// The context of `stream`, created on its first eager use and kept as one of
// the stream's attachments, so it is released with the stream.
absl::StatusOr<std::shared_ptr<Context>> GetContext(Stream& stream, absl::string_view op) {
  if (!stream.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": cuBLASLt on a host stream"));
  }
  std::shared_ptr<void> found = stream.attachment(&kContextKey);
  if (found != nullptr) return std::static_pointer_cast<Context>(found);
  if (stream.capturing()) {
    return absl::FailedPreconditionError(
        absl::StrCat(op,
                     ": the stream has no CUDA context yet and none can be created during a graph "
                     "capture; run every shape eagerly on the stream before capturing it"));
  }
  MLAG_ASSIGN_OR_RETURN(std::unique_ptr<Context> created, Context::Create(stream));
  std::shared_ptr<Context> ctx(std::move(created));
  stream.set_attachment(&kContextKey, ctx);
  return ctx;
}

// Enqueues `plan`'s matmul D = op(A) op(B) on the stream as op `op`, with
// A's and B's scales (fp8_block plans; the descriptor keeps the pointers
// until the next call sets its own).
absl::Status LaunchPlan(Stream& stream, Context& context, const GemmPlan* plan,
                        absl::string_view op, absl::string_view shape, const void* a, const void* b,
                        void* c, const OpCost& cost, const void* a_scale = nullptr,
                        const void* b_scale = nullptr) {
  Context* ctx = &context;
  if (a_scale != nullptr || b_scale != nullptr) {
    MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    MLAG_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
  }
  static const float kOne = 1.0f;
  static const float kZero = 0.0f;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  absl::Status launched = stream.LaunchCuda(
      op, OpKind::kGemm,
      [&](void* s) {
        status = cublasLtMatmul(ctx->handle(), plan->desc, &kOne, a, plan->a, b, plan->b, &kZero, c,
                                plan->c, c, plan->c, &plan->algo, ctx->workspace(),
                                ctx->workspace_bytes(), static_cast<cudaStream_t>(s));
        // LaunchCuda speaks cudaError_t: a failed cublasLtMatmul is reported as
        // cudaErrorUnknown there (and poisons a capture); the status below names it.
        return status == CUBLAS_STATUS_SUCCESS ? 0 : static_cast<int>(cudaErrorUnknown);
      },
      cost);
  if (status != CUBLAS_STATUS_SUCCESS) {
    absl::Status s = LtStatus(status, "cublasLtMatmul", MLAG_WHERE_);
    return absl::Status(s.code(), absl::StrCat(op, " ", shape, ": ", s.message()));
  }
  return launched;
}

// Runs one planned matmul D = op(A) op(B) on the stream as op `op`.
absl::Status RunGemm(Stream& stream, absl::string_view op, absl::string_view shape,
                     const GemmKey& key, const void* a, const void* b, void* c,
                     const OpCost& cost) {
  MLAG_ASSIGN_OR_RETURN(std::shared_ptr<Context> ctx, GetContext(stream, op));
  MLAG_ASSIGN_OR_RETURN(const GemmPlan* plan, ctx->Plan(key, stream.capturing(), op, shape));
  return LaunchPlan(stream, *ctx, plan, op, shape, a, b, c, cost);
}

// Zeroes an f32 [n0, n1, n2] view (an empty reduction's result).
absl::Status LaunchZero(Stream& stream, absl::string_view op, float* p, int64_t n0, int64_t n1,
                        int64_t n2, int64_t stride0, int64_t stride1) {
  return stream.LaunchCuda(op, OpKind::kGemm, [&](void* s) {
    return static_cast<int>(
        cuda::LaunchZeroF32(p, n0, n1, n2, stride0, stride1, static_cast<cudaStream_t>(s)));
  });
}

}  // namespace

absl::Status Linear(Stream& stream, const Tensor& x, const Tensor& weight, const Tensor& y) {
  const int64_t rows = x.size(0);
  const int64_t in = x.size(1);
  const int64_t out = weight.size(0);
  if (rows == 0 || out == 0) return absl::OkStatus();
  if (in == 0) {
    return LaunchZero(stream, "linear", y.data_as<float>(), rows, 1, out, y.stride(0), 0);
  }
  // Column-major: y^T [out, rows] = W [out, in] (stored in x out, ld in, so
  // transposed) * x^T [in, rows] (ld = x's row stride). A single row's stride
  // is never used; cuBLASLt still wants ld >= rows of the stored matrix.
  GemmKey key;
  key.trans_a = true;
  key.trans_b = false;
  key.m = out;
  key.n = rows;
  key.k = in;
  key.lda = in;
  key.ldb = rows > 1 ? x.stride(0) : in;
  key.ldc = rows > 1 ? y.stride(0) : out;
  const void* b = x.data();
  if (weight.dtype() == DType::kBF16) {
    // bf16 weights: x rounded to bf16 into the stream's scratch (cuBLASLt
    // takes A and B of one type), then bf16 x bf16 with f32 accumulation.
    MLAG_ASSIGN_OR_RETURN(void* xb, Scratch(stream, static_cast<size_t>(rows * in) * 2, "linear"));
    MLAG_RETURN_IF_ERROR(stream.LaunchCuda(
        "linear", OpKind::kGemm,
        [&](void* s) {
          return static_cast<int>(cuda::LaunchF32ToBf16Rows(x.data_as<float>(), rows, in,
                                                            x.stride(0), static_cast<uint16_t*>(xb),
                                                            static_cast<cudaStream_t>(s)));
        },
        OpCost{static_cast<double>(rows * in) * (sizeof(float) + 2), 0, DType::kF32}));
    b = xb;
    key.bf16_ab = true;
    key.ldb = in;
  }
  const size_t ab_bytes = key.bf16_ab ? 2 : sizeof(float);
  key.align_a = Alignment(weight.data(), key.lda, 1, 0, ab_bytes);
  key.align_b = Alignment(b, key.ldb, 1, 0, ab_bytes);
  key.align_c = Alignment(y.data(), key.ldc, 1, 0);
  const std::string shape = absl::StrCat(
      "x ", x.ShapeString(), " (row stride ", x.stride(0), ") * weight ", weight.ShapeString(), " ",
      DTypeName(weight.dtype()), "^T -> y ", y.ShapeString(), " (row stride ", y.stride(0), ")");
  // Weights read once, x (as multiplied) read, y written.
  const OpCost cost{static_cast<double>(weight.nbytes()) +
                        static_cast<double>(rows * in) * ab_bytes +
                        static_cast<double>(rows * out) * sizeof(float),
                    2.0 * rows * in * out, weight.dtype()};
  return RunGemm(stream, "linear", shape, key, weight.data(), b, y.data(), cost);
}

absl::StatusOr<bool> Fp8GemmSupported(int device) {
  bool supported = false;
  MLAG_CUDA_RETURN_IF_ERROR(cuda::Fp8BlockGemmSupported(device, &supported));
  return supported;
}

absl::Status LinearFp8(Stream& stream, const Tensor& x, const Tensor& weight, const Tensor& scales,
                       const Tensor& block_scales, const Tensor& y) {
  const int64_t rows = x.size(0);
  const int64_t in = x.size(1);
  const int64_t out = weight.size(0);
  if (rows == 0 || out == 0) return absl::OkStatus();
  if (in == 0) {
    return LaunchZero(stream, "linear", y.data_as<float>(), rows, 1, out, y.stride(0), 0);
  }
  MLAG_ASSIGN_OR_RETURN(const bool supported, Fp8GemmSupported(stream.device().index()));
  if (!supported) {
    return absl::FailedPreconditionError(
        absl::StrCat("linear: fp8 weights need an sm_89 or newer GPU and a build for it (",
                     stream.device().name(), "); the loader keeps them in bf16 there"));
  }
  const OpCost cost{static_cast<double>(weight.nbytes() + scales.nbytes()) +
                        // x read as f32 and written and read again as e4m3; y written
                        static_cast<double>(rows * in) * (sizeof(float) + 2) +
                        static_cast<double>(rows * out) * sizeof(float),
                    2.0 * rows * in * out, weight.dtype()};
  MLAG_ASSIGN_OR_RETURN(std::shared_ptr<Context> ctx, GetContext(stream, "linear"));
  const int64_t blocks = (in + 127) / 128;

  // cuBLASLt's block-scaled FP8 (sm_90): the weights as A, transposed
  // (stored [out, in]: k x m, ld in), with their block scales as
  // BLK128x128; x quantized as B [in, rows] (ld the 16-byte row pitch) with
  // VEC128 scales [blocks][roundup(rows, 4)]. Without block scales, or where
  // cuBLASLt finds no algorithm (sm_89, sm_100), the tensor-core GEMM of
  // fp8_gemm.cuh. cuBLASLt is expected to stream the weights near the copy
  // bandwidth at every batch; the device bundle's profile measures it.
  // MLAG_FP8_GEMM=tc keeps every shape on the tensor-core GEMM, for a
  // benchmark of the two paths on one GPU (tests/gpu/run_device_checks.sh).
  static const bool force_tc = [] {
    const char* v = std::getenv("MLAG_FP8_GEMM");
    return v != nullptr && std::string(v) == "tc";
  }();
  if (!force_tc && block_scales.data() != nullptr && in % 16 == 0) {
    GemmKey key;
    key.trans_a = true;
    key.fp8_block = true;
    key.m = out;
    key.n = rows;
    key.k = in;
    key.lda = in;
    key.ldb = cuda::Fp8QuantizedPitch(in);
    key.ldc = rows > 1 ? y.stride(0) : out;
    key.align_a = Alignment(weight.data(), key.lda, 1, 0, 1);
    key.align_b = 16;  // the scratch below: 256-byte aligned, 16-byte pitch
    key.align_c = Alignment(y.data(), key.ldc, 1, 0);
    const std::string shape = absl::StrCat("x ", x.ShapeString(), " * weight ",
                                           weight.ShapeString(), " e4m3 block-scaled^T -> y ",
                                           y.ShapeString(), " (row stride ", y.stride(0), ")");
    MLAG_ASSIGN_OR_RETURN(const GemmPlan* plan,
                          ctx->TryPlan(key, stream.capturing(), "linear", shape));
    if (plan != nullptr) {
      const int64_t sx_ld = (rows + 3) / 4 * 4;
      const size_t scale_bytes =
          (static_cast<size_t>(blocks * sx_ld) * sizeof(float) + 255) / 256 * 256;
      MLAG_ASSIGN_OR_RETURN(
          void* scratch,
          Scratch(stream, scale_bytes + static_cast<size_t>(rows * key.ldb), "linear (fp8)"));
      float* sx = static_cast<float*>(scratch);
      uint8_t* qx = static_cast<uint8_t*>(scratch) + scale_bytes;
      MLAG_RETURN_IF_ERROR(stream.LaunchCuda("linear", OpKind::kGemm, [&](void* s) {
        return static_cast<int>(cuda::LaunchQuantizeFp8RowsVec128(x.data_as<float>(), rows, in,
                                                                  x.stride(0), qx, sx, sx_ld,
                                                                  static_cast<cudaStream_t>(s)));
      }));
      ++ctx->fp8_matmuls;
      return LaunchPlan(stream, *ctx, plan, "linear", shape, weight.data(), qx, y.data(), cost,
                        block_scales.data(), sx);
    }
  }

  int sm_count = 0;
  MLAG_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, stream.device().index()));
  const int splits = cuda::Fp8GemmSplits(rows, out, in, sm_count);
  const size_t scale_bytes = static_cast<size_t>(rows * blocks) * sizeof(float);
  const size_t quantized_bytes = (cuda::Fp8QuantizedBytes(rows, in) + 255) / 256 * 256;
  MLAG_ASSIGN_OR_RETURN(
      void* scratch, Scratch(stream, quantized_bytes + cuda::Fp8GemmPartialBytes(rows, out, splits),
                             "linear (fp8)"));
  float* sx = static_cast<float*>(scratch);
  uint8_t* qx = static_cast<uint8_t*>(scratch) + (scale_bytes + 255) / 256 * 256;
  float* partials = splits > 1
                        ? reinterpret_cast<float*>(static_cast<char*>(scratch) + quantized_bytes)
                        : nullptr;
  return stream.LaunchCuda(
      "linear", OpKind::kGemm,
      [&](void* s) {
        const cudaStream_t cs = static_cast<cudaStream_t>(s);
        cudaError_t err =
            cuda::LaunchQuantizeFp8Rows(x.data_as<float>(), rows, in, x.stride(0), qx, sx, cs);
        if (err != cudaSuccess) return static_cast<int>(err);
        return static_cast<int>(cuda::LaunchFp8BlockGemm(
            qx, sx, weight.data_as<uint8_t>(), scales.data_as<float>(), rows, out, in,
            y.data_as<float>(), y.stride(0), splits, partials, cs));
      },
      cost);
}

absl::Status HeadMatmul(Stream& stream, const Tensor& x, const Tensor& weight, bool transpose_w,
                        const Tensor& out) {
  const int64_t rows = x.size(0);
  const int64_t heads = x.size(1);
  const int64_t k = x.size(2);
  const int64_t n = out.size(2);
  if (rows == 0 || heads == 0 || n == 0) return absl::OkStatus();
  if (k == 0) {
    return LaunchZero(stream, "head_matmul", out.data_as<float>(), rows, heads, n, out.stride(0),
                      out.stride(1));
  }
  // Per head h, column-major: out_h^T [n, rows] = B_h^T [n, k] * x_h^T [k, rows].
  // W[h] [k, n] row-major is [n, k] column-major with ld n (no transpose);
  // W[h] [n, k] row-major is [k, n] column-major with ld k (transposed).
  GemmKey key;
  key.trans_a = transpose_w;
  key.trans_b = false;
  key.m = n;
  key.n = rows;
  key.k = k;
  key.lda = transpose_w ? k : n;
  key.ldb = rows > 1 ? x.stride(0) : k;
  key.ldc = rows > 1 ? out.stride(0) : n;
  key.batch = static_cast<int32_t>(heads);
  if (heads > 1) {
    key.stride_a = n * k;
    key.stride_b = x.stride(1);
    key.stride_c = out.stride(1);
  }
  key.align_a = Alignment(weight.data(), key.lda, key.batch, key.stride_a);
  key.align_b = Alignment(x.data(), key.ldb, key.batch, key.stride_b);
  key.align_c = Alignment(out.data(), key.ldc, key.batch, key.stride_c);
  const std::string shape = absl::StrCat(
      "x ", x.ShapeString(), " (strides ", x.stride(0), ", ", x.stride(1), ") with weight ",
      weight.ShapeString(), transpose_w ? " transposed" : "", " -> out ", out.ShapeString(),
      " (strides ", out.stride(0), ", ", out.stride(1), ")");
  const OpCost cost{static_cast<double>(weight.nbytes()) +
                        static_cast<double>(rows * heads) * (k + n) * sizeof(float),
                    2.0 * rows * heads * k * n, DType::kF32};
  return RunGemm(stream, "head_matmul", shape, key, weight.data(), x.data(), out.data(), cost);
}

absl::StatusOr<double> MeasureMatmulFlops(Stream& stream, DType ab, int64_t n, int reps) {
  if (ab != DType::kF32 && ab != DType::kBF16 && ab != DType::kF8E4M3) {
    return absl::InvalidArgumentError(absl::StrCat("MeasureMatmulFlops: ", DTypeName(ab),
                                                   " operands; expected f32, bf16 or e4m3"));
  }
  if (n < 1 || n > 65536 || reps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MeasureMatmulFlops: n ", n, ", reps ", reps, "; expected 1..65536, >= 1"));
  }
  const bool fp8 = ab == DType::kF8E4M3;
  const size_t esize = DTypeSize(ab);
  const size_t elements = static_cast<size_t>(n * n);
  MLAG_ASSIGN_OR_RETURN(Buffer a, stream.device().Allocate(elements * esize));
  MLAG_ASSIGN_OR_RETURN(Buffer b, stream.device().Allocate(elements * esize));
  MLAG_ASSIGN_OR_RETURN(Buffer c, stream.device().Allocate(elements * sizeof(float)));
  // Small finite operands (every byte 0x3c: about 0.0115 in either float
  // dtype, 1.5 in e4m3), not zeros, which some GPUs multiply faster.
  MLAG_RETURN_IF_ERROR(stream.Memset(a.data(), 0x3c, a.bytes()));
  MLAG_RETURN_IF_ERROR(stream.Memset(b.data(), 0x3c, b.bytes()));
  GemmKey key;
  key.trans_a = true;  // Linear's form
  key.m = key.n = key.k = n;
  key.lda = key.ldb = key.ldc = n;
  key.bf16_ab = ab == DType::kBF16;
  key.fp8_block = fp8;
  key.align_a = Alignment(a.data(), n, 1, 0, esize);
  key.align_b = Alignment(b.data(), n, 1, 0, esize);
  key.align_c = Alignment(c.data(), n, 1, 0);
  const std::string shape = absl::StrCat(n, "^3 ", DTypeName(ab));
  MLAG_ASSIGN_OR_RETURN(std::shared_ptr<Context> ctx, GetContext(stream, "matmul_probe"));
  // FP8: LinearFp8's block-scaled form, with scales (A BLK128x128, B
  // VEC128) in the layouts cuBLASLt reads, filled like the operands.
  Buffer a_scales, b_scales;
  const GemmPlan* plan = nullptr;
  if (fp8) {
    const int64_t blocks = (n + 127) / 128;
    MLAG_ASSIGN_OR_RETURN(
        a_scales, stream.device().Allocate(static_cast<size_t>(blocks * ((blocks + 3) / 4 * 4)) *
                                           sizeof(float)));
    MLAG_ASSIGN_OR_RETURN(
        b_scales,
        stream.device().Allocate(static_cast<size_t>(blocks * ((n + 3) / 4 * 4)) * sizeof(float)));
    MLAG_RETURN_IF_ERROR(stream.Memset(a_scales.data(), 0x3c, a_scales.bytes()));
    MLAG_RETURN_IF_ERROR(stream.Memset(b_scales.data(), 0x3c, b_scales.bytes()));
    MLAG_ASSIGN_OR_RETURN(plan, ctx->TryPlan(key, false, "matmul_probe", shape));
    if (plan == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("MeasureMatmulFlops: cuBLASLt has no block-scaled FP8 matmul on ",
                       stream.device().name()));
    }
  } else {
    MLAG_ASSIGN_OR_RETURN(plan, ctx->Plan(key, false, "matmul_probe", shape));
  }
  auto run = [&] {
    return LaunchPlan(stream, *ctx, plan, "matmul_probe", shape, a.data(), b.data(), c.data(), {},
                      fp8 ? a_scales.data() : nullptr, fp8 ? b_scales.data() : nullptr);
  };
  MLAG_RETURN_IF_ERROR(run());
  cudaEvent_t start = nullptr, end = nullptr;
  MLAG_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  absl::Cleanup destroy_start = [&] { cudaEventDestroy(start); };
  MLAG_CUDA_RETURN_IF_ERROR(cudaEventCreate(&end));
  absl::Cleanup destroy_end = [&] { cudaEventDestroy(end); };
  const cudaStream_t cs = static_cast<cudaStream_t>(stream.native());
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    MLAG_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, cs));
    MLAG_RETURN_IF_ERROR(run());
    MLAG_CUDA_RETURN_IF_ERROR(cudaEventRecord(end, cs));
    MLAG_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end));
    float ms = 0;
    MLAG_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, end));
    seconds.push_back(ms / 1e3);
  }
  MLAG_RETURN_IF_ERROR(stream.Synchronize());
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  if (median <= 0) return absl::InternalError("MeasureMatmulFlops: a matmul timed at 0 s");
  return 2.0 * n * n * n / median;
}

absl::StatusOr<void*> Scratch(Stream& stream, size_t bytes, absl::string_view user) {
  MLAG_ASSIGN_OR_RETURN(std::shared_ptr<Context> ctx, GetContext(stream, user));
  return ctx->Scratch(stream, bytes, user);
}

size_t CachedAlgorithmCount(const Stream& stream) {
  std::shared_ptr<void> found = stream.attachment(&kContextKey);
  return found == nullptr ? 0 : std::static_pointer_cast<Context>(found)->plan_count();
}

size_t CublasLtFp8Matmuls(const Stream& stream) {
  std::shared_ptr<void> found = stream.attachment(&kContextKey);
  return found == nullptr ? 0 : std::static_pointer_cast<Context>(found)->fp8_matmuls;
}

}  // namespace mlag::cuda_blas
