// Cases of the sampling ops (to be ported from the per-backend tests).
#include "tests/ops/harness.h"

namespace mlag::ops_test {

void AddSamplingCases(CaseList&) {}

}  // namespace mlag::ops_test
