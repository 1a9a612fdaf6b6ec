/* train.h — one rank's training loop: batches -> forward -> loss -> backward ->
 * optimizer, with logging, checkpoints and resume. The algorithm reads top to bottom in
 * train.c; everything it calls lives in its own module. */
#ifndef DDPD_TRAIN_H
#define DDPD_TRAIN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "../schema/err.h"
#include "../schema/spec.h"
#include "comm.h"
#include "dev.h"

struct train_config {
    const struct spec *spec; /* borrowed */
    int rank, world_size;
    const char *data_dir;           /* where data paths and init.from are resolved */
    const char *out_dir;            /* checkpoints and the final model (rank 0 writes them) */
    const char *resume;             /* a checkpoint directory to continue from, or NULL */
    bool resume_force;              /* resume even on data files that changed since it */
    const char *init_path;          /* init.from_job's weights as the server resolved them, or NULL */
    int64_t disk_quota;             /* bytes the job folder may hold (rank 0 checks before each
                                     * checkpoint); 0 = no quota */
    volatile sig_atomic_t *cancel;  /* set by SIGTERM: stop at the next micro-batch */
    volatile sig_atomic_t *preempt; /* set by SIGUSR1: checkpoint at the next optimizer step
                                     * (the same on every rank) and stop there; may be NULL */
    int64_t *preempted_at;          /* out, may be NULL: the step of that checkpoint when the run
                                     * stopped for it (train_run returns DDPD_OK), else 0 */
    volatile sig_atomic_t *in_loop; /* set here on entering the training loop; before
                                     * that the SIGTERM handler may end the process */
    struct comm *comm;              /* the group, NULL for a single rank without DDP */
    struct dev dev;                 /* the compute backend (borrowed; the caller made it) */
    int64_t max_rank_memory;        /* bytes a rank may use (the server's --max-rank-memory), 0 = no
                                     * limit but this machine's memory */
    int64_t stop_at;                /* a pause: stop after this step with its checkpoint and no
                                     * final model (the schedules stay the spec's); 0 = none */
};

/* Runs the job to the end. Emits start, loss, checkpoint and done events (emit.h).
 * Returns DDPD_OK, or an error with `err` filled (the caller turns it into an `error`
 * event and an exit code). A preemption (cfg->preempt) ends it with DDPD_OK early, after
 * the checkpoint ckpt-S of the step S the ranks agreed on, without the final model or a
 * `done` event, and *cfg->preempted_at = S; a preemption whose step is the job's last
 * just finishes the job (nothing to resume). */
ddpd_err train_run(const struct train_config *cfg, struct ddpd_error *err);

/* The bytes of the batch buffers a rank allocates (inputs, targets, labels, loss gradient,
 * the step's losses, eval's logits; host and device together) for micro-batches of `rows`
 * rows and `kmax` micro-batches a step: what spec_memory_estimate's `batch` bounds. */
int64_t train_batch_bytes(const struct spec *s, int64_t rows, int64_t kmax, bool eval);

/* The planner's check of the training batches before a job is accepted, for `rows`
 * samples sharded over `world_size` ranks: DDPD_ESPEC at the layer's path (model[3])
 * when a batch that the job trains would give a batchnorm layer one value per channel
 * (BatchNorm1d on a batch of 1: PyTorch's "Expected more than 1 value per channel when
 * training"), naming the rank, the batch and its size. Every rank checks its own shard
 * the same way before its first step ({rank} files, which the planner cannot see). */
ddpd_err train_check_batches(const struct spec *s, int64_t rows, int world_size, struct ddpd_error *err);

/* The planner's check of `eval.data` (CONTRACT.md §2a) before a job is accepted: what
 * dataset_check finds in the eval data, with the error's path and message naming
 * eval.data. DDPD_OK without eval, and for {rank} files (only the ranks see them). Sets
 * mem->eval_rows to the eval set's rows (0 when unknown: no eval, {rank} files) and raises
 * mem->file_bytes to the eval file read whole, for spec_memory_estimate. */
ddpd_err train_check_eval_data(const struct spec *s, const char *data_dir, int world_size,
                               struct spec_memory_in *mem, struct ddpd_error *err);

#endif
