// Argument validation shared by the communicator backends (internal to
// comm/). Each check returns InvalidArgument naming the collective, the
// argument and what was expected, before anything is launched, so every
// backend rejects the same calls with the same messages.
//
// Aliasing rules (the in-place forms NCCL and MPI support, nothing else):
//   AllGather      send may be exactly this rank's slot of recv
//   ReduceScatter  recv may be exactly this rank's slice of send
//   AllReduce      send and recv may be the same tensor
// Any other overlap of send and recv is rejected.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {
namespace comm_internal {

// Default node names of the data collectives (a NodeScope overrides them).
inline constexpr char kAllGatherName[] = "all_gather";
inline constexpr char kReduceScatterName[] = "reduce_scatter";
inline constexpr char kAllReduceName[] = "all_reduce";
inline constexpr char kBroadcastName[] = "broadcast";
inline constexpr char kSendName[] = "send";
inline constexpr char kRecvName[] = "recv";

// True when the byte ranges of `a` and `b` (contiguous views) share a byte.
bool Overlaps(const Tensor& a, const Tensor& b);

// True for the dtypes the reductions support: f32, i32, i64.
bool IsReducible(DType dtype);

// `t` lives on the stream's device, is contiguous and has data (or is empty).
absl::Status CheckBuffer(absl::string_view op, const Stream& stream, const Tensor& t,
                         absl::string_view arg);

// recv: size * send.numel() elements of send's dtype; aliasing as above.
absl::Status CheckAllGather(absl::string_view op, const Stream& stream, const Tensor& send,
                            const Tensor& recv, int rank, int size);

// send: size * recv.numel() elements, both of one reducible dtype.
absl::Status CheckReduceScatter(absl::string_view op, const Stream& stream, const Tensor& send,
                                const Tensor& recv, int rank, int size);

// send and recv: same element count and reducible dtype.
absl::Status CheckAllReduce(absl::string_view op, const Stream& stream, const Tensor& send,
                            const Tensor& recv);

// 0 <= root < size.
absl::Status CheckBroadcast(absl::string_view op, const Stream& stream, const Tensor& buffer,
                            int root, int size);

// 0 <= peer < size.
absl::Status CheckPeer(absl::string_view op, const Stream& stream, const Tensor& buffer, int peer,
                       int size);

// InvalidArgument unless the stream is a host stream (local and mpi backends).
absl::Status CheckHostStream(absl::string_view backend, absl::string_view op, const Stream& stream);

}  // namespace comm_internal
}  // namespace mlag
