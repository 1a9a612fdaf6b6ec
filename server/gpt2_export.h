/* gpt2_export.h — a job's model.safetensors served as Hugging Face's GPT-2 file (GET
 * .../checkpoint?format=gpt2): their names ("transformer.h.0.attn.c_attn.weight"), Conv1D
 * weights transposed back to [in, out], a tied lm_head left out as their own files leave it.
 * Made as the client reads it, from the checkpoint's header (schema/gpt2.h and
 * safetensors.h) and its bytes on disk: one transposed tensor in memory at a time, never the
 * model. Knows nothing of HTTP. */
#ifndef DDPD_GPT2_EXPORT_H
#define DDPD_GPT2_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "../schema/err.h"
#include "../schema/gpt2.h"

struct gpt2_export;

/* Opens ddpd's file `path` of the model `g` (gpt2_model_of of the job's spec; copied).
 * NULL with DDPD_EDATA naming the file when it cannot be read or does not hold the model's
 * tensors as float32, DDPD_ENOMEM. Caller frees with gpt2_export_free. */
struct gpt2_export *gpt2_export_open(const char *path, const struct gpt2_model *g, struct ddpd_error *err);
/* The bytes of the whole file. */
int64_t gpt2_export_size(const struct gpt2_export *x);
/* Up to `max` bytes at `pos` into buf: how many (at least 1 before the end), 0 at the end,
 * -1 when the checkpoint cannot be read (it shrank, or memory ran out). */
long gpt2_export_read(struct gpt2_export *x, uint64_t pos, char *buf, size_t max);
void gpt2_export_free(struct gpt2_export *x);

#endif
