// The warp-level tensor-core and async-copy instructions the CUDA kernels
// use, one wrapper each: inline PTX on a GPU, and with MLAG_CUDA_EMULATION
// defined the emulation of the same instruction (kernels/cuda/emulation/
// cuda_emulation.h, each checked against the PTX ISA's fragment layouts in
// tests/emulation/device_language_test.cc). Device code only.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16" and
// "mma.m16n8k32"), g = lane / 4, c = lane % 4, lower column / k index in the
// low bits of each 32-bit register:
//   m16n8k16 bf16   A 16x16 (row): a[0] = (g, 2c..2c+1)  a[1] = (g+8, 2c..)
//                                  a[2] = (g, 2c+8..)    a[3] = (g+8, 2c+8..)
//                   B 16x8 (col):  b0 = (k 2c..2c+1, n g)  b1 = (k 2c+8.., n g)
//   m16n8k32 e4m3   A 16x32:       a[0] = (g, 4c..4c+3)  a[1] = (g+8, 4c..)
//                                  a[2] = (g, 4c+16..)   a[3] = (g+8, 4c+16..)
//                   B 32x8:        b0 = (k 4c..4c+3, n g)  b1 = (k 4c+16.., n g)
//   C, D 16x8 f32 (both):          d[0], d[1] = (g, 2c), (g, 2c+1)
//                                  d[2], d[3] = (g+8, 2c), (g+8, 2c+1)
// In bytes the two A layouts are the same: register r of lane (g, c) holds
// bytes 4c..4c+3 of row g + 8 (r & 1), 16-byte column block r >> 1. So one
// ldmatrix .x4 (non-transposed) over a 16-row x 32-byte tile gives the A
// fragment of either instruction, and a 32-bit load at byte 4c (+16) of row g
// of a K-contiguous operand gives B's b0 (b1).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.cuh"

namespace mlag::cuda {

// 16-byte global -> shared copy; src_bytes == 0 writes zeros and reads nothing.
__device__ __forceinline__ void CpAsync16(void* smem_dst, const void* gmem_src, int src_bytes) {
#if defined(MLAG_CUDA_EMULATION)
  ::mlag::emu::CpAsync16(smem_dst, gmem_src, src_bytes);
#else
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void CpAsyncCommit() {
#if defined(MLAG_CUDA_EMULATION)
  ::mlag::emu::CpAsyncCommit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
#if defined(MLAG_CUDA_EMULATION)
  ::mlag::emu::CpAsyncWait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void CpAsyncWaitAll() { CpAsyncWait<0>(); }

// d += a . b (m16n8k16, bf16 x bf16 -> f32).
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(MLAG_CUDA_EMULATION)
  ::mlag::emu::MmaM16N8K16Bf16(d, a, b0, b1);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // launchers never select a bf16 mma kernel below sm_80
#endif
}

// d += a . b (m16n8k32, e4m3 x e4m3 -> f32; sm_89 and later).
__device__ __forceinline__ void MmaE4M3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(MLAG_CUDA_EMULATION)
  ::mlag::emu::MmaM16N8K32E4M3(d, a, b0, b1);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // launchers never select an fp8 mma kernel below sm_89
#endif
}

// Four 8x8 b16 matrices from shared memory; lane l gives the address of row
// l % 8 of matrix l / 8 (16 bytes, 16-byte aligned). Register m of lane
// (g, c) receives elements (row g, cols 2c, 2c + 1) of matrix m.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
#if defined(MLAG_CUDA_EMULATION)
  ::mlag::emu::LdMatrixX4(r, static_cast<const uint16_t*>(row));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
#else
  (void)row;
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

// As LdMatrixX4, transposed: register m of lane (g, c) receives elements
// (row 2c, col g) and (row 2c + 1, col g) of matrix m.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const uint16_t* row) {
#if defined(MLAG_CUDA_EMULATION)
  ::mlag::emu::LdMatrixX4Trans(r, row);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
#else
  (void)row;
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

__device__ __forceinline__ uint32_t PackBf16(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

}  // namespace mlag::cuda
