/* model.h — an nn.Sequential of linear layers and activations with hand-written backward.
 * Parameters are kept in registration order (0.weight, 0.bias, 2.weight, ...) as
 * PyTorch's state_dict names them. Knows the compute backend, nothing of data, DDP or
 * the optimizer: backward reports each parameter whose gradient is complete through a
 * callback, which is where DDP hooks in. */
#ifndef DDPD_MODEL_H
#define DDPD_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "../schema/spec.h"
#include "dev.h"

struct param {
    char name[32]; /* "0.weight" */
    int index;     /* position in registration order */
    int layer;     /* index into the spec's model */
    int ndim;      /* 2 for weights [out,in], 1 for biases [out] */
    int64_t shape[2];
    int64_t numel;
    float *data; /* device memory, owned by the model */
    float *grad; /* device memory; owned by the model unless re-pointed (see below) */
};

struct model;

/* Builds the model of `spec` on `dev` for micro-batches of at most `max_batch` rows,
 * with parameters from PyTorch's default nn.Linear init distribution (uniform in
 * ±1/sqrt(in) for weight and bias) drawn from spec->init_seed. Gradients start zero.
 * Returns NULL only on out of memory. */
struct model *model_new(struct dev dev, const struct spec *spec, int64_t max_batch);
/* The same, saying why it failed: DDPD_EDEVICE (a rank's exit 4) naming the tensor that
 * could not be allocated and its size. Sizes are checked: a max_batch or a width near
 * the caps fails here instead of wrapping into a small buffer. `err` may be NULL. */
struct model *model_new_err(struct dev dev, const struct spec *spec, int64_t max_batch,
                            struct ddpd_error *err);
void model_free(struct model *m);

/* The parameters model_new would make for `spec` (names, shapes, numel; data and grad
 * NULL), without allocating them: out[] has room for 2 * SPEC_MAX_LAYERS. Returns their
 * count, or -1 when memory ran out. */
int model_spec_params(const struct spec *spec, struct param *out);

struct dev model_dev(const struct model *m);       /* the backend it lives on */
int model_param_count(const struct model *m);      /* tensors */
int64_t model_numel(const struct model *m);        /* scalars */
struct param *model_param(struct model *m, int i); /* borrowed, 0 <= i < count */

/* Forward pass of x[B,in] (device memory, B <= max_batch). Returns the output
 * [B,out] (borrowed: valid until the next forward). Keeps the activations backward needs. */
const float *model_forward(struct model *m, const float *x, int64_t batch);

/* Training mode (the default) or eval mode, as nn.Module.train(training): dropout and
 * BatchNorm act by it. */
void model_set_training(struct model *m, bool training);

/* Called during backward as soon as param `index`'s gradient for this backward has been
 * accumulated into its ->grad. Fires once per parameter, last layer first. */
typedef void (*model_grad_ready_fn)(void *ctx, int index);

/* Backward of the last forward given dy[B,out] = dLoss/dOutput (device memory).
 * Accumulates (+=) into every param->grad, as autograd does, so micro-batches add up
 * until model_zero_grad. `ready` may be NULL. */
void model_backward(struct model *m, const float *dy, model_grad_ready_fn ready, void *ctx);

/* Like PyTorch's zero_grad(set_to_none=True): the next backward writes the gradients
 * instead of adding to them (same bits as adding to zeros, one pass fewer). Until that
 * backward, ->grad still holds the old values. */
void model_zero_grad(struct model *m);

/* Re-points param i's gradient at `grad` (device memory of numel floats that the caller
 * owns and keeps alive until model_free), copying the current gradient into it. DDP
 * uses this to make gradients views into its flat buckets. */
void model_set_grad_storage(struct model *m, int i, float *grad);

#endif
