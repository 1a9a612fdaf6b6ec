/* checkpoint.h — model and optimizer state to and from safetensors (CONTRACT.md §4):
 * `model.safetensors` with nn.Sequential state_dict names, `optim.safetensors` with
 * "<param>.<state>" names and the training position in its metadata. A checkpoint
 * directory is written under a temporary name and renamed: never a torn checkpoint. */
#ifndef DDPD_CHECKPOINT_H
#define DDPD_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../schema/err.h"
#include "model.h"
#include "optim.h"
#include "watch.h"

/* Where training stands after an optimizer step: `step` optimizer steps done in all,
 * `epoch_step` of them in epoch `epoch`. Each rank derives its micro-batch position
 * from epoch_step (ranks may hold different batch counts under join). */
struct train_pos {
    int64_t step, epoch, epoch_step;
    /* early_stop's and checkpoint.keep_best's state after this step (watch.h): in every
     * file's metadata as "watch", so that a resumed job decides as an uninterrupted one;
     * zero (no best yet) in checkpoints written before it was recorded. */
    struct watch_state stop, best;
};

/* Loads weights from a safetensors file into the model: every parameter must be there
 * with its shape; extra tensors are an error too (a different model). DDPD_EDATA names
 * the file and the tensor. */
ddpd_err checkpoint_load_weights(struct model *m, const char *path, struct ddpd_error *err);
/* The same from an open descriptor (steals `fd`); `name` names the file in errors. */
ddpd_err checkpoint_load_weights_fd(struct model *m, int fd, const char *name, struct ddpd_error *err);

/* A checkpoint folder holds model.safetensors (the current weights: those of the lowest
 * rank that ran the step itself) and optim.safetensors (rank 0's optimizer state, the
 * contract's name). With per-rank state (a job of several ranks with join on: ranks
 * that joined early stepped their optimizer less often, DDP.md §4.5, so their optimizer
 * states differ for good, and their replicas differ until the next join's final sync)
 * every rank R > 0 adds optim-rank-R.safetensors (its state) and, when the replicas
 * differ (a checkpoint inside an epoch), model-rank-R.safetensors (its replica). Every
 * file's metadata holds format, step, epoch, epoch_step, world_size, rank, per_rank,
 * replicas and the writing rank's optim_steps, and data_fingerprints: the record of the
 * data files the job reads (fingerprint.h), every rank's {rank} files included; absent
 * for synthetic data and in checkpoints written before it was recorded. Files are created
 * 0600, folders 0700. */

/* Starts a checkpoint folder `dir`: makes "<dir>.tmp" (removing a torn leftover of an
 * earlier crash) and writes its name into tmp[cap]. DDPD_EIO when dir exists already. */
ddpd_err checkpoint_dir_begin(const char *dir, char *tmp, size_t cap, struct ddpd_error *err);

/* One rank's share of a checkpoint, written into the existing folder `dir`:
 * model.safetensors when `with_model` (exactly one rank, whose weights are current);
 * optim.safetensors on rank 0; with `per_rank`, optim-rank-R on a rank R > 0, and with
 * `replicas` too, model-rank-R. Each file is written atomically. `data_record` (borrowed,
 * NULL for none) is the data_fingerprints metadata of every file. */
ddpd_err checkpoint_write_rank(const char *dir, struct model *m, struct optim *o, const struct train_pos *pos,
                               int rank, int world, bool with_model, bool per_rank, bool replicas,
                               const char *data_record, struct ddpd_error *err);

/* Renames tmp into place as dir (and syncs the parent folder). */
ddpd_err checkpoint_dir_commit(const char *tmp, const char *dir, struct ddpd_error *err);

/* Restores rank `rank`'s replica and optimizer state and the position from a folder
 * written by the functions above: its own files with per-rank state, else
 * model.safetensors and optim.safetensors. A checkpoint of another world size is
 * DDPD_ESPEC naming world_size; one without world_size (written before it was recorded)
 * gives every rank model.safetensors and optim.safetensors. */
ddpd_err checkpoint_load_dir(const char *dir, struct model *m, struct optim *o, int rank, int world,
                             struct train_pos *pos, struct ddpd_error *err);

/* The data_fingerprints record of the checkpoint folder `dir` (read from its
 * model.safetensors' header) into *record, a new string the caller frees, or NULL when the
 * checkpoint has none; its step into *step (may be NULL). The errors of a file that cannot
 * be read are safetensors_read's. */
ddpd_err checkpoint_data_record(const char *dir, char **record, int64_t *step, struct ddpd_error *err);

/* At least the bytes one rank's checkpoint_write_rank (with the model) writes for this
 * model and optimizer (data plus a bound on the headers, the data record's included): what
 * the disk quota is checked against before a checkpoint is written. */
int64_t checkpoint_bytes_bound(struct model *m, struct optim *o, const char *data_record);

#endif
