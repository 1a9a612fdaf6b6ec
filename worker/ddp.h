/* ddp.h — DistributedDataParallel for ddpd's models, after PyTorch 1.13's
 * `DistributedDataParallel(model, device_ids)` (../shared/DDP.md): wrap a model and a
 * communicator; gradients are averaged across ranks by bucketed all-reduces that start
 * during backward as soon as a bucket's gradients are ready; a no_sync scope skips the
 * communication so gradients accumulate locally; a join scope lets ranks with fewer
 * batches shadow the others' collectives.
 *
 * The mapping from PyTorch:
 *     ddp = DDP(model)              ->  ddp = ddp_new(model, comm, &opts, &err)
 *     out = ddp(x)                  ->  ddp_forward_begin(ddp); out = model_forward(model, x, B)
 *     loss.backward()               ->  model_backward(model, dy, ddp_grad_ready, ddp);
 *                                       ddp_backward_end(ddp, &err)
 *     with ddp.no_sync(): ...       ->  prev = ddp_no_sync_enter(ddp); ...; ddp_no_sync_exit(ddp, prev)
 *     with ddp.join(): loop         ->  loop; ddp_join(ddp, &shadowed, &err)
 *     ddp.register_comm_hook(None, fp16_compress_hook)  ->  opts.hook = DDP_HOOK_FP16
 * Knows tensors (through the model), the compute backend and comm; nothing of the data,
 * the loop or the optimizer. */
#ifndef DDPD_DDP_H
#define DDPD_DDP_H

#include <stdbool.h>
#include <stdint.h>

#include "../schema/err.h"
#include "comm.h"
#include "model.h"

/* A comm hook (DDP.md §6; `ddp.comm_hook`): none, or PyTorch 1.13's fp16_compress_hook /
 * bf16_compress_hook. */
typedef enum { DDP_HOOK_NONE, DDP_HOOK_FP16, DDP_HOOK_BF16 } ddp_hook;

struct ddp_opts {
    double bucket_cap_mb;              /* default 25; the first bucket is capped at 1 MiB */
    bool join;                         /* join mode: per-step notifications, shadowing */
    bool divide_by_initial_world_size; /* join's divisor: W (true) or the live ranks */
    ddp_hook hook;                     /* with a hook each bucket is cast to 16 bits,
                                        * divided by W in 16 bits, summed in 16 bits and
                                        * copied back (the hook replaces the reducer's
                                        * division; join's divisor is then always W) */
    bool initial_plan;                 /* with a hook: the first synced step reduces as
                                        * PyTorch's first iteration does, before its
                                        * one-time bucket rebuild (DDP.md §2.2-2.3): one
                                        * bucket of every parameter in registration order,
                                        * which sets each element's place in gloo's sum
                                        * order. For a job that starts at step 0. */
    bool keep_params;                  /* skip the construction broadcast: every rank
                                        * resumes its own replica from a checkpoint
                                        * (replicas differ between joins, DDP.md §4.5) */
};

struct ddp;

/* Construction, collective on every rank (DDP.md §1.2): all-gathers the parameter count
 * and the shapes and fails on every rank with the same message when any rank's model
 * differs; broadcasts rank 0's parameters and buffers (unless opts->keep_params); lays gradients out as views
 * into flat buckets over the parameters in reverse registration order (first bucket <= 1 MiB, then
 * bucket_cap_mb). `model` and `comm` are borrowed and must outlive the ddp. */
struct ddp *ddp_new(struct model *model, struct comm *comm, const struct ddp_opts *opts,
                    struct ddpd_error *err);
void ddp_free(struct ddp *d);

/* Call before each training forward. Decides, as PyTorch does at forward time, whether
 * the following backward is reduced: it is unless a no_sync scope is open. In join mode a
 * synced forward also tells the joined ranks that one more synced step is coming. A model
 * with buffers (BatchNorm) has them broadcast here when the previous training forward was
 * a synced one (DDP.md §1.3): from rank 0, or in join mode from the highest live rank,
 * and then in join mode every forward, synced or not, notifies the joined ranks (which
 * receive the broadcasts). Not for eval forwards. */
ddpd_err ddp_forward_begin(struct ddp *d, struct ddpd_error *err);

/* The model's gradient-ready hook (model.h): pass it with the ddp as ctx to
 * model_backward. Launches each bucket's all-reduce, in bucket order, once all of its
 * gradients are ready: scaled by float(1/W) first, then summed across ranks (with a
 * hook: cast to 16 bits and divided by W there, then summed in 16 bits). */
void ddp_grad_ready(void *ddp, int param_index);

/* Call after model_backward: waits for every launched all-reduce (and with a hook copies
 * each 16-bit sum back into its float bucket). Afterwards every rank holds the same
 * averaged gradients. A no-op after an unsynced forward. */
ddpd_err ddp_backward_end(struct ddp *d, struct ddpd_error *err);

/* What a comm hook does to the gradients of a lone rank (world 1, where there is no ddp:
 * PyTorch still runs the hook): each rounded to the hook's 16 bits (cast, divided by 1,
 * copied back). Call where a synced backward would end. Gradients in host memory. */
void ddp_hook_lone(ddp_hook hook, struct model *m);

/* no_sync scope: returns the previous state to restore (nesting-safe). */
bool ddp_no_sync_enter(struct ddp *d);
void ddp_no_sync_exit(struct ddp *d, bool prev);

/* Join, called by a rank whose loop has run out of batches (join mode): shadows the
 * other ranks' synced steps with zero buckets until every rank has joined, then
 * broadcasts the parameters and buffers from the last joiner (the highest rank among those that ran
 * the most steps) so that all replicas are equal. *shadowed = steps shadowed here. In
 * non-join mode only the final parameter sync runs. */
ddpd_err ddp_join(struct ddp *d, int64_t *shadowed, struct ddpd_error *err);

/* ddp_join that calls hook(ctx, n, err) after the n-th shadowed step (n from 1), where
 * the live ranks have finished that step's all-reduces and run their optimizer step:
 * the place for the collectives a training loop issues after every step (a loss check,
 * a checkpoint), so that a joined rank pairs with them. A hook's error ends the join
 * and is returned. hook may be NULL. */
typedef ddpd_err (*ddp_step_hook)(void *ctx, int64_t n, struct ddpd_error *err);
ddpd_err ddp_join_each(struct ddp *d, ddp_step_hook hook, void *ctx, int64_t *shadowed,
                       struct ddpd_error *err);

/* Before an eval (collective, every rank at the same point, `live` = this rank ran the
 * step itself): in join mode, when some rank has joined, the parameters of the highest
 * live rank are broadcast to the joined ranks, whose own replicas are stale until the
 * final sync, so that every rank scores its eval shard with the model of this step. The
 * live ranks' replicas are left as they are (the other live ones receive into scratch).
 * Without join, or with every rank live, nothing is sent. */
ddpd_err ddp_eval_params(struct ddp *d, bool live, struct ddpd_error *err);

/* The bucket plan, for tests and logs: bucket count, and for bucket b its parameter
 * indices in layout order (written into idx, at most cap) and its size in bytes. */
int ddp_bucket_count(const struct ddp *d);
int ddp_bucket_params(const struct ddp *d, int b, int *idx, int cap, int64_t *bytes);

/* The assignment rule of DDP.md §2.1 for one dtype: walks `bytes` of n tensors in the
 * given order, closing a bucket when its size reaches the current limit (limits advance
 * through limits[0..nlim), the last repeating). Writes each tensor's bucket into
 * bucket_of and returns the number of buckets. */
int ddp_assign_buckets(const int64_t *bytes, int n, const int64_t *limits, int nlim, int *bucket_of);

#endif
