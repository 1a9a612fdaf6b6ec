/* spec_data.c — the spec's `data` and `eval.data` objects (synthetic, npy, csv, tokens): their
 * keys and their fit to the model and the loss; and how rows fall into the ranks' shards and
 * batches (spec_shard_rows, spec_batches, the join check). Opens no files: paths are only
 * checked for shape here; the worker resolves them against the data directory. */
#include "spec_impl.h"

const char *const data_names[] = {"synthetic", "npy", "csv", "tokens"};
const char *const dtype_names[] = {"uint16", "int32"};

static const char *const synthetic_keys[] = {"type", "samples", "seed", "shuffle", "drop_last"};
static const char *const npy_keys[] = {"type", "x", "y", "seed", "shuffle", "drop_last"};
static const char *const csv_keys[] = {"type", "path", "target", "seed", "shuffle", "drop_last"};
static const char *const tokens_keys[] = {"type", "path",    "block_size", "dtype",
                                          "seed", "shuffle", "drop_last"};

/* ---- the data objects ---- */

static ddpd_err parse_targets(struct ddpd_error *err, json_t *data, const char *P, struct spec *s,
                              struct spec_data *d)
{
    json_t *t = json_object_get(data, "target");
    char tp[PATH_CAP];
    ddpd_err rc;
    path_key(tp, P, "target");
    if (!t)
        return missing(err, tp, "a column name or a list of column names");
    if (json_is_string(t)) {
        rc = get_str_value(err, t, tp, d->targets[0], sizeof d->targets[0]);
        if (rc != DDPD_OK)
            return rc;
        if (!d->targets[0][0])
            return fail(err, tp, "expected a column name, got an empty string");
        d->n_targets = 1;
    } else if (json_is_array(t)) {
        size_t n = json_array_size(t);
        if (n == 0)
            return fail(err, tp, "expected at least one column name, got an empty list");
        if (n > SPEC_MAX_TARGETS)
            return fail(err, tp, "at most %d target columns, got %zu", SPEC_MAX_TARGETS, n);
        for (size_t i = 0; i < n; i++) {
            char path[PATH_CAP];
            path_index(path, tp, i);
            rc = get_str_value(err, json_array_get(t, i), path, d->targets[i], sizeof d->targets[i]);
            if (rc != DDPD_OK)
                return rc;
            if (!d->targets[i][0])
                return fail(err, path, "expected a column name, got an empty string");
            for (size_t j = 0; j < i; j++)
                if (strcmp(d->targets[i], d->targets[j]) == 0)
                    return fail(err, path, "column \"%s\" is already %s[%zu]", d->targets[i], tp, j);
        }
        d->n_targets = (int)n;
    } else {
        return fail_type(err, tp, "a column name or a list of column names", t);
    }

    /* The targets' shape is known here, so check it against the loss (CONTRACT.md §2:
     * mse wants [N,out], cross_entropy wants class ids [N]). */
    int64_t out = spec_out_width(s);
    if (s->loss == LOSS_CROSS_ENTROPY && d->n_targets != 1)
        return fail(err, tp, "cross_entropy needs exactly one target column (the class id), got %d",
                    d->n_targets);
    if (s->loss == LOSS_MSE && d->n_targets != out)
        return fail(err, tp, "mse needs %lld target columns (model[%lld].out), got %d", (long long)out,
                    (long long)last_linear(s), d->n_targets);
    return DDPD_OK;
}

/* tokens data (§2a): ids for a model that starts with embedding, samples [block_size]
 * = input_shape, next-token targets [T] for cross_entropy on logits [T,C]. */
static ddpd_err check_tokens(struct ddpd_error *err, const char *P, const struct spec *s,
                             const struct spec_data *d)
{
    char path[PATH_CAP], sh[128];
    const struct spec_layer *o = spec_output_layer(s);
    path_key(path, P, "type");
    if (s->layers[0].kind != LAYER_EMBEDDING)
        return fail(err, path,
                    "tokens data holds integer ids: the model must start with embedding (model[0] is %s)",
                    layer_kind_name(s->layers[0].kind));
    shape_str(sh, sizeof sh, s->input_rank, s->input_shape);
    if (s->input_rank != 1 || s->input_shape[0] != d->block_size) {
        path_key(path, P, "block_size");
        return fail(err, path,
                    "expected input_shape [%lld] for samples of block_size %lld, got input_shape %s",
                    (long long)d->block_size, (long long)d->block_size, sh);
    }
    if (s->loss != LOSS_CROSS_ENTROPY || o->out_rank != 2 || o->out_shape[0] != d->block_size) {
        shape_str(sh, sizeof sh, o->out_rank, o->out_shape);
        return fail(err, path,
                    "tokens data gives each sample [%lld] next-token targets: it needs loss cross_entropy on "
                    "logits [%lld,C] (the loss is %s, the model's output %s)",
                    (long long)d->block_size, (long long)d->block_size, loss_kind_name(s->loss), sh);
    }
    return DDPD_OK;
}

/* A data object at P ("data" or "eval.data"), into d. */
ddpd_err parse_data_obj(struct ddpd_error *err, json_t *obj, const char *P, struct spec *s,
                        struct spec_data *d)
{
    char path[PATH_CAP];
    int k = 0;
    int64_t seed = 0;
    ddpd_err rc = get_enum(err, obj, P, "type", data_names, COUNT(data_names), true, &k);
    if (rc != DDPD_OK)
        return rc;
    d->kind = (data_kind)k;
    d->shuffle = true;
    d->drop_last = false;
    /* Synthetic data comes from a teacher MLP, and a CSV row is a vector: both feed
     * models of linear layers and activations alone. */
    const int odd = first_non_mlp(s);
    if ((d->kind == DATA_SYNTHETIC || d->kind == DATA_CSV) && odd >= 0) {
        char lp[PATH_CAP];
        layer_path(lp, s, odd);
        path_key(path, P, "type");
        return fail(err, path,
                    "%s data feeds only models of linear layers and activations (%s is %s); use npy%s data",
                    data_names[k], lp, layer_kind_name(s->layers[odd].kind),
                    spec_input_ids(s) ? " or tokens" : "");
    }
    switch (d->kind) {
    case DATA_TOKENS:
        rc = check_keys(err, obj, P, tokens_keys, COUNT(tokens_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_path(err, obj, P, "path", true, d->path);
        if (rc == DDPD_OK)
            rc = get_int(err, obj, P, "block_size", 1, SPEC_MAX_T, true, &d->block_size);
        if (rc == DDPD_OK) {
            int dt = 0;
            rc = get_enum(err, obj, P, "dtype", dtype_names, COUNT(dtype_names), false, &dt);
            d->dtype = (tokens_dtype)dt;
        }
        if (rc == DDPD_OK)
            rc = check_tokens(err, P, s, d);
        break;
    case DATA_SYNTHETIC:
        rc = check_keys(err, obj, P, synthetic_keys, COUNT(synthetic_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_int(err, obj, P, "samples", 1, INT64_MAX, true, &d->samples);
        if (rc == DDPD_OK) { /* the teacher's cap, found here rather than by every rank */
            int64_t weights = 0;
            for (int i = 0; i < s->n_layers; i++)
                if (s->layers[i].kind == LAYER_LINEAR)
                    weights += s->layers[i].in * s->layers[i].out; /* <= 64 * 2^40: no overflow */
            path_key(path, P, "type");
            if (weights > SPEC_MAX_SYNTHETIC_WEIGHTS)
                rc =
                    fail(err, path,
                         "synthetic data is drawn from a teacher of the model's shape, at most %lld weights; "
                         "the model has %lld (use npy or csv data)",
                         SPEC_MAX_SYNTHETIC_WEIGHTS, (long long)weights);
        }
        break;
    case DATA_NPY: {
        char xp[PATH_CAP], yp[PATH_CAP];
        path_key(xp, P, "x");
        path_key(yp, P, "y");
        rc = check_keys(err, obj, P, npy_keys, COUNT(npy_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_path(err, obj, P, "x", true, d->x);
        if (rc == DDPD_OK)
            rc = get_path(err, obj, P, "y", true, d->y);
        /* A {rank} x is one rank's file, so its y must be one too (and the other way round):
         * found here, not by every rank after the job was accepted. */
        if (rc == DDPD_OK && !strstr(d->x, "{rank}") != !strstr(d->y, "{rank}"))
            rc = fail(err, strstr(d->x, "{rank}") ? yp : xp,
                      "x and y must both hold {rank} (one file per rank) or neither (got x \"%.100s\", "
                      "y \"%.100s\")",
                      d->x, d->y);
        break;
    }
    case DATA_CSV:
        rc = check_keys(err, obj, P, csv_keys, COUNT(csv_keys), NULL);
        if (rc == DDPD_OK)
            rc = get_path(err, obj, P, "path", true, d->path);
        if (rc == DDPD_OK)
            rc = parse_targets(err, obj, P, s, d);
        break;
    }
    if (rc == DDPD_OK)
        rc = get_int(err, obj, P, "seed", 0, INT64_MAX, false, &seed);
    if (rc == DDPD_OK)
        rc = get_bool(err, obj, P, "shuffle", &d->shuffle);
    if (rc == DDPD_OK)
        rc = get_bool(err, obj, P, "drop_last", &d->drop_last);
    d->seed = (uint64_t)seed;
    return rc;
}

ddpd_err parse_data(struct ddpd_error *err, json_t *root, struct spec *s)
{
    json_t *obj;
    ddpd_err rc = get_obj(err, root, "data", true, "{\"type\": \"synthetic\", \"samples\": 1000}", &obj);
    if (rc != DDPD_OK)
        return rc;
    return parse_data_obj(err, obj, "data", s, &s->data);
}

/* ---- rows, shards and batches ---- */

int64_t spec_batch_rows(const struct spec *s, int64_t shard_rows)
{
    int64_t r = s->batch_size < shard_rows ? s->batch_size : shard_rows;
    return r > 0 ? r : 1;
}

int64_t spec_shard_rows(int64_t rows, int rank, int world)
{
    return rows / world + (rank < rows % world ? 1 : 0);
}

int64_t spec_batches(int64_t rows, int64_t batch, bool drop_last)
{
    /* Not (rows + batch - 1) / batch: that overflows for sizes near INT64_MAX. */
    return rows / batch + (!drop_last && rows % batch != 0);
}

ddpd_err spec_check_batch_counts(const struct spec *s, const int64_t *counts, struct ddpd_error *err)
{
    int uneven = -1, empty = -1, busy = -1;
    for (int r = 0; r < s->world_size; r++) {
        if (counts[r] != counts[0] && uneven < 0)
            uneven = r;
        if (counts[r] == 0 && empty < 0)
            empty = r;
        if (counts[r] > 0 && busy < 0)
            busy = r;
    }
    if (uneven < 0 || s->ddp.join != JOIN_FALSE)
        return DDPD_OK;
    /* PyTorch runs a rank without inputs under join: it joins at once and shadows every
     * step of the others. */
    if (empty >= 0 && busy >= 0)
        return ddpd_error_set(
            err, DDPD_ESPEC, "ddp.join",
            "ddp.join: rank %d has no batch of %" PRId64 " (its shard is empty%s) while rank %d "
            "has %" PRId64 "; with join \"auto\" or true it would join at once and shadow the "
            "others' steps, but join is false",
            empty, s->batch_size, s->data.drop_last ? " or smaller than a batch" : "", busy, counts[busy]);
    return ddpd_error_set(err, DDPD_ESPEC, "ddp.join",
                          "ddp.join: the ranks have uneven batch counts per epoch (rank 0: %" PRId64
                          ", rank %d: %" PRId64 ") but join is false; use \"auto\" or true",
                          counts[0], uneven, counts[uneven]);
}
