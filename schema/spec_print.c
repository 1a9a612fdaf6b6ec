/* spec_print.c — a parsed spec back to JSON (spec_to_json, spec_dumps), every key written out,
 * the defaults included: what a job ran with is on record, and it parses back to the same spec. */
#include "jsonnum.h"
#include "spec_impl.h"

static json_t *optim_to_json(const struct spec_optim *o)
{
    json_t *j, *sched = json_pack("{s:s, s:I, s:f}", "type", sched_names[o->schedule], "warmup_steps",
                                  (json_int_t)o->warmup_steps, "min_lr", o->min_lr);
    if (sched && o->total_steps > 0 &&
        json_object_set_new(sched, "total_steps", json_integer(o->total_steps)))
        goto fail;
    if (!sched)
        return NULL;
    if (o->kind == OPTIM_SGD)
        j = json_pack("{s:s, s:f, s:f, s:f, s:f, s:b}", "type", "sgd", "lr", o->lr, "momentum", o->momentum,
                      "dampening", o->dampening, "weight_decay", o->weight_decay, "nesterov", o->nesterov);
    else
        j = json_pack("{s:s, s:f, s:[f, f], s:f, s:f}", "type", "adamw", "lr", o->lr, "betas", o->beta1,
                      o->beta2, "eps", o->eps, "weight_decay", o->weight_decay);
    if (!j)
        goto fail;
    if (json_object_set_new(j, "schedule", sched) == 0) /* steals sched, even when it fails */
        return j;
    json_decref(j);
    return NULL;
fail:
    json_decref(sched);
    return NULL;
}

/* Sets o[key] = v (stolen); clears *ok when an allocation failed (v or the member), so
 * that an object missing a member is never taken for a whole spec. */
static void put(json_t *o, const char *key, json_t *v, bool *ok)
{
    if (!v || json_object_set_new(o, key, v) != 0)
        *ok = false;
}

static json_t *data_to_json(const struct spec_data *d, bool *ok)
{
    json_t *j = json_pack("{s:s}", "type", data_names[d->kind]);
    if (!j) {
        *ok = false;
        return NULL;
    }
    switch (d->kind) {
    case DATA_SYNTHETIC: put(j, "samples", json_integer(d->samples), ok); break;
    case DATA_TOKENS:
        put(j, "path", json_string(d->path), ok);
        put(j, "block_size", json_integer(d->block_size), ok);
        put(j, "dtype", json_string(dtype_names[d->dtype]), ok);
        break;
    case DATA_NPY:
        put(j, "x", json_string(d->x), ok);
        put(j, "y", json_string(d->y), ok);
        break;
    case DATA_CSV:
        put(j, "path", json_string(d->path), ok);
        if (d->n_targets == 1) {
            put(j, "target", json_string(d->targets[0]), ok);
        } else {
            json_t *t = json_array();
            for (int i = 0; t && i < d->n_targets; i++)
                if (json_array_append_new(t, json_string(d->targets[i])) != 0)
                    *ok = false;
            put(j, "target", t, ok);
        }
        break;
    }
    put(j, "seed", json_integer((json_int_t)d->seed), ok);
    put(j, "shuffle", json_boolean(d->shuffle), ok);
    put(j, "drop_last", json_boolean(d->drop_last), ok);
    return j;
}

/* [kh, kw] */
static json_t *pair_json(const int64_t v[2])
{
    return json_pack("[I, I]", (json_int_t)v[0], (json_int_t)v[1]);
}

/* The top-level layers from `from` to `to` (and, inside residuals, theirs), every key
 * written out. */
static json_t *layers_to_json(const struct spec *s, int from, int to, bool *ok)
{
    json_t *list = json_array();
    if (!list) {
        *ok = false;
        return NULL;
    }
    for (int i = from; i<to; i = s->layers[i].end> i ? s->layers[i].end : i + 1) {
        const struct spec_layer *l = &s->layers[i];
        json_t *lj = NULL;
        switch (l->kind) {
        case LAYER_LINEAR:
            lj = json_pack("{s:s, s:I, s:I, s:b}", "type", "linear", "in", (json_int_t)l->in, "out",
                           (json_int_t)l->out, "bias", l->bias);
            if (lj && l->tie >= 0) /* the embedding's key, as the spec names it */
                put(lj, "tie", json_string(s->layers[l->tie].key), ok);
            break;
        case LAYER_RELU:
        case LAYER_TANH:
        case LAYER_SIGMOID:
        case LAYER_FLATTEN: lj = json_pack("{s:s}", "type", layer_kind_name(l->kind)); break;
        case LAYER_GELU:
        case LAYER_GELU_TANH:
            lj = json_pack("{s:s, s:s}", "type", "gelu", "approximate",
                           l->kind == LAYER_GELU_TANH ? "tanh" : "none");
            break;
        case LAYER_EMBEDDING:
            lj = json_pack("{s:s, s:I, s:I}", "type", "embedding", "num", (json_int_t)l->num, "dim",
                           (json_int_t)l->dim);
            break;
        case LAYER_POSITION:
            lj = json_pack("{s:s, s:I, s:I}", "type", "position", "max", (json_int_t)l->num, "dim",
                           (json_int_t)l->dim);
            break;
        case LAYER_LAYERNORM:
            lj = json_pack("{s:s, s:I, s:f, s:b}", "type", "layernorm", "dim", (json_int_t)l->dim, "eps",
                           l->eps, "bias", l->bias);
            break;
        case LAYER_ATTENTION:
            lj = json_pack("{s:s, s:I, s:I, s:b, s:b}", "type", "attention", "dim", (json_int_t)l->dim,
                           "heads", (json_int_t)l->heads, "causal", l->causal, "bias", l->bias);
            break;
        case LAYER_RESIDUAL: {
            json_t *inner = layers_to_json(s, i + 1, l->end, ok);
            lj = inner ? json_pack("{s:s, s:o}", "type", "residual", "layers", inner) : NULL;
            break;
        }
        case LAYER_DROPOUT: lj = json_pack("{s:s, s:f}", "type", "dropout", "p", l->p); break;
        case LAYER_CONV2D:
            lj = json_pack("{s:s, s:I, s:I, s:o, s:o, s:o, s:b}", "type", "conv2d", "in", (json_int_t)l->in,
                           "out", (json_int_t)l->out, "kernel", pair_json(l->kernel), "stride",
                           pair_json(l->stride), "padding", pair_json(l->padding), "bias", l->bias);
            break;
        case LAYER_MAXPOOL2D:
        case LAYER_AVGPOOL2D:
            lj = json_pack("{s:s, s:o, s:o, s:o}", "type", layer_kind_name(l->kind), "kernel",
                           pair_json(l->kernel), "stride", pair_json(l->stride), "padding",
                           pair_json(l->padding));
            break;
        case LAYER_BATCHNORM:
            lj = json_pack("{s:s, s:I, s:f, s:f}", "type", "batchnorm", "features", (json_int_t)l->dim, "eps",
                           l->eps, "momentum", l->momentum);
            break;
        }
        if (!lj || json_array_append_new(list, lj) != 0)
            *ok = false;
    }
    return list;
}

struct json_t *spec_to_json(const struct spec *s)
{
    bool ok = true;
    json_t *j = json_object(), *model = layers_to_json(s, 0, s->n_layers, &ok);
    if (!j || !model) {
        json_decref(j);
        json_decref(model);
        return NULL;
    }
    put(j, "name", json_string(s->name), &ok);
    put(j, "world_size", json_integer(s->world_size), &ok);
    put(j, "device", json_string(device_kind_name(s->device)), &ok);
    put(j, "precision", json_string(precision_names[s->precision]), &ok);
    /* A preset prints as itself, its layers beside it (`expanded`): what a job ran, both ways. */
    put(j, "model", s->preset.name[0] ? preset_to_json(s, model) : model, &ok);
    if (s->input_shape_set) {
        json_t *shape = json_array();
        for (int i = 0; shape && i < s->input_rank; i++)
            if (json_array_append_new(shape, json_integer(s->input_shape[i])) != 0)
                ok = false;
        put(j, "input_shape", shape, &ok);
    }
    put(j, "loss", json_string(loss_kind_name(s->loss)), &ok);
    put(j, "optimizer", optim_to_json(&s->optim), &ok);
    put(j, "data", data_to_json(&s->data, &ok), &ok);
    if (s->eval.every_steps > 0) {
        json_t *ev = json_pack("{s:o, s:I}", "data", data_to_json(&s->eval.data, &ok), "every_steps",
                               (json_int_t)s->eval.every_steps);
        if (ev && s->eval.max_batches > 0)
            put(ev, "max_batches", json_integer(s->eval.max_batches), &ok);
        put(j, "eval", ev, &ok);
    }
    put(j, "batch_size", json_integer(s->batch_size), &ok);
    if (s->steps > 0)
        put(j, "steps", json_integer(s->steps), &ok);
    else
        put(j, "epochs", json_integer(s->epochs), &ok);
    put(j, "grad_accum", json_integer(s->grad_accum), &ok);
    if (s->grad_clip > 0)
        put(j, "grad_clip", json_real(s->grad_clip), &ok);
    json_t *join = s->ddp.join == JOIN_AUTO ? json_string("auto") : json_boolean(s->ddp.join == JOIN_TRUE);
    if (!join)
        ok = false;
    json_t *ddp = join ? json_pack("{s:f, s:o, s:b, s:s, s:f}", "bucket_cap_mb", s->ddp.bucket_cap_mb, "join",
                                   join, "divide_by_initial_world_size", s->ddp.divide_by_initial_world_size,
                                   "backend", backend_names[s->ddp.backend], "timeout_s", s->ddp.timeout_s)
                       : NULL;
    /* comm_hook only when set: a spec without one prints as it always has. */
    if (ddp && s->ddp.comm_hook != COMM_HOOK_NONE)
        put(ddp, "comm_hook", json_string(comm_hook_names[s->ddp.comm_hook]), &ok);
    put(j, "ddp", ddp, &ok);
    if (s->init_from[0])
        put(j, "init",
            json_pack("{s:s, s:s}", "from", s->init_from, "format", init_format_names[s->init_format]), &ok);
    else if (s->init_from_job > 0 && s->init_from_step >= 0)
        put(j, "init",
            json_pack("{s:I, s:I}", "from_job", (json_int_t)s->init_from_job, "step",
                      (json_int_t)s->init_from_step),
            &ok);
    else if (s->init_from_job > 0)
        put(j, "init", json_pack("{s:I}", "from_job", (json_int_t)s->init_from_job), &ok);
    else
        put(j, "init", json_pack("{s:I}", "seed", (json_int_t)s->init_seed), &ok);
    json_t *ck = json_pack("{s:I, s:I}", "every_steps", (json_int_t)s->checkpoint_every, "keep_last",
                           (json_int_t)s->checkpoint_keep_last);
    if (ck && s->keep_best.on)
        put(ck, "keep_best", watch_to_json(&s->keep_best, false), &ok);
    put(j, "checkpoint", ck, &ok);
    if (s->early_stop.on)
        put(j, "early_stop", watch_to_json(&s->early_stop, true), &ok);
    put(j, "log_every", json_integer(s->log_every), &ok);
    put(j, "max_restarts", json_integer(s->max_restarts), &ok);
    put(j, "priority", json_integer(s->priority), &ok);
    put(j, "preemptible", json_boolean(s->preemptible), &ok);
    if (s->time_limit > 0)
        put(j, "time_limit", json_real(s->time_limit), &ok);
    if (s->preempt_grace > 0)
        put(j, "preempt_grace", json_real(s->preempt_grace), &ok);
    put(j, "on_nonfinite", json_string(nonfinite_names[s->on_nonfinite]), &ok);
    if (s->tokenizer_vocab[0])
        put(j, "tokenizer",
            json_pack("{s:s, s:s}", "vocab", s->tokenizer_vocab, "merges", s->tokenizer_merges), &ok);
    if (!ok) {
        json_decref(j);
        return NULL;
    }
    return j;
}

/* json_dump_callback's sink for spec_dumps: a growing buffer that remembers a failure
 * (jansson ignores the callback's answer for object keys). */
struct dump_buf {
    char *p;
    size_t len, cap;
    bool failed;
};

static int dump_append(const char *b, size_t n, void *arg)
{
    struct dump_buf *d = arg;
    if (d->failed)
        return -1;
    if (d->len + n + 1 > d->cap) {
        size_t cap = d->cap ? d->cap : 1024;
        while (cap < d->len + n + 1)
            cap *= 2;
        char *p = realloc(d->p, cap);
        if (!p) {
            d->failed = true;
            return -1;
        }
        d->p = p;
        d->cap = cap;
    }
    memcpy(d->p + d->len, b, n);
    d->len += n;
    d->p[d->len] = '\0';
    return 0;
}

char *spec_dumps(const struct spec *s)
{
    json_t *j = spec_to_json(s);
    struct dump_buf d = {0};
    if (!j || json_dump_callback(j, dump_append, &d, JSON_COMPACT) != 0 || d.failed || !d.p) {
        free(d.p);
        d.p = NULL;
    }
    if (d.p) /* a real as the user wrote it: 0.003, not 0.0030000000000000001 */
        jsonnum_tidy(d.p, d.len);
    json_decref(j);
    return d.p;
}
