// Where a model's weights come from: a checkpoint on disk or the built-in
// seeded generator. Layers ask for tensors by their Hugging Face name and the
// shape the config implies; the source checks the shape and converts to f32.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mlag {

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // Writes tensor `name`, converted to f32, into `dst` (host memory holding
  // the product of `shape` floats). NotFound when the source has no such
  // tensor; InvalidArgument when its shape differs from `shape`. Both name
  // the tensor (and the file, for checkpoints).
  virtual absl::Status ReadF32(absl::string_view name, absl::Span<const int64_t> shape,
                               float* dst) = 0;

  // Whether the source holds `name`.
  virtual bool Has(absl::string_view name) const = 0;

  // Names never read so far, sorted: after a model is loaded, anything left is
  // an unexpected tensor (the caller decides which names it may ignore).
  virtual std::vector<std::string> Unread() const = 0;
};

}  // namespace mlag
