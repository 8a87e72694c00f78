// The largest relative error each op showed in a test binary, printed at
// exit as "max_rel_err <op> <err>" lines: how close to its tolerance an op
// runs, which a pass/fail result does not say. Header-only; every binary
// that includes it gets its own table.
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "gtest/gtest.h"

namespace mlag::testing {

inline std::map<std::string, double>& MaxErrors() {
  static std::map<std::string, double> errors;
  return errors;
}

// Records `err` for `op`, keeping the largest.
inline void RecordError(const std::string& op, double err) {
  double& e = MaxErrors()[op];
  e = std::max(e, err);
}

class ErrorReport : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& [op, err] : MaxErrors()) std::printf("max_rel_err %s %.3g\n", op.c_str(), err);
  }
};

[[maybe_unused]] inline ::testing::Environment* const kErrorReport =
    ::testing::AddGlobalTestEnvironment(new ErrorReport);

}  // namespace mlag::testing
