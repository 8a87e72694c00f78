// Host implementation behind kernels/mla_kv_update.h. Arguments are validated
// by the caller.
#pragma once

#include "runtime/core/tensor.h"

namespace mlag::host {

void MlaKvUpdate(const Tensor& kv_c, const Tensor& k_pe, const Tensor& slot_mapping,
                 const Tensor& cache);

}  // namespace mlag::host
