/* data/synthetic.c — the synthetic data set (CONTRACT.md §3): rows drawn from the seed
 * and labelled by a random teacher network, the same bits on every rank whatever the world
 * size. Reads no file. */
#include "data_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../rng.h"
#include "../../base/check.h"

#define TEACHER_MAX_PARAMS SPEC_MAX_SYNTHETIC_WEIGHTS

/* Salts that keep the synthetic streams apart from the shuffle streams, which are
 * rng_seed2(seed, epoch). Row i is rng_seed2(seed ^ SALT_ROWS, i); the teacher's weights
 * are rng_seed2(seed ^ SALT_TEACHER, 0); calibration input c (cross_entropy) is
 * rng_seed2(seed ^ SALT_CALIB, c). */
#define SALT_ROWS    0x73616d706c657321ull /* "samples!" */
#define SALT_TEACHER 0x7465616368657221ull /* "teacher!" */
#define SALT_CALIB   0x63616c6962726174ull /* "calibrat" */

/* ---- synthetic ---- */

/* The fixed random teacher: the spec's layers with weights and biases uniform in
 * ±1/sqrt(in), computed in double. For cross_entropy the outputs are centred by their
 * mean over TEACHER_CALIB inputs before the argmax: without it a constant part of the
 * logits (e.g. after a sigmoid) can make every label the same class. */
#define TEACHER_CALIB 1024
/* Rows computed together: each weight row is read once per block instead of once per
 * row (a teacher of a few million weights does not fit in cache). Every row's numbers
 * are computed in the same order whatever block it is in, so a row is the same on
 * every rank and in every run. */
#define TEACHER_BLOCK 64

struct teacher {
    const struct spec *s;
    int64_t in, out, max_width;
    double *w[SPEC_MAX_LAYERS], *b[SPEC_MAX_LAYERS];
    double *a, *t;  /* [TEACHER_BLOCK, max_width] activations */
    double *center; /* [out], cross_entropy */
};

static void teacher_free(struct teacher *t)
{
    for (int i = 0; i < SPEC_MAX_LAYERS; i++) {
        free(t->w[i]);
        free(t->b[i]);
    }
    free(t->a);
    free(t->t);
    free(t->center);
}

/* w·a in a fixed order: four partial sums (vectorizable without reassociation), then
 * (s0 + s1) + (s2 + s3). */
static double teacher_dot(const double *restrict w, const double *restrict a, int64_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t k = 0;
    for (; k + 4 <= n; k += 4) {
        s0 += w[k] * a[k];
        s1 += w[k + 1] * a[k + 1];
        s2 += w[k + 2] * a[k + 2];
        s3 += w[k + 3] * a[k + 3];
    }
    for (; k < n; k++)
        s0 += w[k] * a[k];
    return (s0 + s1) + (s2 + s3);
}

/* The teacher's outputs for `rows` inputs at t->a (row stride max_width). Returns the
 * outputs (row stride max_width), borrowed until the next call. */
static const double *teacher_forward(struct teacher *t, int64_t rows)
{
    const struct spec *s = t->s;
    const int64_t ld = t->max_width;
    double *a = t->a, *nx = t->t, *tmp;
    int64_t width = t->in;
    for (int l = 0; l < s->n_layers; l++) {
        const struct spec_layer *L = &s->layers[l];
        const int64_t n = rows * ld;
        switch (L->kind) {
        case LAYER_LINEAR:
            for (int64_t o = 0; o < L->out; o++) {
                const double *w = t->w[l] + o * L->in;
                const double bias = t->b[l] ? t->b[l][o] : 0;
                for (int64_t r = 0; r < rows; r++)
                    nx[r * ld + o] = bias + teacher_dot(w, a + r * ld, L->in);
            }
            width = L->out;
            tmp = a;
            a = nx;
            nx = tmp;
            break;
        case LAYER_RELU:
            for (int64_t k = 0; k < n; k++)
                a[k] = a[k] > 0 ? a[k] : 0;
            break;
        case LAYER_TANH:
            for (int64_t k = 0; k < n; k++)
                a[k] = tanh(a[k]);
            break;
        case LAYER_SIGMOID:
            for (int64_t k = 0; k < n; k++)
                a[k] = 1 / (1 + exp(-a[k]));
            break;
        case LAYER_GELU:
            for (int64_t k = 0; k < n; k++)
                a[k] = 0.5 * a[k] * (1 + erf(a[k] / sqrt(2.0)));
            break;
        case LAYER_GELU_TANH:
            for (int64_t k = 0; k < n; k++)
                a[k] = 0.5 * a[k] * (1 + tanh(sqrt(2.0 / M_PI) * (a[k] + 0.044715 * a[k] * a[k] * a[k])));
            break;
        default: /* the validator lets synthetic data take only linear layers and activations */
            ASSERT(!"synthetic teacher: not an MLP layer");
            break;
        }
    }
    (void)width;
    return a;
}

static ddpd_err teacher_new(struct teacher *t, const struct spec *s, struct ddpd_error *err)
{
    struct rng r;
    int64_t params = 0;
    memset(t, 0, sizeof *t);
    t->s = s;
    t->in = s->layers[data__first_linear(s)].in;
    t->out = s->layers[data__last_linear(s)].out;
    int64_t width = t->in;
    t->max_width = width;
    for (int i = 0; i < s->n_layers; i++) {
        const struct spec_layer *L = &s->layers[i];
        if (L->kind != LAYER_LINEAR)
            continue;
        if (L->in != width || L->out < 1 || L->out > SPEC_MAX_WIDTH)
            return data__fail(err, DDPD_ESPEC, "model", "layer %d's shape does not chain", i);
        params += L->in * L->out;
        if (params > TEACHER_MAX_PARAMS)
            return data__fail(err, DDPD_ESPEC, "data.samples",
                              "the model is too large for synthetic data (a teacher over %lld "
                              "parameters)",
                              TEACHER_MAX_PARAMS);
        width = L->out;
        if (width > t->max_width)
            t->max_width = width;
    }
    t->a = malloc((size_t)(TEACHER_BLOCK * t->max_width) * sizeof(double));
    t->t = malloc((size_t)(TEACHER_BLOCK * t->max_width) * sizeof(double));
    if (!t->a || !t->t)
        return data__fail(err, DDPD_EDEVICE, "data",
                          "out of memory: cannot allocate the synthetic teacher's activations");
    rng_seed2(&r, s->data.seed ^ SALT_TEACHER, 0);
    for (int i = 0; i < s->n_layers; i++) {
        const struct spec_layer *L = &s->layers[i];
        if (L->kind != LAYER_LINEAR)
            continue;
        double bound = 1.0 / sqrt((double)L->in);
        t->w[i] = malloc((size_t)(L->in * L->out) * sizeof(double));
        t->b[i] = L->bias ? malloc((size_t)L->out * sizeof(double)) : NULL;
        if (!t->w[i] || (L->bias && !t->b[i]))
            return data__fail(err, DDPD_EDEVICE, "data",
                              "out of memory: cannot allocate the synthetic teacher's layer %d (%" PRId64
                              " doubles, %.1f MiB)",
                              i, L->in * L->out, (double)(L->in * L->out) * sizeof(double) / (1 << 20));
        for (int64_t k = 0; k < L->in * L->out; k++)
            t->w[i][k] = (2 * rng_uniform(&r) - 1) * bound;
        for (int64_t k = 0; L->bias && k < L->out; k++)
            t->b[i][k] = (2 * rng_uniform(&r) - 1) * bound;
    }
    if (s->loss != LOSS_CROSS_ENTROPY)
        return DDPD_OK;
    t->center = calloc((size_t)t->out, sizeof(double));
    if (!t->center)
        return data__fail(err, DDPD_ENOMEM, "data", "out of memory for the synthetic teacher");
    for (int64_t c0 = 0; c0 < TEACHER_CALIB; c0 += TEACHER_BLOCK) {
        for (int64_t r0 = 0; r0 < TEACHER_BLOCK; r0++) {
            rng_seed2(&r, s->data.seed ^ SALT_CALIB, (uint64_t)(c0 + r0));
            for (int64_t j = 0; j < t->in; j++)
                t->a[r0 * t->max_width + j] = rng_normal(&r);
        }
        const double *o = teacher_forward(t, TEACHER_BLOCK);
        for (int64_t r0 = 0; r0 < TEACHER_BLOCK; r0++)
            for (int64_t k = 0; k < t->out; k++)
                t->center[k] += o[r0 * t->max_width + k] / TEACHER_CALIB;
    }
    return DDPD_OK;
}

/* Rows idx[0..n) (n <= TEACHER_BLOCK) of the synthetic set into x/y/label (row k of
 * the output for idx[k]): x ~ N(0,1), then the teacher's output plus 0.01 N(0,1) (mse)
 * or the argmax of its centred output (cross_entropy). A row depends only on
 * (seed, index), so every rank agrees on it whatever it generates. */
static void teacher_rows(struct teacher *t, const int64_t *idx, int64_t n, float *x, float *y, int32_t *label)
{
    struct rng r[TEACHER_BLOCK];
    const int64_t ld = t->max_width;
    for (int64_t k = 0; k < n; k++) {
        rng_seed2(&r[k], t->s->data.seed ^ SALT_ROWS, (uint64_t)idx[k]);
        for (int64_t j = 0; j < t->in; j++) {
            t->a[k * ld + j] = rng_normal(&r[k]);
            x[k * t->in + j] = (float)t->a[k * ld + j];
        }
    }
    const double *out = teacher_forward(t, n);
    for (int64_t k = 0; k < n; k++) {
        const double *o = out + k * ld;
        if (t->center) {
            int64_t best = 0;
            for (int64_t c = 1; c < t->out; c++)
                if (o[c] - t->center[c] > o[best] - t->center[best])
                    best = c;
            label[k] = (int32_t)best;
        } else {
            for (int64_t c = 0; c < t->out; c++)
                y[k * t->out + c] = data__to_f32(o[c] + 0.01 * rng_normal(&r[k]));
        }
    }
}

ddpd_err data__synthetic_open(struct dataset *ds, const struct spec *s, struct ddpd_error *err)
{
    struct teacher t;
    ddpd_err rc;
    if (s->data.samples < 1)
        return data__fail(err, DDPD_ESPEC, "data.samples", "must be at least 1, got %" PRId64,
                          s->data.samples);
    ds->n_total = s->data.samples;
    /* With shuffling every rank needs every row; without, only its own. */
    ds->hold = ds->shuffle ? HOLD_WHOLE : HOLD_SHARD_ONLY;
    int64_t n = ds->shuffle ? ds->n_total : spec_shard_rows(ds->n_total, ds->rank, ds->world);
    if ((rc = teacher_new(&t, s, err)))
        goto out;
    if ((rc = data__alloc_rows(ds, n, DDPD_ESPEC, "data.samples", err)))
        goto out;
    for (int64_t k0 = 0; k0 < n; k0 += TEACHER_BLOCK) {
        int64_t idx[TEACHER_BLOCK], m = n - k0 < TEACHER_BLOCK ? n - k0 : TEACHER_BLOCK;
        for (int64_t k = 0; k < m; k++)
            idx[k] = ds->shuffle ? k0 + k : ds->rank + (k0 + k) * ds->world;
        teacher_rows(&t, idx, m, ds->x + k0 * ds->xn, ds->ce ? NULL : ds->y + k0 * ds->yn,
                     ds->ce ? ds->labels + k0 : NULL);
    }
out:
    teacher_free(&t);
    return rc;
}
