// kernels/cuda/rms_norm.cu, kernels and launchers, compiled as C++ for the CPU
// emulation (kernels/cuda/emulation/cuda_emulation.h).
#define MLAG_CUDA_EMULATION 1
#include "kernels/cuda/rms_norm.cu"
