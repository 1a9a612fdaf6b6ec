/* cuda/plugin.h — the ABI between ddpd-worker and libddpd-cuda.so, the one module that
 * links CUDA, cuBLAS and NCCL. worker/cuda holds both sides: the worker's (loader.c, which
 * dlopens the module the first time a CUDA or NCCL entry point of dev.h / comm.h needs it,
 * and nccl_forward.c; those entry points forward through the table below) and the module's
 * (dev.cu, nccl.c, module.c; built with hidden visibility, exporting only
 * DDPD_CUDA_PLUGIN_SYMBOL). Loading those libraries costs a second at every start, so
 * ddpd-worker links none of them. The dev.h / comm.h names are defined once, by the
 * worker's forwarders; the module's backends carry the cuda__ prefix.
 * Change DDPD_CUDA_PLUGIN_ABI whenever a struct below, or one they carry (dev_ops,
 * comm_ops, dev_cuda_info, ddpd_error), changes: a module of another version is refused.
 * (5: the devices' compute capability and the module's code list, dev_ops' add_i64 and
 * sumsq_group; 6: dev_ops' gemv, which the module leaves NULL.) */
#ifndef DDPD_CUDA_PLUGIN_H
#define DDPD_CUDA_PLUGIN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include "../comm.h"
#include "../dev.h"

#define DDPD_CUDA_PLUGIN_ABI    6
#define DDPD_CUDA_PLUGIN_SYMBOL "ddpd_cuda_plugin"
#define DDPD_CUDA_PLUGIN_FILE   "libddpd-cuda.so"

/* What the worker lends the module. The module needs two functions of the worker: the
 * error setter and the classified exit (emit.c). It gets them here rather than linking the
 * worker's objects a second time, which would duplicate emit's buffered stdout and rank,
 * or resolving them from the executable (-rdynamic), which would tie the module to the
 * executables that export them (every unit test and benchmark links the worker too). */
struct ddpd_cuda_host {
    int abi;
    ddpd_err (*error_vset)(struct ddpd_error *e, ddpd_err code, const char *path, const char *fmt,
                           va_list ap);
    void (*die)(const struct ddpd_error *e); /* emit_die: writes the error event, exits */
};

/* What the module gives back: dev.h's CUDA functions and comm.h's NCCL table, with the
 * meaning those headers give them. */
struct ddpd_cuda_plugin {
    int abi;
    int (*device_count)(void);
    bool (*device_info)(int i, struct dev_cuda_info *out);
    struct dev (*dev_new)(int device, bool tf32, struct ddpd_error *err);
    void (*dev_free)(struct dev d);
    void *(*dev_stream)(struct dev d);
    int (*dev_device)(struct dev d);
    const char *(*dev_name)(struct dev d);
    const struct comm_ops *nccl;
    /* ncclGetUniqueId: 0, or -1 with the reason in errbuf. */
    int (*nccl_unique_id)(struct comm_id *id, char *errbuf, size_t errcap);
    /* What the module's kernels were compiled for (dev.h's dev_cuda_module_code). */
    const char *(*module_code)(void);
};

/* The module's one exported function (DDPD_CUDA_PLUGIN_SYMBOL). `host` is borrowed and
 * must outlive the module. Returns NULL when host->abi is not the module's version. */
typedef const struct ddpd_cuda_plugin *ddpd_cuda_plugin_fn(const struct ddpd_cuda_host *host);

/* ---- the worker's side (cuda/loader.c) ---- */

/* The module, loaded on the first call (once per process; later calls return the first
 * answer). NULL with `err` set (DDPD_EDEVICE, "<path>: <dlerror()>", or "built without
 * CUDA" in a DDPD_CUDA=OFF build without DDPD_CUDA_PLUGIN) when it cannot be loaded; `err`
 * may be NULL. The module is DDPD_CUDA_PLUGIN_FILE beside /proc/self/exe; the environment
 * variable DDPD_CUDA_PLUGIN names another file (tests, packaging, the emulated device
 * libddpd-cuda-emu.so, which every build has, DDPD_CUDA=OFF ones included). */
const struct ddpd_cuda_plugin *cuda_plugin_get(struct ddpd_error *err);
/* The module if it is loaded already, else NULL; never loads it. */
const struct ddpd_cuda_plugin *cuda_plugin_loaded(void);

/* Which entry of a module's code list (dev_cuda_module_code's form: "sm_80 sm_90
 * compute_90", spaces or commas between) a device of compute capability major.minor runs,
 * by CUDA's rules: a cubin sm_XY runs on X.Z for Z >= Y (one major version: sm_80 on an
 * 8.6, never sm_86 on an 8.0 nor sm_80 on a 9.0; sm_XYa only on X.Y itself); PTX
 * compute_XY is compiled by the driver for any X.Y or newer. A cubin is preferred, the
 * newest that fits, as the driver prefers it. Writes the entry into out[cap] and returns
 * true, or writes "" and returns false when none runs there. */
bool cuda_code_pick(const char *list, int major, int minor, char *out, size_t cap);

/* ---- the module's side (hidden inside libddpd-cuda.so) ---- */

/* cuda/dev.cu: the CUDA device backend, with the meaning dev.h gives dev_cuda_*. */
int cuda__device_count(void);
bool cuda__device_info(int i, struct dev_cuda_info *out);
struct dev cuda__dev_new(int device, bool tf32, struct ddpd_error *err);
void cuda__dev_free(struct dev d);
void *cuda__dev_stream(struct dev d);
int cuda__dev_device(struct dev d);
const char *cuda__dev_name(struct dev d);
const char *cuda__module_code(void);

/* cuda/nccl.c: the NCCL collective backend (comm.h's comm_nccl_ops), and
 * ncclGetUniqueId: 0, or -1 with the reason in errbuf. */
extern const struct comm_ops cuda__nccl_ops;
int cuda__nccl_unique_id(struct comm_id *id, char *errbuf, size_t errcap);

#endif
