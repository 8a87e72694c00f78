// Status assertions for the tests. Each prints the status when it fails, so
// a failing test says what went wrong, not only that something did.
//
//   ASSERT_OK(stream.Synchronize());
//   EXPECT_OK(Engine::Create(options));           // a Status or a StatusOr
//   ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(options));
//   EXPECT_THAT(engine->AddRequest(spec),
//               StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocabulary")));
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mlag::testing {

inline const absl::Status& ToStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& ToStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// Matches a Status or StatusOr whose code is `code`.
MATCHER_P(StatusIs, code, "has status code " + ::testing::PrintToString(code)) {
  const absl::Status& status = ::mlag::testing::ToStatus(arg);
  *result_listener << "whose status is " << status;
  return status.code() == code;
}

// Matches a Status or StatusOr whose code is `code` and whose message
// matches `message` (a matcher such as HasSubstr("...") or a string).
MATCHER_P2(StatusIs, code, message,
           "has status code " + ::testing::PrintToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message)) {
  const absl::Status& status = ::mlag::testing::ToStatus(arg);
  *result_listener << "whose status is " << status;
  return status.code() == code && ::testing::Matches(::testing::SafeMatcherCast<const std::string&>(
                                      message))(std::string(status.message()));
}

}  // namespace mlag::testing

// `fail` is FAIL or ADD_FAILURE. The switch keeps a caller's `else` from
// binding to the macro's `if`; the message can be extended with <<.
#define MLAG_TESTING_CHECK_OK_(fail, expr)                                             \
  switch (0)                                                                           \
  case 0:                                                                              \
  default:                                                                             \
    if (const ::absl::Status mlag_testing_status_ = ::mlag::testing::ToStatus((expr)); \
        mlag_testing_status_.ok()) {                                                   \
    } else                                                                             \
      fail() << #expr << " failed: " << mlag_testing_status_

// Fails the test (ASSERT_OK also returns) unless `expr`, a Status or a
// StatusOr, is OK, printing the status; more context can follow with <<.
#define ASSERT_OK(expr) MLAG_TESTING_CHECK_OK_(FAIL, expr)
#define EXPECT_OK(expr) MLAG_TESTING_CHECK_OK_(ADD_FAILURE, expr)

#define MLAG_TESTING_CONCAT_INNER_(a, b) a##b
#define MLAG_TESTING_CONCAT_(a, b) MLAG_TESTING_CONCAT_INNER_(a, b)

// ASSERT_OK_AND_ASSIGN(lhs, expr): asserts that the StatusOr `expr` is OK and
// moves its value into `lhs`, a declaration (`auto x`) or a variable.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  MLAG_TESTING_ASSERT_OK_AND_ASSIGN_(MLAG_TESTING_CONCAT_(mlag_statusor_, __LINE__), lhs, expr)
#define MLAG_TESTING_ASSERT_OK_AND_ASSIGN_(tmp, lhs, expr)       \
  auto tmp = (expr);                                             \
  ASSERT_TRUE(tmp.ok()) << #expr << " failed: " << tmp.status(); \
  lhs = std::move(tmp).value()
