// The CUDA runtime for the kernels and launchers in kernels/cuda/ or, with
// MLAG_CUDA_EMULATION defined, its CPU emulation (emulation/
// cuda_emulation.h), which lets builds with -Demulate_cuda=true run these
// same sources on a machine without a GPU. The two spellings the emulation cannot parse are macros:
//   MLAG_LAUNCH(kernel, grid, block, smem, stream)(args...)
//       kernel<<<grid, block, smem, stream>>>(args...); `kernel` must be a
//       name or a function pointer without unparenthesised commas.
//   MLAG_DYNAMIC_SMEM(type, name);
//       extern __shared__ __align__(16) type name[];  the dynamic shared memory.
//
// Programmatic dependent launch (PDL, sm_90 and later). A decode step is
// 90-180 small dependent kernels; launched plainly, each starts only after
// the one before has drained and its memory is flushed, a gap of about
// 1-2 us per kernel on Hopper, 0.1-0.4 ms per step. Launched with
//   MLAG_LAUNCH_PDL(kernel, grid, block, smem, stream)(args...)
// (cudaLaunchKernelEx with cudaLaunchAttributeProgrammaticStreamSerialization)
// a kernel may be launched, and its CTAs made resident, while the kernel
// before it still runs. Its contract: every thread executes
//   MLAG_GRID_DEPENDENCY_SYNC();
// (griddepcontrol.wait, which returns once every grid it depends on has
// completed and its writes are visible; then griddepcontrol.launch_dependents,
// which lets the kernel after it launch in turn) before it reads or writes
// any global memory; our kernels do so as their first statement. The wait
// covers the whole grid before it, and so, transitively, every earlier one.
// A graph captured from such launches keeps programmatic edges. Kernels of
// libraries (cuBLASLt, NCCL) and copies keep plain stream order. Off where
// the device is older than sm_90 or MLAG_PDL=0 is set (to measure the gain
// against plain launches); the emulation checks the contract (every thread
// of a PDL grid executes the wait) and records the programmatic edges.
// CUB's block collectives come from here too (real or emulated).
#pragma once

#include "runtime/core/scalar_types.h"  // DType, bf16/f16 conversions

#if defined(MLAG_CUDA_EMULATION)
#include "kernels/cuda/emulation/cuda_emulation.h"
#define MLAG_LAUNCH(kernel, grid, block, smem, stream) \
  ::mlag::emu::Launcher(kernel, grid, block, smem, stream, #kernel)
#define MLAG_LAUNCH_PDL(kernel, grid, block, smem, stream) \
  ::mlag::emu::Launcher(kernel, grid, block, smem, stream, #kernel, ::mlag::cuda::PdlEnabled())
#define MLAG_DYNAMIC_SMEM(type, name) \
  type* name = reinterpret_cast<type*>(::mlag::emu::DynamicSmem())
#define MLAG_GRID_DEPENDENCY_SYNC() ::mlag::emu::GridDependencySync()
#else
#include <cuda_runtime.h>

#include <utility>
#define MLAG_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define MLAG_LAUNCH_PDL(kernel, grid, block, smem, stream) \
  ::mlag::cuda::PdlLauncher(kernel, grid, block, smem, stream)
#define MLAG_DYNAMIC_SMEM(type, name) extern __shared__ __align__(16) type name[]
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MLAG_GRID_DEPENDENCY_SYNC()                        \
  do {                                                     \
    asm volatile("griddepcontrol.wait;" ::: "memory");     \
    asm volatile("griddepcontrol.launch_dependents;" :::); \
  } while (0)
#else
#define MLAG_GRID_DEPENDENCY_SYNC() \
  do {                              \
  } while (0)
#endif
#endif

namespace mlag::cuda {

// Whether MLAG_LAUNCH_PDL launches with programmatic stream serialization on
// the current device: sm_90 or later, and MLAG_PDL not "0" (read once).
bool PdlEnabled();

#if defined(__CUDACC__) && !defined(MLAG_CUDA_EMULATION)
// MLAG_LAUNCH_PDL's launch: a callable taking the kernel's arguments. An
// error is left for cudaGetLastError, as a <<<>>> launch leaves it.
template <typename... Params>
auto PdlLauncher(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                 cudaStream_t stream) {
  return [=](auto&&... args) {
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = PdlEnabled() ? 1 : 0;
    (void)cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  };
}
#endif

}  // namespace mlag::cuda

#if defined(__CUDACC__) && !defined(MLAG_CUDA_EMULATION)
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#endif
