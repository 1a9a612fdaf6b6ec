/* gpt2_init.h — init.format "gpt2" in the worker: init.from is a Hugging Face GPT-2
 * model.safetensors with its config.json beside it, checked against the spec (schema/gpt2.h)
 * by the planner from the header alone, and by every rank again as it loads the values:
 * Hugging Face's names mapped to ddpd's, Conv1D weights transposed to [out, in], the mask
 * buffers of older files skipped. Knows the model's parameters; nothing of DDP. */
#ifndef DDPD_GPT2_INIT_H
#define DDPD_GPT2_INIT_H

#include "../schema/err.h"
#include "../schema/spec.h"
#include "model.h"

/* The planner's check (ddpd-worker --plan): config.json and the file's tensors against the
 * spec, reading no values. DDPD_ESPEC at init.from (or init.format) naming the file, the
 * tensor, its shape in the file and the shape the spec needs. */
ddpd_err gpt2_init_plan(const struct spec *s, const char *data_dir, struct ddpd_error *err);

/* The same checks, then the values into m's parameters (a tied lm_head.weight the file
 * has must equal wte.weight). */
ddpd_err gpt2_init_load(struct model *m, const struct spec *s, const char *data_dir, struct ddpd_error *err);

#endif
