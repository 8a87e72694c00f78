// Cases of the moe ops (to be ported from the per-backend tests).
#include "tests/ops/harness.h"

namespace mlag::ops_test {

void AddMoeCases(CaseList&) {}

}  // namespace mlag::ops_test
