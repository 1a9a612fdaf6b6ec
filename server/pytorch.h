/* pytorch.h — a job's model as PyTorch source: `model.py`, which GET /v1/jobs/{id}/pytorch
 * serves and `ddpd pull --pytorch` writes beside model.safetensors. The spec's layers become
 * an nn.Sequential whose state_dict names are ddpd's checkpoint names, with a safetensors
 * reader in plain Python and `load()`. Pure text generation: knows the spec (schema/spec.h)
 * and nothing of HTTP, the store or the worker. */
#ifndef DDPD_PYTORCH_H
#define DDPD_PYTORCH_H

#include <stdbool.h>
#include <stdint.h>

struct spec;

/* model.py for job `job` whose spec is `s` (a validated spec, as spec_parse fills it;
 * borrowed). The text is ASCII: whatever the spec's name holds is written as an escaped
 * Python string literal, so no name can add code to the file. Returns a new NUL-terminated
 * string the caller frees, or NULL when memory ran out. */
char *pytorch_model_py(const struct spec *s, int64_t job);

/* True when the model is of the GPT family that generation takes: it starts with
 * `embedding`, its input is one sequence of ids ([T]) and its output logits over the
 * embedding's vocabulary ([T, num]) under cross_entropy. model.py then has generate(). */
bool pytorch_is_generative(const struct spec *s);

#endif
