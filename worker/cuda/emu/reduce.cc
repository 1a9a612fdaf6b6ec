/* emu/reduce.cc — cuda/reduce.cu as the emulated device runs it: g++ compiles the same
 * source, its kernels included, after the CUDA language of emu.h. */
#include "emu.h"

#include "../reduce.cu"
