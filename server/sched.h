/* sched.h — device slots and the job queue: GPUs and CPU slots, FIFO per device kind
 * with gang allocation (a job starts only when all of its world_size slots are free at
 * once), and the reason a queued job is waiting. Pure bookkeeping: knows no processes,
 * no HTTP, no SQL; the supervisor thread owns it (not thread-safe). */
#ifndef DDPD_SCHED_H
#define DDPD_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../schema/spec.h"

#define SCHED_MAX_SLOTS  1024
#define SCHED_GPU_ID_MAX 64 /* one CUDA_VISIBLE_DEVICES entry, NUL included */

/* The GPU slots of `ddpd serve --gpus ARG`, in slot order, as what each rank's
 * CUDA_VISIBLE_DEVICES must say: "none" is no GPU; "N,M,..." names the devices
 * (numbers or UUIDs, as CUDA_VISIBLE_DEVICES takes them), so `--gpus 2,3` puts slot 0 on
 * GPU 2; "auto" is the `found` devices `ddpd-worker --devices` listed, which it numbered
 * among the server's own CUDA_VISIBLE_DEVICES (`visible`, NULL when unset): device i is
 * the i-th entry of that list, or "i" without one. Fills ids[0..n) and returns n, or -1
 * with `why` for a malformed list, a repeated device or more than `cap`. */
int sched_gpu_ids(const char *arg, int found, const char *visible, char (*ids)[SCHED_GPU_ID_MAX], int cap,
                  char *why, size_t whycap);

/* What `ddpd-worker --devices` said of a GPU, for GET /v1/devices and the dashboard. */
struct sched_gpu_info {
    bool known;     /* false: --devices did not list it (the fields below are empty) */
    bool emulated;  /* a device of the emulated CUDA module (DDPD_CUDA_EMU, tests) */
    int64_t memory; /* bytes */
    char name[256]; /* "NVIDIA H100 80GB HBM3", "ddpd emulated GPU 0" */
    char uuid[48];  /* "GPU-xxxxxxxx-..." */
    /* Its compute capability ("8.6"; "" when --devices did not say: an older worker), and
     * what of the CUDA module runs there (`code`: "sm_80", "compute_90"). A GPU the module
     * holds no code for (no_code) is a slot no job takes: its first kernel would fail. */
    char cc[8];
    bool no_code;
    char code[16];
    char module_code[128]; /* what the module holds: "sm_75 sm_80 ... compute_120" */
};

/* Which of the `found` devices `ddpd-worker --devices` listed (found[j] is its device j,
 * numbered among the server's CUDA_VISIBLE_DEVICES `visible`, NULL when unset) each of the
 * n GPU slots ids[0..n) is: slot i is device j when ids[i] is j's name by sched_gpu_ids'
 * rule for "auto" (the j-th entry of `visible`, or "j") or is j's uuid. Fills out[0..n);
 * a slot that matches none gets {.known = false}. */
void sched_gpu_match(const char (*ids)[SCHED_GPU_ID_MAX], int n, const char *visible,
                     const struct sched_gpu_info *found, int nfound, struct sched_gpu_info *out);

struct sched;

/* `gpus` CUDA devices (indices 0..gpus-1) and `cpu_slots` CPU slots. GPU slot i is
 * device "i" until sched_name_gpus names it. */
struct sched *sched_new(int gpus, int cpu_slots);
/* Names the GPU slots: slot i is device ids[i] (sched_gpu_ids; one entry per GPU slot). */
void sched_name_gpus(struct sched *s, const char (*ids)[SCHED_GPU_ID_MAX]);
/* GPU slot i's device, as its rank's CUDA_VISIBLE_DEVICES names it; borrowed, valid until
 * sched_free. NULL past the GPU slots. */
const char *sched_gpu_device(const struct sched *s, int i);
/* Describes the GPU slots: slot i is info[i] (sched_gpu_match; one entry per GPU slot, or
 * NULL: none known). Copied. A slot whose device the CUDA module holds no code for
 * (no_code) is never given to a job from then on. */
void sched_describe_gpus(struct sched *s, const struct sched_gpu_info *info);
/* What is known of GPU slot i's device; borrowed, valid until sched_free. NULL past the
 * GPU slots; {.known = false} when nothing is. */
const struct sched_gpu_info *sched_gpu_info(const struct sched *s, int i);
void sched_free(struct sched *s);

int sched_slots(const struct sched *s, device_kind kind);
/* The slots a job can be given: sched_slots less the GPUs without code (sched_describe_gpus). */
int sched_usable_slots(const struct sched *s, device_kind kind);

/* False when a job of `world` ranks on `kind` can never run on this server; `why` then
 * says so in a sentence ("world_size 4 needs 4 cpu slots but this server has 2"; for GPUs
 * the module holds no code for: which, their compute capability and the module's code). */
bool sched_fits(const struct sched *s, device_kind kind, int world, char *why, size_t cap);

/* ---- the policy (docs/scheduling.md) ----------------------------------------------------
 * Jobs wait in one queue per device kind, ordered by effective priority (highest first),
 * then by id (FIFO within a priority: ids grow with submission). A job's effective
 * priority is its priority plus one for every `aging_s` seconds it has waited, at most
 * 100 (sched_set_aging): the bound on how long a large low-priority job can starve. The
 * first job of a kind's order that may run (its owner under quota) blocks every job after
 * it in that order (gang scheduling, no backfill): it starts as soon as all of its slots
 * are free at once. Jobs whose owner is at quota are passed over (they wait, saying so)
 * and block nothing. Preemption (sched_preempt) compares the waiting job's base priority
 * with the running jobs' priority as they started: their base priority plus the aging
 * they earned while waiting (a job that reached the top by waiting is not preempted at
 * once by the jobs it waited behind: that would undo the starvation bound). All times are the caller's clock
 * (seconds; the supervisor's monotonic clock, a simulated one in the tests). */

/* A job as the scheduler weighs it. */
struct sched_job {
    int64_t job; /* > 0 */
    device_kind kind;
    int world;
    int priority;      /* 0..100 */
    bool preemptible;  /* false: never chosen by sched_preempt */
    const char *owner; /* copied; NULL or "" for none (no quota applies) */
    double time_limit; /* seconds of running in all, 0 for none (sched_expired) */
    double run_s;      /* seconds it ran in earlier attempts (a preempted job's) */
};

#define SCHED_AGING_S 60.0 /* the default: one point of priority per minute waited */

/* One point of effective priority per `seconds` waited (0: no aging). */
void sched_set_aging(struct sched *s, double seconds);

/* `owner`'s quota: the most GPUs and the most CPU ranks its running jobs may hold at once
 * (-1: no limit). Replaces what was set before; owners never set have no limit. */
void sched_set_limits(struct sched *s, const char *owner, int max_gpus, int max_cpu_ranks);

/* Adds a job to its kind's queue; it has waited since `now` (for aging). A job already
 * queued or running is not added twice. */
void sched_enqueue(struct sched *s, const struct sched_job *j, double now);
/* Removes a queued job (cancelled before it started). False if it was not queued. */
bool sched_dequeue(struct sched *s, int64_t job);

/* The next job that can start at `now` by the policy above. Allocates its slots (their
 * indices into slots[0..world)), records it as running since `now` and returns true;
 * false when no job can start. */
bool sched_next(struct sched *s, double now, int64_t *job, device_kind *kind, int *slots, int *world);

/* Preemption, for the first job of a kind's order that may run but whose slots are not
 * free: when enough running jobs of strictly lower priority (as they started: the policy
 * above) than its base priority, preemptible and not being preempted already,
 * hold slots, chooses the fewest the policy allows: the lowest priority first, then the
 * most recently started, and then drops any chosen job that is not needed. Fills
 * victims[0..n) (n <= cap) and *for_job, marks the victims as being preempted (they hold
 * their slots until sched_release; they are never chosen again, and while any victim
 * drains no further preemption is made for that kind), and returns n; 0 when there is
 * nothing to preempt. One kind per call: call it again for the other kind (a kind whose
 * victims drain answers 0). When more than `cap` victims would be needed it chooses none;
 * cap >= sched_slots of the kind always suffices. */
int sched_preempt(struct sched *s, double now, int64_t *for_job, int64_t *victims, int cap);

/* The running jobs past their time_limit at `now` (run_s + now - started), up to cap, in
 * jobs[]; returns how many. */
int sched_expired(const struct sched *s, double now, int64_t *jobs, int cap);

/* Frees the slots a running job holds and forgets it (it ended, or was preempted: then
 * the caller enqueues it again with its run_s). */
void sched_release(struct sched *s, int64_t job);

/* A row of sched_view. */
struct sched_view_job {
    int64_t job;
    device_kind kind;
    int world;
    int priority, effective; /* base, and with aging (pending: now; running: as it started) */
    bool preemptible, running, preempting;
    const char *owner; /* borrowed for the call; "" for none */
    double since;      /* running: started at; pending: waiting since (the caller's clock) */
    int position;      /* pending: 1-based place in its kind's order; running: 0 */
    char reason[256];  /* pending: why it waits (sched_pending_reason's sentence) */
};

/* Calls fn for every running job (in start order) and then every pending job (per kind,
 * GPUs first, in the order they would start), each with its reason: O(n log n) in all. */
void sched_view(const struct sched *s, double now, void (*fn)(void *ctx, const struct sched_view_job *v),
                void *ctx);

/* One slot of `kind` for a holder that is not a queued job (an inference process,
 * server/inference/: `holder` < 0, by convention -job of the model it holds), taken at
 * once: the lowest free usable slot, only when no job waits in the kind's queue (a job
 * that waits is never overtaken). True with its index in *slot; false when none is free
 * or a job waits. */
bool sched_take(struct sched *s, device_kind kind, int64_t holder, int *slot);
/* Frees slot `i` of `kind` whoever holds it (sched_take's). */
void sched_release_slot(struct sched *s, device_kind kind, int i);
/* Jobs waiting in `kind`'s queue. */
int sched_waiting(const struct sched *s, device_kind kind);

/* Why a queued job is waiting at `now`, in a sentence naming what it waits for ("waiting
 * for 2 GPUs: held by jobs 12 (priority 70) and 15", "quota: alice runs 4 of 4 GPUs",
 * "queued behind job 9 (priority 80)"); "" when it is not queued. */
void sched_pending_reason(const struct sched *s, int64_t job, double now, char *buf, size_t cap);

/* The job holding slot `i` of `kind`, or 0 when it is free; a negative holder is
 * sched_take's (-job for an inference process holding job's model). */
int64_t sched_slot_holder(const struct sched *s, device_kind kind, int i);

#endif
