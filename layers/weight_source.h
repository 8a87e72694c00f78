// Where a model's weights come from: a checkpoint on disk or the built-in
// seeded generator. Layers ask for tensors by their Hugging Face name and the
// shape the config implies; the source checks the shape and converts to f32,
// or hands out the stored bf16 / fp8 form as it is.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/core/scalar_types.h"

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

  // The dtype `name` is stored in: kBF16 or kF8E4M3 when ReadStored can hand
  // it out as stored, kF32 otherwise (f32 and f16 tensors, generated weights).
  virtual DType StoredDType(absl::string_view name) const {
    (void)name;
    return DType::kF32;
  }

  // Writes tensor `name` as stored: bf16 values (uint16) into `dst`; or fp8
  // e4m3 bytes into `dst` and its block scales [Fp8Blocks(rows),
  // Fp8Blocks(cols)] into `block_scales` (runtime/core/fp8_blocks.h). Only
  // for a StoredDType of kBF16 or kF8E4M3; errors as ReadF32.
  virtual absl::Status ReadStored(absl::string_view name, absl::Span<const int64_t> shape,
                                  void* dst, float* block_scales) {
    (void)shape, (void)dst, (void)block_scales;
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", name, "' is not stored in bf16 or fp8"));
  }

  // Whether the source holds `name`.
  virtual bool Has(absl::string_view name) const = 0;

  // Names never read so far, sorted: after a model is loaded, anything left is
  // an unexpected tensor (the caller decides which names it may ignore).
  virtual std::vector<std::string> Unread() const = 0;

  // Whether reads refuse NaN and infinite weights (InvalidArgument naming the
  // tensor and the element). On by default for checkpoints; off skips the
  // scan for trusted ones. Generated weights are always finite.
  virtual void SetScanNonFinite(bool scan) { (void)scan; }
};

}  // namespace mlag
