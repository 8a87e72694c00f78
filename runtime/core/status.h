// Status helpers. The Debian Abseil (20220623) predates ABSL_RETURN_IF_ERROR
// and ABSL_ASSIGN_OR_RETURN, so the project defines its own.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define MLAG_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status mlag_status_ = (expr);        \
    if (!mlag_status_.ok()) return mlag_status_; \
  } while (0)

#define MLAG_CONCAT_INNER_(a, b) a##b
#define MLAG_CONCAT_(a, b) MLAG_CONCAT_INNER_(a, b)

// MLAG_ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>),
// returns its status on error, else moves the value into `lhs`, which may be a
// declaration (`auto x`) or an existing variable.
#define MLAG_ASSIGN_OR_RETURN(lhs, expr) \
  MLAG_ASSIGN_OR_RETURN_IMPL_(MLAG_CONCAT_(mlag_statusor_, __LINE__), lhs, expr)

#define MLAG_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()
