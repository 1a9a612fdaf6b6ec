/* dev/cuda_none.c — the CUDA entry points of a build without CUDA (DDPD_CUDA=OFF or no
 * toolkit): there is never a device. CMake drops this file when it builds dev/cuda.cu. */
#include "../dev.h"

bool dev_cuda_available(void) { return false; }

int dev_cuda_device_count(void) { return 0; }

bool dev_cuda_device_info(int i, struct dev_cuda_info *out)
{
    (void)i;
    (void)out;
    return false;
}

struct dev dev_cuda_new(int device, bool tf32, struct ddpd_error *err)
{
    (void)tf32;
    ddpd_error_set(err, DDPD_EDEVICE, "device",
                   "device: cannot open GPU %d: this ddpd-worker was built without CUDA", device);
    return (struct dev){NULL, NULL};
}

void dev_cuda_free(struct dev d) { (void)d; }

void *dev_cuda_stream(struct dev d)
{
    (void)d;
    return NULL;
}

int dev_cuda_device(struct dev d)
{
    (void)d;
    return -1;
}

const char *dev_cuda_name(struct dev d)
{
    (void)d;
    return "";
}
