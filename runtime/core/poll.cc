#include "runtime/core/poll.h"

#include <algorithm>
#include <thread>

#include "absl/time/clock.h"

namespace mlag {

absl::Status PollUntil(absl::Duration timeout, absl::FunctionRef<absl::StatusOr<bool>()> poll,
                       absl::FunctionRef<absl::Status(absl::Duration waited)> timed_out) {
  const absl::Time start = absl::Now();
  const absl::Time spin_until = start + absl::Microseconds(50);
  const absl::Time deadline = start + timeout;
  absl::Duration pause = absl::Microseconds(10);
  for (;;) {
    absl::StatusOr<bool> done = poll();
    if (!done.ok()) return done.status();
    if (*done) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now > deadline) return timed_out(now - start);
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Microseconds(200));
    }
  }
}

}  // namespace mlag
