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

/* Adds a job to its kind's queue, which is kept in job id order: ids grow with
 * submission, and concurrent submissions may reach the supervisor out of order. */
void sched_enqueue(struct sched *s, int64_t job, device_kind kind, int world);
/* Removes a queued job (cancelled before it started). False if it was not queued. */
bool sched_dequeue(struct sched *s, int64_t job);

/* The next job that can start now: the head of a kind's queue whose slots are all free.
 * Allocates them (their indices into slots[0..world)) and returns true; false when no
 * job can start. Younger jobs never overtake the head of their kind's queue. */
bool sched_next(struct sched *s, int64_t *job, device_kind *kind, int *slots, int *world);

/* Frees the slots a running job holds. */
void sched_release(struct sched *s, int64_t job);

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

/* Why a queued job is waiting, in a sentence; "" when it is not queued. */
void sched_pending_reason(const struct sched *s, int64_t job, char *buf, size_t cap);

/* The job holding slot `i` of `kind`, or 0 when it is free; a negative holder is
 * sched_take's (-job for an inference process holding job's model). */
int64_t sched_slot_holder(const struct sched *s, device_kind kind, int i);

#endif
