/* sched.c — slots and queues per device kind: the policy of docs/scheduling.md (priority
 * with aging, gang allocation, quotas, the choice of preemption victims, time limits) and
 * why a job waits. Pure bookkeeping on the caller's clock: no processes, no HTTP, no SQL.
 * Queues are arrays kept in order; a pass costs a sort only when aging changed an order. */
#include "sched.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/alloc.h"

/* A queued job. Entries live in a pool (stable indices) that the queues and the id index
 * point into. */
struct pend {
    int64_t job;
    device_kind kind;
    int world, priority, eff; /* eff: effective priority at the kind's `at` */
    bool preemptible;
    int owner; /* index into owners, -1 for none */
    double since, time_limit, run_s;
    int pos;  /* index in its kind's order */
    int next; /* the pool's free list */
};

/* A running job, in start order. */
struct run {
    int64_t job;
    device_kind kind;
    int world, priority;
    int hold; /* the effective priority it started with: what a preemptor must exceed */
    bool preemptible, preempting;
    int owner;
    double started, time_limit, run_s;
    int64_t for_job; /* preempting: the job it was chosen for */
};

struct owner {
    char *name;
    int max[2];  /* per kind, -1: no limit */
    int used[2]; /* slots its running jobs hold */
};

struct kind_state {
    int nslots;
    int64_t *holder; /* [nslots], 0 = free */
    bool *off;       /* [nslots]: never given to a job (a GPU without code) */
    /* The queue: pool indices by effective priority desc, then id asc, as of `at`; the
     * order stays true until `next_change`, the first time an effective priority rises. */
    int *order;
    int qlen, qcap;
    double at, next_change;
    bool stale; /* recompute at the next look whatever the time */
};

struct sched {
    struct kind_state k[2];            /* DEVICE_CPU, DEVICE_CUDA */
    char (*gpu_ids)[SCHED_GPU_ID_MAX]; /* [k[DEVICE_CUDA].nslots]: each GPU slot's device */
    struct sched_gpu_info *gpu_info;   /* [k[DEVICE_CUDA].nslots]: what is known of it */
    double aging;
    struct pend *pool;
    int npool, poolcap, freelist;
    int *byid; /* pool indices of every queued job, by job id */
    int nbyid, byidcap;
    struct run *run;
    int nrun, runcap;
    struct owner *owners;
    int nowners, ownercap;
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
    s->aging = SCHED_AGING_S;
    s->freelist = -1;
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
        free(s->k[i].order);
    }
    for (int i = 0; i < s->nowners; i++)
        free(s->owners[i].name);
    free(s->owners);
    free(s->pool);
    free(s->byid);
    free(s->run);
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

/* ---- owners and their quotas --------------------------------------------------------- */

static int owner_find(const struct sched *s, const char *name)
{
    for (int i = 0; name && name[0] && i < s->nowners; i++)
        if (!strcmp(s->owners[i].name, name))
            return i;
    return -1;
}

/* The owner named `name`, added with no limits when new; -1 for none (NULL or ""). */
static int owner_intern(struct sched *s, const char *name)
{
    if (!name || !name[0])
        return -1;
    int i = owner_find(s, name);
    if (i >= 0)
        return i;
    if (s->nowners == s->ownercap) {
        s->ownercap = s->ownercap ? 2 * s->ownercap : 8;
        s->owners = xrealloc(s->owners, (size_t)s->ownercap * sizeof *s->owners);
    }
    s->owners[s->nowners] = (struct owner){.name = xstrdup(name), .max = {-1, -1}};
    return s->nowners++;
}

void sched_set_limits(struct sched *s, const char *owner, int max_gpus, int max_cpu_ranks)
{
    int i = owner_intern(s, owner);
    if (i < 0)
        return;
    s->owners[i].max[DEVICE_CUDA] = max_gpus < 0 ? -1 : max_gpus;
    s->owners[i].max[DEVICE_CPU] = max_cpu_ranks < 0 ? -1 : max_cpu_ranks;
}

/* Whether the job's owner may start it: its running jobs of the kind and this one fit
 * the owner's limit. */
static bool quota_ok(const struct sched *s, const struct pend *p)
{
    if (p->owner < 0)
        return true;
    const struct owner *o = &s->owners[p->owner];
    int lim = o->max[p->kind];
    return lim < 0 || o->used[p->kind] + p->world <= lim;
}

static void quota_reason(const struct sched *s, const struct pend *p, char *buf, size_t cap)
{
    const struct owner *o = &s->owners[p->owner];
    int lim = o->max[p->kind], used = o->used[p->kind];
    const char *unit = p->kind == DEVICE_CUDA ? "GPU" : "CPU rank";
    if (used >= lim)
        snprintf(buf, cap, "quota: %s runs %d of %d %s%s", o->name, used, lim, unit, lim == 1 ? "" : "s");
    else
        snprintf(buf, cap, "quota: %s runs %d of %d %s%s and needs %d", o->name, used, lim, unit,
                 lim == 1 ? "" : "s", p->world);
}

/* ---- the queues: order by effective priority ------------------------------------------ */

void sched_set_aging(struct sched *s, double seconds)
{
    s->aging = seconds > 0 ? seconds : 0;
    s->k[0].stale = s->k[1].stale = true;
}

static int effective(const struct sched *s, const struct pend *p, double now)
{
    double waited = now > p->since ? now - p->since : 0;
    if (s->aging <= 0)
        return p->priority;
    double e = p->priority + floor(waited / s->aging);
    return e >= 100 ? 100 : (int)e;
}

/* When p's effective priority next rises after `now` (INFINITY: never). */
static double next_rise(const struct sched *s, const struct pend *p, double now)
{
    if (s->aging <= 0 || p->eff >= 100)
        return INFINITY;
    double waited = now > p->since ? now - p->since : 0;
    return p->since + (floor(waited / s->aging) + 1) * s->aging;
}

/* a starts before b */
static bool ahead(const struct pend *a, const struct pend *b)
{
    return a->eff > b->eff || (a->eff == b->eff && a->job < b->job);
}

struct sortkey {
    int eff;
    int idx;
    int64_t job;
};

static int cmp_key(const void *x, const void *y)
{
    const struct sortkey *a = x, *b = y;
    if (a->eff != b->eff)
        return a->eff > b->eff ? -1 : 1;
    return a->job < b->job ? -1 : a->job > b->job;
}

/* Makes kind t's order true at `now`: the effective priorities are recomputed only once
 * one of them may have risen (next_change), and the queue sorted only when one did. */
static void reorder(struct sched *s, int t, double now)
{
    struct kind_state *k = &s->k[t];
    if (!k->stale && now >= k->at && now < k->next_change)
        return;
    bool changed = k->stale;
    double nc = INFINITY;
    for (int i = 0; i < k->qlen; i++) {
        struct pend *p = &s->pool[k->order[i]];
        int e = effective(s, p, now);
        changed |= e != p->eff;
        p->eff = e;
        double r = next_rise(s, p, now);
        nc = r < nc ? r : nc;
    }
    k->at = now;
    k->next_change = nc;
    k->stale = false;
    if (!changed)
        return;
    struct sortkey *key = xmalloc((size_t)(k->qlen + 1) * sizeof *key);
    for (int i = 0; i < k->qlen; i++) {
        const struct pend *p = &s->pool[k->order[i]];
        key[i] = (struct sortkey){p->eff, k->order[i], p->job};
    }
    qsort(key, (size_t)k->qlen, sizeof *key, cmp_key);
    for (int i = 0; i < k->qlen; i++) {
        k->order[i] = key[i].idx;
        s->pool[key[i].idx].pos = i;
    }
    free(key);
}

/* The queued job's pool index by id (binary search), or -1. */
static int find_pend(const struct sched *s, int64_t job)
{
    int lo = 0, hi = s->nbyid;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (s->pool[s->byid[mid]].job < job)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->nbyid && s->pool[s->byid[lo]].job == job ? s->byid[lo] : -1;
}

static int find_run(const struct sched *s, int64_t job)
{
    for (int i = 0; i < s->nrun; i++)
        if (s->run[i].job == job)
            return i;
    return -1;
}

void sched_enqueue(struct sched *s, const struct sched_job *j, double now)
{
    if (!j || j->job <= 0 || (j->kind != DEVICE_CPU && j->kind != DEVICE_CUDA) || find_pend(s, j->job) >= 0 ||
        find_run(s, j->job) >= 0)
        return;
    int idx = s->freelist;
    if (idx >= 0)
        s->freelist = s->pool[idx].next;
    else {
        if (s->npool == s->poolcap) {
            /* A few dozen bytes per queued job: out of memory here is fatal. */
            s->poolcap = s->poolcap ? 2 * s->poolcap : 64;
            s->pool = xrealloc(s->pool, (size_t)s->poolcap * sizeof *s->pool);
        }
        idx = s->npool++;
    }
    struct pend *p = &s->pool[idx];
    *p = (struct pend){.job = j->job,
                       .kind = j->kind,
                       .world = j->world,
                       .priority = j->priority < 0     ? 0
                                   : j->priority > 100 ? 100
                                                       : j->priority,
                       .preemptible = j->preemptible,
                       .owner = owner_intern(s, j->owner),
                       .since = now,
                       .time_limit = j->time_limit,
                       .run_s = j->run_s,
                       .next = -1};
    /* The id index: usually the newest id, so the scan stops at once. */
    if (s->nbyid == s->byidcap) {
        s->byidcap = s->byidcap ? 2 * s->byidcap : 64;
        s->byid = xrealloc(s->byid, (size_t)s->byidcap * sizeof *s->byid);
    }
    int b = s->nbyid;
    while (b > 0 && s->pool[s->byid[b - 1]].job > p->job)
        b--;
    memmove(&s->byid[b + 1], &s->byid[b], (size_t)(s->nbyid - b) * sizeof *s->byid);
    s->byid[b] = idx;
    s->nbyid++;
    /* The order: in place by binary search when it is true (at k->at), else sorted at
     * the next look. */
    struct kind_state *k = &s->k[p->kind];
    if (k->qlen == k->qcap) {
        k->qcap = k->qcap ? 2 * k->qcap : 64;
        k->order = xrealloc(k->order, (size_t)k->qcap * sizeof *k->order);
    }
    int at = k->qlen;
    if (!k->stale) {
        p->eff = effective(s, p, k->at);
        double r = next_rise(s, p, k->at);
        k->next_change = r < k->next_change ? r : k->next_change;
        int lo = 0, hi = k->qlen;
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (ahead(&s->pool[k->order[mid]], p))
                lo = mid + 1;
            else
                hi = mid;
        }
        at = lo;
    }
    memmove(&k->order[at + 1], &k->order[at], (size_t)(k->qlen - at) * sizeof *k->order);
    k->order[at] = idx;
    k->qlen++;
    for (int i = at; i < k->qlen; i++)
        s->pool[k->order[i]].pos = i;
}

/* Takes a queued job out of its queue, the id index and the pool. */
static void pend_remove(struct sched *s, int idx)
{
    struct pend *p = &s->pool[idx];
    struct kind_state *k = &s->k[p->kind];
    memmove(&k->order[p->pos], &k->order[p->pos + 1], (size_t)(k->qlen - p->pos - 1) * sizeof *k->order);
    k->qlen--;
    for (int i = p->pos; i < k->qlen; i++)
        s->pool[k->order[i]].pos = i;
    int b = 0;
    while (s->byid[b] != idx)
        b++;
    memmove(&s->byid[b], &s->byid[b + 1], (size_t)(s->nbyid - b - 1) * sizeof *s->byid);
    s->nbyid--;
    p->job = 0;
    p->next = s->freelist;
    s->freelist = idx;
}

bool sched_dequeue(struct sched *s, int64_t job)
{
    int idx = find_pend(s, job);
    if (idx < 0)
        return false;
    pend_remove(s, idx);
    return true;
}

static int free_slots(const struct kind_state *k)
{
    int n = 0;
    for (int i = 0; i < k->nslots; i++)
        n += k->holder[i] == 0 && !k->off[i];
    return n;
}

/* The place in kind t's order of the first job whose owner may run it, or -1. */
static int head(const struct sched *s, int t)
{
    const struct kind_state *k = &s->k[t];
    for (int i = 0; i < k->qlen; i++)
        if (quota_ok(s, &s->pool[k->order[i]]))
            return i;
    return -1;
}

bool sched_next(struct sched *s, double now, int64_t *job, device_kind *kind, int *slots, int *world)
{
    for (int t = 0; t < 2; t++) {
        struct kind_state *k = &s->k[t];
        reorder(s, t, now);
        int h = head(s, t);
        if (h < 0)
            continue;
        int idx = k->order[h];
        const struct pend *p = &s->pool[idx];
        if (free_slots(k) < p->world)
            continue;
        for (int i = 0, n = 0; i < k->nslots && n < p->world; i++)
            if (k->holder[i] == 0 && !k->off[i]) {
                k->holder[i] = p->job;
                slots[n++] = i;
            }
        if (s->nrun == s->runcap) {
            s->runcap = s->runcap ? 2 * s->runcap : 16;
            s->run = xrealloc(s->run, (size_t)s->runcap * sizeof *s->run);
        }
        s->run[s->nrun++] = (struct run){.job = p->job,
                                         .kind = p->kind,
                                         .world = p->world,
                                         .priority = p->priority,
                                         .hold = p->eff,
                                         .preemptible = p->preemptible,
                                         .owner = p->owner,
                                         .started = now,
                                         .time_limit = p->time_limit,
                                         .run_s = p->run_s};
        if (p->owner >= 0)
            s->owners[p->owner].used[t] += p->world;
        *job = p->job;
        *kind = (device_kind)t;
        *world = p->world;
        pend_remove(s, idx);
        return true;
    }
    return false;
}

/* ---- preemption and time limits ------------------------------------------------------- */

/* Victims go lowest priority first, then the most recently started. */
static bool victim_before(const struct run *a, const struct run *b)
{
    if (a->hold != b->hold)
        return a->hold < b->hold;
    if (a->started != b->started)
        return a->started > b->started;
    return a->job > b->job;
}

int sched_preempt(struct sched *s, double now, int64_t *for_job, int64_t *victims, int cap)
{
    for (int t = 0; t < 2; t++) {
        struct kind_state *k = &s->k[t];
        bool draining = false;
        for (int r = 0; r < s->nrun; r++)
            draining |= s->run[r].kind == (device_kind)t && s->run[r].preempting;
        if (draining)
            continue;
        reorder(s, t, now);
        int h = head(s, t);
        if (h < 0)
            continue;
        const struct pend *p = &s->pool[k->order[h]];
        int nfree = free_slots(k);
        if (nfree >= p->world)
            continue; /* it starts now: nothing to preempt for */
        /* The candidates and the usable slots each would free. */
        int *cand = xmalloc((size_t)(s->nrun + 1) * sizeof *cand);
        int *gain = xcalloc((size_t)s->nrun + 1, sizeof *gain);
        for (int i = 0; i < k->nslots; i++) {
            int r = k->holder[i] > 0 && !k->off[i] ? find_run(s, k->holder[i]) : -1;
            if (r >= 0)
                gain[r]++;
        }
        int nc = 0, total = nfree;
        for (int r = 0; r < s->nrun; r++) {
            const struct run *v = &s->run[r];
            if (v->kind != (device_kind)t || v->hold >= p->priority || !v->preemptible || v->preempting ||
                gain[r] == 0)
                continue;
            int at = nc++; /* insertion sort: a few running jobs */
            while (at > 0 && victim_before(v, &s->run[cand[at - 1]])) {
                cand[at] = cand[at - 1];
                at--;
            }
            cand[at] = r;
            total += gain[r];
        }
        int n = 0;
        if (total >= p->world) {
            int have = nfree;
            while (have < p->world)
                have += gain[cand[n++]];
            /* Drop what is not needed, the last chosen first: every one left is needed. */
            for (int i = n - 1; i >= 0; i--)
                if (have - gain[cand[i]] >= p->world) {
                    have -= gain[cand[i]];
                    memmove(&cand[i], &cand[i + 1], (size_t)(n - i - 1) * sizeof *cand);
                    n--;
                }
            if (n > cap)
                n = 0; /* the caller's array is too small: choose none rather than too few */
            for (int i = 0; i < n; i++) {
                struct run *v = &s->run[cand[i]];
                v->preempting = true;
                v->for_job = p->job;
                victims[i] = v->job;
            }
        }
        free(cand);
        free(gain);
        if (n > 0) {
            *for_job = p->job;
            return n;
        }
    }
    return 0;
}

int sched_expired(const struct sched *s, double now, int64_t *jobs, int cap)
{
    int n = 0;
    for (int r = 0; r < s->nrun && n < cap; r++) {
        const struct run *v = &s->run[r];
        if (v->time_limit > 0 && v->run_s + (now - v->started) >= v->time_limit)
            jobs[n++] = v->job;
    }
    return n;
}

void sched_release(struct sched *s, int64_t job)
{
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < s->k[t].nslots; i++)
            if (s->k[t].holder[i] == job)
                s->k[t].holder[i] = 0;
    int r = find_run(s, job);
    if (r < 0)
        return;
    if (s->run[r].owner >= 0)
        s->owners[s->run[r].owner].used[s->run[r].kind] -= s->run[r].world;
    memmove(&s->run[r], &s->run[r + 1], (size_t)(s->nrun - r - 1) * sizeof *s->run);
    s->nrun--;
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

int64_t sched_slot_holder(const struct sched *s, device_kind kind, int i)
{
    return i >= 0 && i < s->k[kind].nslots ? s->k[kind].holder[i] : 0;
}

/* ---- why a job waits ------------------------------------------------------------------ */

#define HOLDERS_SHOWN 6

/* Appends to buf at *o, never past cap. */
static void add(char *buf, size_t cap, size_t *o, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void add(char *buf, size_t cap, size_t *o, const char *fmt, ...)
{
    if (*o >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *o, cap - *o, fmt, ap);
    va_end(ap);
    *o = n < 0 ? cap : *o + (size_t)n;
}

/* The blocked head p's reason: how many slots it lacks and who holds them (its running
 * jobs in slot order, then inference processes), or the victims of its preemption while
 * they drain. */
static void head_reason(const struct sched *s, const struct pend *p, char *buf, size_t cap)
{
    const struct kind_state *k = &s->k[p->kind];
    const char *word = kind_word(p->kind);
    int usable = sched_usable_slots(s, p->kind), lack = p->world - free_slots(k);
    if (p->world > usable) {
        snprintf(buf, cap, "waiting for %d %ss: only %d of this server's %d %ss can take a job", p->world,
                 word, usable, k->nslots, word);
        return;
    }
    if (lack <= 0) {
        snprintf(buf, cap, "starting: the %d %s%s it needs %s free", p->world, word, p->world == 1 ? "" : "s",
                 p->world == 1 ? "is" : "are");
        return;
    }
    bool draining = false;
    for (int r = 0; r < s->nrun; r++)
        draining |= s->run[r].preempting && s->run[r].for_job == p->job;
    /* The distinct holders in slot order; jobs first, then inference processes. */
    int64_t *seen = xmalloc((size_t)(k->nslots + 1) * sizeof *seen);
    int nseen = 0, njobs = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < k->nslots; i++) {
            int64_t h = k->holder[i];
            if (h == 0 || (pass == 0) != (h > 0))
                continue;
            int r = h > 0 ? find_run(s, h) : -1;
            if (draining && (r < 0 || !s->run[r].preempting || s->run[r].for_job != p->job))
                continue;
            bool dup = false;
            for (int j = 0; j < nseen && !dup; j++)
                dup = seen[j] == h;
            if (!dup) {
                seen[nseen++] = h;
                njobs += h > 0;
            }
        }
    size_t o = 0;
    add(buf, cap, &o, "waiting for %d %s%s: %s ", lack, word, lack == 1 ? "" : "s",
        draining ? "preempting" : "held by");
    int shown = nseen > HOLDERS_SHOWN ? HOLDERS_SHOWN - 1 : nseen;
    for (int j = 0; j < shown; j++) {
        if (j > 0)
            add(buf, cap, &o, j == nseen - 1 ? " and " : ", ");
        int64_t h = seen[j];
        if (h < 0) {
            add(buf, cap, &o, "an inference model of job %" PRId64, -h);
            continue;
        }
        add(buf, cap, &o, "%s%" PRId64, j > 0 ? "" : njobs > 1 ? "jobs " : "job ", h);
        const struct run *v = &s->run[find_run(s, h) < 0 ? 0 : find_run(s, h)];
        if (v->job != h || draining)
            continue; /* victims are named bare; a holder that is no running job: never */
        const char *sep = " (";
        if (v->priority != p->priority) {
            add(buf, cap, &o, "%spriority %d", sep, v->priority);
            sep = ", ";
        }
        if (v->hold != v->priority) {
            add(buf, cap, &o, "%sstarted at %d by waiting", sep, v->hold);
            sep = ", ";
        }
        if (!v->preemptible) {
            add(buf, cap, &o, "%snot preemptible", sep);
            sep = ", ";
        }
        if (v->preempting && !draining) {
            add(buf, cap, &o, "%sbeing preempted", sep);
            sep = ", ";
        }
        if (sep[0] == ',')
            add(buf, cap, &o, ")");
    }
    if (shown < nseen)
        add(buf, cap, &o, " and %d more", nseen - shown);
    free(seen);
}

/* The reason of the job at place i of kind t's order, whose head (the first job that may
 * run) is at h and has the reason head_text (NULL: compute it). */
static void reason_at(const struct sched *s, int t, int i, int h, const char *head_text, char *buf,
                      size_t cap)
{
    const struct kind_state *k = &s->k[t];
    const struct pend *p = &s->pool[k->order[i]];
    if (!quota_ok(s, p))
        quota_reason(s, p, buf, cap);
    else if (i == h) {
        if (head_text)
            snprintf(buf, cap, "%s", head_text);
        else
            head_reason(s, p, buf, cap);
    } else {
        const struct pend *hp = &s->pool[k->order[h]];
        if (hp->priority == p->priority)
            snprintf(buf, cap, "queued behind job %" PRId64 " (%d job%s ahead for %ss)", hp->job, i,
                     i == 1 ? "" : "s", kind_word((device_kind)t));
        else if (hp->eff != hp->priority)
            snprintf(buf, cap, "queued behind job %" PRId64 " (priority %d, raised to %d by waiting)",
                     hp->job, hp->priority, hp->eff);
        else
            snprintf(buf, cap, "queued behind job %" PRId64 " (priority %d)", hp->job, hp->priority);
    }
}

/* The order is a cache of what the queue and the clock say: making it true at `now` from a
 * const caller changes nothing the caller can see (the handle is never a const object). */
static void refresh(const struct sched *s, int t, double now)
{
    reorder((struct sched *)s, t, now);
}

void sched_pending_reason(const struct sched *s, int64_t job, double now, char *buf, size_t cap)
{
    buf[0] = '\0';
    int idx = find_pend(s, job);
    if (idx < 0)
        return;
    int t = s->pool[idx].kind;
    refresh(s, t, now);
    reason_at(s, t, s->pool[idx].pos, head(s, t), NULL, buf, cap);
}

void sched_view(const struct sched *s, double now, void (*fn)(void *ctx, const struct sched_view_job *v),
                void *ctx)
{
    struct sched_view_job v;
    for (int r = 0; r < s->nrun; r++) {
        const struct run *u = &s->run[r];
        v = (struct sched_view_job){.job = u->job,
                                    .kind = u->kind,
                                    .world = u->world,
                                    .priority = u->priority,
                                    .effective = u->hold,
                                    .preemptible = u->preemptible,
                                    .running = true,
                                    .preempting = u->preempting,
                                    .owner = u->owner >= 0 ? s->owners[u->owner].name : "",
                                    .since = u->started};
        fn(ctx, &v);
    }
    const int kinds[2] = {DEVICE_CUDA, DEVICE_CPU};
    for (int ki = 0; ki < 2; ki++) {
        int t = kinds[ki];
        const struct kind_state *k = &s->k[t];
        refresh(s, t, now);
        int h = head(s, t);
        char head_text[sizeof v.reason] = "";
        if (h >= 0)
            head_reason(s, &s->pool[k->order[h]], head_text, sizeof head_text);
        for (int i = 0; i < k->qlen; i++) {
            const struct pend *p = &s->pool[k->order[i]];
            v = (struct sched_view_job){.job = p->job,
                                        .kind = p->kind,
                                        .world = p->world,
                                        .priority = p->priority,
                                        .effective = p->eff,
                                        .preemptible = p->preemptible,
                                        .owner = p->owner >= 0 ? s->owners[p->owner].name : "",
                                        .since = p->since,
                                        .position = i + 1};
            reason_at(s, t, i, h, head_text, v.reason, sizeof v.reason);
            fn(ctx, &v);
        }
    }
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
