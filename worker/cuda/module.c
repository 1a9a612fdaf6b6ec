/* cuda/module.c — the entry point of libddpd-cuda.so (cuda/plugin.h): the table of
 * cuda/dev.cu's and cuda/nccl.c's functions, and the two worker functions they call
 * (ddpd_error_set, worker_die), forwarded to the worker that loaded the module. Built only
 * into the module, with hidden visibility: nothing but the entry point is exported, so
 * these names never meet the worker's own. */
#include <stdlib.h>

#include "../emit.h"
#include "plugin.h"

static const struct ddpd_cuda_host *host;

ddpd_err ddpd_error_set(struct ddpd_error *e, ddpd_err code, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ddpd_err rc = host->error_vset(e, code, path, fmt, ap);
    va_end(ap);
    return rc;
}

_Noreturn void worker_die(ddpd_err code, const char *fmt, ...)
{
    struct ddpd_error e;
    va_list ap;
    va_start(ap, fmt);
    host->error_vset(&e, code, "", fmt, ap);
    va_end(ap);
    host->die(&e);
    abort(); /* die exits; a function pointer cannot say so */
}

static const struct ddpd_cuda_plugin table = {
    .abi = DDPD_CUDA_PLUGIN_ABI,
    .device_count = cuda__device_count,
    .device_info = cuda__device_info,
    .dev_new = cuda__dev_new,
    .dev_free = cuda__dev_free,
    .dev_stream = cuda__dev_stream,
    .dev_device = cuda__dev_device,
    .dev_name = cuda__dev_name,
    .nccl = &cuda__nccl_ops,
    .nccl_unique_id = cuda__nccl_unique_id,
    .module_code = cuda__module_code,
};

__attribute__((visibility("default"))) const struct ddpd_cuda_plugin *
ddpd_cuda_plugin(const struct ddpd_cuda_host *h)
{
    if (!h || h->abi != DDPD_CUDA_PLUGIN_ABI)
        return NULL;
    host = h;
    return &table;
}
