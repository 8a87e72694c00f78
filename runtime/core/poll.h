// Waiting for work another party finishes (a stream, a nonblocking MPI
// operation), with a deadline, so that a dead or hung peer becomes an error
// instead of a hang.
#pragma once

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mlag {

// Calls `poll` until it returns true, returning OK; an error from `poll`
// is returned at once. After `timeout` returns `timed_out(waited)` instead,
// `waited` being the time since the call (at least `timeout`).
// Yields for the first 50 us (a collective's latency is microseconds, and a
// sleep would overshoot it), then sleeps with a backoff from 10 us to
// 200 us, so a long wait costs little CPU and a finished one at most 200 us.
absl::Status PollUntil(absl::Duration timeout, absl::FunctionRef<absl::StatusOr<bool>()> poll,
                       absl::FunctionRef<absl::Status(absl::Duration waited)> timed_out);

}  // namespace mlag
