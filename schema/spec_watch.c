/* spec_watch.c — the spec's watches of an eval metric: `early_stop` (end the job when the
 * metric stops improving, as Lightning's EarlyStopping) and `checkpoint.keep_best` (keep
 * the best eval's checkpoint, as ModelCheckpoint's save_top_k=1): their keys, defaults and
 * the checks against the loss and eval they need. The rules themselves run in the worker
 * (worker/watch.c). Knows jansson and nothing else. */
#include "spec_impl.h"

static const char *const metric_names[] = {"eval_loss", "eval_accuracy"}; /* watch_metric order */
static const char *const mode_names[] = {"min", "max"};                   /* watch_mode order */
static const char *const keep_best_keys[] = {"metric", "mode"};
static const char *const early_stop_keys[] = {"metric", "mode", "patience", "min_delta"};

/* The object at `path` ("early_stop", "checkpoint.keep_best") into w. */
static ddpd_err parse_one(struct ddpd_error *err, json_t *obj, const char *path, bool early_stop,
                          const struct spec *s, struct spec_watch *w)
{
    char p[PATH_CAP];
    int k = 0;
    ddpd_err rc = early_stop ? check_keys(err, obj, path, early_stop_keys, COUNT(early_stop_keys), NULL)
                             : check_keys(err, obj, path, keep_best_keys, COUNT(keep_best_keys), NULL);
    if (rc || (rc = get_enum(err, obj, path, "metric", metric_names, COUNT(metric_names), true, &k)))
        return rc;
    w->on = true;
    w->metric = (watch_metric)k;
    w->mode = w->metric == WATCH_EVAL_ACCURACY ? WATCH_MAX : WATCH_MIN;
    if (json_object_get(obj, "mode")) {
        if ((rc = get_enum(err, obj, path, "mode", mode_names, COUNT(mode_names), true, &k)))
            return rc;
        w->mode = (watch_mode)k;
    }
    w->patience = 3; /* Lightning's default */
    w->min_delta = 0;
    if (early_stop && ((rc = get_int(err, obj, path, "patience", 0, INT64_MAX, false, &w->patience)) ||
                       (rc = get_num(err, obj, path, "min_delta", -INFINITY, true, INFINITY, true,
                                     "a finite number", false, &w->min_delta))))
        return rc;
    /* The metric comes from the eval events: it needs eval, and accuracy a classifier. */
    if (s->eval.every_steps <= 0)
        return fail(err, path,
                    "watches %s, which needs eval (eval.every_steps >= 1 with eval.data); the spec has no "
                    "eval",
                    metric_names[w->metric]);
    if (w->metric == WATCH_EVAL_ACCURACY && s->loss != LOSS_CROSS_ENTROPY) {
        path_key(p, path, "metric");
        return fail(err, p, "eval_accuracy needs a classifier (loss \"cross_entropy\"), the loss is \"%s\"",
                    loss_kind_name(s->loss));
    }
    return DDPD_OK;
}

ddpd_err parse_watch(struct ddpd_error *err, json_t *root, json_t *checkpoint, struct spec *s)
{
    json_t *kb = checkpoint ? json_object_get(checkpoint, "keep_best") : NULL;
    json_t *es = json_object_get(root, "early_stop");
    ddpd_err rc;
    if (kb && !json_is_object(kb))
        return fail_type(err, "checkpoint.keep_best", "an object such as {\"metric\": \"eval_loss\"}", kb);
    if (kb && (rc = parse_one(err, kb, "checkpoint.keep_best", false, s, &s->keep_best)))
        return rc;
    if (es && !json_is_object(es))
        return fail_type(err, "early_stop", "an object such as {\"metric\": \"eval_loss\", \"patience\": 3}",
                         es);
    if (es && (rc = parse_one(err, es, "early_stop", true, s, &s->early_stop)))
        return rc;
    return DDPD_OK;
}

json_t *watch_to_json(const struct spec_watch *w, bool early_stop)
{
    json_t *o = json_pack("{s:s, s:s}", "metric", metric_names[w->metric], "mode", mode_names[w->mode]);
    if (o && early_stop &&
        (json_object_set_new(o, "patience", json_integer(w->patience)) ||
         json_object_set_new(o, "min_delta", json_real(w->min_delta)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

const char *watch_metric_name(watch_metric m)
{
    return (unsigned)m < COUNT(metric_names) ? metric_names[m] : "unknown";
}
