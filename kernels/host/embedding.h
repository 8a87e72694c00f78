// Host implementation behind kernels/embedding.h. Arguments are validated by
// the caller (kernels/embedding.cc).
#pragma once

#include "runtime/core/tensor.h"

namespace mlag::host {

// out[t, :] = table[indices[t], :], converting between float dtypes when
// table and out differ; an index outside [0, N) writes a row of zeros.
void GatherRows(const Tensor& indices, const Tensor& table, const Tensor& out);

}  // namespace mlag::host
