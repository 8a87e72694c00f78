// The emulated NCCL. Every communicator is a POSIX shared-memory segment
// named by its unique id, so ranks may be threads of one process or
// separate processes (MPI ranks on one host). A segment holds a header (a
// process-shared mutex and condition variable, a barrier, one slot of
// control data per rank) and a data window per rank; collectives move their
// data through the windows in chunks, between barriers, and reduce in rank
// order (the same bits on every rank).
//
// Collectives run on the stream's worker thread when the stream reaches
// them, or at every replay of a graph that captured them. NCCL's documented
// rules whose breach would hang or corrupt a real job fail loudly here
// (FatalRule: a message naming the rule, then abort):
//   - destroying or aborting a communicator that captured graphs still
//     reference (NCCL 2.26 and later wait for ever for those graphs);
//   - ranks issuing their collectives in different orders, or with
//     different sizes, types, operations or roots;
//   - a send matched with a receive of another size;
//   - work running on a communicator after it was destroyed.
// Two ranks of one communicator on one device are refused with
// ncclInvalidUsage, as NCCL refuses them.
#include "kernels/cuda/emulation/include/nccl.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cuda/emulation/emulated_runtime.h"
#include "runtime/core/scalar_types.h"

namespace mlag::emu {
namespace {

constexpr uint64_t kSegmentMagic = 0x6d6c61676e63636cull;  // "mlagnccl"
constexpr uint64_t kCommMagic = 0x636f6d6d656d75ull;       // "commemu"
constexpr size_t kWindowBytes = size_t{1} << 20;           // data window per rank
constexpr int kMaxRanks = 512;
// How long a rank waits for the others to join a communicator.
constexpr std::chrono::seconds kJoinTimeout{300};

enum class Op : int32_t { kNone, kAllGather, kReduceScatter, kAllReduce, kBroadcast, kSplit };

const char* OpName(Op op) {
  switch (op) {
    case Op::kNone:
      return "nothing";
    case Op::kAllGather:
      return "AllGather";
    case Op::kReduceScatter:
      return "ReduceScatter";
    case Op::kAllReduce:
      return "AllReduce";
    case Op::kBroadcast:
      return "Broadcast";
    case Op::kSplit:
      return "CommSplit";
  }
  return "?";
}

const char* TypeName(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return "int8";
    case ncclUint8:
      return "uint8";
    case ncclInt32:
      return "int32";
    case ncclUint32:
      return "uint32";
    case ncclInt64:
      return "int64";
    case ncclUint64:
      return "uint64";
    case ncclFloat16:
      return "float16";
    case ncclFloat32:
      return "float32";
    case ncclFloat64:
      return "float64";
    case ncclBfloat16:
      return "bfloat16";
  }
  return "?";
}

size_t TypeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;
}

// What one rank says its current collective is; every rank's must agree.
struct Descriptor {
  uint64_t seq = 0;
  Op op = Op::kNone;
  int32_t type = 0;
  int32_t redop = 0;
  int32_t root = 0;
  uint64_t count = 0;

  bool operator==(const Descriptor& o) const {
    return seq == o.seq && op == o.op && type == o.type && redop == o.redop && root == o.root &&
           count == o.count;
  }
  std::string ToString() const {
    return std::string(OpName(op)) + " of " + std::to_string(count) + " " +
           TypeName(static_cast<ncclDataType_t>(type)) +
           (op == Op::kBroadcast ? " from root " + std::to_string(root) : "") +
           (op == Op::kAllReduce || op == Op::kReduceScatter
                ? " (reduction " + std::to_string(redop) + ")"
                : "");
  }
};

struct RankSlot {
  int32_t attached = 0;
  int32_t bus_id = -1;
  int64_t pid = 0;
  Descriptor desc;
  int32_t split_color = 0, split_key = 0;
  char split_id[NCCL_UNIQUE_ID_BYTES] = {};
  // This rank's outgoing point-to-point chunk, in its data window.
  int32_t p2p_full = 0;
  int32_t p2p_peer = -1;
  uint64_t p2p_bytes = 0;  // in this chunk
  uint64_t p2p_total = 0;  // in the whole send
};

struct Segment {
  uint64_t magic;
  int32_t nranks;
  std::atomic<int32_t> ready;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int32_t attached;
  int32_t init_failed;
  char init_error[256];
  uint64_t barrier_count;
  uint64_t barrier_gen;
  // RankSlot slots[nranks] and nranks data windows follow.
};

size_t SegmentBytes(int nranks) {
  const size_t header = (sizeof(Segment) + 63) / 64 * 64;
  const size_t slots = (sizeof(RankSlot) * static_cast<size_t>(nranks) + 63) / 64 * 64;
  return header + slots + kWindowBytes * static_cast<size_t>(nranks);
}

RankSlot* Slots(Segment* s) {
  return reinterpret_cast<RankSlot*>(reinterpret_cast<char*>(s) + (sizeof(Segment) + 63) / 64 * 64);
}

char* Window(Segment* s, int rank) {
  const size_t slots = (sizeof(RankSlot) * static_cast<size_t>(s->nranks) + 63) / 64 * 64;
  return reinterpret_cast<char*>(Slots(s)) + slots + kWindowBytes * static_cast<size_t>(rank);
}

thread_local std::string t_last_error;

ncclResult_t Fail(ncclResult_t result, const std::string& message) {
  t_last_error = message;
  return result;
}

}  // namespace
}  // namespace mlag::emu

// A communicator as one rank holds it. Never freed: work queued before a
// destroy may still look at it (and must then fail loudly, not read freed
// memory).
struct ncclComm {
  uint64_t magic = mlag::emu::kCommMagic;
  int rank = 0;
  int nranks = 0;
  int device = 0;
  std::string name;  // of the segment
  mlag::emu::Segment* segment = nullptr;
  size_t segment_bytes = 0;
  std::mutex mu;  // guards the fields below and `inflight`
  std::condition_variable cv;
  int inflight = 0;     // operations running on a worker now
  int pending = 0;      // operations queued on streams (not in graphs), not yet run
  int launch_refs = 0;  // graph launches queued or running that use it
  bool destroyed = false;
  std::atomic<bool> aborted{false};
  std::atomic<int> graph_refs{0};
  std::atomic<int> async_error{ncclSuccess};
  uint64_t collective_seq = 0;  // collectives run so far (worker side)
  std::string last_error;
};

namespace mlag::emu {
namespace {

// ---- Segment synchronisation ----------------------------------------------------

class SegmentLock {
 public:
  explicit SegmentLock(Segment* s) : s_(s) { pthread_mutex_lock(&s_->mu); }
  ~SegmentLock() { pthread_mutex_unlock(&s_->mu); }
  // Waits up to 20 ms for a broadcast (the caller re-checks its condition
  // and the abort flag).
  void WaitSlice() {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 20 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec += 1;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&s_->cv, &s_->mu, &ts);
  }
  void Broadcast() { pthread_cond_broadcast(&s_->cv); }

 private:
  Segment* s_;
};

// Every rank of `c` arrives before any leaves. False when this rank's
// communicator is aborted while waiting.
bool Barrier(ncclComm* c) {
  Segment* s = c->segment;
  SegmentLock lock(s);
  const uint64_t gen = s->barrier_gen;
  if (++s->barrier_count == static_cast<uint64_t>(s->nranks)) {
    s->barrier_count = 0;
    ++s->barrier_gen;
    lock.Broadcast();
    return true;
  }
  while (s->barrier_gen == gen) {
    if (c->aborted.load()) {
      --s->barrier_count;
      return false;
    }
    lock.WaitSlice();
  }
  return true;
}

// ---- Creating and joining segments ---------------------------------------------------

std::string SegmentName(const ncclUniqueId& id) {
  return std::string(id.internal, strnlen(id.internal, sizeof(id.internal)));
}

// Opens (creating when first) the segment of `name` for `nranks` ranks.
ncclResult_t OpenSegment(const std::string& name, int nranks, Segment** out, size_t* bytes) {
  const size_t size = SegmentBytes(nranks);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  bool creator = fd >= 0;
  if (!creator) {
    if (errno != EEXIST)
      return Fail(ncclSystemError, "shm_open " + name + ": " + std::strerror(errno));
    fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) return Fail(ncclSystemError, "shm_open " + name + ": " + std::strerror(errno));
    // Wait for the creator to size it.
    const auto deadline = std::chrono::steady_clock::now() + kJoinTimeout;
    for (;;) {
      struct stat st;
      if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(Segment)) break;
      if (std::chrono::steady_clock::now() > deadline) {
        close(fd);
        return Fail(ncclSystemError, "communicator segment " + name + " was never initialised");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } else if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    return Fail(ncclSystemError, "ftruncate " + name + ": " + std::strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != size) {
    close(fd);
    return Fail(ncclInvalidUsage, "communicator " + name + ": ranks disagree on its size (nranks " +
                                      std::to_string(nranks) + " here)");
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Fail(ncclSystemError, "mmap " + name + ": " + std::strerror(errno));
  auto* s = static_cast<Segment*>(p);
  if (creator) {
    s->magic = kSegmentMagic;
    s->nranks = nranks;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&s->mu, &ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_cond_init(&s->cv, &ca);
    RankSlot* slots = Slots(s);
    for (int r = 0; r < nranks; ++r) new (&slots[r]) RankSlot();
    s->ready.store(1, std::memory_order_release);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + kJoinTimeout;
    while (s->ready.load(std::memory_order_acquire) != 1) {
      if (std::chrono::steady_clock::now() > deadline) {
        munmap(p, size);
        return Fail(ncclSystemError, "communicator segment " + name + " was never initialised");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (s->magic != kSegmentMagic || s->nranks != nranks) {
      munmap(p, size);
      return Fail(ncclInvalidUsage, "communicator " + name + ": ranks disagree on nranks");
    }
  }
  *out = s;
  *bytes = size;
  return ncclSuccess;
}

int BusId(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return -1;
  return prop.pciBusID;
}

// Takes rank `rank`'s place in the segment without waiting for the others.
ncclResult_t Attach(ncclComm* c) {
  Segment* s = c->segment;
  SegmentLock lock(s);
  RankSlot& me = Slots(s)[c->rank];
  if (me.attached != 0) {
    return Fail(ncclInvalidArgument,
                "rank " + std::to_string(c->rank) + " joined communicator " + c->name + " twice");
  }
  const int bus = BusId(c->device);
  for (int r = 0; r < s->nranks; ++r) {
    if (Slots(s)[r].attached != 0 && Slots(s)[r].bus_id == bus) {
      const std::string why = "Duplicate GPU detected: rank " + std::to_string(c->rank) +
                              " and rank " + std::to_string(r) +
                              " are both on the device with bus id " + std::to_string(bus) +
                              " (two ranks of one communicator on one device)";
      s->init_failed = 1;
      std::snprintf(s->init_error, sizeof(s->init_error), "%s", why.c_str());
      lock.Broadcast();
      return Fail(ncclInvalidUsage, why);
    }
  }
  me.attached = 1;
  me.bus_id = bus;
  me.pid = getpid();
  if (++s->attached == s->nranks) {
    // Everyone has it mapped: the name is no longer needed.
    shm_unlink(c->name.c_str());
  }
  lock.Broadcast();
  return ncclSuccess;
}

// Waits until every rank attached (or one failed to).
ncclResult_t WaitAttached(ncclComm* c) {
  Segment* s = c->segment;
  SegmentLock lock(s);
  const auto deadline = std::chrono::steady_clock::now() + kJoinTimeout;
  while (s->attached < s->nranks && s->init_failed == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      return Fail(ncclSystemError, "communicator " + c->name + ": only " +
                                       std::to_string(s->attached) + " of " +
                                       std::to_string(s->nranks) + " ranks joined");
    }
    lock.WaitSlice();
  }
  if (s->init_failed != 0) return Fail(ncclInvalidUsage, s->init_error);
  return ncclSuccess;
}

ncclResult_t Join(const ncclUniqueId& id, int nranks, int rank, int device, bool wait,
                  ncclComm** out) {
  *out = nullptr;
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) {
    return Fail(ncclInvalidArgument, "rank " + std::to_string(rank) + " of " +
                                         std::to_string(nranks) + " is out of range");
  }
  const std::string name = SegmentName(id);
  if (name.size() < 2 || name[0] != '/') {
    return Fail(ncclInvalidArgument, "the unique id was not made by ncclGetUniqueId");
  }
  auto* c = new ncclComm();
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->name = name;
  ncclResult_t r = OpenSegment(name, nranks, &c->segment, &c->segment_bytes);
  if (r == ncclSuccess) r = Attach(c);
  if (r == ncclSuccess && wait) r = WaitAttached(c);
  if (r != ncclSuccess) {
    if (c->segment != nullptr) munmap(c->segment, c->segment_bytes);
    shm_unlink(name.c_str());  // no rank can complete this communicator
    c->destroyed = true;       // the object stays, invalid
    return r;
  }
  *out = c;
  return ncclSuccess;
}

// ---- Validating calls --------------------------------------------------------------------

ncclResult_t CheckComm(ncclComm_t comm, const char* call) {
  if (comm == nullptr || comm->magic != kCommMagic) {
    return Fail(ncclInvalidArgument, std::string(call) + ": invalid communicator");
  }
  std::lock_guard<std::mutex> lock(comm->mu);
  if (comm->destroyed) {
    return Fail(ncclInvalidUsage, std::string(call) + ": the communicator was destroyed");
  }
  if (comm->aborted.load()) {
    return Fail(ncclInvalidUsage, std::string(call) + ": the communicator was aborted");
  }
  return ncclSuccess;
}

ncclResult_t CheckBuffer(ncclComm_t comm, const void* p, size_t bytes, const char* call,
                         const char* which) {
  if (bytes == 0) return ncclSuccess;
  const std::string why = CheckDeviceAccess(p, bytes, comm->device);
  if (!why.empty()) {
    return Fail(ncclInvalidArgument, std::string(call) + ": " + which + " " + why);
  }
  return ncclSuccess;
}

// ---- Running operations --------------------------------------------------------------------

// Marks one operation of `c` running for its lifetime; `ok()` is false when
// it must not touch the segment (the communicator was aborted).
class Running {
 public:
  Running(ncclComm* c, const std::string& what) : c_(c) {
    std::lock_guard<std::mutex> lock(c->mu);
    // Aborted (before or after the release): the operation is dropped, as
    // NCCL's aborted kernels end without communicating.
    ok_ = !c->aborted.load();
    if (!ok_) return;
    if (c->destroyed) {
      FatalRule("NCCL rule violated: " + what + " ran on communicator " + c->name +
                " after ncclCommDestroy");
    }
    ++c->inflight;
  }
  ~Running() {
    if (!ok_) return;
    std::lock_guard<std::mutex> lock(c_->mu);
    --c_->inflight;
    c_->cv.notify_all();
  }
  bool ok() const { return ok_; }

 private:
  ncclComm* c_;
  bool ok_ = false;
};

// Element i of `base` (type `t`) as double, and back.
double Load(ncclDataType_t t, const void* base, size_t i) {
  switch (t) {
    case ncclInt8:
      return static_cast<const int8_t*>(base)[i];
    case ncclUint8:
      return static_cast<const uint8_t*>(base)[i];
    case ncclInt32:
      return static_cast<const int32_t*>(base)[i];
    case ncclUint32:
      return static_cast<const uint32_t*>(base)[i];
    case ncclInt64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case ncclUint64:
      return static_cast<double>(static_cast<const uint64_t*>(base)[i]);
    case ncclFloat16:
      return mlag::F16ToF32(static_cast<const uint16_t*>(base)[i]);
    case ncclBfloat16:
      return mlag::Bf16ToF32(static_cast<const uint16_t*>(base)[i]);
    case ncclFloat32:
      return static_cast<const float*>(base)[i];
    case ncclFloat64:
      return static_cast<const double*>(base)[i];
  }
  return 0;
}

// out[i] = in[0][i] op in[1][i] op ... in rank order, in the element type's
// own arithmetic (f32 adds as f32, integers as integers).
void Reduce(ncclDataType_t t, ncclRedOp_t op, const std::vector<const char*>& in, void* out,
            size_t n) {
  auto combine = [op](auto a, auto b) {
    switch (op) {
      case ncclSum:
        return static_cast<decltype(a)>(a + b);
      case ncclProd:
        return static_cast<decltype(a)>(a * b);
      case ncclMax:
        return a > b ? a : b;
      case ncclMin:
        return a < b ? a : b;
    }
    return a;
  };
  auto typed = [&](auto* dst) {
    using T = std::remove_pointer_t<decltype(dst)>;
    for (size_t i = 0; i < n; ++i) {
      T acc = reinterpret_cast<const T*>(in[0])[i];
      for (size_t r = 1; r < in.size(); ++r)
        acc = combine(acc, reinterpret_cast<const T*>(in[r])[i]);
      dst[i] = acc;
    }
  };
  switch (t) {
    case ncclInt8:
      typed(static_cast<int8_t*>(out));
      return;
    case ncclUint8:
      typed(static_cast<uint8_t*>(out));
      return;
    case ncclInt32:
      typed(static_cast<int32_t*>(out));
      return;
    case ncclUint32:
      typed(static_cast<uint32_t*>(out));
      return;
    case ncclInt64:
      typed(static_cast<int64_t*>(out));
      return;
    case ncclUint64:
      typed(static_cast<uint64_t*>(out));
      return;
    case ncclFloat32:
      typed(static_cast<float*>(out));
      return;
    case ncclFloat64:
      typed(static_cast<double*>(out));
      return;
    case ncclFloat16:
    case ncclBfloat16:
      // 16-bit floats reduce in f32 and round once.
      for (size_t i = 0; i < n; ++i) {
        float acc = static_cast<float>(Load(t, in[0], i));
        for (size_t r = 1; r < in.size(); ++r)
          acc = combine(acc, static_cast<float>(Load(t, in[r], i)));
        static_cast<uint16_t*>(out)[i] =
            t == ncclFloat16 ? mlag::F32ToF16(acc) : mlag::F32ToBf16(acc);
      }
      return;
  }
}

// The descriptor exchange every collective starts with: all ranks publish
// theirs, and any difference is a breach of NCCL's ordering rule.
bool AgreeOn(ncclComm* c, Descriptor mine) {
  Segment* s = c->segment;
  {
    SegmentLock lock(s);
    Slots(s)[c->rank].desc = mine;
  }
  if (!Barrier(c)) return false;
  {
    SegmentLock lock(s);
    for (int r = 0; r < c->nranks; ++r) {
      const Descriptor& other = Slots(s)[r].desc;
      if (!(other == mine)) {
        FatalRule(
            "NCCL rule violated: collectives issued in a different order (or with "
            "different arguments) on different ranks of communicator " +
            c->name + ": rank " + std::to_string(c->rank) + "'s collective #" +
            std::to_string(mine.seq) + " is " + mine.ToString() + ", rank " + std::to_string(r) +
            "'s collective #" + std::to_string(other.seq) + " is " + other.ToString());
      }
    }
  }
  // Nobody publishes the next descriptor before everyone has read this one.
  return Barrier(c);
}

struct Collective {
  Op op = Op::kNone;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // elements: per rank for AllGather (send) and ReduceScatter (recv)
  ncclDataType_t type = ncclUint8;
  ncclRedOp_t redop = ncclSum;
  int root = 0;
};

// Runs one collective of `c` (worker side). Returns false when aborted.
bool RunCollective(ncclComm* c, const Collective& op) {
  Segment* s = c->segment;
  const int n = c->nranks, me = c->rank;
  const size_t esize = TypeBytes(op.type);
  Descriptor d;
  d.seq = ++c->collective_seq;
  d.op = op.op;
  d.type = op.type;
  d.redop = op.redop;
  d.root = op.root;
  d.count = op.count;
  if (!AgreeOn(c, d)) return false;
  std::vector<const char*> windows(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) windows[static_cast<size_t>(r)] = Window(s, r);
  char* mine = Window(s, me);
  switch (op.op) {
    case Op::kAllGather: {
      const size_t bytes = op.count * esize;
      for (size_t off = 0; off < bytes; off += kWindowBytes) {
        const size_t len = std::min(kWindowBytes, bytes - off);
        std::memcpy(mine, static_cast<const char*>(op.send) + off, len);
        if (!Barrier(c)) return false;
        for (int r = 0; r < n; ++r) {
          std::memcpy(static_cast<char*>(op.recv) + static_cast<size_t>(r) * bytes + off,
                      windows[static_cast<size_t>(r)], len);
        }
        if (!Barrier(c)) return false;
      }
      return true;
    }
    case Op::kAllReduce: {
      const size_t per = kWindowBytes / esize;
      for (size_t off = 0; off < op.count; off += per) {
        const size_t len = std::min(per, op.count - off);
        std::memcpy(mine, static_cast<const char*>(op.send) + off * esize, len * esize);
        if (!Barrier(c)) return false;
        Reduce(op.type, op.redop, windows, static_cast<char*>(op.recv) + off * esize, len);
        if (!Barrier(c)) return false;
      }
      return true;
    }
    case Op::kReduceScatter: {
      // Each round carries `per` elements of every rank's slice.
      const size_t per = std::max<size_t>(1, kWindowBytes / esize / static_cast<size_t>(n));
      for (size_t off = 0; off < op.count; off += per) {
        const size_t len = std::min(per, op.count - off);
        for (int r = 0; r < n; ++r) {
          std::memcpy(
              mine + static_cast<size_t>(r) * per * esize,
              static_cast<const char*>(op.send) + (static_cast<size_t>(r) * op.count + off) * esize,
              len * esize);
        }
        if (!Barrier(c)) return false;
        std::vector<const char*> parts(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) {
          parts[static_cast<size_t>(r)] =
              windows[static_cast<size_t>(r)] + static_cast<size_t>(me) * per * esize;
        }
        Reduce(op.type, op.redop, parts, static_cast<char*>(op.recv) + off * esize, len);
        if (!Barrier(c)) return false;
      }
      return true;
    }
    case Op::kBroadcast: {
      const size_t bytes = op.count * esize;
      for (size_t off = 0; off < bytes; off += kWindowBytes) {
        const size_t len = std::min(kWindowBytes, bytes - off);
        if (me == op.root) std::memcpy(mine, static_cast<const char*>(op.send) + off, len);
        if (!Barrier(c)) return false;
        if (me != op.root) {
          std::memcpy(static_cast<char*>(op.recv) + off, windows[static_cast<size_t>(op.root)],
                      len);
        } else if (op.recv != op.send) {
          std::memmove(static_cast<char*>(op.recv) + off, static_cast<const char*>(op.send) + off,
                       len);
        }
        if (!Barrier(c)) return false;
      }
      return true;
    }
    default:
      return true;
  }
}

// Point to point: the sender puts each chunk in its window and waits until
// the receiver has taken it.
bool RunSend(ncclComm* c, const void* send, size_t bytes, int peer) {
  Segment* s = c->segment;
  RankSlot& me = Slots(s)[c->rank];
  size_t off = 0;
  do {
    const size_t len = std::min(kWindowBytes, bytes - off);
    SegmentLock lock(s);
    while (me.p2p_full != 0) {
      if (c->aborted.load()) return false;
      lock.WaitSlice();
    }
    std::memcpy(Window(s, c->rank), static_cast<const char*>(send) + off, len);
    me.p2p_peer = peer;
    me.p2p_bytes = len;
    me.p2p_total = bytes;
    me.p2p_full = 1;
    lock.Broadcast();
    off += len;
  } while (off < bytes);
  SegmentLock lock(s);
  while (me.p2p_full != 0) {  // the last chunk was taken
    if (c->aborted.load()) return false;
    lock.WaitSlice();
  }
  return true;
}

bool RunRecv(ncclComm* c, void* recv, size_t bytes, int peer) {
  Segment* s = c->segment;
  RankSlot& from = Slots(s)[peer];
  size_t off = 0;
  do {
    SegmentLock lock(s);
    while (!(from.p2p_full != 0 && from.p2p_peer == c->rank)) {
      if (c->aborted.load()) return false;
      lock.WaitSlice();
    }
    if (from.p2p_total != bytes) {
      FatalRule("NCCL rule violated: rank " + std::to_string(peer) + " sends " +
                std::to_string(from.p2p_total) + " bytes to rank " + std::to_string(c->rank) +
                ", which receives " + std::to_string(bytes) + " (communicator " + c->name + ")");
    }
    std::memcpy(static_cast<char*>(recv) + off, Window(s, peer), from.p2p_bytes);
    off += from.p2p_bytes;
    from.p2p_full = 0;
    lock.Broadcast();
  } while (off < bytes);
  return true;
}

// ---- Issuing work (host side), with groups ----------------------------------------

struct Pending {
  ncclComm* comm;
  cudaStream_t stream;
  std::string what;
  std::function<bool()> run;  // false: aborted
};

thread_local int t_group_depth = 0;
thread_local std::vector<Pending> t_group;

// Ends one queued operation's count on `c` (it ran, or its device faulted).
void ReleasePending(ncclComm* c) {
  std::lock_guard<std::mutex> lock(c->mu);
  --c->pending;
  c->cv.notify_all();
}

// Enqueues the operations `ops` (one communicator, one stream) as one work
// item, or records it into the stream's capture. Queued work counts as
// pending on the communicator until it has run (destroy waits for it).
ncclResult_t Submit(std::vector<Pending> ops) {
  ncclComm* c = ops.front().comm;
  cudaStream_t stream = ops.front().stream;
  std::string what = ops.front().what;
  if (ops.size() > 1) what = "group of " + std::to_string(ops.size()) + " NCCL operations";
  const bool captured = StreamCapturing(stream);
  WorkItem w;
  w.kind = WorkKind::kCollective;
  w.what = what;
  w.communicator = c;
  w.run = [c, ops = std::move(ops), what, captured]() -> cudaError_t {
    {
      Running running(c, what);
      if (running.ok()) {  // aborted: the operation is dropped
        for (const Pending& p : ops) {
          if (!p.run()) {
            c->async_error.store(ncclInvalidUsage);
            break;
          }
        }
      }
    }
    if (!captured) ReleasePending(c);
    return cudaSuccess;
  };
  if (!captured) w.on_skip = [c] { ReleasePending(c); };
  if (!captured) {
    std::lock_guard<std::mutex> lock(c->mu);
    ++c->pending;
  }
  const cudaError_t e = Enqueue(stream, std::move(w));
  if (e != cudaSuccess && !captured) {
    std::lock_guard<std::mutex> lock(c->mu);
    --c->pending;
  }
  if (e != cudaSuccess) {
    return Fail(ncclUnhandledCudaError, std::string("enqueueing ") + what + ": " +
                                            cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
  return ncclSuccess;
}

ncclResult_t Issue(Pending p) {
  if (t_group_depth > 0) {
    t_group.push_back(std::move(p));
    return ncclSuccess;
  }
  std::vector<Pending> one;
  one.push_back(std::move(p));
  return Submit(std::move(one));
}

ncclResult_t IssueChecked(ncclComm_t comm, cudaStream_t stream, const char* call, Pending p) {
  const int device = StreamDevice(stream);
  if (device < 0) return Fail(ncclInvalidArgument, std::string(call) + ": invalid stream");
  if (device != comm->device) {
    return Fail(ncclInvalidUsage,
                std::string(call) + ": a stream of cuda:" + std::to_string(device) +
                    " with a communicator of cuda:" + std::to_string(comm->device));
  }
  p.comm = comm;
  p.stream = stream;
  p.what = call;
  return Issue(std::move(p));
}

bool ValidType(ncclDataType_t t) { return TypeBytes(t) != 0; }
bool ValidOp(ncclRedOp_t op) { return op >= ncclSum && op <= ncclMin; }

}  // namespace

void CommGraphRef(void* comm, int delta) {
  static_cast<ncclComm*>(comm)->graph_refs.fetch_add(delta);
}

void CommLaunchRef(void* comm, int delta) {
  auto* c = static_cast<ncclComm*>(comm);
  std::lock_guard<std::mutex> lock(c->mu);
  c->launch_refs += delta;
  c->cv.notify_all();
}

}  // namespace mlag::emu

using namespace mlag::emu;  // NOLINT: the C API below implements the emulation

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclNumResults:
      break;
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return Fail(ncclInvalidArgument, "ncclGetUniqueId: null id");
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const uint64_t a = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  std::memset(id, 0, sizeof(*id));
  std::snprintf(id->internal, sizeof(id->internal), "/mlag-nccl-%d-%016llx-%llu",
                static_cast<int>(getpid()), static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (comm == nullptr) return Fail(ncclInvalidArgument, "ncclCommInitRank: null comm");
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return Fail(ncclUnhandledCudaError, "cudaGetDevice failed");
  return Join(id, nranks, rank, device, /*wait=*/true, comm);
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1) return Fail(ncclInvalidArgument, "ncclCommInitAll: no devices");
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  for (int i = 0; i < ndev; ++i) {
    const int device = devlist != nullptr ? devlist[i] : i;
    r = Join(id, ndev, i, device, /*wait=*/false, &comms[i]);
    if (r != ncclSuccess) {
      for (int j = 0; j < i; ++j) {
        munmap(comms[j]->segment, comms[j]->segment_bytes);
        comms[j]->destroyed = true;
        comms[j] = nullptr;
      }
      return r;
    }
  }
  return ncclSuccess;  // every rank attached: nothing to wait for
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t*) {
  if (newcomm == nullptr) return Fail(ncclInvalidArgument, "ncclCommSplit: null newcomm");
  *newcomm = nullptr;
  ncclResult_t r = CheckComm(comm, "ncclCommSplit");
  if (r != ncclSuccess) return r;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return Fail(ncclInvalidArgument, "ncclCommSplit: negative color " + std::to_string(color));
  }
  Segment* s = comm->segment;
  const int me = comm->rank;
  auto aborted = [] {
    return Fail(ncclInvalidUsage, "ncclCommSplit: the communicator was aborted");
  };
  // A collective like the others (run on the calling thread): its
  // descriptor is checked against the other ranks' current collective.
  Descriptor d;
  d.seq = ++comm->collective_seq;
  d.op = Op::kSplit;
  if (!AgreeOn(comm, d)) return aborted();
  {
    SegmentLock lock(s);
    Slots(s)[me].split_color = color;
    Slots(s)[me].split_key = key;
  }
  if (!Barrier(comm)) return aborted();
  // The new group: same color, ordered by (key, old rank); its lowest old
  // rank makes the id.
  std::vector<std::pair<int, int>> members;  // (key, old rank)
  {
    SegmentLock lock(s);
    for (int q = 0; q < comm->nranks; ++q) {
      if (color >= 0 && Slots(s)[q].split_color == color)
        members.emplace_back(Slots(s)[q].split_key, q);
    }
  }
  std::sort(members.begin(), members.end());
  int leader = comm->nranks;
  for (const auto& m : members) leader = std::min(leader, m.second);
  if (color >= 0 && leader == me) {
    ncclUniqueId id;
    r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return r;
    SegmentLock lock(s);
    std::memcpy(Slots(s)[me].split_id, id.internal, sizeof(id.internal));
  }
  if (!Barrier(comm)) return aborted();
  ncclUniqueId id{};
  if (color >= 0) {
    SegmentLock lock(s);
    std::memcpy(id.internal, Slots(s)[leader].split_id, sizeof(id.internal));
  }
  if (!Barrier(comm)) return aborted();  // ids read before anyone splits again
  if (color < 0) return ncclSuccess;
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == me) new_rank = static_cast<int>(i);
  }
  return Join(id, static_cast<int>(members.size()), new_rank, comm->device, /*wait=*/true, newcomm);
}

namespace {

// Destroy and abort share the lifetime rule and the release.
ncclResult_t Release(ncclComm_t comm, bool abort, const char* call) {
  if (comm == nullptr || comm->magic != kCommMagic) {
    return Fail(ncclInvalidArgument, std::string(call) + ": invalid communicator");
  }
  const int refs = comm->graph_refs.load();
  if (refs > 0) {
    FatalRule(std::string("NCCL rule violated: ") + call + " of communicator " + comm->name +
              " (rank " + std::to_string(comm->rank) + " of " + std::to_string(comm->nranks) +
              ") while " + std::to_string(refs) +
              " captured CUDA graph(s) still reference it; destroy every graph that captured "
              "its collectives first (NCCL 2.26 and later wait for those graphs for ever)");
  }
  std::unique_lock<std::mutex> lock(comm->mu);
  if (comm->destroyed) return Fail(ncclInvalidUsage, std::string(call) + ": destroyed twice");
  if (abort) comm->aborted.store(true);
  // Destroy flushes: operations queued, running or in graph launches run to
  // completion (a peer that never joins them holds this call, as it holds
  // NCCL's). Aborted, they give up within a slice.
  comm->cv.wait(
      lock, [&] { return comm->inflight == 0 && comm->pending == 0 && comm->launch_refs == 0; });
  comm->destroyed = true;
  munmap(comm->segment, comm->segment_bytes);
  comm->segment = nullptr;
  return ncclSuccess;
}

}  // namespace

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return Release(comm, false, "ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return Release(comm, true, "ncclCommAbort"); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (async_error == nullptr)
    return Fail(ncclInvalidArgument, "ncclCommGetAsyncError: null result");
  ncclResult_t r = CheckComm(comm, "ncclCommGetAsyncError");
  if (r != ncclSuccess) return r;
  *async_error = static_cast<ncclResult_t>(comm->async_error.load());
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  ncclResult_t r = CheckComm(comm, "ncclCommCount");
  if (r == ncclSuccess) *count = comm->nranks;
  return r;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  ncclResult_t r = CheckComm(comm, "ncclCommCuDevice");
  if (r == ncclSuccess) *device = comm->device;
  return r;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  ncclResult_t r = CheckComm(comm, "ncclCommUserRank");
  if (r == ncclSuccess) *rank = comm->rank;
  return r;
}

namespace {

ncclResult_t IssueCollective(const char* call, ncclComm_t comm, cudaStream_t stream, Collective op,
                             size_t send_bytes, size_t recv_bytes) {
  ncclResult_t r = CheckComm(comm, call);
  if (r != ncclSuccess) return r;
  if (!ValidType(op.type))
    return Fail(ncclInvalidArgument, std::string(call) + ": invalid data type");
  if (!ValidOp(op.redop))
    return Fail(ncclInvalidArgument, std::string(call) + ": invalid reduction");
  if (op.root < 0 || op.root >= comm->nranks) {
    return Fail(ncclInvalidArgument, std::string(call) + ": root " + std::to_string(op.root) +
                                         " of " + std::to_string(comm->nranks) + " ranks");
  }
  const bool sends = op.op != Op::kBroadcast || comm->rank == op.root;
  if (sends && (r = CheckBuffer(comm, op.send, send_bytes, call, "sendbuff")) != ncclSuccess)
    return r;
  if ((r = CheckBuffer(comm, op.recv, recv_bytes, call, "recvbuff")) != ncclSuccess) return r;
  Pending p;
  p.run = [comm, op] { return RunCollective(comm, op); };
  return IssueChecked(comm, stream, call, std::move(p));
}

}  // namespace

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  Collective op{Op::kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0};
  const size_t bytes = sendcount * TypeBytes(datatype);
  const int n = comm != nullptr && comm->magic == kCommMagic ? comm->nranks : 1;
  return IssueCollective("ncclAllGather", comm, stream, op, bytes, bytes * static_cast<size_t>(n));
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  Collective c{Op::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0};
  const size_t bytes = recvcount * TypeBytes(datatype);
  const int n = comm != nullptr && comm->magic == kCommMagic ? comm->nranks : 1;
  return IssueCollective("ncclReduceScatter", comm, stream, c, bytes * static_cast<size_t>(n),
                         bytes);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  Collective c{Op::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0};
  const size_t bytes = count * TypeBytes(datatype);
  return IssueCollective("ncclAllReduce", comm, stream, c, bytes, bytes);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  Collective c{Op::kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root};
  const size_t bytes = count * TypeBytes(datatype);
  return IssueCollective("ncclBroadcast", comm, stream, c, bytes, bytes);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t r = CheckComm(comm, "ncclSend");
  if (r != ncclSuccess) return r;
  if (!ValidType(datatype)) return Fail(ncclInvalidArgument, "ncclSend: invalid data type");
  if (peer < 0 || peer >= comm->nranks || peer == comm->rank) {
    return Fail(ncclInvalidArgument, "ncclSend: peer " + std::to_string(peer));
  }
  const size_t bytes = count * TypeBytes(datatype);
  if ((r = CheckBuffer(comm, sendbuff, bytes, "ncclSend", "sendbuff")) != ncclSuccess) return r;
  Pending p;
  p.run = [comm, sendbuff, bytes, peer] { return RunSend(comm, sendbuff, bytes, peer); };
  return IssueChecked(comm, stream, "ncclSend", std::move(p));
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t r = CheckComm(comm, "ncclRecv");
  if (r != ncclSuccess) return r;
  if (!ValidType(datatype)) return Fail(ncclInvalidArgument, "ncclRecv: invalid data type");
  if (peer < 0 || peer >= comm->nranks || peer == comm->rank) {
    return Fail(ncclInvalidArgument, "ncclRecv: peer " + std::to_string(peer));
  }
  const size_t bytes = count * TypeBytes(datatype);
  if ((r = CheckBuffer(comm, recvbuff, bytes, "ncclRecv", "recvbuff")) != ncclSuccess) return r;
  Pending p;
  p.run = [comm, recvbuff, bytes, peer] { return RunRecv(comm, recvbuff, bytes, peer); };
  return IssueChecked(comm, stream, "ncclRecv", std::move(p));
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return Fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Pending> ops = std::move(t_group);
  t_group.clear();
  // One unit per (communicator, stream), in the order of first use.
  std::vector<std::vector<Pending>> units;
  for (Pending& p : ops) {
    auto it = std::find_if(units.begin(), units.end(), [&](const std::vector<Pending>& u) {
      return u.front().comm == p.comm && u.front().stream == p.stream;
    });
    if (it == units.end()) {
      units.emplace_back();
      it = units.end() - 1;
    }
    it->push_back(std::move(p));
  }
  for (auto& unit : units) {
    // The operations of a unit run one after another, and a send waits
    // until its chunk is taken: a send and a receive in one group (which
    // NCCL runs concurrently) could wait on each other here for ever.
    const auto has = [&](const char* call) {
      return std::any_of(unit.begin(), unit.end(),
                         [&](const Pending& p) { return p.what == call; });
    };
    if (has("ncclSend") && has("ncclRecv")) {
      FatalRule("not emulated: ncclSend and ncclRecv in one group (communicator " +
                unit.front().comm->name +
                "); NCCL runs them concurrently, the emulation one after another");
    }
    const ncclResult_t r = Submit(std::move(unit));
    if (r != ncclSuccess) return r;
  }
  return ncclSuccess;
}
