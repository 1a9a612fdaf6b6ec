/* sched.c — slots and FIFO queues per device kind with gang allocation. Small arrays and
 * linear scans: a server has a few GPUs and a few thousand queued jobs at most. */
#include "sched.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/alloc.h"

struct queued {
    int64_t job;
    int world;
};

struct kind_state {
    int nslots;
    int64_t *holder;  /* [nslots], 0 = free */
    bool *off;        /* [nslots]: never given to a job (a GPU without code) */
    struct queued *q; /* FIFO: q[0] is the head */
    int qlen, qcap;
};

struct sched {
    struct kind_state k[2];            /* DEVICE_CPU, DEVICE_CUDA */
    char (*gpu_ids)[SCHED_GPU_ID_MAX]; /* [k[DEVICE_CUDA].nslots]: each GPU slot's device */
    struct sched_gpu_info *gpu_info;   /* [k[DEVICE_CUDA].nslots]: what is known of it */
};

static const char *kind_word(device_kind k)
{
    return k == DEVICE_CUDA ? "GPU" : "CPU slot";
}

struct sched *sched_new(int gpus, int cpu_slots)
{
    struct sched *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->k[DEVICE_CPU].nslots = cpu_slots < 0 ? 0 : cpu_slots > SCHED_MAX_SLOTS ? SCHED_MAX_SLOTS : cpu_slots;
    s->k[DEVICE_CUDA].nslots = gpus < 0 ? 0 : gpus > SCHED_MAX_SLOTS ? SCHED_MAX_SLOTS : gpus;
    for (int i = 0; i < 2; i++) {
        s->k[i].holder = calloc((size_t)s->k[i].nslots + 1, sizeof(int64_t));
        s->k[i].off = calloc((size_t)s->k[i].nslots + 1, sizeof(bool));
        if (!s->k[i].holder || !s->k[i].off) {
            sched_free(s);
            return NULL;
        }
    }
    int g = s->k[DEVICE_CUDA].nslots;
    if (!(s->gpu_ids = calloc((size_t)g + 1, sizeof *s->gpu_ids)) ||
        !(s->gpu_info = calloc((size_t)g + 1, sizeof *s->gpu_info))) {
        sched_free(s);
        return NULL;
    }
    for (int i = 0; i < g; i++)
        snprintf(s->gpu_ids[i], sizeof s->gpu_ids[i], "%d", i);
    return s;
}

void sched_name_gpus(struct sched *s, const char (*ids)[SCHED_GPU_ID_MAX])
{
    for (int i = 0; ids && i < s->k[DEVICE_CUDA].nslots; i++)
        snprintf(s->gpu_ids[i], sizeof s->gpu_ids[i], "%s", ids[i]);
}

const char *sched_gpu_device(const struct sched *s, int i)
{
    return i >= 0 && i < s->k[DEVICE_CUDA].nslots ? s->gpu_ids[i] : NULL;
}

void sched_describe_gpus(struct sched *s, const struct sched_gpu_info *info)
{
    for (int i = 0; info && i < s->k[DEVICE_CUDA].nslots; i++) {
        s->gpu_info[i] = info[i];
        s->k[DEVICE_CUDA].off[i] = info[i].known && info[i].no_code;
    }
}

const struct sched_gpu_info *sched_gpu_info(const struct sched *s, int i)
{
    return i >= 0 && i < s->k[DEVICE_CUDA].nslots ? &s->gpu_info[i] : NULL;
}

void sched_free(struct sched *s)
{
    if (!s)
        return;
    for (int i = 0; i < 2; i++) {
        free(s->k[i].holder);
        free(s->k[i].off);
        free(s->k[i].q);
    }
    free(s->gpu_ids);
    free(s->gpu_info);
    free(s);
}

int sched_slots(const struct sched *s, device_kind kind)
{
    return s->k[kind].nslots;
}

int sched_usable_slots(const struct sched *s, device_kind kind)
{
    int n = 0;
    for (int i = 0; i < s->k[kind].nslots; i++)
        n += !s->k[kind].off[i];
    return n;
}

/* Why a cuda job of `world` ranks cannot run on the usable GPUs although the server has
 * enough: the GPUs without code in the module (the first two), their compute capability,
 * what the module holds. Fits the 512 bytes callers give it. */
static void no_code_why(const struct sched *s, int world, char *why, size_t cap)
{
    const int n = s->k[DEVICE_CUDA].nslots, usable = sched_usable_slots(s, DEVICE_CUDA);
    size_t o = (size_t)snprintf(why, cap, "device cuda: ");
    const char *module = "";
    int listed = 0;
    for (int i = 0; i < n && o < cap; i++) {
        const struct sched_gpu_info *g = &s->gpu_info[i];
        if (!s->k[DEVICE_CUDA].off[i])
            continue;
        module = g->module_code;
        if (listed++ < 2)
            o += (size_t)snprintf(why + o, cap - o, "%sGPU %d (device %s, %.48s) has compute capability %s",
                                  listed > 1 ? "; " : "this server's ", i, s->gpu_ids[i], g->name,
                                  g->cc[0] ? g->cc : "unknown");
    }
    if (o < cap && listed > 2)
        o += (size_t)snprintf(why + o, cap - o, " (and %d more)", listed - 2);
    if (o < cap)
        snprintf(
            why + o, cap - o,
            ", for which ddpd's CUDA module holds no code (it was built for %.100s): a job can use %d of "
            "the %d GPU%s, world_size %d needs %d; rebuild the module with -DDDPD_CUDA_ARCHS=all",
            module[0] ? module : "other architectures", usable, n, n == 1 ? "" : "s", world, world);
}

bool sched_fits(const struct sched *s, device_kind kind, int world, char *why, size_t cap)
{
    int n = s->k[kind].nslots;
    if (world <= sched_usable_slots(s, kind))
        return true;
    if (n > 0 && world <= n)
        no_code_why(s, world, why, cap);
    else if (n == 0)
        snprintf(why, cap, "device %s: this server has no %ss", device_kind_name(kind),
                 kind == DEVICE_CUDA ? "GPU" : "CPU slot");
    else
        snprintf(why, cap, "world_size %d needs %d %ss but this server has %d", world, world, kind_word(kind),
                 n);
    return false;
}

void sched_enqueue(struct sched *s, int64_t job, device_kind kind, int world)
{
    struct kind_state *k = &s->k[kind];
    if (k->qlen == k->qcap) {
        int ncap = k->qcap ? 2 * k->qcap : 16;
        /* A few bytes per queued job: out of memory here is fatal. */
        k->q = xrealloc(k->q, (size_t)ncap * sizeof *k->q);
        k->qcap = ncap;
    }
    /* FIFO by id: usually the newest, so the scan stops at once. */
    int i = k->qlen;
    while (i > 0 && k->q[i - 1].job > job)
        i--;
    memmove(&k->q[i + 1], &k->q[i], (size_t)(k->qlen - i) * sizeof *k->q);
    k->q[i] = (struct queued){job, world};
    k->qlen++;
}

bool sched_dequeue(struct sched *s, int64_t job)
{
    for (int t = 0; t < 2; t++) {
        struct kind_state *k = &s->k[t];
        for (int i = 0; i < k->qlen; i++) {
            if (k->q[i].job != job)
                continue;
            memmove(&k->q[i], &k->q[i + 1], (size_t)(k->qlen - i - 1) * sizeof *k->q);
            k->qlen--;
            return true;
        }
    }
    return false;
}

static int free_slots(const struct kind_state *k)
{
    int n = 0;
    for (int i = 0; i < k->nslots; i++)
        n += k->holder[i] == 0 && !k->off[i];
    return n;
}

bool sched_next(struct sched *s, int64_t *job, device_kind *kind, int *slots, int *world)
{
    for (int t = 0; t < 2; t++) {
        struct kind_state *k = &s->k[t];
        if (k->qlen == 0 || free_slots(k) < k->q[0].world)
            continue;
        struct queued head = k->q[0];
        for (int i = 0, n = 0; i < k->nslots && n < head.world; i++)
            if (k->holder[i] == 0 && !k->off[i]) {
                k->holder[i] = head.job;
                slots[n++] = i;
            }
        memmove(&k->q[0], &k->q[1], (size_t)(k->qlen - 1) * sizeof *k->q);
        k->qlen--;
        *job = head.job;
        *kind = (device_kind)t;
        *world = head.world;
        return true;
    }
    return false;
}

void sched_release(struct sched *s, int64_t job)
{
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < s->k[t].nslots; i++)
            if (s->k[t].holder[i] == job)
                s->k[t].holder[i] = 0;
}

bool sched_take(struct sched *s, device_kind kind, int64_t holder, int *slot)
{
    struct kind_state *k = &s->k[kind];
    if (k->qlen > 0)
        return false;
    for (int i = 0; i < k->nslots; i++)
        if (k->holder[i] == 0 && !k->off[i]) {
            k->holder[i] = holder;
            *slot = i;
            return true;
        }
    return false;
}

int sched_waiting(const struct sched *s, device_kind kind)
{
    return s->k[kind].qlen;
}

void sched_release_slot(struct sched *s, device_kind kind, int i)
{
    if (i >= 0 && i < s->k[kind].nslots)
        s->k[kind].holder[i] = 0;
}

/* The reason of the job at position i of kind t's queue. */
static void reason_at(const struct kind_state *k, int t, int i, char *buf, size_t cap)
{
    if (i > 0)
        snprintf(buf, cap, "queued behind job %" PRId64 " (%d earlier job%s waiting for %ss)", k->q[0].job, i,
                 i > 1 ? "s" : "", kind_word((device_kind)t));
    else {
        int usable = 0;
        for (int j = 0; j < k->nslots; j++)
            usable += !k->off[j];
        snprintf(buf, cap, "waiting for %d free %ss (%d of %d free)", k->q[i].world,
                 kind_word((device_kind)t), free_slots(k), usable);
    }
}

void sched_pending_reason(const struct sched *s, int64_t job, char *buf, size_t cap)
{
    buf[0] = '\0';
    for (int t = 0; t < 2; t++) {
        const struct kind_state *k = &s->k[t];
        int lo = 0, hi = k->qlen; /* the queue is in id order: a binary search */
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (k->q[mid].job < job)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < k->qlen && k->q[lo].job == job) {
            reason_at(k, t, lo, buf, cap);
            return;
        }
    }
}

int64_t sched_slot_holder(const struct sched *s, device_kind kind, int i)
{
    return i >= 0 && i < s->k[kind].nslots ? s->k[kind].holder[i] : 0;
}

/* Device j's name under "auto": the entry of CUDA_VISIBLE_DEVICES at *v (CUDA numbers the
 * devices it sees in the order that list names them), or "j" past its end or without one.
 * Moves *v to the next entry. */
static void auto_name(const char **v, int j, char out[SCHED_GPU_ID_MAX])
{
    size_t len = *v ? strcspn(*v, ",") : 0;
    if (len && len < SCHED_GPU_ID_MAX)
        snprintf(out, SCHED_GPU_ID_MAX, "%.*s", (int)len, *v);
    else
        snprintf(out, SCHED_GPU_ID_MAX, "%d", j);
    *v = *v && (*v)[len] == ',' ? *v + len + 1 : NULL;
}

void sched_gpu_match(const char (*ids)[SCHED_GPU_ID_MAX], int n, const char *visible,
                     const struct sched_gpu_info *found, int nfound, struct sched_gpu_info *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = (struct sched_gpu_info){.known = false};
        const char *v = visible;
        for (int j = 0; j < nfound; j++) {
            char name[SCHED_GPU_ID_MAX];
            auto_name(&v, j, name);
            if (!strcmp(ids[i], name) || (found[j].uuid[0] && !strcmp(ids[i], found[j].uuid))) {
                out[i] = found[j];
                out[i].known = true;
                break;
            }
        }
    }
}

int sched_gpu_ids(const char *arg, int found, const char *visible, char (*ids)[SCHED_GPU_ID_MAX], int cap,
                  char *why, size_t whycap)
{
    int n = 0;
    if (!strcmp(arg, "none"))
        return 0;
    if (!strcmp(arg, "auto")) {
        const char *v = visible;
        for (; n < found && n < cap; n++)
            auto_name(&v, n, ids[n]);
        return n;
    }
    for (const char *p = arg;; n++) {
        size_t len = strcspn(p, ",");
        bool ok = len > 0 && len < SCHED_GPU_ID_MAX;
        for (size_t i = 0; ok && i < len; i++)
            ok = (p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'z') ||
                 (p[i] >= 'A' && p[i] <= 'Z') || p[i] == '-' || p[i] == '/';
        if (!ok) {
            snprintf(why, whycap,
                     "--gpus: '%.*s' is not a GPU (auto, none, or device numbers or "
                     "UUIDs as CUDA_VISIBLE_DEVICES takes them: 0,1)",
                     (int)(len > 64 ? 64 : len), p);
            return -1;
        }
        if (n == cap) {
            snprintf(why, whycap, "--gpus: more than %d GPUs", cap);
            return -1;
        }
        snprintf(ids[n], SCHED_GPU_ID_MAX, "%.*s", (int)len, p);
        for (int j = 0; j < n; j++)
            if (!strcmp(ids[j], ids[n])) {
                snprintf(why, whycap, "--gpus: GPU %s is listed twice", ids[n]);
                return -1;
            }
        if (!p[len])
            return n + 1;
        p += len + 1;
    }
}
