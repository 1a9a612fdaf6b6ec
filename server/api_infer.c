/* api_infer.c — POST /v1/jobs/{id}/generate, POST /v1/jobs/{id}/predict and GET
 * /v1/inference: which model of the job (a step's checkpoint, the final model, else the
 * newest checkpoint), the request's fields checked (every error names its field), the
 * worker's request built and handed to the inference pool (inference/pool.h), and its
 * answer bound to the HTTP request: a deferred JSON answer, or an NDJSON / SSE stream of
 * tokens. Nothing here waits for a process: the pool's threads call back. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../base/file.h"
#include "../schema/jobdir.h"
#include "../schema/spec.h"
#include "api_impl.h"
#include "http.h"
#include "inference/pool.h"
#include "store.h"
#include "super.h"

/* ---- which model ----------------------------------------------------------------------------- */

/* The model a request runs on. */
struct model_choice {
    char weights[PATH_MAX];
    int64_t step;      /* the checkpoint's step, -1 for the final model */
    int64_t shown;     /* the answer's "step": the checkpoint's, or the job's last; -1: null */
    char name[32];     /* "final" | "ckpt-N" */
    struct spec *spec; /* the job's spec, parsed (malloc'd) */
};

/* `step` (-1: not given) of job j: that checkpoint, else the final model, else the newest
 * checkpoint; 409 no_model naming what there is. */
static ddpd_err choose_model(struct api *a, const struct store_job *j, int64_t step, struct model_choice *m,
                             struct ddpd_error *err)
{
    char dir[PATH_MAX], ck[PATH_MAX];
    struct stat sb;
    jobdir_job_path(dir, sizeof dir, a->jobs_dir, j->id);
    if (step >= 0) {
        if (!jobdir_init_weights(dir, step, m->weights, sizeof m->weights))
            return api__no_checkpoint_at(err, DDPD_ENOMODEL, "step", "step: ", dir, j->id, step);
        m->step = m->shown = step;
    } else if (jobdir_model_path(m->weights, sizeof m->weights, dir) && stat(m->weights, &sb) == 0) {
        m->step = -1;
        m->shown = j->has_progress ? j->step : -1;
    } else if (jobdir_latest_ckpt(dir, ck, sizeof ck) && jobdir_ckpt_step(strrchr(ck, '/') + 1, &m->step) &&
               jobdir_model_path(m->weights, sizeof m->weights, ck) && stat(m->weights, &sb) == 0) {
        m->shown = m->step;
    } else {
        return ddpd_error_set(err, DDPD_ENOMODEL, "",
                              "job %" PRId64 " has no model yet (no checkpoint and no final model)%s", j->id,
                              j->state == JOB_STATE_QUEUED ? ": it has not started" : "");
    }
    if (m->step < 0)
        snprintf(m->name, sizeof m->name, "final");
    else
        snprintf(m->name, sizeof m->name, "ckpt-%" PRId64, m->step);
    m->spec = malloc(sizeof *m->spec);
    if (!m->spec)
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory reading job %" PRId64 "'s spec", j->id);
    struct ddpd_error e2;
    if (spec_parse(j->spec, strlen(j->spec), NULL, m->spec, &e2) != DDPD_OK)
        return ddpd_error_set(err, DDPD_EINTERNAL, "", "job %" PRId64 "'s stored spec does not parse: %s",
                              j->id, e2.message);
    return DDPD_OK;
}

/* The last layer of the model's top level. */
static const struct spec_layer *last_top_layer(const struct spec *s)
{
    const struct spec_layer *last = &s->layers[0];
    for (int i = 0; i < s->n_layers; i++)
        if (s->layers[i].parent < 0)
            last = &s->layers[i];
    return last;
}

/* The vocabulary of a model generate can run: it starts with embedding and ends in
 * logits over the embedding's `num` (a linear of that width, cross_entropy loss). 0 with
 * a 422 at "model" otherwise. */
static int64_t gpt_vocab(const struct spec *s, int64_t job, struct ddpd_error *err)
{
    const struct spec_layer *first = &s->layers[0], *last = last_top_layer(s);
    if (first->kind == LAYER_EMBEDDING && last->kind == LAYER_LINEAR && last->out == first->num &&
        s->loss == LOSS_CROSS_ENTROPY)
        return first->num;
    char ends[96];
    if (last->kind == LAYER_LINEAR)
        snprintf(ends, sizeof ends, "linear of %" PRId64 " outputs", last->out);
    else
        snprintf(ends, sizeof ends, "%s", layer_kind_name(last->kind));
    ddpd_error_set(err, DDPD_ESPEC, "model",
                   "generate needs a model that starts with embedding and ends in logits over the vocabulary "
                   "(a linear as wide as the embedding's num, loss cross_entropy); job %" PRId64
                   "'s starts with %s and ends in %s%s",
                   job, layer_kind_name(first->kind), ends,
                   s->loss == LOSS_CROSS_ENTROPY ? "" : ", with loss mse");
    return 0;
}

/* ---- one request between its handler and the pool's answer ------------------------------------ */

struct call {
    pthread_mutex_t mu;
    int refs;                 /* the pool's (until done) and a stream's (until its on_close) */
    struct http_request *req; /* a deferred answer; NULL for a stream */
    struct http_stream *st;   /* the stream once open, until closed */
    bool stream, sse;
    bool gone;     /* the stream's client went away */
    bool finished; /* done ran: the stream is to be closed once open */
    char *pending; /* what was written before the stream was open */
    size_t plen;
    int64_t shown; /* the answer's "step" (-1: null) */
    char model[32];
};

static void call_unref(struct call *c)
{
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left)
        return;
    pthread_mutex_destroy(&c->mu);
    free(c->pending);
    free(c);
}

/* Queues bytes for the stream's client (kept until the stream is open). */
static void call_write(struct call *c, const char *data, size_t n)
{
    pthread_mutex_lock(&c->mu);
    if (c->st) {
        if (http_stream_write(c->st, data, n) == DDPD_EBUSY)
            c->gone = true; /* dropped as too slow */
    } else if (!c->gone) {
        char *grown = realloc(c->pending, c->plen + n);
        if (grown) {
            memcpy(grown + c->plen, data, n);
            c->pending = grown;
            c->plen += n;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* The workers print floats with 9 significant digits (float32 round-trips): the answer
 * keeps their text rather than jansson's 17 digits of the same double. */
#define ANSWER_JSON_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(9))

/* One object as a line of the stream: NDJSON, or an SSE frame of `event`. Steals o. */
static void call_send(struct call *c, const char *event, json_t *o)
{
    char *text = o ? json_dumps(o, ANSWER_JSON_FLAGS) : NULL;
    json_decref(o);
    if (!text)
        return;
    size_t n = strlen(text), cap = n + 64;
    char *frame = malloc(cap);
    if (frame) {
        int k = c->sse ? snprintf(frame, cap, "event: %s\ndata: %s\n\n", event, text)
                       : snprintf(frame, cap, "%s\n", text);
        call_write(c, frame, (size_t)k);
    }
    free(frame);
    free(text);
}

static void on_line(void *ctx, json_t *line)
{
    struct call *c = ctx;
    if (c->stream)
        call_send(c, "token", json_incref(line));
}

static bool on_gone(void *ctx)
{
    struct call *c = ctx;
    if (!c->stream)
        return http_request_client_gone(c->req);
    pthread_mutex_lock(&c->mu);
    bool g = c->gone;
    pthread_mutex_unlock(&c->mu);
    return g;
}

/* The answer's body: the worker's answer with the model it ran on. A new reference. */
static json_t *answer_of(struct call *c, json_t *answer)
{
    json_t *o = json_deep_copy(answer);
    if (!o)
        return NULL;
    json_object_set_new(o, "step", c->shown >= 0 ? json_integer(c->shown) : json_null());
    json_object_set_new(o, "model", json_string(c->model));
    return o;
}

static void on_done(void *ctx, ddpd_err rc, json_t *answer, const struct ddpd_error *err, int retry)
{
    struct call *c = ctx;
    if (c->stream) {
        json_t *o;
        if (rc == DDPD_OK) {
            o = answer_of(c, answer);
            if (o)
                json_object_set_new(o, "done", json_true());
        } else {
            o = json_pack("{s:{s:s, s:s, s:s}, s:b}", "error", "code", ddpd_err_code(rc), "message",
                          err->message[0] ? err->message : ddpd_err_text(rc), "path", err->path, "done", 1);
        }
        call_send(c, rc == DDPD_OK ? "done" : "error", o);
        pthread_mutex_lock(&c->mu);
        c->finished = true;
        if (c->st) {
            http_stream_close(c->st);
            c->st = NULL;
        }
        pthread_mutex_unlock(&c->mu);
    } else {
        struct http_request *req = c->req;
        if (rc == DDPD_OK) {
            json_t *o = answer_of(c, answer);
            char *text = o ? json_dumps(o, ANSWER_JSON_FLAGS) : NULL;
            size_t n = text ? strlen(text) : 0;
            json_decref(o);
            if (text)
                text[n] = '\n'; /* json_dumps's NUL becomes the answer's newline */
            rc = text ? http_respond_bytes(req, 200, "application/json", text, n + 1) : DDPD_ENOMEM;
            free(text);
            http_deferred_done(req, rc, NULL);
        } else if (retry > 0) {
            char ra[16];
            snprintf(ra, sizeof ra, "%d", retry);
            http_response_header(req, "Retry-After", ra);
            http_respond_error(req, rc, err);
            http_deferred_done(req, DDPD_OK, NULL);
        } else {
            http_deferred_done(req, rc, err);
        }
    }
    call_unref(c);
}

static void on_stream_close(void *arg, enum http_stream_end why)
{
    (void)why;
    struct call *c = arg;
    pthread_mutex_lock(&c->mu);
    c->gone = true;
    pthread_mutex_unlock(&c->mu);
    call_unref(c);
}

/* A 503 with Retry-After (an error return would drop the header). */
static ddpd_err respond_busy(struct http_request *req, int retry, const struct ddpd_error *err)
{
    char ra[16];
    snprintf(ra, sizeof ra, "%d", retry > 0 ? retry : 1);
    http_response_header(req, "Retry-After", ra);
    return http_respond_error(req, DDPD_EBUSY, err);
}

/* Hands `request` (the worker's request line, malloc'd, stolen) of `op` on model m to the
 * pool and binds its answer to req: a stream
 * (NDJSON, or SSE when the client accepts text/event-stream) or a deferred JSON answer.
 * `upload` (NULL: none) is removed here when the pool does not take it. */
static ddpd_err run(struct http_request *req, const struct infer_model *im, const struct model_choice *m,
                    char *request, const char *op, bool stream, const char *upload, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    struct call *c = calloc(1, sizeof *c);
    if (!c) {
        free(request);
        if (upload)
            unlink(upload);
        return ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->stream = stream;
    const char *accept = http_request_header(req, "Accept");
    c->sse = stream && accept && strstr(accept, "text/event-stream");
    c->refs = stream ? 2 : 1;
    c->req = stream ? NULL : req;
    c->shown = m->shown;
    snprintf(c->model, sizeof c->model, "%s", m->name);
    struct infer_sink sink = {.line = on_line, .gone = on_gone, .done = on_done, .ctx = c};
    int retry = 0;
    if (!stream)
        http_defer(req); /* first: the pool may answer before infer_pool_submit returns */
    ddpd_err rc = infer_pool_submit(a->infer, im, request, op, upload, &sink, &retry, err);
    if (rc) {
        if (upload)
            unlink(upload);
        if (!stream && rc == DDPD_EBUSY) {
            respond_busy(req, retry, err);
            http_deferred_done(req, DDPD_OK, NULL);
        } else if (!stream) {
            http_deferred_done(req, rc, err);
        }
        pthread_mutex_destroy(&c->mu);
        free(c);
        if (!stream)
            return DDPD_OK;
        return rc == DDPD_EBUSY ? respond_busy(req, retry, err) : rc;
    }
    if (!stream)
        return DDPD_OK;
    struct http_stream_opts ho = {.content_type = c->sse ? "text/event-stream" : "application/x-ndjson",
                                  .on_close = on_stream_close,
                                  .arg = c};
    struct http_stream *st;
    if ((rc = http_respond_stream(req, &ho, &st, err))) {
        /* No stream: the request is cancelled (gone) and the pool's done frees the call. */
        pthread_mutex_lock(&c->mu);
        c->gone = true;
        pthread_mutex_unlock(&c->mu);
        call_unref(c);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    if (c->plen)
        http_stream_write(st, c->pending, c->plen);
    free(c->pending);
    c->pending = NULL;
    c->plen = 0;
    if (c->finished)
        http_stream_close(st);
    else
        c->st = st;
    pthread_mutex_unlock(&c->mu);
    return DDPD_OK;
}

/* ---- request fields ---------------------------------------------------------------------------- */

/* A 422 naming a body field that is not one of `known` (NULL-terminated). */
static ddpd_err check_keys(json_t *body, const char *const *known, const char *list, struct ddpd_error *err)
{
    const char *key;
    json_t *v;
    json_object_foreach (body, key, v) {
        bool ok = false;
        for (const char *const *k = known; *k && !ok; k++)
            ok = !strcmp(key, *k);
        if (!ok) {
            char shown[64];
            snprintf(shown, sizeof shown, "%.48s", key);
            return ddpd_error_set(err, DDPD_ESPEC, shown, "%s: unknown field (the fields are %s)", shown,
                                  list);
        }
    }
    return DDPD_OK;
}

/* An optional integer field within [lo, hi]: *out, or dflt when absent. */
static ddpd_err int_field(json_t *body, const char *key, int64_t lo, int64_t hi, int64_t dflt, int64_t *out,
                          struct ddpd_error *err)
{
    json_t *v = json_object_get(body, key);
    *out = dflt;
    if (!v || json_is_null(v))
        return DDPD_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return ddpd_error_set(err, DDPD_ESPEC, key, "%s: expected an integer from %" PRId64 " to %" PRId64,
                              key, lo, hi);
    *out = json_integer_value(v);
    return DDPD_OK;
}

/* The device field: *cuda; a 422 when it is neither, or cuda on a server without GPUs. */
static ddpd_err device_field(struct api *a, json_t *v, bool *cuda, struct ddpd_error *err)
{
    const char *d = json_string_value(v);
    *cuda = false;
    if (!v || json_is_null(v))
        return DDPD_OK;
    if (!d || (strcmp(d, "cpu") && strcmp(d, "cuda")))
        return ddpd_error_set(err, DDPD_ESPEC, "device", "device: expected \"cpu\" or \"cuda\"");
    *cuda = !strcmp(d, "cuda");
    char why[512];
    const char *blame;
    if (*cuda && !super_fits(a->super, DEVICE_CUDA, 1, why, sizeof why, &blame))
        return ddpd_error_set(err, DDPD_ESPEC, "device", "%s", why);
    return DDPD_OK;
}

/* The job of the request's path, and its model for `step`. */
static ddpd_err job_model(struct http_request *req, struct store_job *j, int64_t step, struct model_choice *m,
                          struct ddpd_error *err)
{
    ddpd_err rc = api__get_job(req, j, err);
    return rc ? rc : choose_model(api__ctx(req), j, step, m, err);
}

/* ---- POST /v1/jobs/{id}/generate ----------------------------------------------------------------- */

#define GEN_MAX_NEW_TOKENS  4096
#define GEN_DEFAULT_TOKENS  256
#define GEN_MAX_TEMPERATURE 100.0

static const char *const gen_keys[] = {"prompt", "ids",  "max_new_tokens", "temperature", "top_k",
                                       "seed",   "step", "stream",         "device",      NULL};
#define GEN_KEY_LIST "prompt, ids, max_new_tokens, temperature, top_k, seed, step, stream, device"

/* The worker's generate request from the body (checked against the vocabulary): its line
 * into *out (malloc'd). */
static ddpd_err generate_request(json_t *body, int64_t job, int64_t vocab, bool tokenizer, char **out,
                                 struct ddpd_error *err)
{
    json_t *prompt = json_object_get(body, "prompt"), *ids = json_object_get(body, "ids");
    json_t *temp = json_object_get(body, "temperature");
    int64_t max_new, top_k, seed;
    ddpd_err rc;
    if (prompt && ids)
        return ddpd_error_set(err, DDPD_ESPEC, "ids", "ids: give a prompt (text) or ids, not both");
    if (!prompt && !ids)
        return ddpd_error_set(err, DDPD_ESPEC, "prompt",
                              "prompt: give a prompt (text, for a vocabulary of bytes) or ids (token ids)");
    if (prompt) {
        if (!json_is_string(prompt) || json_string_length(prompt) == 0)
            return ddpd_error_set(err, DDPD_ESPEC, "prompt",
                                  "prompt: expected a string of at least one character");
        if (vocab != 256 && !tokenizer)
            return ddpd_error_set(
                err, DDPD_ESPEC, "prompt",
                "prompt: job %" PRId64 "'s vocabulary has %" PRId64
                " tokens, not the 256 bytes of text, and its spec names no tokenizer: send ids",
                job, vocab);
    } else {
        if (!json_is_array(ids) || json_array_size(ids) == 0)
            return ddpd_error_set(err, DDPD_ESPEC, "ids", "ids: expected a list of at least one token id");
        size_t i;
        json_t *v;
        json_array_foreach (ids, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
                char path[32];
                snprintf(path, sizeof path, "ids[%zu]", i);
                if (!json_is_integer(v))
                    return ddpd_error_set(err, DDPD_ESPEC, path, "%s: expected a token id (an integer)",
                                          path);
                return ddpd_error_set(err, DDPD_ESPEC, path,
                                      "%s: %" JSON_INTEGER_FORMAT " is outside job %" PRId64
                                      "'s vocabulary [0, %" PRId64 ")",
                                      path, json_integer_value(v), job, vocab);
            }
        }
    }
    if ((rc = int_field(body, "max_new_tokens", 1, GEN_MAX_NEW_TOKENS, GEN_DEFAULT_TOKENS, &max_new, err)) ||
        (rc = int_field(body, "top_k", 0, vocab, 0, &top_k, err)) ||
        (rc = int_field(body, "seed", 0, INT64_MAX, -1, &seed, err)))
        return rc;
    double t = 1.0;
    if (temp && !json_is_null(temp)) {
        t = json_number_value(temp);
        if (!json_is_number(temp) || !isfinite(t) || t < 0 || t > GEN_MAX_TEMPERATURE)
            return ddpd_error_set(err, DDPD_ESPEC, "temperature",
                                  "temperature: expected a number from 0 (greedy) to %g",
                                  GEN_MAX_TEMPERATURE);
    }
    if (seed < 0) { /* drawn, and reported: the same seed gives the same text again */
        uint32_t r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
            r = (uint32_t)getpid() ^ (uint32_t)time(NULL);
        seed = r;
    }
    json_t *req =
        json_pack("{s:s, s:I, s:f, s:I, s:I, s:b}", "op", "generate", "max_new_tokens", (json_int_t)max_new,
                  "temperature", t, "top_k", (json_int_t)top_k, "seed", (json_int_t)seed, "stream", 1);
    if (req)
        json_object_set(req, prompt ? "prompt" : "ids", prompt ? prompt : ids);
    *out = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    return *out ? DDPD_OK : ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
}

ddpd_err api__generate(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    json_t *body = http_request_json(req);
    char *request = NULL;
    struct store_job j;
    memset(&j, 0, sizeof j);
    struct model_choice m = {.spec = NULL};
    int64_t step;
    bool cuda = false;
    ddpd_err rc;
    if (!json_is_object(body))
        return ddpd_error_set(err, DDPD_ESPEC, "",
                              "expected a JSON object of generate's fields (" GEN_KEY_LIST ")");
    json_t *stream = json_object_get(body, "stream");
    if ((rc = check_keys(body, gen_keys, GEN_KEY_LIST, err)) ||
        (rc = int_field(body, "step", 0, INT64_MAX, -1, &step, err)))
        return rc;
    if (stream && !json_is_boolean(stream))
        return ddpd_error_set(err, DDPD_ESPEC, "stream", "stream: expected true or false");
    if ((rc = device_field(a, json_object_get(body, "device"), &cuda, err)) ||
        (rc = job_model(req, &j, step, &m, err)))
        goto out;
    int64_t vocab = gpt_vocab(m.spec, j.id, err);
    if (!vocab) {
        rc = err->code;
        goto out;
    }
    const bool tokenizer = m.spec->tokenizer_vocab[0] != '\0';
    if ((rc = generate_request(body, j.id, vocab, tokenizer, &request, err)))
        goto out;
    /* A tokenizer's files are data paths: the worker opens them beneath the data folder. */
    struct infer_model im = {.job = j.id,
                             .step = m.step,
                             .cuda = cuda,
                             .weights = m.weights,
                             .spec = j.spec,
                             .data_dir = tokenizer ? a->data_dir : NULL};
    rc = run(req, &im, &m, request, "generate", json_is_true(stream), NULL, err);
out:
    free(m.spec);
    store_job_clear(&j);
    return rc;
}

/* ---- POST /v1/jobs/{id}/predict ------------------------------------------------------------------ */

#define PREDICT_EVAL_MAX 64
/* Bytes a predicted number takes in the worker's answer (9 significant digits, sign,
 * exponent, comma), to refuse a request whose answer could not be held. */
#define PREDICT_BYTES_PER_OUTPUT 18

static const char *const predict_keys[] = {"inputs", "eval_samples", "step", "device", NULL};
#define PREDICT_KEY_LIST "inputs, eval_samples, step, device"

/* The media type of the body: 0 JSON, 1 .npy, -1 neither. */
static int body_kind(struct http_request *req)
{
    const char *ct = http_request_header(req, "Content-Type");
    if (!ct)
        return -1;
    while (*ct == ' ')
        ct++;
    size_t n = strcspn(ct, "; \t");
    if (n == 16 && !strncasecmp(ct, "application/json", n))
        return 0;
    if ((n == 17 && !strncasecmp(ct, "application/x-npy", n)) ||
        (n == 24 && !strncasecmp(ct, "application/octet-stream", n)))
        return 1;
    return -1;
}

/* The .npy body written to a file of the pool's folder for the worker to read. */
static ddpd_err write_upload(struct api *a, const char *body, size_t len, char *path, size_t cap,
                             struct ddpd_error *err)
{
    if (len < 10 || memcmp(body, "\x93NUMPY", 6) != 0)
        return ddpd_error_set(
            err, DDPD_ESPEC, "body",
            "body: not a .npy file (it starts with \\x93NUMPY; Content-Type application/x-npy "
            "or application/octet-stream is for .npy bodies)");
    int fd = infer_pool_upload_path(a->infer, path, cap);
    if (fd < 0)
        return ddpd_error_set(err, DDPD_EIO, "", "cannot store the upload: %s", strerror(errno));
    int w = base_write_all(fd, body, len);
    int e = errno;
    if (close(fd) != 0 && w == 0) {
        w = -1;
        e = errno;
    }
    if (w != 0) {
        unlink(path);
        return ddpd_error_set(err, DDPD_EIO, "", "cannot store the upload: %s", strerror(e));
    }
    return DDPD_OK;
}

/* The outputs' numbers per sample (the last top-level layer's shape). */
static int64_t outputs_per_sample(const struct spec *s)
{
    const struct spec_layer *l = last_top_layer(s);
    int64_t n = 1;
    for (int i = 0; i < l->out_rank; i++)
        if (__builtin_mul_overflow(n, l->out_shape[i] > 0 ? l->out_shape[i] : 1, &n))
            return INT64_MAX;
    return n;
}

/* The worker's predict request for a JSON body (an object with "inputs", checked): the
 * client's own text with "op" put first and its line breaks made spaces (a JSON string
 * holds none raw), so that the samples' numbers reach the worker as the client wrote them
 * (a re-encoding would print each double with 17 digits, several times the bytes).
 * malloc'd; NULL when out of memory. */
static char *inputs_line(const char *body, size_t len)
{
    static const char head[] = "{\"op\":\"predict\",";
    const char *brace = memchr(body, '{', len);
    if (!brace)
        return NULL;
    size_t rest = len - (size_t)(brace + 1 - body), n = sizeof head - 1;
    char *line = malloc(n + rest + 1);
    if (!line)
        return NULL;
    memcpy(line, head, n);
    memcpy(line + n, brace + 1, rest);
    line[n + rest] = '\0';
    for (char *p = line + n; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    return line;
}

ddpd_err api__predict(struct http_request *req, struct ddpd_error *err)
{
    struct api *a = api__ctx(req);
    int kind = body_kind(req);
    size_t len;
    const char *bytes = http_request_body(req, &len);
    json_t *body = NULL, *request = NULL;
    char *line = NULL;
    struct store_job j;
    memset(&j, 0, sizeof j);
    struct model_choice m = {.spec = NULL};
    char upload[PATH_MAX] = "";
    int64_t step = -1, evals = 0;
    bool cuda = false;
    ddpd_err rc = DDPD_OK;
    if (kind < 0) {
        const char *ct = http_request_header(req, "Content-Type");
        char shown[80];
        snprintf(shown, sizeof shown, "%.64s", ct ? ct : "none");
        for (char *p = shown; *p; p++)
            if (*p < 0x20 || *p > 0x7e)
                *p = '?';
        return ddpd_error_set(err, DDPD_EMEDIATYPE, "Content-Type",
                              "POST /v1/jobs/{id}/predict takes application/json ({\"inputs\": [...]} or "
                              "{\"eval_samples\": N}) or a .npy body (application/x-npy or "
                              "application/octet-stream); got %s",
                              shown);
    }
    if (kind == 0) {
        if (http_query(req, "step") || http_query(req, "device")) {
            const char *q = http_query(req, "step") ? "step" : "device";
            return http_query_error(req, q, err,
                                    "%s: with a JSON body, give it as the body's field, not in the query", q);
        }
        if ((rc = http_body_json(bytes, len, &body, err)))
            return rc;
        if (!json_is_object(body)) {
            rc = ddpd_error_set(err, DDPD_ESPEC, "",
                                "expected a JSON object of predict's fields (" PREDICT_KEY_LIST ")");
            goto out;
        }
        json_t *inputs = json_object_get(body, "inputs"), *ev = json_object_get(body, "eval_samples");
        if ((rc = check_keys(body, predict_keys, PREDICT_KEY_LIST, err)) ||
            (rc = int_field(body, "step", 0, INT64_MAX, -1, &step, err)) ||
            (rc = int_field(body, "eval_samples", 1, PREDICT_EVAL_MAX, 0, &evals, err)) ||
            (rc = device_field(a, json_object_get(body, "device"), &cuda, err)))
            goto out;
        if ((inputs != NULL) == (ev != NULL)) {
            rc = ddpd_error_set(err, DDPD_ESPEC, inputs ? "eval_samples" : "inputs", "%s",
                                inputs ? "eval_samples: give inputs or eval_samples, not both"
                                       : "inputs: give inputs (a list of samples) or eval_samples (N)");
            goto out;
        }
        if (inputs && (!json_is_array(inputs) || json_array_size(inputs) == 0)) {
            rc = ddpd_error_set(err, DDPD_ESPEC, "inputs", "inputs: expected a list of at least one sample");
            goto out;
        }
    } else {
        int64_t q;
        static const char *const devices[] = {"cpu", "cuda", NULL};
        int d = 0;
        if ((rc = http_query_int(req, "step", 0, INT64_MAX, -1, &q, err)) ||
            (rc = http_query_enum(req, "device", devices, 0, &d, err)))
            return rc;
        step = q;
        json_t *dv = json_string(devices[d]);
        rc = device_field(a, dv, &cuda, err);
        json_decref(dv);
        if (rc)
            return rc;
    }
    if ((rc = job_model(req, &j, step, &m, err)))
        goto out;
    if (kind == 0) {
        json_t *inputs = json_object_get(body, "inputs");
        int64_t per = outputs_per_sample(m.spec), n = inputs ? (int64_t)json_array_size(inputs) : evals;
        if (per > (int64_t)(a->infer_cfg.line_max / PREDICT_BYTES_PER_OUTPUT) / n) {
            rc = ddpd_error_set(err, DDPD_ETOOBIG, inputs ? "inputs" : "eval_samples",
                                "%s: %" PRId64 " samples of %" PRId64
                                " outputs each would answer more than the %zu bytes an answer may hold (4 x "
                                "--infer-max-bytes); ask for fewer at a time",
                                inputs ? "inputs" : "eval_samples", n, per, a->infer_cfg.line_max);
            goto out;
        }
        if (inputs)
            line = inputs_line(bytes, len);
        else
            request = json_pack("{s:s, s:{s:I, s:s}}", "op", "predict", "eval", "count", (json_int_t)evals,
                                "data_dir", a->data_dir);
    } else {
        if ((rc = write_upload(a, bytes, len, upload, sizeof upload, err)))
            goto out;
        request = json_pack("{s:s, s:s}", "op", "predict", "npy", upload);
    }
    if (request)
        line = json_dumps(request, JSON_COMPACT);
    if (!line) {
        if (upload[0])
            unlink(upload);
        rc = ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory");
        goto out;
    }
    struct infer_model im = {.job = j.id, .step = m.step, .cuda = cuda, .weights = m.weights, .spec = j.spec};
    rc = run(req, &im, &m, line, "predict", false, upload[0] ? upload : NULL, err);
out:
    json_decref(request);
    json_decref(body);
    free(m.spec);
    store_job_clear(&j);
    return rc;
}

/* ---- GET /v1/inference ------------------------------------------------------------------------------ */

ddpd_err api__inference(struct http_request *req, struct ddpd_error *err)
{
    (void)err;
    return http_respond_json(req, 200, infer_pool_status(api__ctx(req)->infer));
}
