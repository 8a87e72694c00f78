#include "comm/check.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "runtime/core/status.h"

namespace mlag {
namespace comm_internal {
namespace {

absl::Status Invalid(absl::string_view op, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

const unsigned char* Bytes(const Tensor& t) { return static_cast<const unsigned char*>(t.data()); }

absl::Status CheckReducibleDType(absl::string_view op, const Tensor& t, absl::string_view arg) {
  if (IsReducible(t.dtype())) return absl::OkStatus();
  return Invalid(op,
                 absl::StrCat(arg, ": dtype ", DTypeName(t.dtype()), ", expected f32, i32 or i64"));
}

absl::Status CheckSameDType(absl::string_view op, const Tensor& send, const Tensor& recv) {
  if (send.dtype() == recv.dtype()) return absl::OkStatus();
  return Invalid(op, absl::StrCat("send is ", DTypeName(send.dtype()), " but recv is ",
                                  DTypeName(recv.dtype())));
}

}  // namespace

bool Overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data());
  const auto b0 = reinterpret_cast<uintptr_t>(b.data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

bool IsReducible(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kI32 || dtype == DType::kI64;
}

absl::Status CheckBuffer(absl::string_view op, const Stream& stream, const Tensor& t,
                         absl::string_view arg) {
  if (t.device() != stream.device().kind()) {
    return Invalid(op, absl::StrCat(arg, ": tensor on ", DeviceKindName(t.device()), ", stream on ",
                                    DeviceKindName(stream.device().kind())));
  }
  if (t.data() == nullptr && t.numel() > 0) return Invalid(op, absl::StrCat(arg, ": null data"));
  if (!t.is_contiguous()) {
    return Invalid(op, absl::StrCat(arg, ": must be contiguous, got ", t.ShapeString()));
  }
  return absl::OkStatus();
}

absl::Status CheckAllGather(absl::string_view op, const Stream& stream, const Tensor& send,
                            const Tensor& recv, int rank, int size) {
  MLAG_RETURN_IF_ERROR(CheckBuffer(op, stream, send, "send"));
  MLAG_RETURN_IF_ERROR(CheckBuffer(op, stream, recv, "recv"));
  MLAG_RETURN_IF_ERROR(CheckSameDType(op, send, recv));
  if (recv.numel() != size * send.numel()) {
    return Invalid(op, absl::StrCat("recv has ", recv.numel(), " elements, expected ", size, " * ",
                                    send.numel()));
  }
  if (Overlaps(send, recv) && Bytes(send) != Bytes(recv) + rank * send.nbytes()) {
    return Invalid(op, "send overlaps recv other than as this rank's slot (in place)");
  }
  return absl::OkStatus();
}

absl::Status CheckReduceScatter(absl::string_view op, const Stream& stream, const Tensor& send,
                                const Tensor& recv, int rank, int size) {
  MLAG_RETURN_IF_ERROR(CheckBuffer(op, stream, send, "send"));
  MLAG_RETURN_IF_ERROR(CheckBuffer(op, stream, recv, "recv"));
  MLAG_RETURN_IF_ERROR(CheckReducibleDType(op, send, "send"));
  MLAG_RETURN_IF_ERROR(CheckSameDType(op, send, recv));
  if (send.numel() != size * recv.numel()) {
    return Invalid(op, absl::StrCat("send has ", send.numel(), " elements, expected ", size, " * ",
                                    recv.numel()));
  }
  if (Overlaps(send, recv) && Bytes(recv) != Bytes(send) + rank * recv.nbytes()) {
    return Invalid(op, "recv overlaps send other than as this rank's slice (in place)");
  }
  return absl::OkStatus();
}

absl::Status CheckAllReduce(absl::string_view op, const Stream& stream, const Tensor& send,
                            const Tensor& recv) {
  MLAG_RETURN_IF_ERROR(CheckBuffer(op, stream, send, "send"));
  MLAG_RETURN_IF_ERROR(CheckBuffer(op, stream, recv, "recv"));
  MLAG_RETURN_IF_ERROR(CheckReducibleDType(op, send, "send"));
  MLAG_RETURN_IF_ERROR(CheckSameDType(op, send, recv));
  if (send.numel() != recv.numel()) {
    return Invalid(
        op, absl::StrCat("send has ", send.numel(), " elements but recv has ", recv.numel()));
  }
  if (Overlaps(send, recv) && send.data() != recv.data()) {
    return Invalid(op, "send and recv overlap without being the same buffer");
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcast(absl::string_view op, const Stream& stream, const Tensor& buffer,
                            int root, int size) {
  MLAG_RETURN_IF_ERROR(CheckBuffer(op, stream, buffer, "buffer"));
  if (root < 0 || root >= size) {
    return Invalid(op, absl::StrCat("root ", root, " out of range [0, ", size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckPeer(absl::string_view op, const Stream& stream, const Tensor& buffer, int peer,
                       int size) {
  MLAG_RETURN_IF_ERROR(CheckBuffer(op, stream, buffer, "buffer"));
  if (peer < 0 || peer >= size) {
    return Invalid(op, absl::StrCat("peer ", peer, " out of range [0, ", size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckHostStream(absl::string_view backend, absl::string_view op,
                             const Stream& stream) {
  if (!stream.is_cuda()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": the ", backend, " communicator takes host tensors only, got a CUDA stream"));
}

}  // namespace comm_internal
}  // namespace mlag
