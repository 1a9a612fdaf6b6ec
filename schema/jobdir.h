/* jobdir.h — a job's folder on disk, as the server and the worker both see it: complete
 * checkpoints are OUT/ckpt-N (N the optimizer step), one being written is OUT/ckpt-N.tmp,
 * one being deleted OUT/ckpt-N.del; the final model and the rank logs lie in OUT itself.
 * Here: every name in it (the one place that spells them), how big the folder is (the
 * server's per-job disk quota), which checkpoints to delete (checkpoint.keep_last) and
 * the quota's size syntax. Knows no tensors, no HTTP. */
#ifndef DDPD_JOBDIR_H
#define DDPD_JOBDIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* The default of `ddpd serve --job-disk-quota`: 10 GiB per job folder. */
#define JOBDIR_DEFAULT_QUOTA ((int64_t)10 << 30)

/* Folders deeper than this under a job folder are not walked (the layout has one level;
 * the cap only stops a loop of bind mounts or a hostile tree). */
#define JOBDIR_MAX_DEPTH 16

/* ---- names: the one place that spells the layout ----
 *   JOBS/ID                  a job's folder (ddpd serve --jobs-dir JOBS, by default
 *                            DATA/jobs beside the database), called OUT below
 *   OUT/rank-R.log           rank R's stderr; OUT/rank-R.nccl.log NCCL's own log
 *   OUT/ckpt-N               a complete checkpoint (N the optimizer step)
 *   OUT/ckpt-N.tmp, .del     one being written, one being deleted
 *   OUT/best-N               the best checkpoint (checkpoint.keep_best): the eval of step N
 *                            scored best so far; one at a time, outside keep_last's count
 *   OUT/best-N.tmp           one being written (the one it replaces goes once it is whole)
 *   DIR/model.safetensors    the weights, in OUT (final) or in a checkpoint;
 *                            model-rank-R.safetensors rank R's replica of them
 *   DIR/optim.safetensors    rank 0's optimizer state; optim-rank-R.safetensors rank R's
 *   OUT/issuer.log           the group id issuer's stderr (more than one rank)
 *   OUT/srun.log, OUT/srun-stdin.json   srun's own output and the tasks' document (Slurm)
 * Each function writes the name into out[cap] and returns false when it does not fit. */
#define JOBDIR_JOBS       "jobs"  /* the default JOBS's name in the server's data folder */
#define JOBDIR_MODEL      "model" /* the weights' files: jobdir_rank_file(JOBDIR_MODEL, R) */
#define JOBDIR_OPTIM      "optim" /* the optimizer state's files */
#define JOBDIR_MODEL_FILE JOBDIR_MODEL ".safetensors"
#define JOBDIR_ISSUER_LOG "issuer.log"
#define JOBDIR_SRUN_LOG   "srun.log"
#define JOBDIR_SRUN_STDIN "srun-stdin.json"

bool jobdir_job_path(char *out, size_t cap, const char *jobs_dir, int64_t job);  /* JOBS/ID */
bool jobdir_ckpt_path(char *out, size_t cap, const char *out_dir, int64_t step); /* OUT/ckpt-N */
bool jobdir_tmp_path(char *out, size_t cap, const char *ckpt_dir);               /* OUT/ckpt-N.tmp */
bool jobdir_rank_log_path(char *out, size_t cap, const char *out_dir, int rank); /* OUT/rank-R.log */
bool jobdir_nccl_log_path(char *out, size_t cap, const char *out_dir, int rank); /* OUT/rank-R.nccl.log */
bool jobdir_model_path(char *out, size_t cap, const char *dir);                  /* DIR/model.safetensors */
bool jobdir_file_path(char *out, size_t cap, const char *dir, const char *name); /* DIR/NAME */
/* "<what>.safetensors" for rank 0, "<what>-rank-R.safetensors" for R > 0. */
bool jobdir_rank_file(char *out, size_t cap, const char *what, int rank);

/* The newest checkpoint under `out_dir` that a run can resume from (a complete "ckpt-N"
 * holding rank 0's optimizer state) into path[cap]; false when there is none. */
bool jobdir_latest_ckpt(const char *out_dir, char *path, size_t cap);

/* The steps of the complete checkpoints under `out_dir` (as jobdir_latest_ckpt counts
 * them: "ckpt-N" holding rank 0's optimizer state), oldest first, into *steps (malloc'd,
 * the caller frees; NULL when there are none) and their number into *n. A folder that
 * cannot be read has none. False only when memory ran out. */
bool jobdir_ckpt_list(const char *out_dir, int64_t **steps, size_t *n);

/* Makes `dst` (a checkpoint folder "OUT/ckpt-N" that does not exist yet) hold the files
 * of the complete checkpoint `src` (another job's), as hard links: no byte is copied and
 * neither job's pruning or deletion touches the other's files (checkpoint files are
 * never changed once renamed into place). Built as "dst.tmp" and renamed into place, so
 * a crash leaves no half a checkpoint; `dst`'s parent is created (0700) when missing.
 * Only regular files directly in `src` are linked (links and folders are skipped).
 * DDPD_OK when `dst` already exists (an earlier start made it); DDPD_EDATA naming `src`
 * when it is gone or incomplete; DDPD_EIO naming the file that could not be linked. */
ddpd_err jobdir_ckpt_link(const char *src, const char *dst, struct ddpd_error *err);

/* The weights init.from_job names, in job folder `job_dir`, into path[cap]: with step >= 0
 * "ckpt-STEP/model.safetensors" of a complete checkpoint, else the final model, else the
 * newest checkpoint's. False when there is none (or the name does not fit). */
bool jobdir_init_weights(const char *job_dir, int64_t step, char *path, size_t cap);

/* True when `name` is a complete checkpoint's folder name "ckpt-N" (N decimal, no sign,
 * no suffix such as ".tmp" or ".del"), with N in *step. */
bool jobdir_ckpt_step(const char *name, int64_t *step);

/* The bytes of every regular file under `dir` (their sizes, recursively, links not
 * followed). DDPD_EIO naming the path when it cannot be read; a file that vanishes while
 * the folder is walked (a checkpoint being pruned) is simply not counted. */
ddpd_err jobdir_bytes(const char *dir, int64_t *bytes, struct ddpd_error *err);

/* DDPD_EIO with a sentence naming the quota, the folder and the bytes when the folder
 * with `adding` more bytes (what the caller is about to write, `what`: "checkpoint
 * ckpt-40") would hold more than `quota` bytes. quota <= 0 means no quota. */
ddpd_err jobdir_check_quota(const char *dir, int64_t quota, int64_t adding, const char *what,
                            struct ddpd_error *err);

/* The best checkpoint's folder OUT/best-N (checkpoint.keep_best). */
bool jobdir_best_path(char *out, size_t cap, const char *out_dir, int64_t step);
/* The step of the best checkpoint under `out_dir` into *step (the highest N of the "best-N"
 * folders: a crash between writing a new one and removing the old leaves two, and the
 * newer is the better); false when there is none. */
bool jobdir_best_find(const char *out_dir, int64_t *step);
/* The folder that holds step `step`'s checkpoint, "ckpt-N" or else "best-N", into
 * out[cap]; false when neither exists. */
bool jobdir_step_dir(char *out, size_t cap, const char *out_dir, int64_t step);
/* Removes every "best-M" folder under `dir` but "best-<keep>" (the one just renamed into
 * place), and the torn "best-M.tmp" writes of a crash. DDPD_EIO naming the folder that
 * cannot be removed. */
ddpd_err jobdir_best_prune(const char *dir, int64_t keep, struct ddpd_error *err);

/* Deletes the oldest complete checkpoints under `dir` until `keep_last` remain, never
 * "ckpt-<newest>" (the one just written, which may have a smaller step than a stale
 * folder of another run). Crash-safe: each folder is first renamed to "ckpt-N.del" (so
 * it stops being a checkpoint at one instant, and only after the newer ones are
 * complete), then removed; leftovers "ckpt-M.del" of a crash, and torn "ckpt-M.tmp" with
 * M < newest, are removed too. Fills *pruned (may be NULL) with how many checkpoints
 * went. DDPD_EIO naming the folder when one cannot be removed. */
ddpd_err jobdir_prune(const char *dir, int64_t keep_last, int64_t newest, int *pruned,
                      struct ddpd_error *err);

/* For a checkpoint folder `ckpt_dir` that does not exist: DDPD_EDATA with a sentence
 * saying so, that checkpoint.keep_last prunes old ones, and which complete checkpoints
 * its parent folder holds (the newest few), so that a --resume of a pruned step says
 * what to resume from instead. */
ddpd_err jobdir_missing_ckpt(const char *ckpt_dir, struct ddpd_error *err);

/* Parses a size: a whole number of bytes with an optional binary unit K, M, G or T
 * (case-insensitive, an optional "B" or "iB" after it: "10G", "512MiB", "1048576"); "0" or
 * "none" is no quota (0). False for anything else or more than INT64_MAX bytes. */
bool jobdir_size_parse(const char *text, int64_t *bytes);

#endif
