/* super.h — the supervisor: one thread that owns job execution. It schedules queued jobs
 * onto slots (sched.c), starts their processes (launch.c), turns worker output into
 * stored and published events (store.c, hub.c), moves jobs through their states
 * (queued -> starting -> running -> succeeded | failed | cancelled), restarts failed jobs
 * from their latest checkpoint, and cleans up after a server that died. HTTP handlers
 * talk to it only through the functions below (a queue and a wake-up). */
#ifndef DDPD_SUPER_H
#define DDPD_SUPER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../schema/err.h"
#include "../schema/spec.h"
#include "sched.h"

struct store;
struct hub;
struct json_t;
struct launcher;

struct super_opts {
    const char *worker;   /* path of ddpd-worker */
    const char *data_dir; /* absolute; the workers resolve data paths there */
    const char *jobs_dir; /* each job's files go to JOBS_DIR/<id>/ */
    int gpus, cpu_slots;
    /* The CUDA device of GPU slot i, as its rank's CUDA_VISIBLE_DEVICES names it
     * (sched_gpu_ids); gpus entries, borrowed. NULL: slot i is device "i". */
    const char (*gpu_ids)[SCHED_GPU_ID_MAX];
    /* What `ddpd-worker --devices` said of GPU slot i's device (sched_gpu_match), for
     * GET /v1/devices; gpus entries, borrowed. NULL: nothing is known. */
    const struct sched_gpu_info *gpu_info;
    struct store *store;     /* borrowed */
    struct hub *hub;         /* borrowed */
    double grace_s;          /* SIGTERM -> SIGKILL; default 5 */
    bool finish_on_shutdown; /* super_stop waits for running jobs instead of cancelling */
    /* Seconds a preempted job has to reach its checkpoint before it is stopped and
     * restarts from its last one (ddpd serve --preempt-grace; a spec's preempt_grace wins);
     * 0: SUPER_PREEMPT_GRACE_S. */
    double preempt_grace;
    /* One point of effective priority per this many seconds waited (ddpd serve
     * --priority-age-s); 0: SCHED_AGING_S; < 0: no aging. */
    double priority_age_s;
    int64_t max_rank_memory; /* bytes a rank may need, sent to every rank (0 = no limit) */
    /* What runs the ranks (launch.h), borrowed; NULL: the local launcher, on the slots
     * above. A launcher that queues (launcher_queues: Slurm) gets every job as soon as it
     * is queued: it places the ranks, the slots are not counted, and a job waits as
     * `queued` with the launcher's pending reason. */
    const struct launcher *launcher;
    /* Bytes each job's folder and its stored events may hold together (ddpd serve
     * --job-disk-quota); 0 = no quota. The ranks get it in their stdin document (rank 0
     * checks its folder before each checkpoint), and the supervisor measures the folder of
     * every running job every SUPER_QUOTA_CHECK_S (rank logs count too), adds the bytes of
     * its stored events (store_job_usage) and fails a job that is over it. */
    int64_t job_disk_quota;
};

#define SUPER_QUOTA_CHECK_S   1.0
#define SUPER_PREEMPT_GRACE_S 60.0

/* Recovers from an earlier server (jobs left starting/running: their processes are
 * killed, then each is requeued when it has restarts left, else failed with "server
 * restarted"; queued jobs are queued again in order), then starts the thread. */
struct super *super_start(const struct super_opts *o, struct ddpd_error *err);

/* Stops: cancels running jobs (or waits for them with finish_on_shutdown), flushes, joins
 * the thread. NULL is a no-op. */
void super_stop(struct super *s);

/* A job just inserted as queued with its queued event (store_job_new.queued_event):
 * schedule it. `spec_text` (taken, malloc'd) is the spec as stored, with the spec's
 * world_size, device and max_restarts and the job's created_at; with spec_text NULL the
 * supervisor reads the job from the store (and stores a queued event itself). */
void super_submit(struct super *s, int64_t job, char *spec_text, int world_size, device_kind device,
                  int max_restarts, double created_at);

/* Calls fn(ctx) on the supervisor's thread, under its lock, each time a job has reached
 * a final state (its state stored): fn must not block or call the supervisor (the sweep
 * controller's wake-up). NULL removes it; once super_on_end returns, the old fn is not
 * running and will not be called. */
void super_on_end(struct super *s, void (*fn)(void *ctx), void *ctx);

/* Cancels a queued or running job. DDPD_ENOTFOUND for an unknown job, DDPD_ECONFLICT
 * when it has already finished. */
ddpd_err super_cancel(struct super *s, int64_t job, struct ddpd_error *err);

/* Deletes a finished job: its rows and events from the store, its history from the hub
 * and its folder under jobs_dir, on the supervisor's thread (between two turns of its
 * loop); waits for it. DDPD_ENOTFOUND for an unknown job, DDPD_ECONFLICT when it has not
 * finished (store_job_delete's errors, in `err`). Any thread but the supervisor's. */
ddpd_err super_delete(struct super *s, int64_t job, struct ddpd_error *err);

/* Asks a running job to stop at its next optimizer step with a checkpoint and wait in the
 * queue as `preempted` (it resumes from that checkpoint when the scheduler starts it
 * again; not a restart). `by` says who asked ("alice"). DDPD_ENOTFOUND for an unknown
 * job, DDPD_ECONFLICT when it is not running (or starting) or the launcher places jobs
 * itself (Slurm). Any thread but the supervisor's. */
ddpd_err super_preempt(struct super *s, int64_t job, const char *by, struct ddpd_error *err);

/* Why queued job `job` waits, now ("queued behind job 7 (3 earlier jobs waiting for cpu
 * slots)"): true with `buf` set when the scheduler holds it queued. Asked when a job is
 * shown, not stored: every start or end would change the reason of every queued job.
 * False under Slurm, whose reasons (squeue) are stored. Any thread. */
bool super_pending_reason(struct super *s, int64_t job, char *buf, size_t cap);

/* False with `why` when a job of `world` ranks on `kind` can never run here, and *path
 * the spec key to blame: "device" when this server has no slot of that kind at all,
 * else "world_size". */
bool super_fits(struct super *s, device_kind kind, int world, char *why, size_t cap, const char **path);
device_kind super_default_device(const struct super *s);

/* One GPU slot for an inference process holding job `job`'s model (server/inference/),
 * as a 1-rank job would hold it but taken at once, never ahead of a job that waits for
 * GPUs (sched_take). 1 with the slot in *slot and its device, as CUDA_VISIBLE_DEVICES
 * names it, in device[cap]; else `why` (a sentence) and 0 when no GPU is free now or a
 * job waits for one (try again later), -1 when none ever will be: the server has no GPU
 * it may use, or its launcher places jobs itself (Slurm: this host's GPUs are not the
 * server's to give). Any thread. */
int super_gpu_take(struct super *s, int64_t job, int *slot, char *device, size_t cap, char *why,
                   size_t whycap);
/* True when a job waits for a GPU: an idle inference model gives its slot up then
 * (training comes first). Any thread. */
bool super_gpu_wanted(struct super *s);
/* Gives back a slot super_gpu_take gave (once the process that used it has ended), and
 * wakes the supervisor: a job waiting for it may start. Any thread. */
void super_gpu_give(struct super *s, int slot);

/* {"gpus":[{"index":0,"job":7|null,...},...],"cpu_slots":[...]}, the launcher's answer
 * (launcher_devices_json): a new reference. */
struct json_t *super_devices(struct super *s);

/* The queue as GET /v1/queue shows it (docs/api.md), from the scheduler's own view
 * (sched_view): {"running": [...] in start order, "pending": [...] in the order they would
 * start (GPU jobs first, then CPU jobs) cut to `limit` (1..SUPER_QUEUE_LIMIT_MAX),
 * "pending_total": N, "slots": {"gpus": N, "cpu": M}}; each job's id, name, state, owner,
 * priority, preemptible, device, world_size and, running, its slots, running_s,
 * time_limit and preempting, or, pending, its effective_priority, waited_s, position and
 * reason. A new reference; NULL when the store cannot be read (`err` says why). Any
 * thread but the supervisor's (super_queue.c). */
#define SUPER_QUEUE_LIMIT_DEFAULT 500
#define SUPER_QUEUE_LIMIT_MAX     10000
struct json_t *super_queue(struct super *s, int limit, struct ddpd_error *err);

#endif
