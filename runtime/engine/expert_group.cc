#include "runtime/engine/expert_group.h"

#include <utility>

#include "runtime/core/status.h"

namespace mlag {

ExpertGroup::~ExpertGroup() { Replace(nullptr).IgnoreError(); }

absl::Status ExpertGroup::Replace(std::unique_ptr<Communicator> next) {
  if (engine_ != nullptr) {
    // Graphs that captured the old group's collectives go first; a replay
    // still in flight finishes before they do.
    absl::Status drained = engine_->runner().stream().Synchronize();
    absl::Status detached = engine_->SetExpertGroup(nullptr);  // drops every graph
    if (drained.ok()) drained = detached;
    if (!drained.ok()) {
      // A collective that did not finish may wait for a dead peer: abort
      // (not destroy) the old group, and `next` with it, whose peers would
      // otherwise wait for this rank. The rank is left outside any group.
      if (communicator_ != nullptr) communicator_->Abort(drained);
      if (next != nullptr) next->Abort(drained);
      communicator_.reset();
      return drained;
    }
  }
  communicator_ = std::move(next);  // the old communicator, after its graphs
  if (engine_ != nullptr && communicator_ != nullptr) {
    absl::Status attached = engine_->SetExpertGroup(communicator_.get());
    if (!attached.ok()) {
      engine_->SetExpertGroup(nullptr).IgnoreError();
      communicator_.reset();
      return attached;
    }
  }
  return absl::OkStatus();
}

void ExpertGroup::Abort(const absl::Status& reason) {
  if (engine_ != nullptr) engine_->runner().DropGraphs();  // no drain: it may never finish
  if (communicator_ != nullptr) communicator_->Abort(reason);
}

}  // namespace mlag
