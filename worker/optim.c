/* optim.c — SGD and AdamW over a model's parameters, with PyTorch 1.13's per-tensor
 * update rules (_single_tensor_sgd, _single_tensor_adamw). Turns the spec's double
 * hyper-parameters into the float scalars PyTorch's kernels apply and keeps the state
 * tensors; the arithmetic itself is the backend's. Knows nothing of data or DDP. */
#include "optim.h"

/* clip_grad_norm_'s guard against a zero norm: max_norm / (total_norm + 1e-6). */
#define CLIP_EPS 1e-6f

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../base/check.h"

struct optim {
    struct spec_optim cfg; /* cfg.lr: the lr of the next step (optim_set_lr) */
    struct model *m;
    struct dev dev;
    int64_t steps;
    bool have_buf; /* SGD momentum buffers hold a value (PyTorch: buf is not None) */
    int per;       /* state tensors per parameter: 0, 1 (momentum) or 2 (AdamW) */
    int n;         /* parameters */
    int64_t numel; /* scalars in all parameters */
    int64_t *off;  /* [n] offset of each parameter's state within one state kind */
    float *state;  /* [per,numel] device memory: kind k of param i at k*numel + off[i] */
    /* The group's tensors for a backend with one-launch group updates ([n] each). */
    float **p, **s1, **s2;
    const float **g;
    int64_t *numel_of;
    double *sumsq; /* [n] clipping's per-tensor sums of squares */
};

struct sgd_hyper optim_sgd_hyper(const struct spec_optim *o, bool first)
{
    struct sgd_hyper h = {
        .lr = (float)o->lr,
        .momentum = (float)o->momentum,
        .dampening = (float)o->dampening,
        .weight_decay = (float)o->weight_decay,
        .nesterov = o->nesterov,
        .first = first,
        .one_minus_dampening = (float)(1.0 - o->dampening),
    };
    return h;
}

struct adamw_hyper optim_adamw_hyper(const struct spec_optim *o, int64_t step)
{
    /* As adamw.py computes them: Python floats (doubles), rounded to float once when a
     * float tensor op takes them. */
    const double bc1 = 1.0 - pow(o->beta1, (double)step);
    const double bc2 = 1.0 - pow(o->beta2, (double)step);
    struct adamw_hyper h = {
        .lr = (float)o->lr,
        .beta1 = (float)o->beta1,
        .beta2 = (float)o->beta2,
        .eps = (float)o->eps,
        .weight_decay = (float)o->weight_decay,
        .step = step,
        .decay = (float)(1.0 - o->lr * o->weight_decay),
        .one_minus_beta1 = (float)(1.0 - o->beta1),
        .one_minus_beta2 = (float)(1.0 - o->beta2),
        .neg_step_size = (float)(-(o->lr / bc1)),
        .bc2_sqrt = (float)sqrt(bc2),
    };
    return h;
}

struct optim *optim_new(const struct spec_optim *cfg, struct model *m)
{
    struct optim *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    ASSERT(cfg->kind == OPTIM_SGD || cfg->kind == OPTIM_ADAMW);
    o->cfg = *cfg;
    o->m = m;
    o->dev = model_dev(m);
    o->n = model_param_count(m);
    o->per = cfg->kind == OPTIM_ADAMW ? 2 : cfg->momentum != 0.0 ? 1 : 0;
    o->off = calloc((size_t)(o->n ? o->n : 1), sizeof *o->off);
    o->p = calloc((size_t)(o->n ? o->n : 1), sizeof *o->p);
    o->s1 = calloc((size_t)(o->n ? o->n : 1), sizeof *o->s1);
    o->s2 = calloc((size_t)(o->n ? o->n : 1), sizeof *o->s2);
    o->g = calloc((size_t)(o->n ? o->n : 1), sizeof *o->g);
    o->numel_of = calloc((size_t)(o->n ? o->n : 1), sizeof *o->numel_of);
    o->sumsq = calloc((size_t)(o->n ? o->n : 1), sizeof *o->sumsq);
    if (!o->off || !o->p || !o->s1 || !o->s2 || !o->g || !o->numel_of || !o->sumsq)
        goto fail;
    for (int i = 0; i < o->n; i++) {
        o->off[i] = o->numel;
        o->numel += model_param(m, i)->numel;
    }
    if (o->per) {
        /* alloc zeroes: AdamW's moments start at zero, as torch.zeros_like. */
        o->state =
            o->dev.ops->alloc(o->dev.ctx, (size_t)(o->per * (o->numel ? o->numel : 1)) * sizeof(float));
        if (!o->state)
            goto fail;
    }
    return o;
fail:
    optim_free(o);
    return NULL;
}

void optim_free(struct optim *o)
{
    if (!o)
        return;
    if (o->state)
        o->dev.ops->free(o->dev.ctx, o->state);
    free(o->off);
    free(o->p);
    free(o->s1);
    free(o->s2);
    free(o->g);
    free(o->numel_of);
    free(o->sumsq);
    free(o);
}

/* The parameter group as arrays; gradients are re-read because DDP moves them. */
static void gather_group(struct optim *o)
{
    for (int i = 0; i < o->n; i++) {
        struct param *p = model_param(o->m, i);
        o->p[i] = p->data;
        o->g[i] = p->grad;
        o->s1[i] = o->per ? o->state + o->off[i] : NULL;
        o->s2[i] = o->per == 2 ? o->state + o->numel + o->off[i] : NULL;
        o->numel_of[i] = p->numel;
    }
}

/* One launch for the whole group where the backend has it (CUDA), so a step costs one
 * kernel however many tensors the model has. */
static bool group_step(struct optim *o)
{
    const struct dev_ops *ops = o->dev.ops;
    if (o->cfg.kind == OPTIM_SGD ? !ops->sgd_group : !ops->adamw_group)
        return false;
    gather_group(o);
    if (o->cfg.kind == OPTIM_SGD) {
        const struct sgd_hyper h = optim_sgd_hyper(&o->cfg, !o->have_buf);
        ops->sgd_group(o->dev.ctx, &h, o->n, o->p, o->g, o->s1, o->numel_of);
        o->have_buf = o->per > 0;
    } else {
        const struct adamw_hyper h = optim_adamw_hyper(&o->cfg, o->steps);
        ops->adamw_group(o->dev.ctx, &h, o->n, o->p, o->g, o->s1, o->s2, o->numel_of);
    }
    return true;
}

/* Whether the parameters and their gradients lie in registration order in one slab each,
 * as the state does (the model's own layout; DDP re-points gradients into its buckets, which
 * are not): then one elementwise update over all `numel` scalars is the per-tensor updates,
 * bit for bit, without a call and a vector tail per tensor. */
static bool flat(struct optim *o, float **data, float **grad)
{
    if (o->n == 0)
        return false;
    const struct param *p0 = model_param(o->m, 0);
    for (int i = 1; i < o->n; i++) {
        const struct param *p = model_param(o->m, i);
        if (p->data != p0->data + o->off[i] || p->grad != p0->grad + o->off[i])
            return false;
    }
    *data = p0->data;
    *grad = p0->grad;
    return true;
}

void optim_step(struct optim *o)
{
    const struct dev_ops *ops = o->dev.ops;
    void *ctx = o->dev.ctx;
    o->steps++;
    if (group_step(o))
        return;
    float *data = NULL, *grad = NULL;
    const bool one_pass = flat(o, &data, &grad);
    if (o->cfg.kind == OPTIM_SGD) {
        const struct sgd_hyper h = optim_sgd_hyper(&o->cfg, !o->have_buf);
        if (one_pass)
            ops->sgd_step(ctx, &h, data, grad, o->per ? o->state : NULL, o->numel);
        for (int i = 0; !one_pass && i < o->n; i++) {
            struct param *p = model_param(o->m, i);
            float *buf = o->per ? o->state + o->off[i] : NULL;
            ops->sgd_step(ctx, &h, p->data, p->grad, buf, p->numel);
        }
        o->have_buf = o->per > 0;
    } else {
        const struct adamw_hyper h = optim_adamw_hyper(&o->cfg, o->steps);
        if (one_pass)
            ops->adamw_step(ctx, &h, data, grad, o->state, o->state + o->numel, o->numel);
        for (int i = 0; !one_pass && i < o->n; i++) {
            struct param *p = model_param(o->m, i);
            float *avg = o->state + o->off[i];
            ops->adamw_step(ctx, &h, p->data, p->grad, avg, avg + o->numel, p->numel);
        }
    }
}

void optim_set_lr(struct optim *o, double lr)
{
    o->cfg.lr = lr;
}

double optim_schedule_lr(const struct spec_optim *o, int64_t step, int64_t job_steps)
{
    const double lr = o->lr, m = o->min_lr;
    const int64_t w = o->warmup_steps > 0 ? o->warmup_steps : 0;
    const int64_t total = o->total_steps > 0 ? o->total_steps : job_steps;
    if (step <= w)
        return lr * (double)step / (double)w;
    /* p = 1 when the schedule has no steps after the warmup (S <= W). */
    double p = total > w ? (double)(step - w) / (double)(total - w) : 1.0;
    if (p > 1.0)
        p = 1.0;
    switch (o->schedule) {
    case SCHED_LINEAR: return lr + (m - lr) * p;
    case SCHED_COSINE: return m + (lr - m) * (1.0 + cos(M_PI * p)) / 2.0;
    case SCHED_CONSTANT:
    default: return lr;
    }
}

double optim_clip_grad_norm(struct optim *o, double max_norm)
{
    const struct dev_ops *ops = o->dev.ops;
    /* torch.norm(torch.stack([torch.norm(g) for g in grads])): each norm a float. Every
     * gradient's sum of squares in one pass where the backend has it (CUDA: one launch per
     * 64 tensors and a single wait, not a wait per tensor), else one sumsq each. */
    gather_group(o);
    if (ops->sumsq_group)
        ops->sumsq_group(o->dev.ctx, o->n, o->g, o->numel_of, o->sumsq);
    else
        for (int i = 0; i < o->n; i++)
            o->sumsq[i] = ops->sumsq(o->dev.ctx, o->g[i], o->numel_of[i]);
    double sq = 0.0;
    for (int i = 0; i < o->n; i++) {
        const float norm_i = (float)sqrt(o->sumsq[i]);
        sq += (double)norm_i * (double)norm_i;
    }
    const float total = (float)sqrt(sq);
    /* max_norm / (total_norm + 1e-6): Tensor.__rtruediv__ is reciprocal() * max_norm,
     * every step in float; clamp(max=1.0) then mul_, which leaves the gradients alone at
     * 1 (a NaN norm scales by NaN, as PyTorch does). */
    const float denom = total + CLIP_EPS;
    const float coef = (1.0f / denom) * (float)max_norm;
    if (coef < 1.0f || isnan(coef))
        for (int i = 0; i < o->n; i++) {
            struct param *p = model_param(o->m, i);
            ops->scale(o->dev.ctx, p->grad, coef, p->numel);
        }
    return total;
}

int64_t optim_steps(const struct optim *o)
{
    return o->steps;
}

int optim_state_count(const struct optim *o)
{
    return o->per * o->n;
}

float *optim_state_at(struct optim *o, int i, char *name, int cap, const struct param **like)
{
    ASSERT(i >= 0 && i < o->per * o->n);
    const int pi = i / o->per, kind = i % o->per;
    const struct param *p = model_param(o->m, pi);
    const char *what = o->per == 1 ? "momentum_buffer" : kind == 0 ? "exp_avg" : "exp_avg_sq";
    if (name && cap > 0)
        snprintf(name, (size_t)cap, "%s.%s", p->name, what);
    if (like)
        *like = p;
    return o->state + (int64_t)kind * o->numel + o->off[pi];
}

void optim_restore(struct optim *o, int64_t steps)
{
    o->steps = steps;
    o->have_buf = o->per > 0 && steps > 0;
}
