/* emu/sort.cc — cuda/sort.cu as the emulated device runs it: the same source against the
 * emulator's CUB (emu/include/cub). */
#include "emu.h"

#include "../sort.cu"
