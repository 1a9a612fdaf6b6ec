/* gpt2_export.c — ddpd's model.safetensors as Hugging Face's GPT-2 file (gpt2_export.h):
 * the new header is made once (safetensors_header, the writer's own), then each read is
 * served from the header, from the checkpoint's bytes as they are (a tensor kept as it is),
 * or from the one Conv1D weight transposed last (ddpd's [out, in] to their [in, out]).
 * Tensors are moved as 4-byte units, so the bytes stay little-endian on any host. */
#include "gpt2_export.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../base/file.h"
#include "../schema/safetensors.h"

/* One tensor of the output, in data order. */
struct part {
    int64_t begin, end; /* its bytes in the output file */
    int64_t src;        /* where ddpd's file has them */
    int64_t rows, cols; /* ddpd's [out, in] of a Conv1D weight; else 0 */
};

struct gpt2_export {
    int fd;
    char *head; /* the 8-byte length, the JSON header and its padding */
    size_t head_len;
    int n;
    struct part *parts;
    int64_t size;
    int cached; /* the part whose transpose `cache` holds, -1 none */
    uint32_t *cache, *scratch;
};

void gpt2_export_free(struct gpt2_export *x)
{
    if (!x)
        return;
    if (x->fd >= 0)
        close(x->fd);
    free(x->head);
    free(x->parts);
    free(x->cache);
    free(x->scratch);
    free(x);
}

struct gpt2_export *gpt2_export_open(const char *path, const struct gpt2_model *g, struct ddpd_error *err)
{
    struct gpt2_export *x = calloc(1, sizeof *x);
    struct safetensors_file *f = NULL;
    struct safetensors_tensor *out = NULL;
    const struct safetensors_tensor **src = NULL;
    int *order = NULL;
    /* The header is made from shapes and names; safetensors_header reads no value. */
    static const float no_values[1];
    if (!x)
        goto nomem;
    x->fd = -1;
    x->cached = -1;
    if (!(f = safetensors_read_header(path, err)))
        goto fail;
    out = calloc((size_t)g->n, sizeof *out);
    src = calloc((size_t)g->n, sizeof *src);
    order = calloc((size_t)g->n, sizeof *order);
    x->parts = calloc((size_t)g->n, sizeof *x->parts);
    if (!out || !src || !order || !x->parts)
        goto nomem;
    for (int i = 0; i < g->n; i++) {
        const struct gpt2_tensor *e = &g->t[i];
        if (e->tied)
            continue; /* Hugging Face's files leave the tied copy of wte out */
        const struct safetensors_tensor *t = safetensors_get(f, e->key);
        bool same = t && t->ndim == e->ndim && !strcmp(t->dtype, "F32");
        for (int d = 0; same && d < e->ndim; d++)
            same = t->shape[d] == e->shape[e->conv1d ? 1 - d : d];
        if (!same) {
            ddpd_error_set(err, DDPD_EDATA, path,
                           "%s: tensor \"%s\" is %s, not the float32 %s of the job's spec", path, e->key,
                           t ? "of another shape or dtype" : "missing", e->hf);
            goto fail;
        }
        struct safetensors_tensor *o = &out[x->n];
        snprintf(o->name, sizeof o->name, "transformer.%s", e->hf);
        if (!strcmp(e->hf, "lm_head.weight"))
            snprintf(o->name, sizeof o->name, "%s", e->hf);
        o->ndim = e->ndim;
        memcpy(o->shape, e->shape, sizeof e->shape);
        o->data = (float *)no_values;
        src[x->n++] = t;
    }
    const struct safetensors_meta meta[] = {{"format", "pt"}};
    if (safetensors_header(path, out, x->n, meta, 1, &x->head, &x->head_len, order, err))
        goto fail;
    int64_t at = (int64_t)x->head_len;
    for (int k = 0; k < x->n; k++) {
        const struct safetensors_tensor *o = &out[order[k]], *t = src[order[k]];
        const struct gpt2_tensor *e = gpt2_tensor_find(g, o->name);
        struct part *p = &x->parts[k];
        int64_t numel = o->ndim == 2 ? o->shape[0] * o->shape[1] : o->shape[0];
        p->begin = at;
        p->end = at += numel * 4;
        p->src = t->file_offset;
        if (e && e->conv1d) {
            p->rows = t->shape[0];
            p->cols = t->shape[1];
        }
    }
    x->size = at;
    if ((x->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        ddpd_error_set(err, DDPD_EDATA, path, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    goto done;
nomem:
    ddpd_error_set(err, DDPD_ENOMEM, "", "out of memory exporting %s", path);
fail:
    gpt2_export_free(x);
    x = NULL;
done:
    safetensors_free(f);
    free(out);
    free(src);
    free(order);
    return x;
}

int64_t gpt2_export_size(const struct gpt2_export *x)
{
    return x->size;
}

/* Part k's transpose into x->cache: ddpd's [rows, cols] read whole, written [cols, rows]. */
static bool transpose(struct gpt2_export *x, int k)
{
    const struct part *p = &x->parts[k];
    const int64_t n = p->rows * p->cols;
    free(x->cache);
    free(x->scratch);
    x->cached = -1;
    x->cache = malloc((size_t)n * 4);
    x->scratch = malloc((size_t)n * 4);
    if (!x->cache || !x->scratch || base_read_at(x->fd, x->scratch, n * 4, p->src) != n * 4)
        return false;
    for (int64_t r = 0; r < p->rows; r++)
        for (int64_t c = 0; c < p->cols; c++)
            x->cache[c * p->rows + r] = x->scratch[r * p->cols + c];
    free(x->scratch);
    x->scratch = NULL;
    x->cached = k;
    return true;
}

long gpt2_export_read(struct gpt2_export *x, uint64_t pos, char *buf, size_t max)
{
    size_t done = 0;
    while (done < max && (int64_t)pos < x->size) {
        size_t n;
        if (pos < x->head_len) {
            n = x->head_len - pos < max - done ? x->head_len - pos : max - done;
            memcpy(buf + done, x->head + pos, n);
        } else {
            int k = 0;
            while (x->parts[k].end <= (int64_t)pos)
                k++;
            const struct part *p = &x->parts[k];
            const int64_t off = (int64_t)pos - p->begin, left = p->end - (int64_t)pos;
            n = (size_t)left < max - done ? (size_t)left : max - done;
            if (p->rows) {
                if (x->cached != k && !transpose(x, k))
                    return -1;
                memcpy(buf + done, (const char *)x->cache + off, n);
            } else if (base_read_at(x->fd, buf + done, (int64_t)n, p->src + off) != (int64_t)n) {
                return -1;
            }
        }
        done += n;
        pos += n;
    }
    return (long)done;
}
