/* api_files.c — what a job left behind, as the API reads it: its loss curve
 * (GET .../metrics, from the store), its ranks' logs, its checkpoints and weights (from
 * its folder under the jobs folder). Reads only; never blocks on a file that is not a
 * regular one. */
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../schema/gpt2.h"
#include "../schema/jobdir.h"
#include "gpt2_export.h"
#include "api_impl.h"
#include "http.h"
#include "store.h"

/* "5, 10, 15" (the newest few when there are many) into buf[cap]; "none" for no steps. */
void api__steps_text(const int64_t *steps, size_t n, char *buf, size_t cap)
{
    size_t first = n > 8 ? n - 8 : 0, len = 0;
    buf[0] = '\0';
    if (!n)
        snprintf(buf, cap, "none");
    if (first)
        len += (size_t)snprintf(buf, cap, "... ");
    for (size_t i = first; i < n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64, i > first ? ", " : "", steps[i]);
}

/* `code` at `path`: "<prefix>job ID has no checkpoint at step STEP; it has steps 5, 10"
 * (or "step 5", or "none"), the steps read from the job's folder `dir`. */
ddpd_err api__no_checkpoint_at(struct ddpd_error *err, ddpd_err code, const char *path, const char *prefix,
                               const char *dir, int64_t id, int64_t step)
{
    int64_t *steps;
    size_t n;
    char list[256];
    if (!jobdir_ckpt_list(dir, &steps, &n))
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory listing the checkpoints");
    api__steps_text(steps, n, list, sizeof list);
    free(steps);
    /* The best one (checkpoint.keep_best) is a checkpoint too. */
    char best_text[64] = "";
    int64_t best;
    if (jobdir_best_find(dir, &best) && n)
        snprintf(best_text, sizeof best_text, ", and its best one at step %" PRId64, best);
    else if (jobdir_best_find(dir, &best))
        snprintf(list, sizeof list, "only its best one, at step %" PRId64, best);
    return ddpd_error_set(err, code, path,
                          "%sjob %" PRId64 " has no checkpoint at step %" PRId64 "; it has %s%s%s", prefix,
                          id, step, n ? (n > 1 ? "steps " : "step ") : "", list, best_text);
}

ddpd_err api__metrics(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    int64_t maxp;
    ddpd_err rc = http_query_int(req, "max_points", 2, STORE_METRICS_MAX_POINTS, 1000, &maxp, err);
    if (rc)
        return rc;
    struct store_job j;
    if ((rc = api__get_job(req, &j, err)))
        return rc;
    store_job_clear(&j);
    struct store_metrics m;
    if ((rc = store_metrics_get(a->store, http_request_id(req, 0), (int)maxp, &m, err)))
        return rc;
    json_t *series = json_array();
    json_t *mean = json_null();
    for (size_t i = 0; i < m.n_series; i++) {
        const struct store_series *s = &m.series[i];
        json_t *steps = json_array(), *loss = json_array();
        for (size_t k = 0; k < s->n; k++) {
            json_array_append_new(steps, json_integer(s->step[k]));
            json_array_append_new(loss, isfinite(s->loss[k]) ? json_real(s->loss[k]) : json_null());
        }
        json_t *o = json_pack("{s:o, s:o}", "step", steps, "loss", loss);
        if (s->rank < 0) {
            json_decref(mean);
            mean = o;
        } else {
            json_object_set_new(o, "rank", json_integer(s->rank));
            json_array_append_new(series, o);
        }
    }
    /* The lr of each logged step, and the eval points (CONTRACT.md §2a), as columns. */
    json_t *lr_step = json_array(), *lr = json_array();
    for (size_t k = 0; k < m.lr.n; k++) {
        json_array_append_new(lr_step, json_integer(m.lr.step[k]));
        json_array_append_new(lr, json_real(m.lr.loss[k]));
    }
    json_t *ev_step = json_array(), *ev_loss = json_array(), *ev_acc = json_array(), *ev_n = json_array();
    for (size_t k = 0; k < m.n_eval; k++) {
        const struct store_eval *e = &m.eval[k];
        json_array_append_new(ev_step, json_integer(e->step));
        json_array_append_new(ev_loss, isfinite(e->loss) ? json_real(e->loss) : json_null());
        json_array_append_new(ev_acc, e->has_accuracy && isfinite(e->accuracy) ? json_real(e->accuracy)
                                                                               : json_null());
        json_array_append_new(ev_n, json_integer(e->samples));
    }
    json_t *out =
        json_pack("{s:I, s:I, s:I, s:o, s:o, s:{s:o, s:o}, s:{s:o, s:o, s:o, s:o}}", "points",
                  (json_int_t)m.points, "first_step", (json_int_t)m.first_step, "last_step",
                  (json_int_t)m.last_step, "mean", mean, "ranks", series, "lr", "step", lr_step, "lr", lr,
                  "eval", "step", ev_step, "loss", ev_loss, "accuracy", ev_acc, "samples", ev_n);
    store_metrics_free(&m);
    return http_respond_json(req, 200, out);
}

ddpd_err api__logs(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    struct store_job j;
    ddpd_err rc = api__get_job(req, &j, err);
    if (rc)
        return rc;
    int world = j.world_size;
    store_job_clear(&j);
    int64_t rank, tail;
    if ((rc = http_query_int(req, "rank", 0, world - 1, 0, &rank, err)) ||
        (rc = http_query_int(req, "tail", 1, 100000, 200, &tail, err)))
        return rc;
    char path[PATH_MAX];
    char dir[PATH_MAX];
    jobdir_job_path(dir, sizeof dir, a->jobs_dir, http_request_id(req, 0));
    jobdir_rank_log_path(path, sizeof path, dir, (int)rank);
    /* Not blocking, no links, a regular file only: a FIFO or a device in the job's folder
     * must not hold an HTTP thread (nor a link make it read another file). */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        return ddpd_error_set(err, DDPD_EIO, "", "%s of job %" PRId64 " is not a regular file",
                              strrchr(path, '/') + 1, http_request_id(req, 0));
    }
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0)
            close(fd);
        return http_respond_text(req, 200, "");
    }
    /* The last `tail` lines: read at most 4 MiB from the end. */
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long start = size > (4 << 20) ? size - (4 << 20) : 0;
    fseek(f, start, SEEK_SET);
    char *buf = malloc((size_t)(size - start) + 1);
    size_t n = buf ? fread(buf, 1, (size_t)(size - start), f) : 0;
    fclose(f);
    if (!buf)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
    buf[n] = '\0';
    const char *p = buf + n;
    int64_t lines = 0;
    if (p > buf && p[-1] == '\n')
        p--;
    while (p > buf && lines < tail)
        if (*--p == '\n' && ++lines == tail) {
            p++;
            break;
        }
    rc = http_respond_text(req, 200, p);
    free(buf);
    return rc;
}

/* {"step":S,"time":T,"bytes":B} of the checkpoint folder (or file) `path`: time its last
 * change (when it was renamed into place), bytes its files together; NULL when it is gone
 * (pruned meanwhile). */
static json_t *ckpt_entry(const char *path, int64_t step)
{
    struct stat st;
    int64_t bytes = 0;
    struct ddpd_error e2;
    if (stat(path, &st) != 0 ||
        (S_ISREG(st.st_mode) ? (bytes = st.st_size, false) : jobdir_bytes(path, &bytes, &e2) != DDPD_OK))
        return NULL;
    double t = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9;
    return json_pack("{s:I, s:f, s:I}", "step", (json_int_t)step, "time", t, "bytes", (json_int_t)bytes);
}

/* GET /v1/jobs/{id}/checkpoints: {"checkpoints":[{"step":S,"time":T,"bytes":B},...]},
 * oldest first; time is the folder's completion (its last change, when it was renamed
 * into place), bytes its files together. The best one (checkpoint.keep_best) is among
 * them, in step order, with "best": true; once the job has its final model, "final":
 * {"step", "time", "bytes"} (the step the job ended at, the weights file's bytes). */
ddpd_err api__checkpoints(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    int64_t id = http_request_id(req, 0);
    struct store_job j;
    ddpd_err rc = api__get_job(req, &j, err);
    if (rc)
        return rc;
    const int64_t last = j.has_progress ? j.step : 0;
    store_job_clear(&j);
    char dir[PATH_MAX], ck[PATH_MAX + 32];
    jobdir_job_path(dir, sizeof dir, a->jobs_dir, id);
    int64_t *steps;
    size_t n;
    if (!jobdir_ckpt_list(dir, &steps, &n))
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory listing the checkpoints of job %" PRId64,
                              id);
    json_t *list = json_array(), *e;
    for (size_t i = 0; i < n; i++)
        /* One pruned meanwhile (checkpoint.keep_last) is simply not listed. */
        if (jobdir_ckpt_path(ck, sizeof ck, dir, steps[i]) && (e = ckpt_entry(ck, steps[i])))
            json_array_append_new(list, e);
    free(steps);
    int64_t best;
    if (jobdir_best_find(dir, &best) && jobdir_best_path(ck, sizeof ck, dir, best) &&
        (e = ckpt_entry(ck, best))) {
        size_t at = 0;
        while (at < json_array_size(list) &&
               json_integer_value(json_object_get(json_array_get(list, at), "step")) <= best)
            at++;
        json_object_set_new(e, "best", json_true());
        json_array_insert_new(list, at, e);
    }
    json_t *out = json_pack("{s:o}", "checkpoints", list);
    if (jobdir_model_path(ck, sizeof ck, dir) && (e = ckpt_entry(ck, last)))
        json_object_set_new(out, "final", e);
    return http_respond_json(req, 200, out);
}

/* Why job `id` (in state `st`) has no weights to download yet. */
static ddpd_err no_checkpoint(int64_t id, job_state st, struct ddpd_error *err)
{
    switch (st) {
    case JOB_STATE_QUEUED:
        return ddpd_error_set(err, DDPD_ENOTFOUND, "",
                              "job %" PRId64 " has no checkpoint: it has not started yet", id);
    case JOB_STATE_FAILED:
    case JOB_STATE_CANCELLED:
        return ddpd_error_set(err, DDPD_ENOTFOUND, "",
                              "job %" PRId64 " has no checkpoint: it %s before its first checkpoint", id,
                              st == JOB_STATE_FAILED ? "failed" : "was cancelled");
    case JOB_STATE_SUCCEEDED:
        return ddpd_error_set(err, DDPD_ENOTFOUND, "",
                              "job %" PRId64 " has no checkpoint: its files were removed from the server",
                              id);
    default:
        return ddpd_error_set(err, DDPD_ENOTFOUND, "",
                              "job %" PRId64
                              " has no checkpoint yet (it writes one every checkpoint.every_steps "
                              "steps, and its final model at the end)",
                              id);
    }
}

/* format=gpt2: the job's model as Hugging Face's GPT-2 (schema/gpt2.h), into *g, or 409
 * saying why it is not GPT-2-shaped. */
static ddpd_err job_gpt2(int64_t id, const char *spec_text, struct gpt2_model *g, struct ddpd_error *err)
{
    struct spec *s = malloc(sizeof *s);
    if (!s)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
    ddpd_err rc = spec_parse(spec_text ? spec_text : "", spec_text ? strlen(spec_text) : 0, NULL, s, err);
    if (rc == DDPD_OK && (rc = gpt2_model_of(s, g, err)) == DDPD_ESPEC) {
        char why[sizeof err->message];
        snprintf(why, sizeof why, "%s", err->message);
        rc = ddpd_error_set(
            err, DDPD_ECONFLICT, "format",
            "job %" PRId64 "'s model is not GPT-2-shaped, so it has no Hugging Face GPT-2 form: %s", id, why);
    }
    free(s);
    return rc;
}

static long export_read(void *arg, uint64_t pos, char *buf, size_t max)
{
    return gpt2_export_read(arg, pos, buf, max);
}

static void export_done(void *arg)
{
    gpt2_export_free(arg);
}

/* The GPT-2 answers: config.json, or the weights file at `path` in Hugging Face's layout. */
static ddpd_err respond_gpt2(struct http_request *req, const struct gpt2_model *g, const char *path,
                             struct ddpd_error *err)
{
    if (!path) {
        json_t *c = gpt2_config_json(g);
        char *text = c ? json_dumps(c, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
        json_decref(c);
        if (!text)
            return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
        http_response_header(req, "Content-Disposition", "attachment; filename=\"config.json\"");
        ddpd_err rc = http_respond_bytes(req, 200, "application/json", text, strlen(text));
        free(text);
        return rc;
    }
    struct gpt2_export *x = gpt2_export_open(path, g, err);
    if (!x)
        return err->code;
    http_response_header(req, "Content-Disposition", "attachment; filename=\"model.safetensors\"");
    return http_respond_reader(req, gpt2_export_size(x), "application/octet-stream", export_read, export_done,
                               x, err);
}

/* GET /v1/jobs/{id}/checkpoint[?step=S][&file=model|optim][&format=gpt2[&file=config]]: a
 * checkpoint's weights (or rank 0's optimizer state); without step the final model, else
 * the newest checkpoint. format=gpt2: the weights as Hugging Face's GPT-2 model.safetensors,
 * or with file=config its config.json (409 for a model that is not GPT-2-shaped). */
ddpd_err api__checkpoint(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    int64_t id = http_request_id(req, 0), step;
    static const char *const files[] = {"model", "optim", "config", NULL};
    static const char *const formats[] = {"ddpd", "gpt2", NULL};
    int file, format;
    struct store_job j;
    struct gpt2_model *g = NULL;
    ddpd_err rc = api__get_job(req, &j, err);
    if (rc)
        return rc;
    job_state state = j.state;
    if ((rc = http_query_int(req, "step", 0, INT64_MAX, -1, &step, err)) ||
        (rc = http_query_enum(req, "file", files, 0, &file, err)) ||
        (rc = http_query_enum(req, "format", formats, 0, &format, err)))
        goto out;
    if (format == 0 && file == 2) {
        rc = http_query_error(req, "file", err,
                              "file=config goes with format=gpt2 (Hugging Face's config.json)");
        goto out;
    }
    if (format == 1 && file == 1) {
        rc = http_query_error(req, "file", err,
                              "format=gpt2 gives the model (file=model) or its config.json "
                              "(file=config); the optimizer's state is ddpd's own");
        goto out;
    }
    if (format == 1) {
        if (!(g = malloc(sizeof *g))) {
            rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
            goto out;
        }
        if ((rc = job_gpt2(id, j.spec, g, err)))
            goto out;
        if (file == 2) {
            rc = respond_gpt2(req, g, NULL, err);
            goto out;
        }
    }
    const char *what = file == 1 ? JOBDIR_OPTIM : JOBDIR_MODEL;
    char dir[PATH_MAX], ck[PATH_MAX + 32], name[64], path[PATH_MAX + 128];
    jobdir_job_path(dir, sizeof dir, a->jobs_dir, id);
    jobdir_rank_file(name, sizeof name, what, 0);
    struct stat st;
    if (step >= 0) {
        if (!jobdir_step_dir(ck, sizeof ck, dir, step)) /* ckpt-S, or the best one best-S */
            jobdir_ckpt_path(ck, sizeof ck, dir, step);
        jobdir_file_path(path, sizeof path, ck, name);
        if (stat(path, &st) != 0) {
            rc = api__no_checkpoint_at(err, DDPD_ENOTFOUND, "step", "", dir, id, step);
            goto out;
        }
    } else {
        jobdir_file_path(path, sizeof path, dir, name);
        if (stat(path, &st) != 0) {
            /* No final model yet: the newest checkpoint. */
            if (!jobdir_latest_ckpt(dir, ck, sizeof ck)) {
                rc = no_checkpoint(id, state, err);
                goto out;
            }
            jobdir_file_path(path, sizeof path, ck, name);
        }
    }
    if (g) {
        rc = respond_gpt2(req, g, path, err);
        goto out;
    }
    char disp[128];
    snprintf(disp, sizeof disp, "attachment; filename=\"%s\"", name);
    http_response_header(req, "Content-Disposition", disp);
    rc = http_respond_file(req, path, "application/octet-stream", "no-cache", err);
out:
    free(g);
    store_job_clear(&j);
    return rc;
}
