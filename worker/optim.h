/* optim.h — SGD and AdamW with PyTorch 1.13's update rules to the letter (SGD: first
 * momentum step buf = grad, dampening, nesterov, L2 weight_decay added to the grad;
 * AdamW: decoupled weight decay, bias corrections). Knows the model's parameters and
 * the compute backend, nothing of data or DDP. */
#ifndef DDPD_OPTIM_H
#define DDPD_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "../schema/spec.h"
#include "model.h"

struct optim;

struct optim *optim_new(const struct spec_optim *o, struct model *m);
void optim_free(struct optim *o);

/* One update of every parameter from its ->grad, at the lr set last (optim_set_lr;
 * the spec's lr until then). */
void optim_step(struct optim *o);

/* The lr of the next optim_step: AdamW's decay and step size use it, as a
 * torch.optim.lr_scheduler.LambdaLR feeding the optimizer would. */
void optim_set_lr(struct optim *o, double lr);

/* The lr at optimizer step `step` (from 1) under the spec's schedule (CONTRACT.md §2a):
 * lr*s/W while s <= W (warmup_steps); after it, with p = min(1, (s-W)/(S-W)), constant
 * lr, linear lr + (min_lr-lr)*p, cosine min_lr + (lr-min_lr)*(1+cos(pi*p))/2. S is
 * total_steps, or `job_steps` (the job's number of optimizer steps) when that is 0; a
 * step past S keeps p = 1. In double, as Python computes it. */
double optim_schedule_lr(const struct spec_optim *o, int64_t step, int64_t job_steps);

/* torch.nn.utils.clip_grad_norm_(params, max_norm) of PyTorch 1.13 over every
 * parameter's ->grad: the L2 norm of the per-tensor L2 norms (each a float32, as
 * torch.norm returns), and when max_norm/(norm+1e-6) (float32 arithmetic) is below 1,
 * every gradient scaled by it. Returns the norm before clipping. */
double optim_clip_grad_norm(struct optim *o, double max_norm);

int64_t optim_steps(const struct optim *o); /* updates applied so far */

/* State tensors for checkpoints, per parameter in registration order:
 * "<param>.momentum_buffer" (sgd with momentum), "<param>.exp_avg", "<param>.exp_avg_sq"
 * (adamw). They exist from optim_new on (zeros), so a loader can fill them before
 * optim_restore; a momentum buffer counts as created (PyTorch: not None) once a step
 * has run or optim_restore was given steps > 0, and until then the first step sets it
 * to the gradient whatever it holds. */
int optim_state_count(const struct optim *o);
/* i-th state tensor: its name (written into name, cap bytes), device pointer and numel;
 * ndim/shape as the parameter's. */
float *optim_state_at(struct optim *o, int i, char *name, int cap, const struct param **like);
/* Marks that state exists (restored from a checkpoint) and sets the step count. */
void optim_restore(struct optim *o, int64_t steps);

/* The scalars of one update as PyTorch's Python derives them from the spec's doubles
 * (dev.h): `first` = the momentum buffer does not exist yet; `step` counts from 1. */
struct sgd_hyper optim_sgd_hyper(const struct spec_optim *o, bool first);
struct adamw_hyper optim_adamw_hyper(const struct spec_optim *o, int64_t step);

#endif
