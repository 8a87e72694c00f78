#include "layers/weight_arena.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/host/parallel.h"
#include "runtime/core/fp8_blocks.h"
#include "runtime/core/status.h"

namespace mlag {
namespace {

// Rows per parallel conversion item: one fp8 block row.
constexpr int64_t kConvertRows = kFp8BlockSize;

// Checks fp8 block scales and values read from `name`.
absl::Status CheckFp8(const std::string& name, const uint8_t* q, int64_t n, const float* scales,
                      int64_t num_scales) {
  for (int64_t i = 0; i < num_scales; ++i) {
    if (!(scales[i] > 0.0f && scales[i] <= kFp8MaxScale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': fp8 block scale ", i, " is ", scales[i],
                       ", expected a finite value in (0, ", kFp8MaxScale, "]"));
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if ((q[i] & 0x7f) == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': fp8 element ", i, " is NaN"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

float* WeightArena::Staging(int64_t n) {
  if (static_cast<int64_t>(staging_.size()) < n) staging_.resize(static_cast<size_t>(n));
  return staging_.data();
}

absl::string_view WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kAuto:
      return "auto";
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kFp8:
      return "fp8";
  }
  return "?";
}

absl::StatusOr<WeightFormat> ParseWeightFormat(absl::string_view name) {
  for (WeightFormat f :
       {WeightFormat::kAuto, WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kFp8}) {
    if (WeightFormatName(f) == name) return f;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("weight dtype '", name, "': expected auto, f32, bf16 or fp8"));
}

DType WeightArena::LinearDType(const WeightSource& source, absl::string_view name,
                               bool allow_fp8) const {
  DType d = DType::kF32;
  switch (format_) {
    case WeightFormat::kAuto: {
      const DType stored = source.StoredDType(name);
      d = stored == DType::kBF16 || stored == DType::kF8E4M3 ? stored : DType::kF32;
      break;
    }
    case WeightFormat::kF32:
      d = DType::kF32;
      break;
    case WeightFormat::kBF16:
      d = DType::kBF16;
      break;
    case WeightFormat::kFp8:
      d = DType::kF8E4M3;
      break;
  }
  // bf16 (dequantized at load) where fp8 is not wanted or the device has no
  // fp8 GEMM: the fallback for GPUs before sm_89.
  return d == DType::kF8E4M3 && (!allow_fp8 || !Fp8OnDevice()) ? DType::kBF16 : d;
}

bool WeightArena::Fp8OnDevice() const {
  if (fp8_on_device_ < 0) {
    // A failed query counts as "no": bf16 works everywhere.
    const absl::StatusOr<bool> supported = Fp8LinearSupported(*device_);
    fp8_on_device_ = supported.ok() && *supported ? 1 : 0;
  }
  return fp8_on_device_ == 1;
}

absl::StatusOr<LinearWeight> WeightArena::AllocateLinear(std::initializer_list<int64_t> shape,
                                                         DType dtype) {
  return AllocateLinearImpl(shape, dtype, /*zero=*/true);
}

absl::StatusOr<LinearWeight> WeightArena::AllocateLinearImpl(std::initializer_list<int64_t> shape,
                                                             DType dtype, bool zero) {
  LinearWeight w;
  MLAG_ASSIGN_OR_RETURN(w.values, AllocateImpl(shape, dtype, zero));
  if (dtype == DType::kF8E4M3) {
    std::vector<int64_t> s(shape);
    s.back() = Fp8Blocks(s.back());
    Tensor probe(nullptr, DType::kF32, s);
    MLAG_ASSIGN_OR_RETURN(Buffer buf, device_->Allocate(probe.nbytes()));
    if (zero) MLAG_RETURN_IF_ERROR(device_->Zero(buf.data(), probe.nbytes()));
    w.scales = buf.AsTensor(DType::kF32, s);
    bytes_ += buf.bytes();
    bytes_by_dtype_[DType::kF32] += buf.bytes();
    buffers_.push_back(std::move(buf));
  }
  return w;
}

absl::StatusOr<LinearWeight> WeightArena::LoadLinear(WeightSource& source, const std::string& name,
                                                     std::initializer_list<int64_t> shape,
                                                     bool allow_fp8) {
  MLAG_ASSIGN_OR_RETURN(LinearWeight w,
                        AllocateLinearImpl(shape, LinearDType(source, name, allow_fp8),
                                           /*zero=*/false));
  MLAG_RETURN_IF_ERROR(AddBlockScales(w));
  MLAG_RETURN_IF_ERROR(LoadLinearInto(source, name, shape, w));
  MLAG_RETURN_IF_ERROR(PackForLinear(*device_, w));
  return w;
}

absl::Status WeightArena::AddBlockScales(LinearWeight& w) {
  if (!device_->is_cuda() || w.dtype() != DType::kF8E4M3 || w.values.ndim() != 2) {
    return absl::OkStatus();
  }
  MLAG_ASSIGN_OR_RETURN(w.block_scales,
                        AllocateImpl({Fp8Blocks(w.values.size(0)), BlockScaleLd(w.values.size(1))},
                                     DType::kF32, /*zero=*/true));
  return absl::OkStatus();
}

absl::Status WeightArena::LoadLinearInto(WeightSource& source, const std::string& name,
                                         std::initializer_list<int64_t> shape,
                                         const LinearWeight& dst) {
  const DType dtype = dst.values.dtype();
  if (dtype == DType::kF32) return LoadInto(source, name, shape, dst.values);
  const std::vector<int64_t> dims(shape);
  if (dims.size() != 2 || dst.values.numel() != dims[0] * dims[1] || !dst.values.is_contiguous()) {
    return absl::InternalError(absl::StrCat("LoadLinearInto '", name, "': destination ",
                                            dst.values.ShapeString(), " in ", DTypeName(dtype),
                                            " does not fit"));
  }
  const int64_t rows = dims[0], cols = dims[1];
  const DType stored = source.StoredDType(name);
  if (dtype == DType::kBF16) {
    // On CUDA through host staging.
    if (device_->is_cuda() && static_cast<int64_t>(staging_bf16_.size()) < rows * cols) {
      staging_bf16_.resize(static_cast<size_t>(rows * cols));
    }
    uint16_t* bf16 = device_->is_cuda() ? staging_bf16_.data() : dst.values.data_as<uint16_t>();
    if (stored == DType::kBF16) {
      MLAG_RETURN_IF_ERROR(source.ReadStored(name, dims, bf16, nullptr));
    } else {
      // f32, f16, or fp8 dequantized (CUDA's fp8 fallback), rounded to bf16.
      float* f32 = Staging(rows * cols);
      MLAG_RETURN_IF_ERROR(source.ReadF32(name, dims, f32));
      host::ParallelFor((rows + kConvertRows - 1) / kConvertRows, [&](int64_t c) {
        const int64_t r0 = c * kConvertRows, r1 = std::min(rows, r0 + kConvertRows);
        ConvertFromF32(f32 + r0 * cols, DType::kBF16, bf16 + r0 * cols,
                       static_cast<size_t>((r1 - r0) * cols));
      });
    }
    if (!device_->is_cuda()) return absl::OkStatus();
    return uploader_->Copy(dst.values.data(), bf16, dst.values.nbytes());
  }
  // fp8: as stored, or quantized here; then the block scales go per row (on
  // CUDA through host staging).
  if (device_->is_cuda() && static_cast<int64_t>(staging_fp8_.size()) < rows * cols) {
    staging_fp8_.resize(static_cast<size_t>(rows * cols));
  }
  uint8_t* q = device_->is_cuda() ? staging_fp8_.data() : dst.values.data_as<uint8_t>();
  const int64_t col_blocks = Fp8Blocks(cols);
  std::vector<float> block_scales(static_cast<size_t>(Fp8Blocks(rows) * col_blocks));
  if (stored == DType::kF8E4M3) {
    MLAG_RETURN_IF_ERROR(source.ReadStored(name, dims, q, block_scales.data()));
    MLAG_RETURN_IF_ERROR(CheckFp8(name, q, rows * cols, block_scales.data(),
                                  static_cast<int64_t>(block_scales.size())));
  } else {
    float* f32 = Staging(rows * cols);
    MLAG_RETURN_IF_ERROR(source.ReadF32(name, dims, f32));
    host::ParallelFor(Fp8Blocks(rows), [&](int64_t br) {
      const int64_t r0 = br * kFp8BlockSize, r1 = std::min(rows, r0 + kFp8BlockSize);
      QuantizeFp8Blocks(f32 + r0 * cols, r1 - r0, cols, q + r0 * cols,
                        block_scales.data() + br * col_blocks);
    });
    MLAG_RETURN_IF_ERROR(CheckFp8(name, q, rows * cols, block_scales.data(),
                                  static_cast<int64_t>(block_scales.size())));
  }
  if (!device_->is_cuda()) {
    ExpandFp8RowScales(block_scales.data(), rows, cols, dst.scales.data_as<float>());
    return absl::OkStatus();
  }
  std::vector<float> row_scales(static_cast<size_t>(rows * col_blocks));
  ExpandFp8RowScales(block_scales.data(), rows, cols, row_scales.data());
  MLAG_RETURN_IF_ERROR(uploader_->Copy(dst.values.data(), q, dst.values.nbytes()));
  MLAG_RETURN_IF_ERROR(uploader_->Copy(dst.scales.data(), row_scales.data(), dst.scales.nbytes()));
  if (!dst.has_block_scales()) return absl::OkStatus();
  // The checkpoint's block scales as they are, the K blocks padded to
  // BlockScaleLd with zeros (cuBLASLt's BLK128x128 layout).
  const int64_t ld = BlockScaleLd(cols);
  if (dst.block_scales.numel() != Fp8Blocks(rows) * ld) {
    return absl::InternalError(absl::StrCat("LoadLinearInto '", name, "': block scales ",
                                            dst.block_scales.ShapeString(), " do not fit ", rows,
                                            " rows"));
  }
  std::vector<float> padded(static_cast<size_t>(Fp8Blocks(rows) * ld), 0.0f);
  for (int64_t br = 0; br < Fp8Blocks(rows); ++br) {
    std::copy_n(block_scales.data() + br * col_blocks, col_blocks, padded.data() + br * ld);
  }
  return uploader_->Copy(dst.block_scales.data(), padded.data(), dst.block_scales.nbytes());
}

absl::StatusOr<Tensor> WeightArena::Allocate(std::initializer_list<int64_t> shape, DType dtype) {
  return AllocateImpl(shape, dtype, /*zero=*/true);
}

absl::StatusOr<Tensor> WeightArena::AllocateImpl(std::initializer_list<int64_t> shape, DType dtype,
                                                 bool zero) {
  Tensor probe(nullptr, dtype, shape, device_->kind());
  MLAG_ASSIGN_OR_RETURN(Buffer buf, device_->Allocate(probe.nbytes()));
  // (Not zeroed: filled by the caller at once.)
  if (zero) MLAG_RETURN_IF_ERROR(device_->Zero(buf.data(), probe.nbytes()));
  Tensor t = buf.AsTensor(dtype, shape);
  bytes_ += buf.bytes();
  bytes_by_dtype_[dtype] += buf.bytes();
  buffers_.push_back(std::move(buf));
  return t;
}

double WeightArena::huge_page_bytes() const {
  double bytes = 0.0;
  for (const Buffer& buf : buffers_) {
    bytes += Device::HostHugePageShare(buf.data(), buf.bytes()) * static_cast<double>(buf.bytes());
  }
  return bytes;
}

absl::StatusOr<Tensor> WeightArena::Load(WeightSource& source, const std::string& name,
                                         std::initializer_list<int64_t> shape) {
  MLAG_ASSIGN_OR_RETURN(Tensor t, AllocateImpl(shape, DType::kF32, /*zero=*/false));
  MLAG_RETURN_IF_ERROR(LoadInto(source, name, shape, t));
  return t;
}

absl::Status WeightArena::LoadInto(WeightSource& source, const std::string& name,
                                   std::initializer_list<int64_t> shape, const Tensor& dst) {
  Tensor probe(nullptr, DType::kF32, shape);
  if (dst.numel() != probe.numel() || !dst.is_contiguous() || dst.dtype() != DType::kF32) {
    return absl::InternalError(absl::StrCat("LoadInto '", name, "': destination ",
                                            dst.ShapeString(), " does not fit ",
                                            probe.ShapeString()));
  }
  if (!device_->is_cuda()) {
    return source.ReadF32(name, probe.shape(), dst.data_as<float>());
  }
  float* staging = Staging(probe.numel());
  MLAG_RETURN_IF_ERROR(source.ReadF32(name, probe.shape(), staging));
  return uploader_->Copy(dst.data(), staging, probe.nbytes());
}

absl::StatusOr<std::vector<float>> WeightArena::ReadHost(WeightSource& source,
                                                         const std::string& name,
                                                         std::initializer_list<int64_t> shape) {
  Tensor probe(nullptr, DType::kF32, shape);
  std::vector<float> host(static_cast<size_t>(probe.numel()));
  MLAG_RETURN_IF_ERROR(source.ReadF32(name, probe.shape(), host.data()));
  return host;
}

absl::Status WeightArena::Upload(const std::vector<float>& host, const Tensor& dst) {
  if (static_cast<int64_t>(host.size()) != dst.numel() || dst.dtype() != DType::kF32) {
    return absl::InternalError("WeightArena::Upload: size mismatch");
  }
  return uploader_->Copy(dst.data(), host.data(), host.size() * sizeof(float));
}

absl::Status WeightArena::Upload(const std::vector<int32_t>& host, const Tensor& dst) {
  if (static_cast<int64_t>(host.size()) != dst.numel() || dst.dtype() != DType::kI32) {
    return absl::InternalError("WeightArena::Upload: size mismatch");
  }
  return uploader_->Copy(dst.data(), host.data(), host.size() * sizeof(int32_t));
}

absl::Status WeightArena::FinishLoading() {
  MLAG_RETURN_IF_ERROR(uploader_->Finish());
  // A fresh uploader: the page-locked ring and the copy stream are freed
  // until a later load needs them again.
  uploader_ = std::make_unique<Uploader>(device_);
  std::vector<float>().swap(staging_);
  std::vector<uint16_t>().swap(staging_bf16_);
  std::vector<uint8_t>().swap(staging_fp8_);
  return absl::OkStatus();
}

void WeightPlan::Add(std::initializer_list<int64_t> shape, DType dtype) {
  AddBytes(Tensor(nullptr, dtype, shape).nbytes());
}

void WeightPlan::AddBytes(size_t bytes) {
  bytes_ += bytes;
  if (!arena_.device().is_cuda()) mapping_overhead_ += Device::HostMappingOverhead(bytes);
}

void WeightPlan::AddLinear(const std::string& name, std::initializer_list<int64_t> shape,
                           bool allow_fp8) {
  AddLinearAs(shape, LinearDType(name, allow_fp8), /*block_scales=*/true);
}

void WeightPlan::AddLinearAs(std::initializer_list<int64_t> shape, DType dtype, bool block_scales) {
  Add(shape, dtype);
  if (dtype != DType::kF8E4M3) return;
  // AllocateLinearImpl's per-row scales.
  std::vector<int64_t> s(shape);
  s.back() = Fp8Blocks(s.back());
  AddBytes(Tensor(nullptr, DType::kF32, s).nbytes());
  // AddBlockScales.
  if (block_scales && arena_.device().is_cuda() && s.size() == 2) {
    const std::vector<int64_t> dims(shape);
    Add({Fp8Blocks(dims[0]), BlockScaleLd(dims[1])}, DType::kF32);
  }
}

}  // namespace mlag
