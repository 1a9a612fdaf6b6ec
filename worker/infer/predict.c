/* infer/predict.c — the predict request: samples from the request (`inputs`, nested lists
 * of the spec's input_shape), an .npy file (`npy`) or the job's eval data (`eval`, read by
 * the data module as a rank reads it), the model's eval-mode forward in batches of at most
 * load's max_batch (activations allocated for the request and given back after it), and
 * one final line: the raw outputs, their shape, the top classes of a classifier, the
 * labels of eval samples. Floats are written with 9 significant digits (float32 round
 * trips), non-finite ones as null. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/clock.h"
#include "../data.h"
#include "infer_impl.h"

/* What a request's samples are: x [n, sample numel] (float32, or int32 ids), and for eval
 * samples their targets (labels [n, yn] for cross_entropy, y [n, yn] for mse). */
struct batch {
    int64_t n, numel;
    void *x;
    int32_t *labels;
    float *y;
    int64_t yn;
};

static void batch_free(struct batch *b)
{
    free(b->x);
    free(b->labels);
    free(b->y);
}

/* ---- `inputs`: nested lists ---- */

/* The shape of a nested list, following first elements (at most SPEC_MAX_RANK + 1 dims). */
static int json_shape(json_t *v, int64_t *shape)
{
    int r = 0;
    while (json_is_array(v) && r <= SPEC_MAX_RANK) {
        shape[r++] = (int64_t)json_array_size(v);
        v = json_array_get(v, 0);
    }
    return r;
}

/* Copies sample v (of `shape`, rank dims) into out (floats, or ids checked in [0, vocab)
 * when vocab > 0); `path` names it and is extended for what is inside. */
static ddpd_err copy_sample(json_t *v, int rank, const int64_t *shape, int64_t vocab, void *out, int64_t *k,
                            char *path, size_t cap, struct ddpd_error *err)
{
    if (rank == 0) {
        if (vocab > 0) {
            const json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
            if (!json_is_integer(v) || id < 0 || id >= vocab)
                return ddpd_error_set(err, DDPD_ESPEC, path,
                                      "%s: expected a token id (an integer in [0, %" PRId64 ")), got %s",
                                      path, vocab, json_is_integer(v) ? "one outside it" : "something else");
            ((int32_t *)out)[(*k)++] = (int32_t)id;
            return DDPD_OK;
        }
        if (!json_is_number(v))
            return ddpd_error_set(err, DDPD_ESPEC, path, "%s: expected a number", path);
        ((float *)out)[(*k)++] = (float)json_number_value(v);
        return DDPD_OK;
    }
    if (!json_is_array(v) || (int64_t)json_array_size(v) != shape[0])
        return ddpd_error_set(err, DDPD_ESPEC, path, "%s: expected a list of %" PRId64 " values, got %s",
                              path, shape[0], json_is_array(v) ? "another length" : "something else");
    const size_t len = strlen(path);
    for (int64_t i = 0; i < shape[0]; i++) {
        snprintf(path + len, cap - len, "[%" PRId64 "]", i);
        ddpd_err rc =
            copy_sample(json_array_get(v, (size_t)i), rank - 1, shape + 1, vocab, out, k, path, cap, err);
        if (rc)
            return rc;
    }
    path[len] = '\0';
    return DDPD_OK;
}

static ddpd_err read_inputs(const struct spec *s, json_t *inputs, struct batch *b, struct ddpd_error *err)
{
    if (!json_is_array(inputs) || json_array_size(inputs) == 0)
        return ddpd_error_set(err, DDPD_ESPEC, "inputs", "inputs: expected a list of at least one sample");
    b->n = (int64_t)json_array_size(inputs);
    if (b->n > INFER_MAX_SAMPLES)
        return ddpd_error_set(err, DDPD_ETOOBIG, "inputs",
                              "inputs: %" PRId64 " samples, more than the %d one request may hold", b->n,
                              INFER_MAX_SAMPLES);
    if (!(b->x = malloc((size_t)(b->n * b->numel) * 4)))
        return ddpd_error_set(err, DDPD_ENOMEM, "inputs", "out of memory reading %" PRId64 " samples", b->n);
    const int64_t vocab = spec_vocab(s);
    int64_t k = 0;
    for (int64_t i = 0; i < b->n; i++) {
        json_t *v = json_array_get(inputs, (size_t)i);
        char path[256], want[96], got[96];
        int64_t gs[SPEC_MAX_RANK + 1];
        snprintf(path, sizeof path, "inputs[%" PRId64 "]", i);
        const int gr = json_shape(v, gs);
        /* A wrong shape names the sample and both shapes; a ragged list or a non-number
         * inside a sample of the right shape names its place. */
        bool same = gr == s->input_rank;
        for (int d = 0; same && d < gr; d++)
            same = gs[d] == s->input_shape[d];
        if (!same) {
            data_shape_text(want, sizeof want, s->input_rank, s->input_shape);
            data_shape_text(got, sizeof got, gr, gs);
            return ddpd_error_set(err, DDPD_ESPEC, path,
                                  "%s: the sample has shape %s but the model's input_shape is %s", path, got,
                                  want);
        }
        ddpd_err rc = copy_sample(v, s->input_rank, s->input_shape, vocab, b->x, &k, path, sizeof path, err);
        if (rc)
            return rc;
    }
    return DDPD_OK;
}

/* ---- `eval`: the job's eval data (else its training data) ---- */

static ddpd_err read_eval(const struct spec *s, json_t *ev, struct batch *b, struct ddpd_error *err)
{
    json_t *count = json_object_get(ev, "count"), *dir = json_object_get(ev, "data_dir");
    if (!json_is_object(ev))
        return ddpd_error_set(err, DDPD_ESPEC, "eval",
                              "eval: expected {\"count\": N, \"data_dir\": \"/abs\"}");
    if (!json_is_integer(count) || json_integer_value(count) < 1 ||
        json_integer_value(count) > INFER_MAX_SAMPLES)
        return ddpd_error_set(err, DDPD_ESPEC, "eval.count", "eval.count: expected an integer in [1, %d]",
                              INFER_MAX_SAMPLES);
    if (!json_is_string(dir) || !json_string_length(dir))
        return ddpd_error_set(err, DDPD_ESPEC, "eval.data_dir",
                              "eval.data_dir: expected the job's data folder");
    struct spec *es = malloc(sizeof *es);
    if (!es)
        return ddpd_error_set(err, DDPD_ENOMEM, "eval", "out of memory reading the eval data");
    *es = *s;
    if (s->eval.every_steps > 0)
        es->data = s->eval.data;
    es->data.shuffle = false;
    es->batch_size = json_integer_value(count);
    /* As rank 0 of one: the whole data set (rank 0's own file for a {rank} one). */
    struct dataset *ds = dataset_open(es, json_string_value(dir), 0, 1, err);
    free(es);
    if (!ds)
        return err->code ? err->code : DDPD_EDATA;
    ddpd_err rc = DDPD_OK;
    const int64_t n = json_integer_value(count);
    const bool ce = s->loss == LOSS_CROSS_ENTROPY;
    b->yn = spec_target_numel(s);
    b->x = malloc((size_t)(n * b->numel) * 4);
    b->labels = ce ? malloc((size_t)(n * b->yn) * 4) : NULL;
    b->y = ce ? NULL : malloc((size_t)(n * b->yn) * 4);
    if (!b->x || (ce ? !b->labels : !b->y)) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, "eval", "out of memory reading %" PRId64 " eval samples", n);
    } else {
        dataset_set_epoch(ds, 0);
        b->n = dataset_batches(ds) > 0 ? dataset_batch(ds, 0, b->x, b->y, b->labels) : 0;
        if (b->n < 0)
            rc = ddpd_error_set(err, dataset_error(ds)->code, dataset_error(ds)->path, "%s",
                                dataset_error(ds)->message);
        else if (b->n == 0)
            rc = ddpd_error_set(err, DDPD_EDATA, "eval", "eval: the job's data holds no sample");
    }
    dataset_free(ds);
    return rc;
}

/* ---- the forward ---- */

void infer__plan_release(struct infer *in)
{
    if (in->m && in->plan_rows > 0)
        model_plan_free(in->m);
    if (in->plan_x)
        in->dev.ops->free(in->dev.ctx, in->plan_x);
    in->plan_x = NULL;
    in->plan_rows = 0;
}

/* The activation plan and an input batch on the device for `rows` samples: the ones held
 * since the last predict when they are large enough (a burst of predicts allocates them
 * once: a fresh allocation costs a page fault per 4 KiB, more than the forward of a small
 * net), else new ones. infer__plan_release gives them back when the worker idles. */
static ddpd_err plan_for(struct infer *in, int64_t rows, int64_t numel, struct ddpd_error *err)
{
    if (in->plan_rows >= rows)
        return DDPD_OK;
    infer__plan_release(in);
    ddpd_err rc = model_plan(in->m, rows, err);
    if (rc)
        return rc;
    in->plan_rows = rows;
    if (!(in->plan_x = in->dev.ops->alloc(in->dev.ctx, (size_t)(rows * numel) * 4))) {
        infer__plan_release(in);
        return ddpd_error_set(err, DDPD_EDEVICE, "inputs",
                              "out of memory: cannot allocate a batch of %" PRId64 " inputs", rows);
    }
    return DDPD_OK;
}

/* out[n, out_numel] (host) = the model's outputs of the n samples, in batches of at most
 * max_batch. */
static ddpd_err forward_all(struct infer *in, const struct batch *b, int64_t out_numel, float *out,
                            struct ddpd_error *err)
{
    const struct dev_ops *ops = in->dev.ops;
    void *c = in->dev.ctx;
    const int64_t rows = b->n < in->max_batch ? b->n : in->max_batch;
    ddpd_err rc = plan_for(in, rows, b->numel, err);
    if (rc)
        return rc;
    for (int64_t off = 0; off < b->n; off += rows) {
        const int64_t k = b->n - off < rows ? b->n - off : rows;
        ops->to_device(c, in->plan_x, (const char *)b->x + off * b->numel * 4, (size_t)(k * b->numel) * 4);
        const float *y = model_forward(in->m, in->plan_x, k);
        ops->to_host(c, out + off * out_numel, y, (size_t)(k * out_numel) * sizeof(float));
    }
    in->plan_used = base_mono_s();
    return DDPD_OK;
}

/* ---- the answer, written as it is formatted (it may be large) ---- */

static void put_float(FILE *f, float v)
{
    if (isfinite(v))
        fprintf(f, "%.9g", (double)v);
    else
        fputs("null", f);
}

/* A nested list of shape[0..rank) from v (rank 0: one number). */
static const float *put_nested(FILE *f, const float *v, int rank, const int64_t *shape)
{
    if (rank == 0) {
        put_float(f, *v);
        return v + 1;
    }
    fputc('[', f);
    for (int64_t i = 0; i < shape[0]; i++) {
        if (i)
            fputc(',', f);
        v = put_nested(f, v, rank - 1, shape + 1);
    }
    fputc(']', f);
    return v;
}

/* The INFER_TOP most likely classes of logits[c] (softmax in double; ties by lower class). */
static void put_top(FILE *f, const float *l, int64_t c)
{
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < c; j++)
        mx = l[j] > mx ? l[j] : mx;
    for (int64_t j = 0; j < c; j++)
        sum += exp((double)l[j] - mx);
    int64_t taken[INFER_TOP];
    int k = 0;
    fputc('[', f);
    for (; k < INFER_TOP && k < c; k++) {
        int64_t best = -1;
        for (int64_t j = 0; j < c; j++) {
            bool used = false;
            for (int t = 0; t < k && !used; t++)
                used = taken[t] == j;
            if (!used && !isnan(l[j]) && (best < 0 || l[j] > l[best]))
                best = j;
        }
        if (best < 0)
            break;
        taken[k] = best;
        fprintf(f, "%s{\"class\":%" PRId64 ",\"p\":", k ? "," : "", best);
        const double p = exp((double)l[best] - mx) / sum;
        if (isfinite(p))
            fprintf(f, "%.9g}", p);
        else
            fputs("null}", f);
    }
    fputc(']', f);
}

static void answer(struct infer *in, const struct batch *b, const float *out, int orank,
                   const int64_t *oshape, int64_t out_numel, double seconds)
{
    FILE *f = in->out;
    fprintf(f, "{\"ok\":true,\"op\":\"predict\",\"seconds\":%.9g,\"shape\":[", seconds);
    for (int d = 0; d < orank; d++)
        fprintf(f, d ? ",%" PRId64 : "%" PRId64, oshape[d]);
    fputs("],\"outputs\":[", f);
    for (int64_t i = 0; i < b->n; i++) {
        if (i)
            fputc(',', f);
        put_nested(f, out + i * out_numel, orank, oshape);
    }
    fputc(']', f);
    /* A classifier whose output is one vector of classes per sample. */
    if (in->spec->loss == LOSS_CROSS_ENTROPY && orank == 1) {
        fputs(",\"top\":[", f);
        for (int64_t i = 0; i < b->n; i++) {
            if (i)
                fputc(',', f);
            put_top(f, out + i * out_numel, out_numel);
        }
        fputc(']', f);
    }
    if (b->labels || b->y) {
        fputs(",\"labels\":[", f);
        for (int64_t i = 0; i < b->n; i++) {
            if (i)
                fputc(',', f);
            if (b->labels && b->yn == 1) {
                fprintf(f, "%" PRId32, b->labels[i]);
            } else if (b->labels) {
                fputc('[', f);
                for (int64_t j = 0; j < b->yn; j++)
                    fprintf(f, j ? ",%" PRId32 : "%" PRId32, b->labels[i * b->yn + j]);
                fputc(']', f);
            } else {
                put_nested(f, b->y + i * b->yn, orank, oshape);
            }
        }
        fputc(']', f);
    }
    fputs("}\n", f);
    fflush(f);
}

void infer__predict(struct infer *in, json_t *req)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    const double t0 = base_mono_s();
    const struct spec *s = in->spec;
    struct batch b;
    memset(&b, 0, sizeof b);
    float *out = NULL;
    ddpd_err rc = DDPD_OK;
    json_t *inputs = json_object_get(req, "inputs"), *npy = json_object_get(req, "npy"),
           *ev = json_object_get(req, "eval");
    b.numel = spec_sample_numel(s);
    if (!!inputs + !!npy + !!ev != 1) {
        rc =
            ddpd_error_set(&err, DDPD_ESPEC, "inputs",
                           "predict takes one of inputs (samples), npy (a file) or eval ({count, data_dir})");
    } else if (inputs) {
        rc = read_inputs(s, inputs, &b, &err);
    } else if (npy) {
        if (!json_is_string(npy) || !json_string_length(npy))
            rc = ddpd_error_set(&err, DDPD_ESPEC, "npy", "npy: expected the path of an .npy file");
        else
            rc = data_npy_inputs(s, json_string_value(npy), "npy", INFER_MAX_SAMPLES, &b.x, &b.n, &err);
    } else {
        rc = read_eval(s, ev, &b, &err);
    }
    const struct spec_layer *o = spec_output_layer(s);
    int64_t oshape[SPEC_MAX_RANK] = {spec_out_width(s)};
    int orank = 1;
    if (o && o->out_rank > 0) {
        orank = o->out_rank;
        memcpy(oshape, o->out_shape, sizeof oshape);
    }
    int64_t out_numel = 1;
    for (int d = 0; d < orank; d++)
        out_numel *= oshape[d];
    if (!rc && b.n > INFER_MAX_OUTPUTS / (out_numel > 0 ? out_numel : 1))
        rc = ddpd_error_set(&err, DDPD_ETOOBIG,
                            inputs ? "inputs"
                            : npy  ? "npy"
                                   : "eval",
                            "%" PRId64 " samples of %" PRId64
                            " outputs each are more than the %d values one answer may hold",
                            b.n, out_numel, INFER_MAX_OUTPUTS);
    if (!rc && !(out = malloc((size_t)(b.n * out_numel) * sizeof *out)))
        rc = ddpd_error_set(&err, DDPD_ENOMEM, "inputs", "out of memory for %" PRId64 " outputs",
                            b.n * out_numel);
    if (!rc)
        rc = forward_all(in, &b, out_numel, out, &err);
    if (rc)
        infer__fail(in, "predict", &err);
    else
        answer(in, &b, out, orank, oshape, out_numel, base_mono_s() - t0);
    free(out);
    batch_free(&b);
}
