/* cuda/loader.c — dev.h's CUDA entry points in ddpd-worker: they load libddpd-cuda.so
 * (cuda/plugin.h) the first time one needs a device, and forward through its table.
 * The only code of the worker that calls dlopen; it never links CUDA, so a CPU job,
 * --plan and --version start without mapping a byte of it. In a DDPD_CUDA=OFF build there
 * is no module beside the worker: only one that DDPD_CUDA_PLUGIN names is loaded (the
 * emulated device, built with or without nvcc); without it every call answers "no device" or
 * "built without CUDA". */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../emit.h"
#include "plugin.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const struct ddpd_cuda_plugin *plugin; /* set once, by load() */
static char why[768];                         /* load()'s failure, when plugin is NULL */

/* Fails the load with a message (cut to fit); the handle, if any, is the caller's. */
static void refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void refuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
}

static void host_die(const struct ddpd_error *e)
{
    emit_die(e);
}

static const struct ddpd_cuda_host host = {
    .abi = DDPD_CUDA_PLUGIN_ABI,
    .error_vset = ddpd_error_vset,
    .die = host_die,
};

/* DDPD_CUDA_PLUGIN, else the module beside the executable; false when there is none to
 * load (a DDPD_CUDA=OFF build builds no libddpd-cuda.so). */
static bool module_path(char *out, size_t cap)
{
    const char *env = getenv("DDPD_CUDA_PLUGIN");
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return true;
    }
#ifndef DDPD_HAVE_CUDA
    (void)out;
    (void)cap;
    return false;
#else
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(out, cap, "%s", DDPD_CUDA_PLUGIN_FILE); /* the loader's search path */
        return true;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    snprintf(out, cap, "%s/%s", slash ? exe : ".", DDPD_CUDA_PLUGIN_FILE);
    return true;
#endif
}

static bool table_complete(const struct ddpd_cuda_plugin *p)
{
    const struct comm_ops *c = p->nccl;
    /* The optional barrier is not forwarded (cuda/nccl_forward.c). */
    return p->device_count && p->device_info && p->dev_new && p->dev_free && p->dev_stream && p->dev_device &&
           p->dev_name && p->nccl_unique_id && p->module_code && c && c->init_rank && c->allreduce_start &&
           c->wait && c->broadcast && c->allgather && c->allreduce_max_i64 && c->abort && c->last_error &&
           c->free && c->bind_dev;
}

static void load(void)
{
    char path[PATH_MAX + 64];
    if (!module_path(path, sizeof path)) {
        refuse("this ddpd-worker was built without CUDA or NCCL, so it trains on the CPU only: use "
               "\"device\": \"cpu\" and ddp.backend \"cpu\"");
        return;
    }
    /* RTLD_NOW: a missing library or symbol fails here, with dlerror() naming it, not in
     * the middle of a job. RTLD_LOCAL: CUDA's symbols stay out of the worker's scope. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        refuse("cannot load the CUDA module %s: %s", path, e ? e : "unknown error");
        return;
    }
    ddpd_cuda_plugin_fn *entry;
    /* POSIX's sanctioned way to turn dlsym's void * into a function pointer. */
    *(void **)&entry = dlsym(h, DDPD_CUDA_PLUGIN_SYMBOL);
    if (!entry) {
        const char *e = dlerror();
        refuse("the CUDA module %s is not a ddpd module: %s", path, e ? e : "no entry point");
        dlclose(h);
        return;
    }
    const struct ddpd_cuda_plugin *p = entry(&host);
    if (!p || p->abi != DDPD_CUDA_PLUGIN_ABI || !table_complete(p)) {
        refuse("the CUDA module %s was built for another ddpd-worker (module ABI %d expected)", path,
               DDPD_CUDA_PLUGIN_ABI);
        dlclose(h);
        return;
    }
    /* Never dlclosed: CUDA's and NCCL's threads live as long as the process. */
    __atomic_store_n(&plugin, p, __ATOMIC_RELEASE);
}

const struct ddpd_cuda_plugin *cuda_plugin_get(struct ddpd_error *err)
{
    pthread_once(&once, load);
    if (!plugin)
        ddpd_error_set(err, DDPD_EDEVICE, "device", "%s", why);
    return plugin;
}

const struct ddpd_cuda_plugin *cuda_plugin_loaded(void)
{
    /* Read after pthread_once completed on some thread; a racing first load reads NULL,
     * which callers take as "not a CUDA object", and that is true: none exists yet. */
    return __atomic_load_n(&plugin, __ATOMIC_ACQUIRE);
}

/* DDPD_CUDA_EMU as a positive number: emulated devices are asked for (their module needs
 * no driver, and says how many it makes of the number). */
static bool emulation_asked(void)
{
    const char *v = getenv("DDPD_CUDA_EMU");
    if (!v || !*v)
        return false;
    char *end;
    long n = strtol(v, &end, 10);
    return *end == '\0' && n > 0;
}

bool dev_cuda_driver_present(void)
{
    return emulation_asked() || access("/proc/driver/nvidia/version", F_OK) == 0 ||
           access("/dev/nvidiactl", F_OK) == 0 || access("/dev/dxg", F_OK) == 0;
}

/* ---- dev.h ---- */

bool dev_cuda_load(struct ddpd_error *err)
{
    return cuda_plugin_get(err) != NULL;
}

bool dev_cuda_available(void)
{
    return dev_cuda_device_count() > 0;
}

int dev_cuda_device_count(void)
{
    if (!dev_cuda_driver_present())
        return 0;
    const struct ddpd_cuda_plugin *p = cuda_plugin_get(NULL);
    return p ? p->device_count() : 0;
}

bool dev_cuda_device_info(int i, struct dev_cuda_info *out)
{
    const struct ddpd_cuda_plugin *p = dev_cuda_driver_present() ? cuda_plugin_get(NULL) : NULL;
    if (!p || !p->device_info(i, out))
        return false;
    out->has_code =
        cuda_code_pick(p->module_code(), out->cc_major, out->cc_minor, out->code, sizeof out->code);
    return true;
}

const char *dev_cuda_module_code(void)
{
    const struct ddpd_cuda_plugin *p = cuda_plugin_get(NULL);
    return p ? p->module_code() : "";
}

/* ---- CUDA's rules for which code of a fat binary a device runs ---- */

/* One entry of a code list: "sm_86" (a cubin; `exact` for sm_90a, which only a 9.0 runs)
 * or "compute_90" (PTX) as a capability times 10 (86, 90, 100, 120). False for anything
 * else, which no device runs. */
static bool code_entry(const char *s, size_t len, bool *ptx, bool *exact, int *cc)
{
    const char *digits;
    if (len > 3 && !strncmp(s, "sm_", 3))
        *ptx = false, digits = s + 3;
    else if (len > 8 && !strncmp(s, "compute_", 8))
        *ptx = true, digits = s + 8;
    else
        return false;
    int v = 0;
    const char *e = digits;
    for (; e < s + len && *e >= '0' && *e <= '9' && v < 10000; e++)
        v = v * 10 + (*e - '0');
    *exact = e < s + len && *e == 'a';
    *cc = v;
    return e > digits && v >= 10 && e + (*exact ? 1 : 0) == s + len;
}

bool cuda_code_pick(const char *list, int major, int minor, char *out, size_t cap)
{
    const int cc = major * 10 + minor;
    int best = -1, best_rank = -1; /* rank: a cubin beats PTX, then the newer one */
    size_t best_len = 0;
    const char *best_at = NULL;
    for (const char *p = list ? list : ""; *p;) {
        size_t len = strcspn(p, " ,");
        bool ptx, exact;
        int v = 0;
        if (len && code_entry(p, len, &ptx, &exact, &v)) {
            bool runs = ptx ? v <= cc : exact ? v == cc : v / 10 == major && v % 10 <= minor;
            int rank = (ptx ? 0 : 100000) + v;
            if (runs && rank > best_rank)
                best = v, best_rank = rank, best_at = p, best_len = len;
        }
        p += len;
        p += strspn(p, " ,");
    }
    if (cap)
        snprintf(out, cap, "%.*s", best_at ? (int)best_len : 0, best_at ? best_at : "");
    return best >= 0;
}

struct dev dev_cuda_new(int device, bool tf32, struct ddpd_error *err)
{
    const struct ddpd_cuda_plugin *p = cuda_plugin_get(err);
    if (!p) {
        /* Say which GPU could not be opened, and why. */
        ddpd_error_set(err, DDPD_EDEVICE, "device", "device: cannot open GPU %d: %s", device, why);
        return (struct dev){NULL, NULL};
    }
    return p->dev_new(device, tf32, err);
}

/* The rest take a backend: one of the module's only if the module is loaded. */

void dev_cuda_free(struct dev d)
{
    const struct ddpd_cuda_plugin *p = cuda_plugin_loaded();
    if (p)
        p->dev_free(d);
}

void *dev_cuda_stream(struct dev d)
{
    const struct ddpd_cuda_plugin *p = cuda_plugin_loaded();
    return p ? p->dev_stream(d) : NULL;
}

int dev_cuda_device(struct dev d)
{
    const struct ddpd_cuda_plugin *p = cuda_plugin_loaded();
    return p ? p->dev_device(d) : -1;
}

const char *dev_cuda_name(struct dev d)
{
    const struct ddpd_cuda_plugin *p = cuda_plugin_loaded();
    return p ? p->dev_name(d) : "";
}
