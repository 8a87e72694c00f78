// Collective checks shared by the local backend's GoogleTest suite (one
// thread per rank) and the MPI test program (one process per rank): each
// check runs on one rank, computes the expected result of every rank from
// the same deterministic inputs, and records a pass or a failure message.
//
// Inputs are nonzero multiples of 1/8 (f32) or small integers, so sums are
// exact in any order: the checks hold for backends that reduce in any order
// (MPI's algorithms); the local backend's rank-order guarantee is tested on
// random floats in comm_test.cc.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag {
namespace comm_checks {

// Passes and failures of one rank.
struct CheckLog {
  int passed = 0;
  std::vector<std::string> failures;

  void Expect(bool ok, const std::string& what) {
    if (ok) {
      ++passed;
    } else {
      failures.push_back(what);
    }
  }
  // Records `status`; returns whether it was OK.
  bool ExpectOk(const absl::Status& status, const std::string& what) {
    Expect(status.ok(), absl::StrCat(what, ": ", status.ToString()));
    return status.ok();
  }
};

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}

template <typename T>
Tensor View(std::vector<T>& v) {
  return Tensor(v.data(), DTypeOf<T>(), {static_cast<int64_t>(v.size())});
}
template <typename T>
Tensor View(std::vector<T>& v, int64_t begin, int64_t count) {
  return Tensor(v.data() + begin, DTypeOf<T>(), {count});
}

inline uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Element i of rank `rank`'s input for the check seeded `seed`: k / 8 for
// f32, k for integers, with k in [-64, 64] and never 0.
template <typename T>
T Value(uint64_t seed, int rank, int64_t i) {
  const uint64_t h =
      Mix(Mix(seed) ^ (static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(i));
  int64_t k = static_cast<int64_t>(h % 128) - 64;
  if (k >= 0) ++k;
  if (std::is_floating_point<T>::value) return static_cast<T>(static_cast<double>(k) / 8.0);
  return static_cast<T>(k);
}

template <typename T>
std::vector<T> Values(uint64_t seed, int rank, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = Value<T>(seed, rank, i);
  return v;
}

// A value no input takes (NaN for floats), to prove every element was written.
template <typename T>
T Poison() {
  if (std::is_floating_point<T>::value) return std::numeric_limits<T>::quiet_NaN();
  return static_cast<T>(0x7eadbeef);
}

template <typename T>
T Combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kMax:
      return a > b ? a : b;
    case ReduceOp::kMin:
      return a < b ? a : b;
  }
  return a;
}

// Empty when equal, else where the first difference is.
template <typename T>
std::string Diff(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return absl::StrCat("size ", got.size(), " vs ", want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(got[i] == want[i])) {
      return absl::StrCat("element ", i, ": got ", got[i], ", want ", want[i]);
    }
  }
  return "";
}

template <typename T>
void ExpectEqual(CheckLog& log, const std::string& what, const std::vector<T>& got,
                 const std::vector<T>& want) {
  const std::string diff = Diff(got, want);
  log.Expect(diff.empty(), absl::StrCat(what, ": ", diff));
}

// ---- AllGather ------------------------------------------------------------

template <typename T>
void CheckAllGatherOf(Communicator& comm, Stream& stream, CheckLog& log, int64_t n, bool in_place) {
  const int size = comm.size();
  const int rank = comm.rank();
  const uint64_t seed = 100 + n + (in_place ? 7 : 0);
  const std::string what =
      absl::StrCat("all_gather ", DTypeName(DTypeOf<T>()), " n=", n, in_place ? " in place" : "");
  std::vector<T> send = Values<T>(seed, rank, n);
  std::vector<T> recv(static_cast<size_t>(size * n), Poison<T>());
  Tensor send_t = View(send);
  if (in_place) {
    for (int64_t i = 0; i < n; ++i) recv[static_cast<size_t>(rank * n + i)] = send[i];
    send_t = View(recv, rank * n, n);
  }
  if (!log.ExpectOk(comm.AllGather(stream, send_t, View(recv)), what)) return;
  std::vector<T> want;
  for (int p = 0; p < size; ++p) {
    std::vector<T> v = Values<T>(seed, p, n);
    want.insert(want.end(), v.begin(), v.end());
  }
  ExpectEqual(log, what, recv, want);
}

inline void CheckAllGather(Communicator& comm, Stream& stream, CheckLog& log) {
  CheckAllGatherOf<float>(comm, stream, log, 37, false);
  CheckAllGatherOf<int64_t>(comm, stream, log, 5, false);
  CheckAllGatherOf<float>(comm, stream, log, 19, true);
  CheckAllGatherOf<float>(comm, stream, log, 0, false);  // empty is fine
}

// ---- ReduceScatter ----------------------------------------------------------

template <typename T>
void CheckReduceScatterOf(Communicator& comm, Stream& stream, CheckLog& log, int64_t n,
                          bool in_place) {
  const int size = comm.size();
  const int rank = comm.rank();
  const uint64_t seed = 200 + n + (in_place ? 7 : 0);
  const std::string what = absl::StrCat("reduce_scatter ", DTypeName(DTypeOf<T>()), " n=", n,
                                        in_place ? " in place" : "");
  std::vector<T> send = Values<T>(seed, rank, size * n);
  std::vector<T> recv(static_cast<size_t>(n), Poison<T>());
  Tensor recv_t = in_place ? View(send, rank * n, n) : View(recv);
  if (!log.ExpectOk(comm.ReduceScatter(stream, View(send), recv_t), what)) return;
  std::vector<T> got(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    got[i] = in_place ? send[static_cast<size_t>(rank * n + i)] : recv[i];
  }
  std::vector<T> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    T acc = Value<T>(seed, 0, rank * n + i);
    for (int p = 1; p < size; ++p) {
      acc = Combine(acc, Value<T>(seed, p, rank * n + i), ReduceOp::kSum);
    }
    want[i] = acc;
  }
  ExpectEqual(log, what, got, want);
}

inline void CheckReduceScatter(Communicator& comm, Stream& stream, CheckLog& log) {
  CheckReduceScatterOf<float>(comm, stream, log, 29, false);
  CheckReduceScatterOf<int32_t>(comm, stream, log, 6, false);
  CheckReduceScatterOf<float>(comm, stream, log, 17, true);
}

// ---- AllReduce --------------------------------------------------------------

template <typename T>
void CheckAllReduceOf(Communicator& comm, Stream& stream, CheckLog& log, int64_t n, ReduceOp op,
                      bool in_place) {
  const int size = comm.size();
  const int rank = comm.rank();
  const uint64_t seed = 300 + n + static_cast<uint64_t>(op) * 11 + (in_place ? 7 : 0);
  const std::string what =
      absl::StrCat("all_reduce ", ReduceOpName(op), " ", DTypeName(DTypeOf<T>()), " n=", n,
                   in_place ? " in place" : "");
  std::vector<T> send = Values<T>(seed, rank, n);
  std::vector<T> recv(static_cast<size_t>(n), Poison<T>());
  std::vector<T>& out = in_place ? send : recv;
  if (!log.ExpectOk(comm.AllReduce(stream, View(send), View(out), op), what)) return;
  std::vector<T> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    T acc = Value<T>(seed, 0, i);
    for (int p = 1; p < size; ++p) acc = Combine(acc, Value<T>(seed, p, i), op);
    want[i] = acc;
  }
  ExpectEqual(log, what, out, want);
}

inline void CheckAllReduce(Communicator& comm, Stream& stream, CheckLog& log) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    CheckAllReduceOf<float>(comm, stream, log, 53, op, false);
    CheckAllReduceOf<int32_t>(comm, stream, log, 41, op, false);
    CheckAllReduceOf<int64_t>(comm, stream, log, 23, op, false);
    CheckAllReduceOf<float>(comm, stream, log, 1031, op, true);  // more than one block
  }
}

// ---- Broadcast ----------------------------------------------------------------

inline void CheckBroadcast(Communicator& comm, Stream& stream, CheckLog& log) {
  const int64_t n = 31;
  for (int root = 0; root < comm.size(); ++root) {
    const uint64_t seed = 400 + static_cast<uint64_t>(root);
    const std::string what = absl::StrCat("broadcast from root ", root);
    std::vector<float> buffer = Values<float>(seed, comm.rank(), n);
    if (!log.ExpectOk(comm.Broadcast(stream, View(buffer), root), what)) continue;
    ExpectEqual(log, what, buffer, Values<float>(seed, root, n));
  }
}

// ---- Send / Recv ----------------------------------------------------------------

// A ring: rank r sends to r + 1 and receives from r - 1. Even ranks send
// first and odd ranks receive first, so no rank waits in a cycle.
inline void CheckSendRecvRing(Communicator& comm, Stream& stream, CheckLog& log) {
  const int size = comm.size();
  const int rank = comm.rank();
  if (size < 2) return;
  const int64_t n = 11;
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  for (int round = 0; round < 3; ++round) {
    const uint64_t seed = 500 + static_cast<uint64_t>(round);
    std::vector<int64_t> send = Values<int64_t>(seed, rank, n);
    std::vector<int64_t> recv(static_cast<size_t>(n), Poison<int64_t>());
    const std::string what = absl::StrCat("send/recv ring round ", round);
    absl::Status s;
    if (rank % 2 == 0) {
      s = comm.Send(stream, View(send), right);
      if (s.ok()) s = comm.Recv(stream, View(recv), left);
    } else {
      s = comm.Recv(stream, View(recv), left);
      if (s.ok()) s = comm.Send(stream, View(send), right);
    }
    if (!log.ExpectOk(s, what)) return;
    ExpectEqual(log, what, recv, Values<int64_t>(seed, left, n));
  }
}

// ---- Barrier and the scalar all-reduce ----------------------------------------------

inline void CheckBarrier(Communicator& comm, CheckLog& log) {
  for (int i = 0; i < 3; ++i) log.ExpectOk(comm.Barrier(), absl::StrCat("barrier ", i));
}

inline void CheckAllReduceScalar(Communicator& comm, CheckLog& log) {
  const int size = comm.size();
  auto value = [](int r) { return static_cast<int64_t>(r) * 7 - 5 + (int64_t{1} << 40); };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    int64_t want = value(0);
    for (int p = 1; p < size; ++p) want = Combine(want, value(p), op);
    absl::StatusOr<int64_t> got = comm.AllReduceScalar(value(comm.rank()), op);
    const std::string what = absl::StrCat("all_reduce_scalar ", ReduceOpName(op));
    if (!log.ExpectOk(got.status(), what)) continue;
    log.Expect(*got == want, absl::StrCat(what, ": got ", *got, ", want ", want));
  }
}

// ---- Capture and replay ------------------------------------------------------------

// The MoE exchange in miniature: all-gather the tokens, apply this rank's
// "experts" (a host op scaling gathered element j by rank + 1 + j % 3),
// reduce-scatter the sums back. Captured once, replayed `replays` times with
// new inputs written into the captured buffers; every replay must match the
// expected values and an eager run of the same ops.
inline void CheckGraphReplay(Communicator& comm, Stream& stream, CheckLog& log, int replays) {
  const int size = comm.size();
  const int rank = comm.rank();
  const int64_t n = 13;
  std::vector<float> x(static_cast<size_t>(n));
  std::vector<float> gathered(static_cast<size_t>(size * n));
  std::vector<float> out(static_cast<size_t>(n));
  Tensor x_t = View(x), gathered_t = View(gathered), out_t = View(out);
  auto weight = [](int r, int64_t j) { return static_cast<float>(r + 1 + j % 3); };
  auto launch = [&]() -> absl::Status {
    {
      NodeScope scope(stream, "layers.0.moe.dispatch", OpKind::kComm);
      absl::Status s = comm.AllGather(stream, x_t, gathered_t);
      if (!s.ok()) return s;
    }
    absl::Status s = stream.LaunchHost("experts", OpKind::kKernel, [gathered_t, rank, weight] {
      float* g = gathered_t.data_as<float>();
      for (int64_t j = 0; j < gathered_t.numel(); ++j) g[j] = g[j] * weight(rank, j);
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return comm.ReduceScatter(stream, gathered_t, out_t);
  };

  if (!log.ExpectOk(stream.BeginCapture(), "BeginCapture")) return;
  absl::Status launched = launch();
  absl::StatusOr<std::unique_ptr<Graph>> graph = stream.EndCapture();
  if (!log.ExpectOk(launched, "launch under capture")) return;
  if (!log.ExpectOk(graph.status(), "EndCapture")) return;
  const std::vector<GraphNode>& nodes = (*graph)->nodes();
  log.Expect(nodes.size() == 3, absl::StrCat("graph has ", nodes.size(), " nodes, want 3"));
  if (nodes.size() == 3) {
    log.Expect(nodes[0].name == "layers.0.moe.dispatch" && nodes[0].kind == OpKind::kComm,
               absl::StrCat("node 0 is ", nodes[0].name, " (", OpKindName(nodes[0].kind), ")"));
    log.Expect(nodes[1].name == "experts" && nodes[1].kind == OpKind::kKernel,
               absl::StrCat("node 1 is ", nodes[1].name, " (", OpKindName(nodes[1].kind), ")"));
    log.Expect(nodes[2].name == "reduce_scatter" && nodes[2].kind == OpKind::kComm,
               absl::StrCat("node 2 is ", nodes[2].name, " (", OpKindName(nodes[2].kind), ")"));
  }

  int bad = 0;
  std::string first_bad;
  for (int it = 0; it < replays; ++it) {
    const uint64_t seed = 600 + static_cast<uint64_t>(it);
    std::vector<float> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float acc = 0.0f;
      for (int p = 0; p < size; ++p) {
        const float term = Value<float>(seed, rank, i) * weight(p, rank * n + i);
        acc = p == 0 ? term : acc + term;
      }
      want[i] = acc;
    }
    const std::vector<float> fresh = Values<float>(seed, rank, n);
    std::copy(fresh.begin(), fresh.end(), x.begin());  // into the captured buffer
    std::fill(out.begin(), out.end(), Poison<float>());
    absl::Status s = (*graph)->Replay(stream);
    std::string diff = s.ok() ? Diff(out, want) : s.ToString();
    std::fill(out.begin(), out.end(), Poison<float>());
    if (diff.empty()) {
      s = launch();  // eager, same buffers
      diff = s.ok() ? Diff(out, want) : s.ToString();
      if (!diff.empty()) diff = absl::StrCat("eager: ", diff);
    }
    if (!diff.empty() && bad++ == 0) first_bad = absl::StrCat("iteration ", it, ": ", diff);
  }
  log.Expect(bad == 0, absl::StrCat("graph replay: ", bad, " of ", replays, " iterations wrong; ",
                                    first_bad));
}

// ---- Split --------------------------------------------------------------------------

// Old ranks, in the order the new communicator should rank them.
inline std::vector<int64_t> Members(int size, const std::function<int(int)>& color,
                                    const std::function<int(int)>& key, int my_color) {
  std::vector<int64_t> m;
  for (int r = 0; r < size; ++r) {
    if (color(r) == my_color) m.push_back(r);
  }
  std::stable_sort(m.begin(), m.end(), [&](int64_t a, int64_t b) {
    return key(static_cast<int>(a)) < key(static_cast<int>(b));
  });
  return m;
}

inline void CheckSubgroup(Communicator& parent, Stream& stream, CheckLog& log,
                          const std::function<int(int)>& color, const std::function<int(int)>& key,
                          const std::string& name) {
  const int rank = parent.rank();
  absl::StatusOr<std::unique_ptr<Communicator>> sub = parent.Split(color(rank), key(rank));
  if (!log.ExpectOk(sub.status(), name)) return;
  if (color(rank) < 0) {
    log.Expect(*sub == nullptr, absl::StrCat(name, ": negative color should give nullptr"));
    return;
  }
  if (*sub == nullptr) {
    log.Expect(false, absl::StrCat(name, ": got nullptr"));
    return;
  }
  Communicator& c = **sub;
  const std::vector<int64_t> members = Members(parent.size(), color, key, color(rank));
  const int want_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  log.Expect(c.size() == static_cast<int>(members.size()) && c.rank() == want_rank,
             absl::StrCat(name, ": rank ", c.rank(), " of ", c.size(), ", want ", want_rank, " of ",
                          members.size()));
  log.Expect(c.backend() == parent.backend(), absl::StrCat(name, ": backend ", c.backend()));
  // Who is where: gather the old ranks.
  std::vector<int64_t> mine = {rank};
  std::vector<int64_t> all(members.size(), Poison<int64_t>());
  if (log.ExpectOk(c.AllGather(stream, View(mine), View(all)), name + " all_gather")) {
    ExpectEqual(log, name + " all_gather of old ranks", all, members);
  }
  std::vector<float> v(7, static_cast<float>(rank + 1));
  if (log.ExpectOk(c.AllReduce(stream, View(v), View(v), ReduceOp::kSum), name + " all_reduce")) {
    float want = 0;
    for (int64_t m : members) want += static_cast<float>(m + 1);
    ExpectEqual(log, name + " all_reduce", v, std::vector<float>(7, want));
  }
  absl::StatusOr<int64_t> top = c.AllReduceScalar(rank, ReduceOp::kMax);
  if (log.ExpectOk(top.status(), name + " all_reduce_scalar")) {
    const int64_t want = *std::max_element(members.begin(), members.end());
    log.Expect(*top == want, absl::StrCat(name, " all_reduce_scalar max: got ", *top));
  }
}

inline void CheckSplit(Communicator& comm, Stream& stream, CheckLog& log) {
  const int size = comm.size();
  // By parity, keys reversing the order within each color.
  CheckSubgroup(
      comm, stream, log, [](int r) { return r % 2; }, [](int r) { return -r; }, "split by parity");
  // Everyone but rank 1, which passes color -1 (scale-down by one rank).
  if (size >= 2) {
    CheckSubgroup(
        comm, stream, log, [](int r) { return r == 1 ? -1 : 0; }, [](int r) { return r; },
        "split without rank 1");
  }
  // The parent stays usable.
  log.ExpectOk(comm.Barrier(), "barrier after split");
  absl::StatusOr<int64_t> count = comm.AllReduceScalar(1, ReduceOp::kSum);
  if (log.ExpectOk(count.status(), "parent all_reduce_scalar after split")) {
    log.Expect(*count == size, absl::StrCat("parent all_reduce_scalar after split: ", *count));
  }
}

// Every check, in the same order on every rank.
inline void RunAll(Communicator& comm, Stream& stream, CheckLog& log, int replays) {
  CheckAllGather(comm, stream, log);
  CheckReduceScatter(comm, stream, log);
  CheckAllReduce(comm, stream, log);
  CheckBroadcast(comm, stream, log);
  CheckSendRecvRing(comm, stream, log);
  CheckBarrier(comm, log);
  CheckAllReduceScalar(comm, log);
  CheckGraphReplay(comm, stream, log, replays);
  CheckSplit(comm, stream, log);
}

}  // namespace comm_checks
}  // namespace mlag
