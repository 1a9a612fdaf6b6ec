/* dev/cuda_none.c — the CUDA entry points of a build without CUDA (DDPD_CUDA=OFF or no
 * toolkit): there is never a device. CMake drops this file when it builds dev/cuda.cu. */
#include "../dev.h"

bool dev_cuda_available(void) { return false; }
