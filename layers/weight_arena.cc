#include "layers/weight_arena.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace mlag {

absl::StatusOr<Tensor> WeightArena::Allocate(std::initializer_list<int64_t> shape, DType dtype) {
  return AllocateImpl(shape, dtype, /*zero=*/true);
}

absl::StatusOr<Tensor> WeightArena::AllocateImpl(std::initializer_list<int64_t> shape, DType dtype,
                                                 bool zero) {
  Tensor probe(nullptr, dtype, shape, device_->kind());
  MLAG_ASSIGN_OR_RETURN(Buffer buf, device_->Allocate(probe.nbytes()));
  if (!zero) {
    // Filled by the caller at once.
  } else if (device_->is_cuda()) {
    std::vector<char> zeros(probe.nbytes(), 0);
    MLAG_RETURN_IF_ERROR(device_->CopyFromHost(buf.data(), zeros.data(), zeros.size()));
  } else if (probe.nbytes() > 0) {
    std::memset(buf.data(), 0, probe.nbytes());
  }
  Tensor t = buf.AsTensor(dtype, shape);
  bytes_ += buf.bytes();
  buffers_.push_back(std::move(buf));
  return t;
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
  std::vector<float> staging(static_cast<size_t>(probe.numel()));
  MLAG_RETURN_IF_ERROR(source.ReadF32(name, probe.shape(), staging.data()));
  return device_->CopyFromHost(dst.data(), staging.data(), staging.size() * sizeof(float));
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
  return device_->CopyFromHost(dst.data(), host.data(), host.size() * sizeof(float));
}

absl::Status WeightArena::Upload(const std::vector<int32_t>& host, const Tensor& dst) {
  if (static_cast<int64_t>(host.size()) != dst.numel() || dst.dtype() != DType::kI32) {
    return absl::InternalError("WeightArena::Upload: size mismatch");
  }
  return device_->CopyFromHost(dst.data(), host.data(), host.size() * sizeof(int32_t));
}

}  // namespace mlag
