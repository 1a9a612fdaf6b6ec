/* codec_impl.h — what the document codecs of schema/ (jobdoc.c, plan.c) share: reading
 * one member of a JSON object with an error that names the key "in the job document".
 * Not part of the contract: only schema/ includes it. */
#ifndef DDPD_SCHEMA_CODEC_IMPL_H
#define DDPD_SCHEMA_CODEC_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

struct json_t;

/* A string member into buf (cap bytes): "" when absent or null; a wrong type or a string
 * longer than buf is DDPD_ESPEC naming the key. */
ddpd_err schema__get_str(const struct json_t *obj, const char *key, char *buf, size_t cap,
                         struct ddpd_error *err);
/* An integer member in [lo, hi]; anything else (absent included) is DDPD_ESPEC. */
ddpd_err schema__get_int(const struct json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                         struct ddpd_error *err);
/* An optional integer member in [0, INT64_MAX]: `none` when absent (or, with null_ok, null). */
ddpd_err schema__get_opt_int(const struct json_t *obj, const char *key, bool null_ok, int64_t none,
                             int64_t *out, struct ddpd_error *err);

#endif
