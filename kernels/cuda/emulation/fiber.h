// Fiber contexts for the device emulation: the thread of a block runs on a
// stack of its own and switches to the block scheduler at barriers. On
// x86-64 a switch saves and restores the callee-saved registers and the
// stack pointer (no system call); elsewhere it falls back to ucontext.
#pragma once

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace mlag::emu {

struct FiberContext {
#if defined(__x86_64__)
  void* sp = nullptr;  // saved stack pointer (registers are on the stack)
#else
  ucontext_t uc;
#endif
};

// Makes `ctx` start `entry` on the stack [stack, stack + bytes) at the next
// switch to it. `entry` must never return: it ends by switching away for
// good.
void PrepareFiber(FiberContext* ctx, char* stack, size_t bytes, void (*entry)());

// Saves the running context into `from` and resumes `to`.
void SwitchFiber(FiberContext* from, FiberContext* to);

}  // namespace mlag::emu
