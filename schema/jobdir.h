/* jobdir.h — a job's folder on disk, as the server and the worker both see it: complete
 * checkpoints are OUT/ckpt-N (N the optimizer step), one being written is OUT/ckpt-N.tmp,
 * one being deleted OUT/ckpt-N.del; the final model and the rank logs lie in OUT itself.
 * Here: how big the folder is (the server's per-job disk quota), which checkpoints to
 * delete (checkpoint.keep_last) and the quota's size syntax. Knows no tensors, no HTTP. */
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
