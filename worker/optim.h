/* optim.h — SGD and AdamW with PyTorch 1.13's update rules to the letter (SGD: first
 * momentum step buf = grad, dampening, nesterov, L2 weight_decay added to the grad;
 * AdamW: decoupled weight decay, bias corrections). Knows the model's parameters and
 * the compute backend, nothing of data or DDP. */
#ifndef DDPD_OPTIM_H
#define DDPD_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "../schema/spec.h"
#include "nn.h"

struct optim;

struct optim *optim_new(const struct spec_optim *o, struct model *m);
void optim_free(struct optim *o);

/* One update of every parameter from its ->grad. */
void optim_step(struct optim *o);

int64_t optim_steps(const struct optim *o); /* updates applied so far */

/* State tensors for checkpoints: "<param>.momentum_buffer" (sgd with momentum, once
 * created), "<param>.exp_avg", "<param>.exp_avg_sq" (adamw). */
int optim_state_count(const struct optim *o);
/* i-th state tensor: its name (written into name, cap bytes), device pointer and numel;
 * ndim/shape as the parameter's. */
float *optim_state_at(struct optim *o, int i, char *name, int cap, const struct param **like);
/* Marks that state exists (restored from a checkpoint) and sets the step count. */
void optim_restore(struct optim *o, int64_t steps);

#endif
