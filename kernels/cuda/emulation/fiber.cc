#include "kernels/cuda/emulation/fiber.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#if defined(__x86_64__)
// mlag_emu_switch(void** save_sp, void* load_sp): pushes the System V
// callee-saved registers, MXCSR and the x87 control word, stores the stack
// pointer in *save_sp, loads load_sp and pops the same from there.
asm(R"(
  .text
  .globl mlag_emu_switch
  .type mlag_emu_switch, @function
mlag_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size mlag_emu_switch, .-mlag_emu_switch
  .section .note.GNU-stack,"",@progbits
  .text
)");
extern "C" void mlag_emu_switch(void** save_sp, void* load_sp);
#endif

namespace mlag::emu {

#if defined(__x86_64__)

void PrepareFiber(FiberContext* ctx, char* stack, size_t bytes, void (*entry)()) {
  // The frame mlag_emu_switch pops, below a 16-byte aligned top: control
  // words, r15..rbp, then `entry` as the return address, and a zero above
  // it standing for entry's own return address (so entry starts with the
  // stack aligned as after a call).
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top);
  *--slot = 0;                                   // entry's return address
  *--slot = reinterpret_cast<uint64_t>(entry);   // where `ret` goes
  for (int i = 0; i < 6; ++i) *--slot = 0;       // rbp rbx r12 r13 r14 r15
  *--slot = 0x1F80u | (uint64_t{0x037F} << 32);  // MXCSR, x87 control word
  ctx->sp = slot;
}

void SwitchFiber(FiberContext* from, FiberContext* to) { mlag_emu_switch(&from->sp, to->sp); }

#else

void PrepareFiber(FiberContext* ctx, char* stack, size_t bytes, void (*entry)()) {
  if (getcontext(&ctx->uc) != 0) {
    std::fprintf(stderr, "cuda emulation: getcontext failed\n");
    std::abort();
  }
  ctx->uc.uc_stack.ss_sp = stack;
  ctx->uc.uc_stack.ss_size = bytes;
  ctx->uc.uc_link = nullptr;
  makecontext(&ctx->uc, entry, 0);
}

void SwitchFiber(FiberContext* from, FiberContext* to) {
  if (swapcontext(&from->uc, &to->uc) != 0) {
    std::fprintf(stderr, "cuda emulation: swapcontext failed\n");
    std::abort();
  }
}

#endif

}  // namespace mlag::emu
