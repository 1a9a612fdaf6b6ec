/* checkpoint.h — model and optimizer state to and from safetensors (CONTRACT.md §4):
 * `model.safetensors` with nn.Sequential state_dict names, `optim.safetensors` with
 * "<param>.<state>" names and the training position in its metadata. A checkpoint
 * directory is written under a temporary name and renamed: never a torn checkpoint. */
#ifndef DDPD_CHECKPOINT_H
#define DDPD_CHECKPOINT_H

#include <stdint.h>

#include "../schema/err.h"
#include "nn.h"
#include "optim.h"

/* Where training stands after an optimizer step: `step` optimizer steps done in all,
 * `epoch_step` of them in epoch `epoch`. Each rank derives its micro-batch position
 * from epoch_step (ranks may hold different batch counts under join). */
struct train_pos {
    int64_t step, epoch, epoch_step;
};

/* Loads weights from a safetensors file into the model: every parameter must be there
 * with its shape; extra tensors are an error too (a different model). DDPD_EDATA names
 * the file and the tensor. */
ddpd_err ckpt_load_weights(struct model *m, const char *path, struct ddpd_error *err);
/* The same from an open descriptor (steals `fd`); `name` names the file in errors. */
ddpd_err ckpt_load_weights_fd(struct model *m, int fd, const char *name, struct ddpd_error *err);

/* Writes model.safetensors and optim.safetensors into `dir` (created; must not exist
 * yet unless `replace`), atomically: files are written into "<dir>.tmp" which is then
 * renamed. With replace = 0 and dir existing, DDPD_EIO. */
ddpd_err ckpt_save_dir(const char *dir, struct model *m, struct optim *o,
                       const struct train_pos *pos, struct ddpd_error *err);

/* Writes model.safetensors and optim.safetensors into an existing directory, each file
 * atomically (the final weights of a run). */
ddpd_err ckpt_save_files(const char *dir, struct model *m, struct optim *o,
                         const struct train_pos *pos, struct ddpd_error *err);

/* Restores model, optimizer and position from a directory written by either. */
ddpd_err ckpt_load_dir(const char *dir, struct model *m, struct optim *o, struct train_pos *pos,
                       struct ddpd_error *err);

#endif
