// The emulated cuBLASLt: descriptors as plain structs, one "algorithm",
// matmuls enqueued on the emulated stream and computed with OpenBLAS's
// sgemm (bf16 and f16 operands are widened to f32 first); FP8 (e4m3)
// operands with their scale modes (SCALAR_32F, and Hopper's VEC128_32F and
// BLK128x128_32F block scaling, laid out as <cublasLt.h> here documents)
// are summed in double per 128-wide K block, scaled, and rounded once.
// Rules the real library enforces and the emulation checks: consistent
// layouts, device pointers on the stream's device, no heuristic query while
// the calling thread captures, FP8 only in the TN form with 16-byte leading
// dimensions, block scaling only on compute capability 9.x and never
// BLK128x128 on both operands, every block-scaled operand given its scales.
#include "kernels/cuda/emulation/include/cublasLt.h"

#include <cblas.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/emulation/emulated_runtime.h"
#include "runtime/core/scalar_types.h"

struct cublasLtContext {
  uint64_t magic = 0x6c74686e646c;  // "lthndl"
};

struct cublasLtMatmulDescOpaque {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  cublasOperation_t trans_a = CUBLAS_OP_N;
  cublasOperation_t trans_b = CUBLAS_OP_N;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  int32_t a_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  int32_t b_scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};

struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t stride = 0;  // elements between batch entries
};

struct cublasLtMatmulPreferenceOpaque {
  uint64_t max_workspace = 0;
};

namespace {

using mlag::emu::WorkItem;
using mlag::emu::WorkKind;

constexpr uint64_t kAlgoMagic = 0x656d75616c676f;  // "emualgo"

bool IsFloatType(cudaDataType_t t) {
  return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F;
}

bool IsBlockMode(int32_t mode) {
  return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ||
         mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

uint64_t RoundUp4(uint64_t v) { return (v + 3) / 4 * 4; }

// Elements of an operand's scale tensor: op(X) has `rows` rows (m for A, n
// for B) and k columns (the layouts of <cublasLt.h>).
size_t ScaleElements(int32_t mode, uint64_t rows, uint64_t k) {
  const uint64_t kb = (k + 127) / 128;
  switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:
      return static_cast<size_t>(kb * RoundUp4(rows));
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:
      return static_cast<size_t>((rows + 127) / 128 * RoundUp4(kb));
    default:
      return 1;
  }
}

// The scale of row r, K block kb of op(X) (1 for a scalar mode without a
// pointer).
double ScaleAt(int32_t mode, const float* scale, uint64_t rows, uint64_t k, uint64_t r,
               uint64_t kb) {
  switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:
      return scale[kb * RoundUp4(rows) + r];
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:
      return scale[r / 128 * RoundUp4((k + 127) / 128) + kb];
    default:
      return scale == nullptr ? 1.0 : scale[0];
  }
}

// The compute capability (major) of `device`, or -1.
int ComputeMajor(int device) {
  int major = -1;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return major;
}

size_t TypeBytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_8F_E4M3 ? 1 : 2; }

// Elements a layout spans, batches included.
size_t Span(const cublasLtMatrixLayoutOpaque& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  size_t one = static_cast<size_t>(l.ld) * (l.cols - 1) + l.rows;
  return one + static_cast<size_t>(l.batch - 1) * static_cast<size_t>(l.stride);
}

// Matrix `l` of batch entry `b` at `base`, widened to f32, column-major
// with leading dimension `ld` (returns a pointer into `scratch` or `base`).
const float* AsF32(const void* base, const cublasLtMatrixLayoutOpaque& l, int b,
                   std::vector<float>* scratch) {
  const size_t offset = static_cast<size_t>(b) * static_cast<size_t>(l.stride);
  if (l.type == CUDA_R_32F) return static_cast<const float*>(base) + offset;
  const mlag::DType dtype = l.type == CUDA_R_16BF ? mlag::DType::kBF16 : mlag::DType::kF16;
  const size_t n = static_cast<size_t>(l.ld) * (l.cols - 1) + l.rows;
  scratch->resize(n);
  for (size_t i = 0; i < n; ++i) {
    (*scratch)[i] = mlag::LoadAsF32(dtype, base, offset + i);
  }
  return scratch->data();
}

}  // namespace

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
  }
  return "unknown status";
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
  *handle = new cublasLtContext();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  if (desc == nullptr || compute != CUBLAS_COMPUTE_32F || scale_type != CUDA_R_32F) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *desc = new cublasLtMatmulDescOpaque();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  if (desc == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
      cublasOperation_t op;
      std::memcpy(&op, buf, sizeof(op));
      if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->trans_a : desc->trans_b) = op;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: {
      if (size != sizeof(const void*)) return CUBLAS_STATUS_INVALID_VALUE;
      const void* p;
      std::memcpy(&p, buf, sizeof(p));
      (attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER ? desc->a_scale : desc->b_scale) = p;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE:
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: {
      if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      int32_t mode;
      std::memcpy(&mode, buf, sizeof(mode));
      if (mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && !IsBlockMode(mode)) {
        return CUBLAS_STATUS_NOT_SUPPORTED;  // the modes of other GPUs and dtypes
      }
      (attr == CUBLASLT_MATMUL_DESC_A_SCALE_MODE ? desc->a_scale_mode : desc->b_scale_mode) = mode;
      return CUBLAS_STATUS_SUCCESS;
    }
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr || !(IsFloatType(type) || type == CUDA_R_8F_E4M3) ||
      ld < static_cast<int64_t>(rows) || ld < 1) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  auto* l = new cublasLtMatrixLayoutOpaque();
  l->type = type;
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  *layout = l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  if (layout == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&layout->batch, buf, size);
      return layout->batch >= 1 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      if (size != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&layout->stride, buf, size);
      return layout->stride >= 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (pref == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (size != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&pref->max_workspace, buf, size);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      uint32_t align;
      std::memcpy(&align, buf, size);
      // Powers of two (2 bytes: a bf16 matrix with an odd leading
      // dimension); nothing else is valid.
      return align >= 1 && (align & (align - 1)) == 0 ? CUBLAS_STATUS_SUCCESS
                                                      : CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

namespace {

// The shapes of a matmul, checked for consistency: op(A) is m x k, op(B)
// k x n, C and D m x n, one batch count.
struct Problem {
  uint64_t m = 0, n = 0, k = 0;
  int32_t batch = 1;
  bool fp8 = false;
};

// `device`: the GPU it runs on (the current one for a heuristic query).
cublasStatus_t CheckProblem(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                            cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                            cublasLtMatrixLayout_t d, int device, Problem* p) {
  if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;
  p->m = d->rows;
  p->n = d->cols;
  p->k = ta ? a->rows : a->cols;
  if ((ta ? a->cols : a->rows) != p->m || (tb ? b->cols : b->rows) != p->k ||
      (tb ? b->rows : b->cols) != p->n || c->rows != p->m || c->cols != p->n) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (a->batch != d->batch || b->batch != d->batch || c->batch != d->batch) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (c->type != CUDA_R_32F || d->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  p->batch = d->batch;
  const bool fp8_a = a->type == CUDA_R_8F_E4M3, fp8_b = b->type == CUDA_R_8F_E4M3;
  p->fp8 = fp8_a && fp8_b;
  const bool block = IsBlockMode(desc->a_scale_mode) || IsBlockMode(desc->b_scale_mode);
  if (fp8_a != fp8_b) return CUBLAS_STATUS_NOT_SUPPORTED;  // no mixed FP8 here
  if (!p->fp8) {
    // Scale modes and pointers are FP8 features.
    if (block || desc->a_scale != nullptr || desc->b_scale != nullptr) {
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    return CUBLAS_STATUS_SUCCESS;
  }
  // FP8 tensor-core GEMMs: the TN form only, 16-byte leading dimensions.
  if (!ta || tb || a->ld % 16 != 0 || b->ld % 16 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (block) {
    if (ComputeMajor(device) != 9) return CUBLAS_STATUS_NOT_SUPPORTED;  // Hopper's modes
    if (desc->a_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F &&
        desc->b_scale_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) {
      return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    // Batched block scaling is not emulated.
    if (p->batch != 1) return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* returned) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (pref == nullptr || requested < 1 || results == nullptr || returned == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (mlag::emu::CaptureForbidsUnsafeCalls()) return CUBLAS_STATUS_NOT_SUPPORTED;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return CUBLAS_STATUS_NOT_INITIALIZED;
  Problem p;
  const cublasStatus_t bad = CheckProblem(desc, a, b, c, d, device, &p);
  if (bad != CUBLAS_STATUS_SUCCESS) return bad;
  std::memset(results, 0, sizeof(*results));
  results->algo.data[0] = kAlgoMagic;
  results->state = CUBLAS_STATUS_SUCCESS;
  results->wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t a_desc, const void* b,
                              cublasLtMatrixLayout_t b_desc, const void* beta, const void* c,
                              cublasLtMatrixLayout_t c_desc, void* d, cublasLtMatrixLayout_t d_desc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (algo == nullptr) {
    // Without an algorithm the library runs its heuristic now: refused
    // during a capture, like an explicit query.
    if (mlag::emu::CaptureForbidsUnsafeCalls()) return CUBLAS_STATUS_NOT_SUPPORTED;
  } else if (algo->data[0] != kAlgoMagic) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const int device = mlag::emu::StreamDevice(stream);
  if (device < 0) return CUBLAS_STATUS_INVALID_VALUE;
  Problem p;
  const cublasStatus_t bad = CheckProblem(desc, a_desc, b_desc, c_desc, d_desc, device, &p);
  if (bad != CUBLAS_STATUS_SUCCESS) return bad;
  const cublasLtMatmulDescOpaque dv = *desc;  // scale pointers as set now
  if ((IsBlockMode(dv.a_scale_mode) && dv.a_scale == nullptr) ||
      (IsBlockMode(dv.b_scale_mode) && dv.b_scale == nullptr)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  float alpha_v, beta_v;
  std::memcpy(&alpha_v, alpha, sizeof(float));
  std::memcpy(&beta_v, beta, sizeof(float));
  const cublasLtMatrixLayoutOpaque la = *a_desc, lb = *b_desc, lc = *c_desc, ld = *d_desc;
  const bool ta = desc->trans_a == CUBLAS_OP_T, tb = desc->trans_b == CUBLAS_OP_T;

  WorkItem w;
  w.kind = WorkKind::kKernel;
  w.what = "cublasLtMatmul m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) +
           " k=" + std::to_string(p.k) + " batch=" + std::to_string(p.batch);
  w.function = reinterpret_cast<const void*>(&cublasLtMatmul);
  w.run = [=]() -> cudaError_t {
    if (p.m == 0 || p.n == 0) return cudaSuccess;
    struct Operand {
      const void* ptr;
      size_t bytes;
      const char* name;
    } operands[] = {
        {a, Span(la) * TypeBytes(la.type), "A"},
        {b, Span(lb) * TypeBytes(lb.type), "B"},
        {c, beta_v != 0.0f ? Span(lc) * 4 : 0, "C"},
        {d, Span(ld) * 4, "D"},
        {workspace, workspace_bytes, "workspace"},
        {dv.a_scale, dv.a_scale ? ScaleElements(dv.a_scale_mode, p.m, p.k) * 4 : 0, "A scales"},
        {dv.b_scale, dv.b_scale ? ScaleElements(dv.b_scale_mode, p.n, p.k) * 4 : 0, "B scales"},
    };
    for (const Operand& o : operands) {
      if (o.bytes == 0) continue;
      const std::string why = mlag::emu::CheckDeviceAccess(o.ptr, o.bytes, device);
      if (!why.empty()) {
        std::fprintf(stderr, "cuda emulation: cublasLtMatmul: %s: %s\n", o.name, why.c_str());
        return cudaErrorIllegalAddress;
      }
    }
    if (p.fp8) {
      // TN: A stored k x m (column i of A is row i of op(A)), B k x n.
      const auto* qa = static_cast<const uint8_t*>(a);
      const auto* qb = static_cast<const uint8_t*>(b);
      const auto* sa = static_cast<const float*>(dv.a_scale);
      const auto* sb = static_cast<const float*>(dv.b_scale);
      const float* in_c = static_cast<const float*>(c);
      float* out = static_cast<float*>(d);
      for (uint64_t j = 0; j < p.n; ++j) {
        for (uint64_t i = 0; i < p.m; ++i) {
          double acc = 0.0;
          for (uint64_t k0 = 0; k0 < p.k; k0 += 128) {
            double block = 0.0;
            for (uint64_t kk = k0; kk < p.k && kk < k0 + 128; ++kk) {
              block += static_cast<double>(mlag::F8E4M3ToF32(qa[i * la.ld + kk])) *
                       static_cast<double>(mlag::F8E4M3ToF32(qb[j * lb.ld + kk]));
            }
            acc += block * ScaleAt(dv.a_scale_mode, sa, p.m, p.k, i, k0 / 128) *
                   ScaleAt(dv.b_scale_mode, sb, p.n, p.k, j, k0 / 128);
          }
          double v = static_cast<double>(alpha_v) * acc;
          if (beta_v != 0.0f) v += static_cast<double>(beta_v) * in_c[j * lc.ld + i];
          out[j * ld.ld + i] = static_cast<float>(v);
        }
      }
      return cudaSuccess;
    }
    std::vector<float> a32, b32;
    for (int32_t batch = 0; batch < p.batch; ++batch) {
      float* out =
          static_cast<float*>(d) + static_cast<size_t>(batch) * static_cast<size_t>(ld.stride);
      const float* in_c = static_cast<const float*>(c) +
                          static_cast<size_t>(batch) * static_cast<size_t>(lc.stride);
      // D starts as beta * C (exactly 0 when beta is 0: stale D, even NaN,
      // must not leak in), then sgemm adds alpha op(A) op(B).
      for (uint64_t col = 0; col < p.n; ++col) {
        for (uint64_t row = 0; row < p.m; ++row) {
          const float cv = beta_v != 0.0f ? beta_v * in_c[col * lc.ld + row] : 0.0f;
          out[col * ld.ld + row] = cv;
        }
      }
      if (p.k == 0) continue;
      const float* av = AsF32(a, la, batch, &a32);
      const float* bv = AsF32(b, lb, batch, &b32);
      cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                  static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), alpha_v, av,
                  static_cast<int>(la.ld), bv, static_cast<int>(lb.ld), 1.0f, out,
                  static_cast<int>(ld.ld));
    }
    return cudaSuccess;
  };
  return mlag::emu::Enqueue(stream, std::move(w)) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                 : CUBLAS_STATUS_EXECUTION_FAILED;
}
