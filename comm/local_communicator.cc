#include "comm/local_communicator.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "comm/check.h"
#include "runtime/core/peer_fault.h"
#include "runtime/core/status.h"

namespace mlag {
namespace local_internal {
namespace {

enum class Op : uint8_t {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kBarrier,
  kScalar,
  kSplit
};

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kBarrier:
      return "barrier";
    case Op::kScalar:
      return "all_reduce_scalar";
    case Op::kSplit:
      return "split";
  }
  return "?";
}

}  // namespace

// What a rank launched: every rank of a collective must post the same one.
struct OpDesc {
  Op op = Op::kBarrier;
  size_t bytes = 0;  // of send (all_gather, reduce_scatter, all_reduce) or buffer
  DType dtype = DType::kU8;
  ReduceOp reduce = ReduceOp::kSum;
  int root = -1;

  bool operator==(const OpDesc& o) const {
    return op == o.op && bytes == o.bytes && dtype == o.dtype && reduce == o.reduce &&
           root == o.root;
  }
  std::string ToString() const {
    std::string s = OpName(op);
    if (op == Op::kBarrier || op == Op::kSplit) return s;
    if (op == Op::kScalar) return absl::StrCat(s, " ", ReduceOpName(reduce));
    absl::StrAppend(&s, " of ", bytes, " bytes ", DTypeName(dtype));
    if (op == Op::kAllReduce || op == Op::kReduceScatter) {
      absl::StrAppend(&s, " ", ReduceOpName(reduce));
    }
    if (op == Op::kBroadcast) absl::StrAppend(&s, " from root ", root);
    return s;
  }
};

class LocalGroup;

// One rank's post for the collective in flight. Written only by its rank
// before the entry barrier (the split group also between the barriers) and
// read by every rank between the entry and exit barriers.
struct Slot {
  OpDesc desc;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t scalar = 0;
  int color = 0;
  int key = 0;
  std::shared_ptr<LocalGroup> new_group;  // set by the leader of a split color
};

// One direction of one pair of ranks: a rendezvous for Send/Recv.
struct Mailbox {
  absl::Mutex mu;
  absl::CondVar cv;
  bool posted = false;  // a Send is waiting with data/bytes
  bool taken = false;   // its Recv has run (result says how)
  const void* data = nullptr;
  size_t bytes = 0;
  absl::Status result;
};

// The state the ranks of one group share.
class LocalGroup {
 public:
  LocalGroup(int size, absl::Duration timeout)
      : size_(size), timeout_(timeout), slots_(size), present_(size, false), gave_up_(size, false) {
    mailboxes_.reserve(static_cast<size_t>(size) * size);
    for (int i = 0; i < size * size; ++i) mailboxes_.push_back(std::make_unique<Mailbox>());
  }

  int size() const { return size_; }
  absl::Duration timeout() const { return timeout_; }

  // Fails every waiting and later collective of the group with `reason`.
  void Abort(const absl::Status& reason) {
    {
      absl::MutexLock lock(&mu_);
      if (abort_reason_.ok()) {
        abort_reason_ = reason.ok() ? absl::UnknownError("aborted without a reason") : reason;
      }
      cv_.SignalAll();
    }
    for (auto& box : mailboxes_) {
      absl::MutexLock lock(&box->mu);
      box->cv.SignalAll();
    }
  }

  // OkStatus, or the Aborted error a rank `rank` in collective `name` gets.
  absl::Status Aborted(int rank, const char* name) {
    absl::MutexLock lock(&mu_);
    return AbortedLocked(rank, name);
  }
  Mailbox& mailbox(int src, int dst) { return *mailboxes_[static_cast<size_t>(src) * size_ + dst]; }

  // The error of a send or recv of `rank` that waited `waited` for `peer`.
  absl::Status PointToPointTimeout(int rank, const char* op, int peer,
                                   absl::Duration waited) const {
    return PeerTimeoutError(rank, size_, op, waited, {peer});
  }

  // Runs one collective of the two-barrier protocol: post `mine`, wait for
  // every rank, check that all posted the same op, `read` the peers' posts,
  // wait again (no rank may reuse a buffer a peer still reads), `finish`.
  // `timeout` bounds each barrier's wait (zero: the group's timeout).
  absl::Status Run(int rank, const Slot& mine,
                   absl::FunctionRef<void(const std::vector<Slot>&)> read,
                   absl::FunctionRef<void()> finish,
                   absl::Duration timeout = absl::ZeroDuration()) {
    const char* name = OpName(mine.desc.op);
    const absl::Duration bound = timeout > absl::ZeroDuration() ? timeout : timeout_;
    MLAG_RETURN_IF_ERROR(CheckUsable(rank, name));
    slots_[rank] = mine;
    MLAG_RETURN_IF_ERROR(Arrive(rank, name, /*inside=*/false, bound));
    absl::Status agree = CheckAgree(name);
    if (agree.ok()) read(slots_);
    MLAG_RETURN_IF_ERROR(Arrive(rank, name, /*inside=*/true, bound));
    if (!agree.ok()) return agree;
    finish();
    return absl::OkStatus();
  }

  // Split: post (color, key); the lowest old rank of each color creates the
  // new group between the first two barriers, the others pick it up between
  // the second and the third.
  // Returns the new group and this rank's place in it (nullptr, -1 for a
  // negative color).
  absl::StatusOr<std::pair<std::shared_ptr<LocalGroup>, int>> Split(int rank, int color, int key) {
    const char* name = OpName(Op::kSplit);
    MLAG_RETURN_IF_ERROR(CheckUsable(rank, name));
    Slot mine;
    mine.desc.op = Op::kSplit;
    mine.color = color;
    mine.key = key;
    slots_[rank] = mine;
    MLAG_RETURN_IF_ERROR(Arrive(rank, name, /*inside=*/false, timeout_));
    absl::Status agree = CheckAgree(name);
    std::vector<int> members;  // old ranks of my color, in new-rank order
    if (agree.ok() && color >= 0) {
      for (int r = 0; r < size_; ++r) {
        if (slots_[r].color == color) members.push_back(r);
      }
      std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
        return slots_[a].key < slots_[b].key;  // ties keep old-rank order
      });
      if (rank == *std::min_element(members.begin(), members.end())) {
        slots_[rank].new_group =
            std::make_shared<LocalGroup>(static_cast<int>(members.size()), timeout_);
      }
    }
    // All ranks agree on `agree`, so all take the same barriers. The
    // leader's reference to the new group is dropped on every way out.
    if (agree.ok()) {
      absl::Status arrived = Arrive(rank, name, /*inside=*/true, timeout_);
      if (!arrived.ok()) {
        slots_[rank].new_group.reset();
        return arrived;
      }
    }
    std::shared_ptr<LocalGroup> group;
    int new_rank = -1;
    if (agree.ok() && color >= 0) {
      group = slots_[*std::min_element(members.begin(), members.end())].new_group;
      new_rank =
          static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    }
    absl::Status arrived = Arrive(rank, name, /*inside=*/true, timeout_);
    slots_[rank].new_group.reset();  // the leader's reference; peers hold their own now
    MLAG_RETURN_IF_ERROR(arrived);
    if (!agree.ok()) return agree;
    return std::make_pair(std::move(group), new_rank);
  }

 private:
  absl::Status AbortedLocked(int rank, const char* name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (abort_reason_.ok()) return absl::OkStatus();
    return absl::AbortedError(absl::StrCat("local ", name, " (rank ", rank, " of ", size_,
                                           "): the group was aborted: ", abort_reason_.message()));
  }

  absl::Status CheckUsable(int rank, const char* name) {
    absl::MutexLock lock(&mu_);
    MLAG_RETURN_IF_ERROR(AbortedLocked(rank, name));
    if (broken_.ok()) return absl::OkStatus();
    // Aborted with the timeout's text: a consequence of the peer fault,
    // never mistaken for a failure of this rank's own.
    return absl::AbortedError(absl::StrCat(
        "local ", name, " (rank ", rank, " of ", size_,
        "): the group is unusable after a rank timed out in the middle of a collective: ",
        broken_.message()));
  }

  // The reusable barrier. A rank that times out withdraws its arrival
  // (under the lock, so either the barrier completed or it did not). At the
  // entry barrier that leaves the group usable; at a later barrier (`inside`
  // a collective) a peer is stuck mid-collective, so the group is marked
  // unusable. A rank waits at most `timeout`.
  absl::Status Arrive(int rank, const char* name, bool inside, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      std::fill(present_.begin(), present_.end(), false);
      std::fill(gave_up_.begin(), gave_up_.end(), false);
      ++generation_;
      cv_.SignalAll();
      return absl::OkStatus();
    }
    present_[rank] = true;
    gave_up_[rank] = false;
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + timeout;
    while (generation_ == generation) {
      // An abort ends the wait at the entry barrier only. Past it, every
      // rank is between barriers, which never blocks, so the exit barrier
      // completes; leaving it early would let this rank reuse a buffer a
      // peer is still reading.
      if (!inside && !abort_reason_.ok()) {
        --arrived_;
        present_[rank] = false;
        return AbortedLocked(rank, name);
      }
      if (cv_.WaitWithDeadline(&mu_, deadline) && generation_ == generation &&
          (inside || abort_reason_.ok())) {
        // This rank waited for those that never arrived or, when every
        // rank did, for those that arrived and gave up before it.
        std::vector<int> peers;
        for (int r = 0; r < size_; ++r) {
          if (!present_[r]) peers.push_back(r);
        }
        if (peers.empty()) {
          for (int r = 0; r < size_; ++r) {
            if (gave_up_[r]) peers.push_back(r);
          }
        }
        --arrived_;
        gave_up_[rank] = true;
        absl::Status timed_out =
            PeerTimeoutError(rank, size_, absl::StrCat("local ", name), absl::Now() - start, peers);
        if (inside) broken_ = timed_out;
        return timed_out;
      }
    }
    return absl::OkStatus();
  }

  // Identical on every rank: all read the same posts.
  absl::Status CheckAgree(const char* name) const {
    bool same = true;
    for (int r = 1; r < size_; ++r) same &= slots_[r].desc == slots_[0].desc;
    if (same) return absl::OkStatus();
    std::string what;
    for (int r = 0; r < size_; ++r) {
      absl::StrAppend(&what, r == 0 ? "" : "; ", "rank ", r, ": ", slots_[r].desc.ToString());
    }
    return absl::InvalidArgumentError(
        absl::StrCat("local ", name, ": ranks launched different collectives (", what, ")"));
  }

  const int size_;
  const absl::Duration timeout_;
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  int arrived_ = 0;  // guarded by mu_
  // guarded by mu_: the ranks that reached the barrier of this generation
  // (waiting, or gone after a timeout), and of those the ones gone.
  std::vector<bool> present_;
  std::vector<bool> gave_up_;
  uint64_t generation_ = 0;  // guarded by mu_
  // guarded by mu_: OK, or the timeout that left a peer stuck between the
  // barriers of a collective (the group is unusable from then on).
  absl::Status broken_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);  // not ok once aborted
};

namespace {

// The accumulator type: integer sums wrap (unsigned) instead of overflowing.
template <typename T, bool = std::is_integral<T>::value>
struct AccOf {
  using type = T;
};
template <typename T>
struct AccOf<T, true> {
  using type = std::make_unsigned_t<T>;
};

// out[i] = in[0][i] op in[1][i] op ... in rank order. Blocked, so `out` may
// be exactly one of the inputs (every input element is read before the
// output element is written).

template <typename T>
void ReduceTyped(void* out_v, const std::vector<const void*>& in_v, int64_t n, ReduceOp op) {
  using Acc = typename AccOf<T>::type;
  constexpr int64_t kBlock = 512;
  Acc acc[kBlock];
  T* out = static_cast<T*>(out_v);
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    const T* x0 = static_cast<const T*>(in_v[0]) + b;
    for (int64_t i = 0; i < m; ++i) acc[i] = static_cast<Acc>(x0[i]);
    for (size_t p = 1; p < in_v.size(); ++p) {
      const T* x = static_cast<const T*>(in_v[p]) + b;
      switch (op) {
        case ReduceOp::kSum:
          for (int64_t i = 0; i < m; ++i) acc[i] += static_cast<Acc>(x[i]);
          break;
        case ReduceOp::kMax:
          for (int64_t i = 0; i < m; ++i) {
            if (x[i] > static_cast<T>(acc[i])) acc[i] = static_cast<Acc>(x[i]);
          }
          break;
        case ReduceOp::kMin:
          for (int64_t i = 0; i < m; ++i) {
            if (x[i] < static_cast<T>(acc[i])) acc[i] = static_cast<Acc>(x[i]);
          }
          break;
      }
    }
    for (int64_t i = 0; i < m; ++i) out[b + i] = static_cast<T>(acc[i]);
  }
}

void Reduce(DType dtype, void* out, const std::vector<const void*>& in, int64_t n, ReduceOp op) {
  switch (dtype) {
    case DType::kF32:
      ReduceTyped<float>(out, in, n, op);
      break;
    case DType::kI32:
      ReduceTyped<int32_t>(out, in, n, op);
      break;
    case DType::kI64:
      ReduceTyped<int64_t>(out, in, n, op);
      break;
    default:
      break;  // rejected at launch
  }
}

int64_t ReduceScalar(int64_t a, int64_t b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kMin:
      return std::min(a, b);
  }
  return a;
}

void CopyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

const void* Offset(const void* p, size_t bytes) {
  return static_cast<const unsigned char*>(p) + bytes;
}

}  // namespace
}  // namespace local_internal

using local_internal::CopyBytes;
using local_internal::LocalGroup;
using local_internal::Mailbox;
using local_internal::Offset;
using local_internal::Op;
using local_internal::Reduce;
using local_internal::ReduceScalar;
using local_internal::Slot;
namespace ci = comm_internal;

LocalCommunicator::LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}

LocalCommunicator::~LocalCommunicator() = default;

std::vector<std::unique_ptr<Communicator>> LocalCommunicator::CreateGroup(int size) {
  return CreateGroup(size, kDefaultTimeout);
}

std::vector<std::unique_ptr<Communicator>> LocalCommunicator::CreateGroup(int size,
                                                                          absl::Duration timeout) {
  std::vector<std::unique_ptr<Communicator>> comms;
  if (size < 1) return comms;
  auto group = std::make_shared<LocalGroup>(size, timeout);
  for (int r = 0; r < size; ++r) comms.emplace_back(new LocalCommunicator(group, r));
  return comms;
}

int LocalCommunicator::size() const { return group_->size(); }

absl::Status LocalCommunicator::AllGather(Stream& stream, const Tensor& send, const Tensor& recv) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("local", ci::kAllGatherName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckAllGather(ci::kAllGatherName, stream, send, recv, rank_, size()));
  return stream.LaunchHost(
      ci::kAllGatherName, OpKind::kComm,
      [group = group_, rank = rank_, send, recv]() -> absl::Status {
        Slot mine;
        mine.desc = {Op::kAllGather, send.nbytes(), send.dtype(), ReduceOp::kSum, -1};
        mine.send = send.data();
        mine.recv = recv.data();
        const size_t bytes = send.nbytes();
        return group->Run(
            rank, mine,
            [&](const std::vector<Slot>& slots) {
              auto* out = static_cast<unsigned char*>(recv.data());
              for (size_t p = 0; p < slots.size(); ++p) {
                CopyBytes(out + p * bytes, slots[p].send, bytes);
              }
            },
            [] {});
      });
}

absl::Status LocalCommunicator::ReduceScatter(Stream& stream, const Tensor& send,
                                              const Tensor& recv) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("local", ci::kReduceScatterName, stream));
  MLAG_RETURN_IF_ERROR(
      ci::CheckReduceScatter(ci::kReduceScatterName, stream, send, recv, rank_, size()));
  return stream.LaunchHost(
      ci::kReduceScatterName, OpKind::kComm,
      [group = group_, rank = rank_, send, recv]() -> absl::Status {
        Slot mine;
        mine.desc = {Op::kReduceScatter, send.nbytes(), send.dtype(), ReduceOp::kSum, -1};
        mine.send = send.data();
        mine.recv = recv.data();
        // Only this rank reads slice `rank` of any send, so recv may be this
        // rank's own slice (in place): the blocked reduction reads before writing.
        const size_t slice_bytes = recv.nbytes();
        return group->Run(
            rank, mine,
            [&](const std::vector<Slot>& slots) {
              std::vector<const void*> in;
              in.reserve(slots.size());
              for (const Slot& s : slots) in.push_back(Offset(s.send, rank * slice_bytes));
              Reduce(recv.dtype(), recv.data(), in, recv.numel(), ReduceOp::kSum);
            },
            [] {});
      });
}

absl::Status LocalCommunicator::AllReduce(Stream& stream, const Tensor& send, const Tensor& recv,
                                          ReduceOp op) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("local", ci::kAllReduceName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckAllReduce(ci::kAllReduceName, stream, send, recv));
  // In place, the peers read this rank's send while it reduces: reduce into
  // scratch and copy it into recv after the exit barrier.
  std::shared_ptr<std::vector<unsigned char>> scratch;
  if (send.data() == recv.data() && recv.nbytes() > 0) {
    scratch = std::make_shared<std::vector<unsigned char>>(recv.nbytes());
  }
  return stream.LaunchHost(
      ci::kAllReduceName, OpKind::kComm,
      [group = group_, rank = rank_, send, recv, op, scratch]() -> absl::Status {
        Slot mine;
        mine.desc = {Op::kAllReduce, send.nbytes(), send.dtype(), op, -1};
        mine.send = send.data();
        mine.recv = recv.data();
        void* out = scratch ? static_cast<void*>(scratch->data()) : recv.data();
        return group->Run(
            rank, mine,
            [&](const std::vector<Slot>& slots) {
              std::vector<const void*> in;
              in.reserve(slots.size());
              for (const Slot& s : slots) in.push_back(s.send);
              Reduce(recv.dtype(), out, in, recv.numel(), op);
            },
            [&] { CopyBytes(recv.data(), out, recv.nbytes()); });
      });
}

absl::Status LocalCommunicator::Broadcast(Stream& stream, const Tensor& buffer, int root) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("local", ci::kBroadcastName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckBroadcast(ci::kBroadcastName, stream, buffer, root, size()));
  return stream.LaunchHost(
      ci::kBroadcastName, OpKind::kComm,
      [group = group_, rank = rank_, buffer, root]() -> absl::Status {
        Slot mine;
        mine.desc = {Op::kBroadcast, buffer.nbytes(), buffer.dtype(), ReduceOp::kSum, root};
        mine.send = buffer.data();
        mine.recv = buffer.data();
        return group->Run(
            rank, mine,
            [&](const std::vector<Slot>& slots) {
              if (rank != root) CopyBytes(buffer.data(), slots[root].send, buffer.nbytes());
            },
            [] {});
      });
}

absl::Status LocalCommunicator::Send(Stream& stream, const Tensor& buffer, int peer) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("local", ci::kSendName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckPeer(ci::kSendName, stream, buffer, peer, size()));
  if (peer == rank_) {
    return absl::InvalidArgumentError(
        "send: the local backend cannot send to its own rank (Send waits for the Recv)");
  }
  return stream.LaunchHost(
      ci::kSendName, OpKind::kComm, [group = group_, rank = rank_, buffer, peer]() -> absl::Status {
        Mailbox& box = group->mailbox(rank, peer);
        absl::MutexLock lock(&box.mu);
        const absl::Time start = absl::Now();
        const absl::Time deadline = start + group->timeout();
        box.posted = true;
        box.taken = false;
        box.data = buffer.data();
        box.bytes = buffer.nbytes();
        box.cv.SignalAll();
        while (!box.taken) {
          absl::Status aborted = group->Aborted(rank, "send");
          if (!aborted.ok()) {
            box.posted = false;  // withdraw: the buffer is the caller's again
            return aborted;
          }
          if (box.cv.WaitWithDeadline(&box.mu, deadline) && !box.taken) {
            box.posted = false;  // withdraw: the buffer is the caller's again
            return group->PointToPointTimeout(rank, "local send", peer, absl::Now() - start);
          }
        }
        box.posted = false;
        box.taken = false;
        box.cv.SignalAll();
        return box.result;
      });
}

absl::Status LocalCommunicator::Recv(Stream& stream, const Tensor& buffer, int peer) {
  MLAG_RETURN_IF_ERROR(ci::CheckHostStream("local", ci::kRecvName, stream));
  MLAG_RETURN_IF_ERROR(ci::CheckPeer(ci::kRecvName, stream, buffer, peer, size()));
  if (peer == rank_) {
    return absl::InvalidArgumentError(
        "recv: the local backend cannot receive from its own rank (Send waits for the Recv)");
  }
  return stream.LaunchHost(
      ci::kRecvName, OpKind::kComm, [group = group_, rank = rank_, buffer, peer]() -> absl::Status {
        Mailbox& box = group->mailbox(peer, rank);
        absl::MutexLock lock(&box.mu);
        const absl::Time start = absl::Now();
        const absl::Time deadline = start + group->timeout();
        while (!box.posted || box.taken) {
          MLAG_RETURN_IF_ERROR(group->Aborted(rank, "recv"));
          if (box.cv.WaitWithDeadline(&box.mu, deadline) && (!box.posted || box.taken)) {
            return group->PointToPointTimeout(rank, "local recv", peer, absl::Now() - start);
          }
        }
        if (box.bytes != buffer.nbytes()) {
          box.result = absl::InvalidArgumentError(
              absl::StrCat("local send/recv (rank ", peer, " to rank ", rank, "): send of ",
                           box.bytes, " bytes matched a recv of ", buffer.nbytes(), " bytes"));
        } else {
          CopyBytes(buffer.data(), box.data, box.bytes);
          box.result = absl::OkStatus();
        }
        box.taken = true;
        box.cv.SignalAll();
        return box.result;
      });
}

absl::Status LocalCommunicator::Barrier() { return Barrier(group_->timeout()); }

absl::Status LocalCommunicator::Barrier(absl::Duration timeout) {
  Slot mine;
  mine.desc.op = Op::kBarrier;
  return group_->Run(
      rank_, mine, [](const std::vector<Slot>&) {}, [] {}, timeout);
}

absl::StatusOr<int64_t> LocalCommunicator::AllReduceScalar(int64_t value, ReduceOp op) {
  Slot mine;
  mine.desc.op = Op::kScalar;
  mine.desc.reduce = op;
  mine.scalar = value;
  int64_t result = 0;
  MLAG_RETURN_IF_ERROR(group_->Run(
      rank_, mine,
      [&](const std::vector<Slot>& slots) {
        result = slots[0].scalar;
        for (size_t p = 1; p < slots.size(); ++p) {
          result = ReduceScalar(result, slots[p].scalar, op);
        }
      },
      [] {}));
  return result;
}

absl::StatusOr<std::unique_ptr<Communicator>> LocalCommunicator::Split(int color, int key) {
  MLAG_ASSIGN_OR_RETURN(auto joined, group_->Split(rank_, color, key));
  if (joined.first == nullptr) return std::unique_ptr<Communicator>();
  return std::unique_ptr<Communicator>(
      new LocalCommunicator(std::move(joined.first), joined.second));
}

void LocalCommunicator::Abort(const absl::Status& reason) { group_->Abort(reason); }

absl::Status LocalCommunicator::Health() { return group_->Aborted(rank_, "group"); }

}  // namespace mlag
