// Owns a model's parameter buffers on its device and fills them from a
// WeightSource. On the host the f32 data is read straight into the buffer; on
// CUDA it is read (and converted) into host staging, then queued on an
// Uploader: page-locked chunks copied asynchronously while the host reads the
// next tensor. Loaded weights are on the device once FinishLoading returns.
//
// Projection weights (LinearWeight) are held in the arena's WeightFormat:
// f32, bf16, or fp8 e4m3 with per-row 128-column block scales; kAuto keeps
// each tensor's stored dtype (bf16 and fp8 as stored, anything else f32).
// Everything else (norms, router gate, correction bias, embeddings) is f32.
// A CUDA device holds fp8 projections in fp8 where Linear's FP8 GEMM runs
// (sm_89 and later: Fp8LinearSupported), routed experts included (the
// grouped expert GEMM widens them as loaded), and in bf16 elsewhere
// (dequantized at load, the fallback). f32 and bf16 as the host does.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/linear.h"
#include "layers/weight_source.h"
#include "runtime/core/device.h"
#include "runtime/core/upload.h"

namespace mlag {

enum class WeightFormat { kAuto, kF32, kBF16, kFp8 };

// "auto", "f32", "bf16", "fp8".
absl::string_view WeightFormatName(WeightFormat format);
absl::StatusOr<WeightFormat> ParseWeightFormat(absl::string_view name);

class WeightArena {
 public:
  explicit WeightArena(Device* device, WeightFormat format = WeightFormat::kAuto)
      : device_(device), format_(format), uploader_(std::make_unique<Uploader>(device)) {}

  WeightFormat format() const { return format_; }

  // The dtype projection `name` is held in (see the file comment); with
  // allow_fp8 false (lm_head, as DeepSeek-V3 keeps it), fp8 becomes bf16.
  DType LinearDType(const WeightSource& source, absl::string_view name,
                    bool allow_fp8 = true) const;

  // A new zero-filled projection of `shape` ([.., out, in]) in `dtype`, with
  // its scales for fp8.
  absl::StatusOr<LinearWeight> AllocateLinear(std::initializer_list<int64_t> shape, DType dtype);

  // A new projection holding source tensor `name` [out, in] in LinearDType,
  // in the layout the device reads (PackForLinear: packed on the host).
  // Gives a CUDA fp8 [out, in] projection its block_scales (LinearWeight),
  // zeroed, for LoadLinearInto to fill; a no-op elsewhere. LoadLinear calls
  // it; a caller assembling a matrix from parts calls it only when every
  // part starts on a 128-row boundary (a part that does not cannot fill them).
  absl::Status AddBlockScales(LinearWeight& w);

  absl::StatusOr<LinearWeight> LoadLinear(WeightSource& source, const std::string& name,
                                          std::initializer_list<int64_t> shape,
                                          bool allow_fp8 = true);

  // Reads source tensor `name` [rows, cols] into `dst`, a view of arena (or
  // arena-device) memory of that shape in any projection dtype, row-major
  // (whatever dst.host_row_groups says: PackForLinear the whole projection
  // once every part is read), converting
  // as needed: bf16 and fp8 are copied as stored when stored so; otherwise
  // f32 is rounded to bf16, or quantized to fp8 in 128 x 128 blocks. fp8
  // block scales must be finite, positive and at most kFp8MaxScale, and fp8
  // values must not be NaN (errors name the tensor).
  absl::Status LoadLinearInto(WeightSource& source, const std::string& name,
                              std::initializer_list<int64_t> shape, const LinearWeight& dst);

  Device& device() const { return *device_; }

  // A new zero-filled parameter tensor of `shape` on the device.
  absl::StatusOr<Tensor> Allocate(std::initializer_list<int64_t> shape, DType dtype = DType::kF32);

  // A new f32 tensor holding source tensor `name`, whose shape must be `shape`.
  absl::StatusOr<Tensor> Load(WeightSource& source, const std::string& name,
                              std::initializer_list<int64_t> shape);

  // Reads source tensor `name` (shape `shape`) into `dst`, a contiguous f32
  // view of memory this arena owns (e.g. one half of a fused gate/up matrix).
  absl::Status LoadInto(WeightSource& source, const std::string& name,
                        std::initializer_list<int64_t> shape, const Tensor& dst);

  // Reads source tensor `name` into host memory (for weights that are
  // transformed before they reach the device, such as kv_b_proj).
  absl::StatusOr<std::vector<float>> ReadHost(WeightSource& source, const std::string& name,
                                              std::initializer_list<int64_t> shape);

  // Copies host data into `dst` (device memory owned by this arena); the
  // element counts and sizes must match. `host` may be freed on return.
  absl::Status Upload(const std::vector<float>& host, const Tensor& dst);
  absl::Status Upload(const std::vector<int32_t>& host, const Tensor& dst);

  // Waits until every weight loaded or uploaded so far is on the device
  // (until then no device work may touch them), then frees the staging
  // memory and the uploader's page-locked ring. Call once loading is done,
  // and on a failed load before anything the arena filled is freed; loading
  // may go on afterwards.
  absl::Status FinishLoading();

  // Bytes of parameters held, in all and by dtype (fp8 scales count as f32).
  size_t bytes() const { return bytes_; }
  const std::map<DType, size_t>& bytes_by_dtype() const { return bytes_by_dtype_; }
  // Host: the bytes of its buffers on huge pages (Device::HostHugePageShare).
  double huge_page_bytes() const;

 private:
  absl::StatusOr<Tensor> AllocateImpl(std::initializer_list<int64_t> shape, DType dtype, bool zero);
  // AllocateLinear; with zero false for a projection about to be loaded
  // whole (zeroing on CUDA waits for the device, uploads in flight included).
  absl::StatusOr<LinearWeight> AllocateLinearImpl(std::initializer_list<int64_t> shape, DType dtype,
                                                  bool zero);

  Device* device_;
  WeightFormat format_;
  std::vector<Buffer> buffers_;
  size_t bytes_ = 0;
  std::map<DType, size_t> bytes_by_dtype_;
  // f32 staging of conversions and uploads, reused: fresh memory for every
  // tensor would page-fault (and be zeroed by the kernel) once per tensor.
  std::vector<float> staging_;
  std::vector<uint16_t> staging_bf16_;  // bf16 weights on their way to CUDA
  std::vector<uint8_t> staging_fp8_;    // fp8 weights on their way to CUDA
  std::unique_ptr<Uploader> uploader_;  // staging -> device, asynchronous on CUDA
  float* Staging(int64_t n);
  // Whether fp8 projections stay fp8 on this device (asked once).
  bool Fp8OnDevice() const;
  mutable int fp8_on_device_ = -1;  // -1: not asked yet
};

// Counts the bytes a WeightArena holds for a model, tensor by tensor, as its
// Allocate, Load, LoadLinear, AllocateLinear and AddBlockScales would, without
// allocating or reading anything: the weights item of the memory plan
// (runtime/engine/memory_plan.h). Each layer's PlanWeights mirrors its Load;
// tests check the two agree for every built-in model, format and device.
class WeightPlan {
 public:
  // `arena` decides the dtypes (LinearDType); it allocates nothing here.
  WeightPlan(const WeightArena& arena, const WeightSource& source)
      : arena_(arena), source_(source) {}

  // Allocate / Load: a plain tensor.
  void Add(std::initializer_list<int64_t> shape, DType dtype = DType::kF32);
  // LoadLinear of source tensor `name`.
  void AddLinear(const std::string& name, std::initializer_list<int64_t> shape,
                 bool allow_fp8 = true);
  // AllocateLinear in `dtype`, then AddBlockScales when `block_scales`.
  void AddLinearAs(std::initializer_list<int64_t> shape, DType dtype, bool block_scales);
  // Memory a layer allocates outside the arena (the routed experts), in one
  // allocation.
  void AddBytes(size_t bytes);

  DType LinearDType(const std::string& name, bool allow_fp8 = true) const {
    return arena_.LinearDType(source_, name, allow_fp8);
  }
  const Device& device() const { return arena_.device(); }
  size_t bytes() const { return bytes_; }
  // The address space the allocations take beyond bytes() on the host
  // (Device::HostMappingOverhead of each).
  size_t mapping_overhead() const { return mapping_overhead_; }

 private:
  const WeightArena& arena_;
  const WeightSource& source_;
  size_t bytes_ = 0;
  size_t mapping_overhead_ = 0;
};

}  // namespace mlag
