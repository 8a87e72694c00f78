// The expert-parallel group one rank's MoE layers dispatch over, and the one
// owner of its communicator's lifetime.
//
// NCCL (2.26 and later) will not destroy or abort a communicator while CUDA
// graphs that captured its collectives exist: it waits for them for ever.
// So the graphs go first, always, and this class is the only place a group
// communicator is released:
//   Replace  (reconfiguration, a rank leaving, shutdown): drain the stream,
//            drop every graph, then destroy the old communicator;
//   Abort    (failure): drop the graphs without draining (a collective may
//            be stuck waiting for a dead peer), then abort the communicator,
//            which makes its stuck collectives give up.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "comm/communicator.h"
#include "runtime/engine/engine.h"

namespace mlag {

class ExpertGroup {
 public:
  ExpertGroup() = default;
  explicit ExpertGroup(std::unique_ptr<Communicator> communicator)
      : communicator_(std::move(communicator)) {}
  // Releases the group as Replace(nullptr) would (errors ignored).
  ~ExpertGroup();
  ExpertGroup(const ExpertGroup&) = delete;
  ExpertGroup& operator=(const ExpertGroup&) = delete;

  // The engine whose graphs capture this group's collectives. Must outlive
  // this object, and be bound before the first Replace or Abort.
  void Bind(Engine* engine) { engine_ = engine; }

  // The communicator (nullptr while this rank is outside any group).
  Communicator* get() const { return communicator_.get(); }

  // Makes `next` the group (nullptr: this rank leaves). Drains the engine's
  // stream, drops its graphs, destroys the old communicator and points the
  // model at `next`; the caller captures the graphs again. On an error the
  // rank is left outside any group; when the stream did not drain, the old
  // communicator and `next` are aborted rather than destroyed.
  absl::Status Replace(std::unique_ptr<Communicator> next);

  // Drops the graphs without waiting for the stream, then aborts the
  // communicator with `reason` (see Communicator::Abort). The communicator
  // object stays until the group is replaced or destroyed.
  void Abort(const absl::Status& reason);

 private:
  std::unique_ptr<Communicator> communicator_;
  Engine* engine_ = nullptr;
};

}  // namespace mlag
