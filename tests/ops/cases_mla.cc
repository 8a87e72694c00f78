// Cases of the mla ops (to be ported from the per-backend tests).
#include "tests/ops/harness.h"

namespace mlag::ops_test {

void AddMlaCases(CaseList&) {}

}  // namespace mlag::ops_test
