// The op harness: every op's cases are written once (tests/ops/cases_*.cc)
// and run on every backend present, each against a reference computed in
// double from the inputs as stored, with the tolerance its output dtype
// allows. In the manner of ggml's test-backend-ops.
//
// Backends: "host" always; "cuda" when a CUDA device is present: a real GPU,
// or the CPU emulation of builds with -Demulate_cuda=true. Test names are
// <backend>/<op>.<case>; a backend that is absent skips its cases.
//
// What every case gets checked, whatever the op:
//   - outputs are poisoned (0xff bytes: NaN in every float dtype, -1 in
//     integers) before the run, and every element must be written;
//   - views may be strided, and the bytes around a view (padding between
//     rows, before and after it) must come back as they were;
//   - RunOp runs the op eagerly and then, on the same buffers, as a captured
//     graph replayed twice: the replay must give the eager bytes exactly.
//
// Writing a case:
//   void RmsNormCase(Context& ctx, ...) {
//     Buf& x = ctx.Make("x", DType::kBF16, {rows, dim}, /*pad=*/3);
//     ctx.Randomize(x, -2, 2);
//     Buf& y = ctx.Output("y", DType::kF32, {rows, dim});
//     ctx.RunOp({&y}, [&](Stream& s) { return RmsNorm(s, x.t, w.t, eps, y.t); });
//     ctx.ExpectClose(y, reference, Tolerance::F32(1e-6));
//   }
//   void AddNormCases(CaseList& cases) { cases.Add("rms_norm", "bf16 5x513", ...); }
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace mlag::ops_test {

// Element `i` of a host buffer of `dtype` as a double, and `v` stored there:
// integers exact, floats rounded as the dtype rounds.
double LoadElement(DType dtype, const uint8_t* base, int64_t i);
void StoreElement(DType dtype, uint8_t* base, int64_t i, double v);

// The device a case runs on and a stream of it.
class Backend {
 public:
  // The host backend (always), and the CUDA backend (nullptr without a CUDA
  // device).
  static Backend& Host();
  static Backend* Cuda();

  const std::string& name() const { return name_; }
  bool is_cuda() const { return device_->is_cuda(); }
  Device& device() { return *device_; }
  Stream& stream() { return *stream_; }

 private:
  Backend(std::string name, std::unique_ptr<Device> device, std::unique_ptr<Stream> stream)
      : name_(std::move(name)), device_(std::move(device)), stream_(std::move(stream)) {}
  std::string name_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
};

// How close an output must be to its double-precision reference, per dtype:
//   f32       normwise relative error max|got - want| / max|want| <= f32;
//   bf16/f16  each element within `ulps` of the reference rounded to that
//             dtype (the op rounds its f32 result once; the reference
//             rounds the exact value once; they may straddle a midpoint);
//   integers  exact.
//   flips     ops that round to bf16 inside (a normalised value before the
//             weight multiplies it): where the op's f32 value and the
//             reference's straddle a bf16 midpoint the result moves by a
//             bf16 ulp (2^-8 relative); up to `flip_fraction` of the
//             elements (plus one) may then be off by up to `flip_error`
//             relative to max|want| instead of `f32`.
struct Tolerance {
  double f32 = 1e-5;
  int ulps = 1;
  double flip_error = 0.0;
  double flip_fraction = 0.0;
  // Copies, conversions and other ops that must be exact.
  static Tolerance Exact() { return {0.0, 0, 0.0, 0.0}; }
  static Tolerance F32(double normwise) { return {normwise, 1, 0.0, 0.0}; }
  static Tolerance Bf16Inside() { return {1e-5, 2, 1.0 / 64, 0.01}; }
};

// A tensor view on a backend and the buffer around it, mirrored on the host:
// `host` holds what the test put there (inputs) or expects to find
// untouched (everything outside an output's view).
struct Buf {
  std::string name;
  DType dtype = DType::kF32;
  int64_t span = 0;           // elements in the buffer
  std::vector<uint8_t> host;  // span * element size bytes
  int64_t offset = 0;         // element index of the view's first element
  std::vector<int64_t> shape, strides;
  Buffer device_buffer;
  Tensor t;  // the view, on the backend's device

  size_t esize() const { return DTypeSize(dtype); }
  int64_t numel() const { return t.numel(); }
  std::vector<int64_t> elements;  // buffer index of each view element, row-major

  // Buffer index of each view element, in row-major order.
  const std::vector<int64_t>& ViewElements() const { return elements; }
  // Element `i` of the view (row-major) as the host mirror has it.
  double Value(int64_t i) const;
  // Every view element as the host mirror has it (the reference's input).
  std::vector<double> Values() const;
  // Writes `v` (rounded to the dtype) as view element `i` of the mirror.
  void Set(int64_t i, double v);
  template <typename T>
  T* HostData() {
    return reinterpret_cast<T*>(host.data()) + offset;
  }
};

// What a case works with: its backend, its buffers and the checks.
class Context {
 public:
  explicit Context(Backend& backend, uint32_t seed) : backend_(backend), seed_(seed) {}

  Backend& backend() { return backend_; }
  Stream& stream() { return backend_.stream(); }
  bool is_cuda() const { return backend_.is_cuda(); }
  // A fresh seed for each use, the same sequence on every backend.
  uint32_t NextSeed() { return seed_++; }

  // A view of `shape`, row-major with every stride but the last padded by
  // `pad` elements, `offset` elements into its buffer, `tail` after it. The
  // mirror starts as 0xff bytes (poison); Randomize or Set and Upload fill it.
  Buf& Make(const std::string& name, DType dtype, std::vector<int64_t> shape, int64_t pad = 0,
            int64_t offset = 0, int64_t tail = 0);
  Buf& MakeStrided(const std::string& name, DType dtype, std::vector<int64_t> shape,
                   std::vector<int64_t> strides, int64_t offset = 0, int64_t tail = 0);
  // Make under the name the case reads as an output (Make poisons every
  // buffer, on the device and in the mirror).
  Buf& Output(const std::string& name, DType dtype, std::vector<int64_t> shape, int64_t pad = 0,
              int64_t offset = 0, int64_t tail = 0);

  // Uniform values in [lo, hi) in the whole buffer (padding too), uploaded.
  void Randomize(Buf& b, double lo = -1.0, double hi = 1.0);
  // The mirror to the device (after Set).
  void Upload(Buf& b);
  // 0xff bytes in the whole buffer, on the device and in the mirror.
  void Poison(Buf& b);
  // The device buffer's bytes now.
  std::vector<uint8_t> Download(const Buf& b);
  // View element values of `b` read from the device.
  std::vector<double> DeviceValues(const Buf& b);

  // Runs `op` eagerly; then, unless `graph` is false, captures it into a
  // graph (outputs poisoned again) and replays the graph twice: each replay
  // must leave the eager result in every output, byte for byte (in-place
  // outputs are restored from `inputs_restored` first: the buffers an op
  // reads and writes, copied back to their values before the eager run).
  void RunOp(std::initializer_list<Buf*> outputs, const std::function<absl::Status(Stream&)>& op,
             bool graph = true, std::initializer_list<Buf*> in_place = {});

  // Output checks. Each checks every view element written (not NaN unless
  // the reference is), within `tol` of `want`, and every byte outside the
  // view unchanged; messages name the output by its Buf::name.
  void ExpectClose(const Buf& out, const std::vector<double>& want, const Tolerance& tol);
  // Integer (or any) outputs: exactly `want`, bytes outside the view unchanged.
  void ExpectInts(const Buf& out, const std::vector<int64_t>& want);

 private:
  void ExpectOutsideUnchanged(const Buf& out, const std::vector<uint8_t>& device_bytes);

  Backend& backend_;
  uint32_t seed_;
  std::vector<std::unique_ptr<Buf>> bufs_;
};

// `v` rounded as storing it in `dtype` would (f32 rounds to f32).
double RoundTo(DType dtype, double v);

// One case of one op.
struct OpCase {
  std::string op;
  std::string name;
  std::function<void(Context&)> run;
};

class CaseList {
 public:
  void Add(std::string op, std::string name, std::function<void(Context&)> run) {
    cases_.push_back({std::move(op), std::move(name), std::move(run)});
  }
  const std::vector<OpCase>& cases() const { return cases_; }

 private:
  std::vector<OpCase> cases_;
};

// The case families (one file each).
void AddBasicCases(
    CaseList& cases);  // cases_basic.cc: norms, activation, embedding, rope, elementwise
void AddLinearCases(CaseList& cases);  // cases_linear.cc: linear, head matmul
// ---- Tensor-core accumulation bounds ------------------------------------------------------
//
// How far an f32-accumulated product on tensor cores may be from its exact
// value, from what the instructions document:
//   - products of bf16 or e4m3 operands are exact in f32;
//   - mma.sync's f32 accumulation: the PTX ISA leaves its rounding to the
//     implementation; bf16 m16n8k16 is taken as truncating (unit 2^-23), and
//     e4m3 m16n8k32 as keeping ~14 bits (unit 2^-14: DeepSeek-V3's measured
//     figure for Hopper's FP8 accumulation, the reason its recipe promotes
//     each 128-wide K block to f32, as the kernels do);
//   - f32 operations outside the mma round to nearest (unit 2^-24).

// gamma_n = n u / (1 - n u), the classic bound of n roundings of unit u.
double GammaBound(int64_t n, double unit);

// Error bound of a dot product of `n` exact products whose absolute values
// sum to `abs_sum`: bf16 in one f32 mma accumulator; fp8 summed per 128-wide
// K block on the tensor core, each block's sum scaled by two f32 factors and
// added in f32 (in one chain, or in split-K slices then summed).
double TensorCoreDotBound(DType dtype, int64_t n, double abs_sum);

// A reference with a per-element bound on the device's distance from it.
struct BoundedRef {
  std::vector<double> want, bound;
};

// Elements of `got` outside their bound (NaN counts); the first `show` of
// them are described in `what` (may be nullptr).
int64_t OutsideBound(const std::vector<double>& got, const BoundedRef& ref, std::string* what,
                     int show = 5);

void AddMlaCases(CaseList& cases);       // cases_mla.cc: kv_update, decode, prefill
void AddMoeCases(CaseList& cases);       // cases_moe.cc: route, experts
void AddSamplingCases(CaseList& cases);  // cases_sampling.cc: sample

}  // namespace mlag::ops_test
