/* infer/infer.c — the request loop of `ddpd-worker --infer` (docs/generation.md
 * "The worker's protocol"): reads one JSON object a line from stdin, answers each with
 * exactly one final line on stdout, and holds the one loaded model (load, unload); the
 * generate and predict requests are generate.c's and predict.c's. A client's mistake is
 * an answer naming the field, never an exit; a device failure ends the process as a
 * rank's does (worker_die), which the server sees as the worker's death. */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../base/clock.h"
#include "../checkpoint.h"
#include "../spec_tokenizer.h"
#include "infer_impl.h"

/* ---- the request reader ---- */

/* Reads what is there (one read), waiting for it when `block`. false at EOF or a read
 * error (taken as EOF: the server is gone). */
static bool fill(struct lines *l, bool block)
{
    if (l->eof)
        return false;
    if (!block) {
        struct pollfd p = {l->fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0)
            return true; /* nothing now (or EINTR: look again later) */
    }
    if (l->cap - l->len < 65536) {
        size_t cap = l->cap ? l->cap * 2 : 65536;
        if (cap > (size_t)INFER_LINE_MAX + 65536)
            cap = (size_t)INFER_LINE_MAX + 65536;
        if (cap > l->cap) {
            char *nb = realloc(l->buf, cap + 1);
            if (!nb) {
                l->eof = true; /* cannot go on reading requests */
                return false;
            }
            l->buf = nb;
            l->cap = cap;
        }
    }
    for (;;) {
        ssize_t r = read(l->fd, l->buf + l->len, l->cap - l->len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!block)
                return true;
            struct pollfd p = {l->fd, POLLIN, 0};
            poll(&p, 1, -1); /* between requests stdin is waited on by design */
            continue;
        }
        if (r <= 0) {
            l->eof = true;
            return false;
        }
        l->len += (size_t)r;
        return true;
    }
}

enum lines_rc lines_peek(struct lines *l, bool block, char **line, size_t *n)
{
    for (;;) {
        char *nl = l->len ? memchr(l->buf, '\n', l->len) : NULL;
        if (l->skipping) {
            /* The rest of an overlong line goes, up to its newline. */
            if (nl) {
                size_t drop = (size_t)(nl - l->buf) + 1;
                memmove(l->buf, l->buf + drop, l->len - drop);
                l->len -= drop;
                l->skipping = false;
                return LINES_TOOLONG;
            }
            l->len = 0;
        } else if (nl && (size_t)(nl - l->buf) > (size_t)INFER_LINE_MAX) {
            const size_t drop = (size_t)(nl - l->buf) + 1;
            memmove(l->buf, l->buf + drop, l->len - drop);
            l->len -= drop;
            return LINES_TOOLONG;
        } else if (nl) {
            *line = l->buf;
            *n = (size_t)(nl - l->buf);
            l->taken = *n + 1;
            return LINES_LINE;
        } else if (l->len > (size_t)INFER_LINE_MAX) {
            l->skipping = true;
            l->len = 0;
            continue;
        } else if (l->eof && l->len) {
            /* A last line without its newline. */
            *line = l->buf;
            *n = l->taken = l->len;
            return LINES_LINE;
        }
        if (l->eof)
            return l->skipping ? (l->skipping = false, LINES_TOOLONG) : LINES_EOF;
        const size_t before = l->len;
        if (!fill(l, block) && !l->eof)
            return LINES_EOF;
        if (!block && l->len == before && !l->eof)
            return LINES_NONE;
    }
}

void lines_consume(struct lines *l)
{
    const size_t drop = l->taken < l->len ? l->taken : l->len;
    memmove(l->buf, l->buf + drop, l->len - drop);
    l->len -= drop;
    l->taken = 0;
}

static bool is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

/* ---- answers ---- */

json_t *infer__text(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j)
        return j;
    /* Not UTF-8 (a path, a message quoting a file): decoded with replacement. */
    char *t = malloc(n * 3 + UTF8_OUT_MAX + 1);
    if (!t)
        return json_string("?");
    struct utf8_stream u;
    utf8_stream_init(&u);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += utf8_stream_feed(&u, (unsigned char)s[i], t + k);
    k += utf8_stream_flush(&u, t + k);
    j = json_stringn(t, k);
    free(t);
    return j ? j : json_string("?");
}

void infer__write(struct infer *in, json_t *obj)
{
    char *line = obj ? json_dumps(obj, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(obj);
    if (!line) {
        /* Out of memory building the answer: still exactly one final line. */
        fputs("{\"ok\":false,\"error\":{\"code\":\"out_of_memory\",\"path\":\"\",\"message\":\"out of memory "
              "writing the answer\"}}\n",
              in->out);
    } else {
        fputs(line, in->out);
        fputc('\n', in->out);
        free(line);
    }
    fflush(in->out);
}

void infer__fail(struct infer *in, const char *op, const struct ddpd_error *err)
{
    json_t *e = json_object();
    json_object_set_new(e, "code", json_string(ddpd_err_code(err->code)));
    json_object_set_new(e, "path", infer__text(err->path, strnlen(err->path, sizeof err->path)));
    json_object_set_new(e, "message", infer__text(err->message, strnlen(err->message, sizeof err->message)));
    json_t *o = json_object();
    json_object_set_new(o, "ok", json_false());
    if (op)
        json_object_set_new(o, "op", json_string(op));
    json_object_set_new(o, "error", e);
    infer__write(in, o);
}

ddpd_err infer__int(json_t *req, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    struct ddpd_error *err)
{
    json_t *v = json_object_get(req, key);
    if (!v || json_is_null(v))
        return DDPD_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return ddpd_error_set(err, DDPD_ESPEC, key, "%s: expected an integer in [%" PRId64 ", %" PRId64 "]",
                              key, lo, hi);
    *out = json_integer_value(v);
    return DDPD_OK;
}

bool infer__cancelled(struct infer *in)
{
    char *line;
    size_t n;
    if (in->cancel_pending)
        return true;
    for (;;) {
        enum lines_rc rc = lines_peek(&in->in, false, &line, &n);
        if (rc == LINES_EOF)
            return in->cancel_pending = true; /* the server is gone: stop */
        if (rc != LINES_LINE)
            return false;
        /* A cancel is a short line; a long one is a request sent early. */
        json_t *j = n < 256 ? json_loadb(line, n, 0, NULL) : NULL;
        json_t *op = json_object_get(j, "op");
        const bool cancel = json_is_string(op) && !strcmp(json_string_value(op), "cancel");
        const bool blank = is_blank(line, n);
        json_decref(j);
        if (!cancel && !blank)
            return false; /* a request sent early waits for this one's answer */
        lines_consume(&in->in);
        if (cancel)
            return in->cancel_pending = true;
    }
}

/* ---- load, unload ---- */

static void unload(struct infer *in)
{
    infer__plan_release(in);
    kv_free(in->kv);
    in->kv = NULL;
    bpe_free(in->tok);
    in->tok = NULL;
    model_free(in->m);
    in->m = NULL;
    if (in->cuda)
        dev_cuda_free(in->dev);
    in->cuda = false;
    in->dev = in->cpu;
    free(in->spec);
    in->spec = NULL;
    in->why_not[0] = '\0';
    in->resident = 0;
}

/* The device of a load request: the CPU, or visible GPU `gpu` (the CUDA module loaded as a
 * rank loads it). */
static ddpd_err open_device(struct infer *in, const char *device, int64_t gpu, struct ddpd_error *err)
{
    if (!strcmp(device, "cpu")) {
        in->dev = in->cpu;
        return DDPD_OK;
    }
    const int n = dev_cuda_device_count();
    if (n == 0) {
        if (dev_cuda_load(err))
            ddpd_error_set(err, DDPD_EDEVICE, "device",
                           "device: cuda was asked for but no CUDA device is visible");
        return err ? err->code : DDPD_EDEVICE;
    }
    if (gpu >= n)
        return ddpd_error_set(err, DDPD_ESPEC, "gpu",
                              "gpu: %" PRId64 " is not a visible CUDA device (%d visible)", gpu, n);
    struct dev d = dev_cuda_new((int)gpu, in->spec->precision == PRECISION_TF32, err);
    if (!d.ops)
        return err ? err->code : DDPD_EDEVICE;
    in->dev = d;
    in->cuda = true;
    return DDPD_OK;
}

static ddpd_err load_fields(json_t *req, json_t **spec, const char **weights, const char **device,
                            int64_t *gpu, int64_t *max_batch, struct ddpd_error *err)
{
    *spec = json_object_get(req, "spec");
    json_t *w = json_object_get(req, "weights"), *d = json_object_get(req, "device");
    if (!json_is_object(*spec))
        return ddpd_error_set(err, DDPD_ESPEC, "spec", "spec: expected the job's spec (an object)");
    if (!json_is_string(w) || !json_string_length(w))
        return ddpd_error_set(err, DDPD_ESPEC, "weights",
                              "weights: expected the path of a .safetensors file");
    *weights = json_string_value(w);
    *device = "cpu";
    if (d && !json_is_null(d)) {
        if (!json_is_string(d) ||
            (strcmp(json_string_value(d), "cpu") && strcmp(json_string_value(d), "cuda")))
            return ddpd_error_set(err, DDPD_ESPEC, "device", "device: expected \"cpu\" or \"cuda\"");
        *device = json_string_value(d);
    }
    ddpd_err rc = infer__int(req, "gpu", 0, 1023, gpu, err);
    if (!rc && json_object_get(req, "gpu") && !json_is_null(json_object_get(req, "gpu")) &&
        strcmp(*device, "cuda") != 0)
        return ddpd_error_set(err, DDPD_ESPEC, "gpu", "gpu: only with \"device\": \"cuda\"");
    return rc ? rc : infer__int(req, "max_batch", 1, INFER_MAX_BATCH, max_batch, err);
}

/* What a loaded model holds in its device's memory: parameters, buffers, the KV cache and
 * generation's workspace, and the activations of a predict of max_batch samples, which
 * exist only while a predict runs but count, so that a memory cap is never passed. */
static int64_t resident_bytes(struct infer *in, int64_t *cache)
{
    int64_t b = model_numel(in->m) * (int64_t)sizeof(float);
    for (int i = 0; i < model_buffer_count(in->m); i++)
        b += model_buffer(in->m, i)->numel * 8;
    *cache = in->kv ? kv_cache_bytes(in->kv) : 0;
    if (in->kv)
        b += kv_cache_bytes(in->kv) + kv_work_bytes(in->kv);
    return b + model_plan_bytes(in->m, in->max_batch);
}

/* The spec's tokenizer, its files beneath the load request's data_dir (the server's data
 * folder, where the planner found them at submit). */
static ddpd_err load_tokenizer(struct infer *in, json_t *req, struct ddpd_error *err)
{
    json_t *dir = json_object_get(req, "data_dir");
    if (!json_is_string(dir) || !json_string_length(dir))
        return ddpd_error_set(
            err, DDPD_ESPEC, "data_dir",
            "data_dir: the spec names a tokenizer: expected the data folder its files are in");
    in->tok = spec_tokenizer_open(in->spec, json_string_value(dir), err);
    return in->tok ? DDPD_OK : err->code;
}

static void do_load(struct infer *in, json_t *req)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    const double t0 = base_mono_s();
    json_t *spec_json = NULL;
    const char *weights = NULL, *device = "cpu";
    int64_t gpu = 0, max_batch = INFER_DEFAULT_BATCH;
    /* The old model goes first: a load replaces it, and memory is freed before the new
     * one takes its own. A failed load leaves no model loaded. */
    unload(in);
    ddpd_err rc = load_fields(req, &spec_json, &weights, &device, &gpu, &max_batch, &err);
    if (!rc && !(in->spec = malloc(sizeof *in->spec)))
        rc = ddpd_error_set(&err, DDPD_ENOMEM, "spec", "out of memory reading the spec");
    if (!rc && (rc = spec_from_json(spec_json, NULL, in->spec, &err))) {
        char path[sizeof err.path];
        snprintf(path, sizeof path, "%s", err.path);
        snprintf(err.path, sizeof err.path, "spec%s%.200s", path[0] && path[0] != '[' ? "." : "", path);
    }
    if (!rc)
        rc = open_device(in, device, gpu, &err);
    if (!rc && !(in->m = model_new_eval(in->dev, in->spec, &err)))
        rc = err.code ? err.code : DDPD_EDEVICE;
    if (!rc && (rc = checkpoint_load_weights(in->m, weights, &err)))
        snprintf(err.path, sizeof err.path, "weights");
    if (!rc && !kv_why_not(in->spec, in->why_not, sizeof in->why_not) &&
        !(in->kv = kv_new(in->m, in->spec, &err)))
        rc = err.code ? err.code : DDPD_EDEVICE;
    if (!rc && in->spec->tokenizer_vocab[0])
        rc = load_tokenizer(in, req, &err);
    if (rc) {
        unload(in);
        infer__fail(in, "load", &err);
        return;
    }
    in->max_batch = max_batch;
    int64_t cache = 0;
    in->resident = resident_bytes(in, &cache);
    const bool gen = in->kv != NULL;
    const bool bytes = gen && kv_vocab(in->kv) == 256 && !in->tok;
    json_t *o = json_object();
    json_object_set_new(o, "ok", json_true());
    json_object_set_new(o, "op", json_string("load"));
    json_object_set_new(o, "params", json_integer(model_numel(in->m)));
    json_object_set_new(o, "param_bytes", json_integer(model_numel(in->m) * (json_int_t)sizeof(float)));
    json_object_set_new(o, "cache_bytes", json_integer(cache));
    json_object_set_new(o, "resident_bytes", json_integer(in->resident));
    json_object_set_new(o, "activation_bytes", json_integer(model_plan_bytes(in->m, in->max_batch)));
    json_object_set_new(o, "vocab",
                        spec_input_ids(in->spec) ? json_integer(spec_vocab(in->spec)) : json_null());
    json_object_set_new(o, "block_size", gen ? json_integer(kv_block(in->kv)) : json_null());
    json_object_set_new(o, "generate", json_boolean(gen));
    if (!gen)
        json_object_set_new(o, "why_not", infer__text(in->why_not, strlen(in->why_not)));
    json_object_set_new(o, "bytes_vocab", json_boolean(bytes));
    json_object_set_new(o, "tokenizer", in->tok ? json_integer(bpe_vocab_size(in->tok)) : json_null());
    json_object_set_new(o, "device", json_string(in->cuda ? "cuda" : "cpu"));
    json_object_set_new(o, "seconds", json_real(base_mono_s() - t0));
    infer__write(in, o);
}

/* ---- the loop ---- */

/* Answers one request (`req` stolen; NULL with jerr for a line that is not JSON). */
static void dispatch(struct infer *in, json_t *req, const json_error_t *jerr)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    json_t *opj = json_object_get(req, "op");
    const char *op = json_is_string(opj) ? json_string_value(opj) : NULL;
    if (!json_is_object(req)) {
        ddpd_error_set(&err, DDPD_EJSON, "", "the request is not a JSON object (column %d: %s)", jerr->column,
                       req ? "not an object" : jerr->text);
        infer__fail(in, NULL, &err);
    } else if (!op) {
        ddpd_error_set(&err, DDPD_ESPEC, "op",
                       "op: expected \"load\", \"generate\", \"predict\", \"unload\" or \"cancel\"");
        infer__fail(in, NULL, &err);
    } else if (!strcmp(op, "cancel")) {
        /* No generation runs: read and ignored, without an answer. */
    } else if (!strcmp(op, "load")) {
        do_load(in, req);
    } else if (!strcmp(op, "unload")) {
        unload(in);
        json_t *o = json_object();
        json_object_set_new(o, "ok", json_true());
        json_object_set_new(o, "op", json_string("unload"));
        infer__write(in, o);
    } else if (strcmp(op, "generate") && strcmp(op, "predict")) {
        ddpd_error_set(&err, DDPD_ESPEC, "op",
                       "op: unknown operation \"%.64s\" (load, generate, predict, unload, cancel)", op);
        infer__fail(in, NULL, &err);
    } else if (!in->m) {
        ddpd_error_set(&err, DDPD_ECONFLICT, "op", "%s: no model loaded (send load first)", op);
        infer__fail(in, op, &err);
    } else if (!strcmp(op, "generate")) {
        in->cancel_pending = false;
        infer__plan_release(in); /* a generating model holds its cache and little more */
        infer__generate(in, req);
    } else {
        infer__predict(in, req);
    }
    json_decref(req);
}

/* Waits for the next request while predict's activations are held, and gives them back
 * once INFER_PLAN_IDLE_S has passed since the last predict. */
static void idle_wait(struct infer *in)
{
    for (;;) {
        const double left = in->plan_used + INFER_PLAN_IDLE_S - base_mono_s();
        if (left <= 0) {
            fprintf(stderr,
                    "ddpd-worker --infer: predict's activations for %" PRId64
                    " samples given back (idle %.1f s)\n",
                    in->plan_rows, INFER_PLAN_IDLE_S);
            infer__plan_release(in);
            return;
        }
        struct pollfd p = {in->in.fd, POLLIN, 0};
        const int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r > 0 || (r < 0 && errno != EINTR))
            return; /* a request (or EOF, an error) is there */
    }
}

int infer_main(void)
{
    struct infer *in = calloc(1, sizeof *in);
    if (!in)
        return 1;
    signal(SIGPIPE, SIG_IGN);
    /* A fixed threshold: large transient buffers (a predict's activations, a weights
     * file) are mapped and go back to the system when freed, instead of glibc raising the
     * threshold after the first one and keeping later ones in the heap: the memory a
     * loaded model holds stays what load reported. */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    in->in.fd = STDIN_FILENO;
    in->out = stdout;
    in->cpu = dev_cpu_new(1);
    in->dev = in->cpu;
    for (;;) {
        char *line;
        size_t n;
        if (in->plan_rows > 0 && lines_peek(&in->in, false, &line, &n) == LINES_NONE)
            idle_wait(in);
        enum lines_rc rc = lines_peek(&in->in, true, &line, &n);
        if (rc == LINES_EOF)
            break;
        if (rc == LINES_TOOLONG) {
            struct ddpd_error err;
            ddpd_error_set(&err, DDPD_ETOOBIG, "", "the request line is longer than %d bytes",
                           INFER_LINE_MAX);
            infer__fail(in, NULL, &err);
            continue;
        }
        if (is_blank(line, n)) {
            lines_consume(&in->in);
            continue;
        }
        /* Parsed, then consumed: generation looks at the lines after it for a cancel. */
        json_error_t jerr;
        json_t *req = json_loadb(line, n, JSON_REJECT_DUPLICATES, &jerr);
        lines_consume(&in->in);
        dispatch(in, req, &jerr);
    }
    unload(in);
    dev_cpu_free(in->cpu);
    free(in->in.buf);
    free(in);
    return 0;
}
