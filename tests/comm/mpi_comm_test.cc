// The MPI communicator under mpirun: every rank runs the collective checks
// the local backend's tests run (collective_checks.h) on MpiCommunicator::
// World(), prints "mpi_comm_test rank R: N passed, M failed" and its
// failures, and exits non-zero when any rank failed a check. A plain main()
// rather than GoogleTest, so every process reports and exits on its own terms.
//
//   mpirun --allow-run-as-root --oversubscribe -np 4 build/tests/mpi_comm_test
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "tests/comm/collective_checks.h"

namespace mlag {
namespace {

using comm_checks::CheckLog;
using comm_checks::View;

// What only a process backend shows: the world matches the launcher's, and
// bad arguments fail before any message is exchanged.
void CheckWorld(Communicator& world, Stream& stream, CheckLog& log) {
  log.Expect(world.backend() == "mpi", "backend is mpi");
  log.Expect(world.rank() >= 0 && world.rank() < world.size(), "rank within size");
  if (const char* launcher_size = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    log.Expect(std::atoi(launcher_size) == world.size(),
               absl::StrCat("size ", world.size(), " vs OMPI_COMM_WORLD_SIZE ", launcher_size));
  }
  log.Expect(MpiCommunicator::LaunchedByMpirun(), "LaunchedByMpirun under mpirun");
  std::vector<float> a(8), b(8);
  log.Expect(world.AllGather(stream, View(a), View(b)).code() ==
                 (world.size() == 1 ? absl::StatusCode::kOk : absl::StatusCode::kInvalidArgument),
             "all_gather with a too small recv is rejected");
  log.Expect(world.Send(stream, View(a), world.size()).code() == absl::StatusCode::kInvalidArgument,
             "send to a rank out of range is rejected");
}

int Main() {
  absl::StatusOr<std::unique_ptr<Communicator>> world = MpiCommunicator::World();
  if (!world.ok()) {
    std::fprintf(stderr, "mpi_comm_test: MpiCommunicator::World: %s\n",
                 world.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Device>> device = Device::Create("host");
  absl::StatusOr<std::unique_ptr<Stream>> stream =
      device.ok() ? Stream::Create(device->get()) : device.status();
  if (!stream.ok()) {
    std::fprintf(stderr, "mpi_comm_test: %s\n", stream.status().ToString().c_str());
    return 1;
  }
  Communicator& comm = **world;
  CheckLog log;
  CheckWorld(comm, **stream, log);
  comm_checks::RunAll(comm, **stream, log, 100);

  // Every rank learns whether any rank failed.
  absl::StatusOr<int64_t> failed_anywhere =
      comm.AllReduceScalar(static_cast<int64_t>(log.failures.size()), ReduceOp::kSum);
  std::printf("mpi_comm_test rank %d: %d passed, %zu failed\n", comm.rank(), log.passed,
              log.failures.size());
  for (const std::string& f : log.failures) std::printf("  rank %d: %s\n", comm.rank(), f.c_str());
  std::fflush(stdout);
  const bool ok = failed_anywhere.ok() && *failed_anywhere == 0;
  world->reset();
  absl::Status finalized = MpiCommunicator::Finalize();
  if (!finalized.ok()) {
    std::fprintf(stderr, "mpi_comm_test: %s\n", finalized.ToString().c_str());
    return 1;
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace mlag

int main() { return mlag::Main(); }
