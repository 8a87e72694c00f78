// Token sampling: argument rejection. The numerical cases (greedy, the
// distributions, top-k / top-p, determinism by (seed, step), adversarial
// rows, every token against a scalar reference of the rule, on every
// backend) are in tests/ops/cases_sampling.cc.
#include "kernels/sampling.h"

#include "gtest/gtest.h"
#include "tests/status_matchers.h"
#include "tests/test_util.h"

namespace mlag {
namespace {

using testing::HostStream;
using testing::Make;
using testing::Owned;

TEST(Sample, RejectsBadArguments) {
  Owned logits = Make(DType::kF32, {2, 8});
  Owned temp = Make(DType::kF32, {2});
  Owned top_k = Make(DType::kI32, {2});
  Owned top_p = Make(DType::kF32, {2});
  Owned seeds = Make(DType::kI64, {2});
  Owned steps = Make(DType::kI64, {2});
  Owned out = Make(DType::kI32, {2});
  EXPECT_OK(Sample(HostStream(), logits.t, temp.t, top_k.t, top_p.t, seeds.t, steps.t, out.t));
  Owned seeds32 = Make(DType::kI32, {2});
  absl::Status st =
      Sample(HostStream(), logits.t, temp.t, top_k.t, top_p.t, seeds32.t, steps.t, out.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("seeds"), absl::string_view::npos) << st;
  Owned out3 = Make(DType::kI32, {3});
  st = Sample(HostStream(), logits.t, temp.t, top_k.t, top_p.t, seeds.t, steps.t, out3.t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("out_tokens"), absl::string_view::npos) << st;
}

}  // namespace
}  // namespace mlag
