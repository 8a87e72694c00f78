// Owns a model's parameter buffers on its device and fills them from a
// WeightSource. On the host the f32 data is read straight into the buffer; on
// CUDA it is staged through host memory.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "layers/weight_source.h"
#include "runtime/core/device.h"

namespace mlag {

class WeightArena {
 public:
  explicit WeightArena(Device* device) : device_(device) {}

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
  // element counts and sizes must match.
  absl::Status Upload(const std::vector<float>& host, const Tensor& dst);
  absl::Status Upload(const std::vector<int32_t>& host, const Tensor& dst);

  // Bytes of parameters held.
  size_t bytes() const { return bytes_; }

 private:
  absl::StatusOr<Tensor> AllocateImpl(std::initializer_list<int64_t> shape, DType dtype, bool zero);

  Device* device_;
  std::vector<Buffer> buffers_;
  size_t bytes_ = 0;
};

}  // namespace mlag
