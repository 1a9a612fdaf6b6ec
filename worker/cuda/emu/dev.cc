/* emu/dev.cc — cuda/dev.cu as the emulated device runs it: g++ compiles the same source,
 * its kernels included, after the CUDA language of emu.h (LAUNCH becomes emu_launch). */
#include "emu.h"

#include "../dev.cu"
