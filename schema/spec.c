/* spec.c — parses and validates the job spec of CONTRACT.md §2 and §2a (v2: the layer tree,
 * input_shape and the shapes inferred from it, tokens data, eval, the lr schedule, grad_clip) into
 * a struct spec: spec_parse and spec_from_json, the top-level keys, and the sections that are
 * neither the model (spec_layers.c) nor the data (spec_data.c): loss, optimizer and schedule,
 * eval, ddp, init, checkpoint. Every error names the JSON path and says what was expected and
 * what came. Knows jansson and nothing else: it opens no files. */
#include "gpt2.h"
#include "jobmeta.h"
#include "spec_impl.h"

static const char *const loss_names[] = {"mse", "cross_entropy"};
static const char *const optim_names[] = {"sgd", "adamw"};
const char *const sched_names[] = {"constant", "linear", "cosine"};
static const char *const device_names[] = {"cpu", "cuda"};
const char *const backend_names[] = {"cpu", "nccl"};
const char *const comm_hook_names[] = {"none", "fp16", "bf16"};
const char *const precision_names[] = {"fp32", "tf32"};
const char *const nonfinite_names[] = {"fail", "continue"}; /* nonfinite_mode order */

/* The keys each object may hold, in the order error messages list them. */
static const char *const top_keys[] = {
    "name",      "world_size", "device",   "precision",   "model",      "input_shape",  "loss",
    "optimizer", "data",       "eval",     "batch_size",  "epochs",     "steps",        "grad_accum",
    "grad_clip", "ddp",        "init",     "checkpoint",  "log_every",  "max_restarts", "on_nonfinite",
    "tokenizer", "early_stop", "priority", "preemptible", "time_limit", "preempt_grace"};
static const char *const sgd_keys[] = {"type",         "lr",       "momentum", "dampening",
                                       "weight_decay", "nesterov", "schedule"};
static const char *const adamw_keys[] = {"type", "lr", "betas", "eps", "weight_decay", "schedule"};
static const char *const schedule_keys[] = {"type", "warmup_steps", "min_lr", "total_steps"};
static const char *const eval_keys[] = {"data", "every_steps", "max_batches"};
static const char *const ddp_keys[] = {"bucket_cap_mb", "join",      "divide_by_initial_world_size",
                                       "backend",       "timeout_s", "comm_hook"};
static const char *const init_keys[] = {"seed", "from", "from_job", "step", "format"};
const char *const init_format_names[] = {"ddpd", "gpt2"}; /* init_format_kind order */
static const char *const checkpoint_keys[] = {"every_steps", "keep_last", "keep_best"};
static const char *const tokenizer_keys[] = {"vocab", "merges"};

/* ---- loss, optimizer and schedule ---- */

static ddpd_err parse_loss(struct ddpd_error *err, json_t *root, struct spec *s)
{
    int k = 0;
    ddpd_err rc = get_enum(err, root, "", "loss", loss_names, COUNT(loss_names), true, &k);
    if (rc != DDPD_OK)
        return rc;
    s->loss = (loss_kind)k;
    if (s->loss != LOSS_CROSS_ENTROPY)
        return DDPD_OK; /* mse: any output shape */
    const struct spec_layer *o = spec_output_layer(s);
    char sh[128];
    shape_str(sh, sizeof sh, o->out_rank, o->out_shape);
    if (o->out_rank > 2)
        return fail(err, "loss",
                    "cross_entropy needs logits [C] or [T,C] per sample, the model's output is %s", sh);
    /* Cross entropy over one class is always zero: surely a mistake. */
    if (spec_classes(s) < 2) {
        int64_t ll = last_linear(s);
        if (o->out_rank == 1 && ll >= 0 && s->layers[ll].parent < 0 && s->layers[ll].out == spec_classes(s))
            return fail(err, "loss", "cross_entropy needs at least 2 outputs (model[%lld].out is %lld)",
                        (long long)ll, (long long)s->layers[ll].out);
        return fail(err, "loss", "cross_entropy needs at least 2 classes, the model's output is %s", sh);
    }
    return DDPD_OK;
}

static ddpd_err parse_optimizer_kind(struct ddpd_error *err, json_t *root, struct spec *s)
{
    struct spec_optim *o = &s->optim;
    const char *P = "optimizer";
    json_t *obj;
    int k = 0;
    ddpd_err rc = get_obj(err, root, "optimizer", true, "{\"type\": \"sgd\", \"lr\": 0.01}", &obj);
    if (rc == DDPD_OK)
        rc = get_enum(err, obj, P, "type", optim_names, COUNT(optim_names), true, &k);
    if (rc != DDPD_OK)
        return rc;
    o->kind = (optim_kind)k;
    if (o->kind == OPTIM_SGD) {
        o->lr = 0;
        o->momentum = o->dampening = o->weight_decay = 0;
        o->nesterov = false;
        rc = check_keys(err, obj, P, sgd_keys, COUNT(sgd_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "lr", 0, true, INFINITY, false, "a positive number", true, &o->lr);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "momentum", 0, false, INFINITY, false, "a non-negative number", false,
                         &o->momentum);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "dampening", 0, false, INFINITY, false, "a non-negative number", false,
                         &o->dampening);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "weight_decay", 0, false, INFINITY, false, "a non-negative number",
                         false, &o->weight_decay);
        if (rc == DDPD_OK)
            rc = get_bool(err, obj, P, "nesterov", &o->nesterov);
        if (rc != DDPD_OK)
            return rc;
        /* PyTorch's own check, in its words. */
        if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
            return fail(err, "optimizer.nesterov",
                        "nesterov momentum requires a momentum and zero dampening");
        return DDPD_OK;
    }

    o->lr = 0.001;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->weight_decay = 0.01;
    rc = check_keys(err, obj, P, adamw_keys, COUNT(adamw_keys), NULL);
    if (rc == DDPD_OK)
        rc = get_num(err, obj, P, "lr", 0, true, INFINITY, false, "a positive number", false, &o->lr);
    if (rc != DDPD_OK)
        return rc;
    json_t *betas = json_object_get(obj, "betas");
    if (betas) {
        if (!json_is_array(betas))
            return fail_type(err, "optimizer.betas", "a list of 2 numbers", betas);
        if (json_array_size(betas) != 2)
            return fail(err, "optimizer.betas", "expected a list of 2 numbers, got %zu",
                        json_array_size(betas));
        for (size_t i = 0; i < 2; i++) {
            char path[PATH_CAP];
            json_t *b = json_array_get(betas, i);
            double x;
            path_index(path, "optimizer.betas", i);
            if (!json_is_number(b) || !isfinite(x = json_number_value(b)) || x < 0 || x >= 1)
                return fail_type(err, path, "a number in [0, 1)", b);
            *(i ? &o->beta2 : &o->beta1) = x;
        }
    }
    rc = get_num(err, obj, P, "eps", 0, true, INFINITY, false, "a positive number", false, &o->eps);
    if (rc == DDPD_OK)
        rc = get_num(err, obj, P, "weight_decay", 0, false, INFINITY, false, "a non-negative number", false,
                     &o->weight_decay);
    return rc;
}

/* optimizer.schedule (§2a); warmup_steps < total_steps is checked once `steps` is known
 * (check_schedule). */
static ddpd_err parse_optimizer(struct ddpd_error *err, json_t *root, struct spec *s)
{
    struct spec_optim *o = &s->optim;
    const char *P = "optimizer.schedule";
    int k = 0;
    ddpd_err rc = parse_optimizer_kind(err, root, s);
    if (rc != DDPD_OK)
        return rc;
    json_t *obj = json_object_get(json_object_get(root, "optimizer"), "schedule");
    if (!obj)
        return DDPD_OK;
    if (!json_is_object(obj))
        return fail_type(err, P, "an object such as {\"type\": \"cosine\", \"warmup_steps\": 100}", obj);
    rc = check_keys(err, obj, P, schedule_keys, COUNT(schedule_keys), NULL);
    if (rc == DDPD_OK)
        rc = get_enum(err, obj, P, "type", sched_names, COUNT(sched_names), true, &k);
    o->schedule = (sched_kind)k;
    if (rc == DDPD_OK)
        rc = get_int(err, obj, P, "warmup_steps", 0, INT64_MAX, false, &o->warmup_steps);
    if (rc == DDPD_OK)
        rc = get_num(err, obj, P, "min_lr", 0, false, INFINITY, false, "a non-negative number", false,
                     &o->min_lr);
    if (rc == DDPD_OK && o->min_lr > o->lr) {
        char lr[40];
        fmt_real(lr, sizeof lr, o->lr);
        json_t *v = json_object_get(obj, "min_lr");
        char want[80], d[200];
        snprintf(want, sizeof want, "a number from 0 to optimizer.lr (%s)", lr);
        return fail(err, "optimizer.schedule.min_lr", "expected %s, got %s", want, describe(v, d, sizeof d));
    }
    if (rc == DDPD_OK)
        rc = get_int(err, obj, P, "total_steps", 1, INT64_MAX, false, &o->total_steps);
    return rc;
}

/* warmup_steps < total_steps when both are known: the schedule divides by their
 * difference after the warmup. */
static ddpd_err check_schedule(struct ddpd_error *err, const struct spec *s)
{
    const struct spec_optim *o = &s->optim;
    if (o->warmup_steps == 0)
        return DDPD_OK;
    if (o->total_steps > 0 && o->warmup_steps >= o->total_steps)
        return fail(err, "optimizer.schedule.warmup_steps",
                    "expected fewer than total_steps (%lld), got %lld", (long long)o->total_steps,
                    (long long)o->warmup_steps);
    if (o->total_steps == 0 && s->steps > 0 && o->warmup_steps >= s->steps)
        return fail(err, "optimizer.schedule.warmup_steps",
                    "expected fewer than the job's steps (%lld: total_steps defaults to them), got %lld",
                    (long long)s->steps, (long long)o->warmup_steps);
    return DDPD_OK;
}

/* ---- eval, ddp, init and the top level ---- */

/* eval (§2a): a data object evaluated every every_steps optimizer steps, never shuffled. */
static ddpd_err parse_eval(struct ddpd_error *err, json_t *root, struct spec *s)
{
    struct spec_eval *e = &s->eval;
    const char *P = "eval";
    json_t *obj;
    ddpd_err rc = get_obj(err, root, "eval", false, "", &obj);
    if (rc != DDPD_OK || !obj)
        return rc;
    rc = check_keys(err, obj, P, eval_keys, COUNT(eval_keys), NULL);
    if (rc != DDPD_OK)
        return rc;
    json_t *data = json_object_get(obj, "data");
    if (!data)
        return fail(
            err, "eval.data",
            "missing (expected a data object such as {\"type\": \"npy\", \"x\": \"val_x.npy\", \"y\": "
            "\"val_y.npy\"})");
    if (!json_is_object(data))
        return fail_type(err, "eval.data", "a data object", data);
    if ((rc = parse_data_obj(err, data, "eval.data", s, &e->data)) != DDPD_OK)
        return rc;
    /* Eval data is never shuffled (§2a): false by default, and true is refused. */
    json_t *shuffle = json_object_get(data, "shuffle");
    if (json_is_true(shuffle))
        return fail(err, "eval.data.shuffle", "expected false (eval data is never shuffled), got true");
    e->data.shuffle = false;
    rc = get_int(err, obj, P, "every_steps", 1, INT64_MAX, true, &e->every_steps);
    if (rc == DDPD_OK)
        rc = get_int(err, obj, P, "max_batches", 1, INT64_MAX, false, &e->max_batches);
    return rc;
}

static ddpd_err parse_ddp(struct ddpd_error *err, json_t *root, struct spec *s)
{
    struct spec_ddp *d = &s->ddp;
    const char *P = "ddp";
    json_t *obj;
    int backend = -1, hook = COMM_HOOK_NONE;
    d->bucket_cap_mb = 25;
    d->join = JOIN_AUTO;
    d->divide_by_initial_world_size = true;
    d->timeout_s = 300;
    ddpd_err rc = get_obj(err, root, "ddp", false, "", &obj);
    if (rc != DDPD_OK)
        return rc;
    if (obj) {
        rc = check_keys(err, obj, P, ddp_keys, COUNT(ddp_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "bucket_cap_mb", 0, true, 1024, false,
                         "a number greater than 0 and at most 1024", false, &d->bucket_cap_mb);
        if (rc != DDPD_OK)
            return rc;
        json_t *join = json_object_get(obj, "join");
        if (join) {
            if (json_is_boolean(join))
                d->join = json_is_true(join) ? JOIN_TRUE : JOIN_FALSE;
            else if (json_is_string(join) && strcmp(json_string_value(join), "auto") == 0 &&
                     json_string_length(join) == 4)
                d->join = JOIN_AUTO;
            else
                return fail_type(err, "ddp.join", "true, false or \"auto\"", join);
        }
        rc = get_bool(err, obj, P, "divide_by_initial_world_size", &d->divide_by_initial_world_size);
        if (rc == DDPD_OK)
            rc = get_enum(err, obj, P, "backend", backend_names, COUNT(backend_names), false, &backend);
        if (rc == DDPD_OK)
            rc = get_num(err, obj, P, "timeout_s", 0, true, 86400, false,
                         "a number of seconds greater than 0 and at most 86400", false, &d->timeout_s);
        if (rc == DDPD_OK)
            rc = get_enum(err, obj, P, "comm_hook", comm_hook_names, COUNT(comm_hook_names), false, &hook);
        if (rc != DDPD_OK)
            return rc;
    }
    d->comm_hook = (comm_hook_kind)hook;
    if (d->comm_hook != COMM_HOOK_NONE) {
        /* The hook casts, divides and sums its 16-bit buckets on the host, over the cpu
         * collectives: not on a GPU nor over NCCL (yet). */
        if (s->device == DEVICE_CUDA)
            return fail(err, "ddp.comm_hook", "\"%s\" needs device \"cpu\" (device is \"cuda\")",
                        comm_hook_names[hook]);
        /* PyTorch's hooks divide by the world size, whatever join's divisor says. */
        if (!d->divide_by_initial_world_size)
            return fail(err, "ddp.comm_hook",
                        "\"%s\" divides by the world size, as PyTorch's hook does: it cannot apply with "
                        "ddp.divide_by_initial_world_size false",
                        comm_hook_names[hook]);
    }
    if (backend >= 0) {
        d->backend = (comm_backend)backend;
        d->backend_set = true;
        /* cpu with cuda is fine (host-staged); NCCL has no CPU tensors. */
        if (d->backend == BACKEND_NCCL && s->device == DEVICE_CPU)
            return fail(err, "ddp.backend", "nccl needs device \"cuda\" (device is \"cpu\")");
    } else {
        d->backend = s->device == DEVICE_CUDA ? BACKEND_NCCL : BACKEND_CPU;
    }
    return DDPD_OK;
}

/* init.format "gpt2" needs a model that is GPT-2-shaped: why not, at the layer. */
static ddpd_err check_gpt2(struct ddpd_error *err, const struct spec *s)
{
    struct gpt2_model *g = malloc(sizeof *g);
    if (!g)
        return ddpd_error_set(err, DDPD_ENOMEM, "init.format", "out of memory");
    ddpd_err rc = gpt2_model_of(s, g, err);
    free(g);
    if (rc == DDPD_ESPEC) {
        char msg[sizeof err->message], path[sizeof err->path];
        snprintf(msg, sizeof msg, "%s", err->message);
        snprintf(path, sizeof path, "%s", err->path);
        return fail(err, path, "init.format \"gpt2\" reads a Hugging Face GPT-2, but %s", msg);
    }
    return rc;
}

static ddpd_err parse_init(struct ddpd_error *err, json_t *root, struct spec *s)
{
    json_t *obj;
    int64_t seed = 0;
    ddpd_err rc = get_obj(err, root, "init", false, "", &obj);
    if (rc != DDPD_OK || !obj)
        return rc;
    rc = check_keys(err, obj, "init", init_keys, COUNT(init_keys), NULL);
    if (rc != DDPD_OK)
        return rc;
    bool has_seed = json_object_get(obj, "seed") != NULL;
    bool has_from = json_object_get(obj, "from") != NULL;
    bool has_job = json_object_get(obj, "from_job") != NULL;
    if (has_seed + has_from + has_job > 1)
        return fail(err, has_job ? "init.from_job" : "init.from",
                    "give one of seed, from and from_job, not %s",
                    has_seed + has_from + has_job == 3 ? "all three" : "two");
    if (!has_seed && !has_from && !has_job)
        return fail(err, "init.seed", "missing (give one of seed, from and from_job)");
    if (json_object_get(obj, "step") && !has_job)
        return fail(err, "init.step", "a checkpoint's step goes with from_job only");
    if (json_object_get(obj, "format")) {
        int k = 0;
        if ((rc =
                 get_enum(err, obj, "init", "format", init_format_names, COUNT(init_format_names), true, &k)))
            return rc;
        s->init_format = (init_format_kind)k;
        /* Another job's weights are ddpd's own, whatever their first job read. */
        if (!has_from && s->init_format != INIT_FORMAT_DDPD)
            return fail(err, "init.format", "\"%s\" goes with init.from (%s)", init_format_names[k],
                        has_job ? "a job's weights are in ddpd's own format" : "a file to read");
    }
    if (has_from && s->init_format == INIT_FORMAT_GPT2 && (rc = check_gpt2(err, s)))
        return rc;
    if (has_from)
        return get_path(err, obj, "init", "from", true, s->init_from);
    if (has_job) {
        /* Another job of the same server: the server finds its weights (the final model or
         * the newest checkpoint, or the checkpoint at init.step) in its own jobs folder. */
        s->init_from_step = -1;
        if ((rc = get_int(err, obj, "init", "from_job", 1, INT64_MAX, true, &s->init_from_job)))
            return rc;
        return json_object_get(obj, "step")
                   ? get_int(err, obj, "init", "step", 0, INT64_MAX, true, &s->init_from_step)
                   : DDPD_OK;
    }
    rc = get_int(err, obj, "init", "seed", 0, INT64_MAX, true, &seed);
    s->init_seed = (uint64_t)seed;
    return rc;
}

/* tokenizer: GPT-2's vocab.json and merges.txt, data paths, for a model that reads token
 * ids (the planner reads them and checks the vocabulary against the embedding). */
static ddpd_err parse_tokenizer(struct ddpd_error *err, json_t *root, struct spec *s)
{
    json_t *obj;
    ddpd_err rc = get_obj(err, root, "tokenizer", false, "", &obj);
    if (rc || !obj)
        return rc;
    if ((rc = check_keys(err, obj, "tokenizer", tokenizer_keys, COUNT(tokenizer_keys), NULL)) ||
        (rc = get_path(err, obj, "tokenizer", "vocab", true, s->tokenizer_vocab)) ||
        (rc = get_path(err, obj, "tokenizer", "merges", true, s->tokenizer_merges)))
        return rc;
    if (!spec_input_ids(s))
        return fail(err, "tokenizer",
                    "a tokenizer needs a model that reads token ids (its first layer embedding)");
    return DDPD_OK;
}

static ddpd_err parse_spec(json_t *root, const struct spec_parse_opts *opts, struct spec *s,
                           struct ddpd_error *err)
{
    json_t *obj;
    int k = 0;
    ddpd_err rc;

    s->world_size = 1;
    s->device = opts ? opts->default_device : DEVICE_CPU;
    s->grad_accum = 1;
    s->log_every = 1;
    s->priority = SPEC_PRIORITY_DEFAULT;
    s->preemptible = true;
    s->checkpoint_keep_last = 3;

    rc = check_keys(err, root, "", top_keys, COUNT(top_keys), NULL);
    if (rc != DDPD_OK)
        return rc;
    json_t *name = json_object_get(root, "name");
    if (name && (rc = get_str_value(err, name, "name", s->name, sizeof s->name)) != DDPD_OK)
        return rc;
    if ((rc = get_int32(err, root, "", "world_size", 1, SPEC_MAX_WORLD, &s->world_size)))
        return rc;
    if (json_object_get(root, "device")) {
        if ((rc = get_enum(err, root, "", "device", device_names, COUNT(device_names), true, &k)))
            return rc;
        s->device = (device_kind)k;
        s->device_set = true;
    }
    if (json_object_get(root, "precision")) {
        if ((rc = get_enum(err, root, "", "precision", precision_names, COUNT(precision_names), true, &k)))
            return rc;
        s->precision = (precision_kind)k;
        /* TF32 is a GPU tensor-core format; the CPU backend has no such mode. */
        if (s->precision == PRECISION_TF32 && s->device != DEVICE_CUDA)
            return fail(err, "precision", "tf32 needs device \"cuda\" (device is \"cpu\")");
    }
    if ((rc = parse_model(err, root, s)) || (rc = parse_loss(err, root, s)) ||
        (rc = parse_optimizer(err, root, s)) || (rc = parse_data(err, root, s)) ||
        (rc = parse_eval(err, root, s)))
        return rc;
    if ((rc = get_int(err, root, "", "batch_size", 1, INT64_MAX, true, &s->batch_size)))
        return rc;
    bool has_epochs = json_object_get(root, "epochs") != NULL;
    bool has_steps = json_object_get(root, "steps") != NULL;
    if (has_epochs && has_steps)
        return fail(err, "steps", "give either epochs or steps, not both");
    if (!has_epochs && !has_steps)
        return fail(err, "epochs", "missing (give either epochs or steps)");
    if ((rc = get_int(err, root, "", "epochs", 1, INT64_MAX, false, &s->epochs)) ||
        (rc = get_int(err, root, "", "steps", 1, INT64_MAX, false, &s->steps)) ||
        (rc = get_int(err, root, "", "grad_accum", 1, INT64_MAX, false, &s->grad_accum)) ||
        (rc = check_schedule(err, s)) ||
        (rc = get_num(err, root, "", "grad_clip", 0, true, INFINITY, false, "a positive number", false,
                      &s->grad_clip)))
        return rc;
    if ((rc = parse_ddp(err, root, s)) || (rc = parse_init(err, root, s)))
        return rc;
    if ((rc = get_obj(err, root, "checkpoint", false, "", &obj)))
        return rc;
    if (obj &&
        ((rc = check_keys(err, obj, "checkpoint", checkpoint_keys, COUNT(checkpoint_keys), NULL)) ||
         (rc = get_int(err, obj, "checkpoint", "every_steps", 0, INT64_MAX, false, &s->checkpoint_every)) ||
         (rc = get_int(err, obj, "checkpoint", "keep_last", 1, INT64_MAX, false, &s->checkpoint_keep_last))))
        return rc;
    if ((rc = parse_watch(err, root, obj, s)))
        return rc;
    if ((rc = get_int(err, root, "", "log_every", 1, INT64_MAX, false, &s->log_every)) ||
        (rc = get_int32(err, root, "", "max_restarts", 0, 100, &s->max_restarts)) ||
        (rc = get_int32(err, root, "", "priority", 0, 100, &s->priority)) ||
        (rc = get_bool(err, root, "", "preemptible", &s->preemptible)) ||
        (rc = get_num(err, root, "", "time_limit", 0, true, 1e9, false, "a number of seconds above 0", false,
                      &s->time_limit)) ||
        (rc = get_num(err, root, "", "preempt_grace", 0, true, 86400, false,
                      "a number of seconds above 0, at most 86400", false, &s->preempt_grace)))
        return rc;
    if (json_object_get(root, "on_nonfinite")) {
        if ((rc = get_enum(err, root, "", "on_nonfinite", nonfinite_names, COUNT(nonfinite_names), true, &k)))
            return rc;
        s->on_nonfinite = (nonfinite_mode)k;
    }
    return parse_tokenizer(err, root, s);
}

ddpd_err spec_from_json(struct json_t *obj, const struct spec_parse_opts *opts, struct spec *out,
                        struct ddpd_error *err)
{
    char d[200];
    memset(out, 0, sizeof *out);
    ddpd_error_clear(err);
    if (!obj)
        return fail(err, "", "expected a JSON object, got nothing");
    if (!json_is_object(obj))
        return fail(err, "", "expected a JSON object at the top level, got %s", describe(obj, d, sizeof d));
    return parse_spec(obj, opts, out, err);
}

/* jansson reports a duplicate key without naming it when the key is long; the key is the
 * string that ends just before the error position, so find its opening quote (the first
 * one before it that is not escaped) and decode it. */
static void duplicate_key_text(const char *text, size_t len, size_t pos, char *dst, size_t cap)
{
    snprintf(dst, cap, "duplicate key");
    if (pos < 2 || pos > len || text[pos - 1] != '"')
        return;
    for (size_t i = pos - 1; i-- > 0;) {
        size_t bs = 0;
        if (text[i] != '"')
            continue;
        while (bs < i && text[i - 1 - bs] == '\\')
            bs++;
        if (bs % 2)
            continue;
        json_t *key = json_loadb(text + i, pos - i, JSON_DECODE_ANY, NULL);
        if (json_is_string(key)) {
            char q[160];
            quote_into(q, sizeof q, json_string_value(key), json_string_length(key), 64);
            snprintf(dst, cap, "duplicate key \"%s\"", q);
        }
        json_decref(key);
        return;
    }
}

ddpd_err spec_parse(const char *text, size_t len, const struct spec_parse_opts *opts, struct spec *out,
                    struct ddpd_error *err)
{
    json_error_t jerr;
    json_t *root = NULL;
    ddpd_err rc;

    memset(out, 0, sizeof *out);
    ddpd_error_clear(err);
    if (len > SPEC_MAX_BODY) {
        rc = ddpd_error_set(err, DDPD_ETOOBIG, "", "the spec is %zu bytes; the limit is %d bytes (1 MiB)",
                            len, SPEC_MAX_BODY);
        goto out;
    }
    root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        /* jansson does not always say that it ran out of memory: it may report an empty
         * message, or a syntax error where an allocation failed. A genuine syntax error
         * comes back the same from a second parse; anything else was memory. */
        json_error_t again;
        root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &again);
        if (!root && (json_error_code(&jerr) == json_error_out_of_memory || !jerr.text[0] ||
                      again.position != jerr.position || strcmp(again.text, jerr.text) != 0)) {
            rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory reading the spec");
            goto out;
        }
    }
    if (!root) {
        char what[200];
        if (json_error_code(&jerr) == json_error_duplicate_key)
            duplicate_key_text(text, len, (size_t)jerr.position, what, sizeof what);
        else
            snprintf(what, sizeof what, "%s", jerr.text);
        int line = jerr.line > 0 ? jerr.line : 1, column = jerr.column > 0 ? jerr.column : 1;
        rc = ddpd_error_set(err, DDPD_EJSON, "", "malformed JSON at line %d, column %d: %s", line, column,
                            what);
        if (err) {
            err->line = line;
            err->column = column;
        }
        goto out;
    }
    if (opts && opts->job_file) {
        struct jobmeta meta;
        rc = jobmeta_from_json(root, true, &meta, err);
        jobmeta_clear(&meta);
        if (rc)
            goto out;
    }
    rc = spec_from_json(root, opts, out, err);
out:
    json_decref(root);
    return rc;
}

const char *loss_kind_name(loss_kind k)
{
    return (unsigned)k < COUNT(loss_names) ? loss_names[k] : "unknown";
}

const char *device_kind_name(device_kind k)
{
    return (unsigned)k < COUNT(device_names) ? device_names[k] : "unknown";
}
