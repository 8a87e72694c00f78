#include "kernels/host/blas.h"

#include <cblas.h>

#include <mutex>

namespace mlag::host {

void UseSerialBlas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace mlag::host
