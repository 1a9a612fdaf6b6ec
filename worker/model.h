/* model.h — the model of a spec's layer tree (CONTRACT.md §2a: linear, activations,
 * embedding, position, layernorm, attention, residual, dropout, and the conv-net layers
 * conv2d, maxpool2d, avgpool2d, batchnorm, flatten) with hand-written backward, on
 * tensors whose first dimension is the batch. Parameters and buffers are kept in
 * registration order (0.weight, 0.bias, 2.1.qkv.weight, 1.running_mean, ...) as
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
    char name[64]; /* "0.weight", "2.1.qkv.weight" */
    int index;     /* position in registration order */
    int layer;     /* index into the spec's layers (the flat preorder list) */
    int ndim;      /* 2 for weights [out,in], 1 for biases [out], 4 for conv2d [out,in,kh,kw] */
    int64_t shape[4];
    int64_t numel;
    float *data; /* device memory, owned by the model */
    float *grad; /* device memory; owned by the model unless re-pointed (see below) */
};

/* A buffer: state a layer keeps that is not trained (BatchNorm's running_mean,
 * running_var, num_batches_tracked; CONTRACT.md §2a), named like a parameter, saved in
 * the model file, broadcast by DDP (DDP.md §1.3). Registered in preorder beside the
 * parameters; no v2 layer of issue 17 has one. */
struct model_buffer {
    char name[64]; /* "3.running_mean" */
    int index;     /* position among the buffers */
    int layer;     /* index into the spec's layers */
    bool i64;      /* int64 elements (num_batches_tracked), else float32 */
    int64_t numel;
    void *data; /* device memory, owned by the model */
};

/* A second state_dict name of a parameter: a tied linear's "<key>.weight" (issue 30), which
 * is the embedding's table. The parameter list holds a shared tensor once, at the
 * embedding (its first occurrence: DDP.md §1.1), so DDP buckets it once, the optimizer
 * keeps one state and clipping counts it once; the model file holds it under both names,
 * as PyTorch's state_dict does, and a load wants both, equal (checkpoint.c). */
struct model_alias {
    char name[64]; /* "6.weight" */
    int param;     /* the parameter it names (model_param) */
    int layer;     /* the tied layer, into the spec's layers */
};

struct model;

/* Builds the model of `spec` on `dev` for micro-batches of at most `max_batch` samples,
 * with parameters initialised as §2a says (linear, qkv, proj: PyTorch's nn.Linear
 * U(±1/sqrt(in)); embedding, position: N(0,1); layernorm: 1, 0), drawn from one stream
 * of spec->init_seed in registration order. Gradients start zero. Every activation a
 * step needs is allocated here, once (model_activation_bytes says how much).
 * Returns NULL only on out of memory. */
struct model *model_new(struct dev dev, const struct spec *spec, int64_t max_batch);
/* The same, saying why it failed: DDPD_EDEVICE (a rank's exit 4) naming the tensor that
 * could not be allocated and its size, or the backend op (a NULL dev_ops slot) a layer
 * needs and the layer's key; DDPD_ESPEC for a layer kind this engine cannot run. Sizes are checked: a
 * max_batch or a width near the caps fails here instead of wrapping into a small buffer. `err` may be NULL.
 */
struct model *model_new_err(struct dev dev, const struct spec *spec, int64_t max_batch,
                            struct ddpd_error *err);
void model_free(struct model *m);

/* ---- inference (worker/infer/) ---- */

/* The model of `spec` for inference: its parameters and buffers alone (parameters zeroed:
 * the caller loads them, checkpoint_load_weights), in eval mode, with no gradients and no
 * activation plan, so that a loaded model holds its parameter bytes and little more.
 * model_forward needs model_plan first; model_backward, model_zero_grad and
 * model_set_grad_storage are not for it. NULL with `err` set as model_new_err. */
struct model *model_new_eval(struct dev dev, const struct spec *spec, struct ddpd_error *err);
/* Allocates an eval model's activation plan for forwards of up to max_batch samples (every
 * layer's output, what its forward keeps, the layers' scratch; no backward scratch),
 * replacing the previous one; model_activation_bytes then says its size. DDPD_EDEVICE
 * naming the tensor and its bytes when it cannot. model_plan_free gives it back. */
ddpd_err model_plan(struct model *m, int64_t max_batch, struct ddpd_error *err);
void model_plan_free(struct model *m);
/* The bytes model_plan(m, max_batch) would allocate (INT64_MAX when too large for any
 * memory), without allocating them. */
int64_t model_plan_bytes(const struct model *m, int64_t max_batch);
/* The layer tree as the model holds it, for code that runs it its own way (inference's
 * incremental forward, worker/infer/cache.c): layer i of the preorder list (borrowed,
 * valid until model_free), and its parameters, first[0 .. returned count) in the order
 * the layer's family registers them (layers/layers.h). */
int model_layer_count(const struct model *m);
const struct spec_layer *model_layer(const struct model *m, int i);
int model_layer_params(struct model *m, int i, struct param **first);
/* The parameter layer i uses without owning it (a tied linear's weight, the embedding's
 * table; its bias, if any, is its own, model_layer_params), or NULL. Borrowed. */
struct param *model_layer_tied(struct model *m, int i);

/* The parameters model_new would make for `spec` (names, shapes, numel; data and grad
 * NULL), without allocating them: out[] has room for SPEC_MAX_PARAMS. Returns their
 * count (never negative). */
int model_spec_params(const struct spec *spec, struct param *out);
/* The aliases the model of `spec` would have (out[] has room for SPEC_MAX_LAYERS), in
 * layer order; returns their count. */
int model_spec_aliases(const struct spec *spec, struct model_alias *out);

struct dev model_dev(const struct model *m);       /* the backend it lives on */
int model_param_count(const struct model *m);      /* tensors */
int64_t model_numel(const struct model *m);        /* scalars */
struct param *model_param(struct model *m, int i); /* borrowed, 0 <= i < count */
int model_alias_count(const struct model *m);
const struct model_alias *model_alias(const struct model *m, int i); /* borrowed, 0 <= i < count */
int model_buffer_count(const struct model *m);
struct model_buffer *model_buffer(struct model *m, int i); /* borrowed, 0 <= i < count */
/* Bytes of device memory the activation plan holds: every layer's output for max_batch
 * samples, what layers keep for backward (layernorm's mean/rstd, attention's q, k, v and
 * probabilities, dropout's masks), their shared scratch and backward's dy buffers. */
int64_t model_activation_bytes(const struct model *m);

/* Dropout's masks are drawn from a seed mixed from (init seed, rank, position, layer
 * index), so that ranks draw different masks and a run is reproducible. The position is
 * a count of training forwards unless the caller sets it: the training loop sets it to
 * (optimizer step, micro-batch) before each forward, so a resumed run draws the masks
 * the uninterrupted run drew. */
void model_set_rank(struct model *m, int rank);
void model_set_position(struct model *m, int64_t step, int64_t micro);

/* Forward pass of batch samples x (device memory, batch <= max_batch): float32
 * [B, input_shape], or int32 ids [B, T] when the model starts with embedding
 * (spec_input_ids). Returns the output [B, output shape] (borrowed: valid until the
 * next forward). Keeps the activations backward needs. */
const float *model_forward(struct model *m, const void *x, int64_t batch);

/* Whether a training forward of `batch` rows can run: BatchNorm needs more than one
 * value per channel (batch * H * W > 1), as PyTorch, which raises "Expected more than 1
 * value per channel when training". DDPD_EDATA naming the layer and the input size
 * when it cannot; DDPD_OK in eval mode. */
ddpd_err model_check_batch(const struct model *m, int64_t batch, struct ddpd_error *err);

/* Training mode (the default) or eval mode, as nn.Module.train(training): dropout and
 * BatchNorm act by it. */
void model_set_training(struct model *m, bool training);

/* Called during backward as soon as param `index`'s gradient for this backward has been
 * accumulated into its ->grad. Fires once per parameter, in reverse registration order
 * (last layer first; within a layer, last registered first): DDP's bucket order. */
typedef void (*model_grad_ready_fn)(void *ctx, int index);

/* Backward of the last forward given dy = dLoss/dOutput (device memory, its shape).
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
