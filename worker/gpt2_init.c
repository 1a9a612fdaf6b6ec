/* gpt2_init.c — init.format "gpt2" (gpt2_init.h): the config.json beside init.from read and
 * checked, the file's header matched to the spec's GPT-2 (schema/gpt2.c), and in a rank the
 * values copied into the model, Conv1D weights transposed on the way. Every file is opened
 * beneath the data directory, as init.from always is. */
#include "gpt2_init.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/file.h"
#include "../schema/gpt2.h"
#include "../schema/safetensors.h"
#include "data.h"

#define FIELD "init.from"

/* What both checks find: the spec's GPT-2, the file (header, or with values) and each
 * tensor's source in it. */
struct hf {
    struct gpt2_model *g;
    struct safetensors_file *f;
    const struct safetensors_tensor **src; /* [g->n] */
};

static void hf_free(struct hf *h)
{
    safetensors_free(h->f);
    free(h->src);
    free(h->g);
}

/* Re-sets a file error of the reader (DDPD_EDATA "<path>: <why>") as DDPD_ESPEC at
 * init.from, naming the file as the spec gives it. */
static ddpd_err as_spec_error(struct ddpd_error *err, const char *shown)
{
    char msg[sizeof err->message];
    const char *rest = strstr(err->message, ": ");
    snprintf(msg, sizeof msg, "%s", rest ? rest + 2 : err->message);
    return ddpd_error_set(err, DDPD_ESPEC, FIELD, "%s: %s: %s", FIELD, shown, msg);
}

/* config.json beside init.from, checked against h->g. */
static ddpd_err check_config(const struct spec *s, const char *data_dir, const struct gpt2_model *g,
                             struct ddpd_error *err)
{
    char path[SPEC_PATH_MAX + 16];
    const char *slash = strrchr(s->init_from, '/');
    snprintf(path, sizeof path, "%.*sconfig.json", slash ? (int)(slash - s->init_from) + 1 : 0, s->init_from);
    int fd = data_path_open(data_dir, FIELD, path, err);
    if (fd < 0) {
        char msg[sizeof err->message];
        snprintf(msg, sizeof msg, "%s", err->message);
        return ddpd_error_set(err, DDPD_ESPEC, FIELD,
                              "%s: init.format \"gpt2\" reads the config.json beside %s (%s): %s", FIELD,
                              s->init_from, path, msg);
    }
    char *text = malloc(GPT2_CONFIG_MAX + 1);
    int64_t n = text ? base_read_at(fd, text, GPT2_CONFIG_MAX + 1, 0) : -1;
    int en = errno;
    close(fd);
    ddpd_err rc;
    if (!text)
        rc = ddpd_error_set(err, DDPD_ENOMEM, FIELD, "out of memory reading %s", path);
    else if (n < 0)
        rc = ddpd_error_set(err, DDPD_ESPEC, FIELD, "%s: %s: cannot read: %s", FIELD, path, strerror(en));
    else
        rc = gpt2_config_check(text, (size_t)n, g, FIELD, path, err);
    free(text);
    return rc;
}

/* Reads (values: with the data) and matches init.from. */
static ddpd_err hf_open(const struct spec *s, const char *data_dir, bool values, struct hf *h,
                        struct ddpd_error *err)
{
    memset(h, 0, sizeof *h);
    if (!(h->g = malloc(sizeof *h->g)))
        return ddpd_error_set(err, DDPD_ENOMEM, FIELD, "out of memory");
    ddpd_err rc = gpt2_model_of(s, h->g, err);
    if (rc || (rc = check_config(s, data_dir, h->g, err)))
        return rc;
    if (values) {
        /* Opened beneath the data directory in one step, as the data files are. */
        int fd = data_path_open(data_dir, FIELD, s->init_from, err);
        if (fd < 0)
            return err ? err->code : DDPD_EDATA;
        h->f = safetensors_read_fd(fd, s->init_from, err);
    } else {
        char path[4096];
        if ((rc = data_path_resolve(data_dir, FIELD, s->init_from, path, sizeof path, err)))
            return rc;
        h->f = safetensors_read_header(path, err);
    }
    if (!h->f)
        return as_spec_error(err, s->init_from);
    if (!(h->src = calloc((size_t)h->g->n, sizeof *h->src)))
        return ddpd_error_set(err, DDPD_ENOMEM, FIELD, "out of memory");
    return gpt2_file_match(h->g, h->f, FIELD, s->init_from, h->src, err);
}

ddpd_err gpt2_init_plan(const struct spec *s, const char *data_dir, struct ddpd_error *err)
{
    struct hf h;
    ddpd_err rc = hf_open(s, data_dir, false, &h, err);
    hf_free(&h);
    return rc;
}

/* A tied lm_head.weight in the file must be wte's. */
static ddpd_err check_tied(const struct spec *s, const struct hf *h, struct ddpd_error *err)
{
    const struct safetensors_tensor *wte = h->src[0], *head = h->src[h->g->n - 1];
    const struct gpt2_tensor *e = &h->g->t[h->g->n - 1];
    int64_t numel = e->shape[0] * e->shape[1];
    for (int64_t i = 0; i < numel && head != wte; i++)
        if (head->data[i] != wte->data[i])
            return ddpd_error_set(err, DDPD_ESPEC, FIELD,
                                  "%s: %s: \"%s\" and \"%s\" differ at [%" PRId64 ", %" PRId64
                                  "] (%.9g and %.9g), but the spec ties %s to the embedding: "
                                  "they must be equal",
                                  FIELD, s->init_from, head->name, wte->name, i / e->shape[1],
                                  i % e->shape[1], (double)head->data[i], (double)wte->data[i], e->where);
    return DDPD_OK;
}

ddpd_err gpt2_init_load(struct model *m, const struct spec *s, const char *data_dir, struct ddpd_error *err)
{
    struct hf h;
    float *tmp = NULL;
    ddpd_err rc = hf_open(s, data_dir, true, &h, err);
    if (rc || (h.g->tied && (rc = check_tied(s, &h, err))))
        goto out;
    struct dev dev = model_dev(m);
    const int np = model_param_count(m);
    int placed = 0;
    for (int i = 0; i < np; i++) {
        struct param *p = model_param(m, i);
        const struct gpt2_tensor *e = gpt2_tensor_by_key(h.g, p->name);
        if (!e) {
            rc = ddpd_error_set(err, DDPD_EINTERNAL, FIELD, "the model's %s has no GPT-2 tensor", p->name);
            goto out;
        }
        const float *v = h.src[e - h.g->t]->data;
        if (e->conv1d) {
            /* Hugging Face's Conv1D keeps [in, out] (x @ W + b); ddpd's linear [out, in]. */
            const int64_t in = e->shape[0], out = e->shape[1];
            free(tmp);
            if (!(tmp = malloc((size_t)(in * out) * sizeof *tmp))) {
                rc = ddpd_error_set(err, DDPD_ENOMEM, FIELD, "out of memory transposing %s", e->hf);
                goto out;
            }
            for (int64_t r = 0; r < in; r++)
                for (int64_t c = 0; c < out; c++)
                    tmp[c * in + r] = v[r * out + c];
            v = tmp;
        }
        dev.ops->to_device(dev.ctx, p->data, v, (size_t)p->numel * sizeof(float));
        placed++;
    }
    /* Every tensor of the list has its parameter (a tied lm_head is wte's). */
    if (placed != h.g->n - (h.g->tied ? 1 : 0))
        rc =
            ddpd_error_set(err, DDPD_EINTERNAL, FIELD, "the model has %d parameters but GPT-2 has %d tensors",
                           placed, h.g->n - (h.g->tied ? 1 : 0));
out:
    free(tmp);
    hf_free(&h);
    return rc;
}
