// The CUDA runtime for the kernels and launchers in kernels/cuda/ or, with
// MLAG_CUDA_EMULATION defined, its CPU emulation (emulation/
// cuda_emulation.h), which lets builds with -Demulate_cuda=true run these
// same sources on a machine without a GPU. The two spellings the emulation cannot parse are macros:
//   MLAG_LAUNCH(kernel, grid, block, smem, stream)(args...)
//       kernel<<<grid, block, smem, stream>>>(args...); `kernel` must be a
//       name or a function pointer without unparenthesised commas.
//   MLAG_DYNAMIC_SMEM(type, name);
//       extern __shared__ __align__(16) type name[];  the dynamic shared memory.
// CUB's block collectives come from here too (real or emulated).
#pragma once

#include "runtime/core/scalar_types.h"  // DType, bf16/f16 conversions

#if defined(MLAG_CUDA_EMULATION)
#include "kernels/cuda/emulation/cuda_emulation.h"
#define MLAG_LAUNCH(kernel, grid, block, smem, stream) \
  ::mlag::emu::Launcher(kernel, grid, block, smem, stream, #kernel)
#define MLAG_DYNAMIC_SMEM(type, name) \
  type* name = reinterpret_cast<type*>(::mlag::emu::DynamicSmem())
#else
#include <cuda_runtime.h>
#define MLAG_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define MLAG_DYNAMIC_SMEM(type, name) extern __shared__ __align__(16) type name[]
#endif

#if defined(__CUDACC__) && !defined(MLAG_CUDA_EMULATION)
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#endif
