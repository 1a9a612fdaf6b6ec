/* spec_impl.h — what the files of the spec module (spec.c, spec_getters.c, spec_layers.c,
 * spec_preset.c, spec_data.c, spec_print.c, spec_memory.c) share, and nothing else includes: the JSON getters
 * whose errors name the path, the model's shape helpers, the name tables that the parser and
 * the printer both read, and the limits. The public contract is spec.h. */
#ifndef DDPD_SPEC_IMPL_H
#define DDPD_SPEC_IMPL_H

#include "spec.h"
#include "text.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define PATH_CAP sizeof(((struct ddpd_error *)0)->path)

/* The helpers keep the short names they had when the module was one file, so the code reads
 * as before; the linker sees them with the module's prefix, as zlib's Z_PREFIX does it, so
 * that no program linking the schema library can collide with a `fail` or a `describe`. */
#define quote_into      spec__quote_into
#define path_key        spec__path_key
#define path_index      spec__path_index
#define fmt_real        spec__fmt_real
#define describe        spec__describe
#define fail            spec__fail
#define fail_type       spec__fail_type
#define check_keys      spec__check_keys
#define missing         spec__missing
#define get_int         spec__get_int
#define get_int32       spec__get_int32
#define get_num         spec__get_num
#define get_bool        spec__get_bool
#define get_str_value   spec__get_str_value
#define get_enum        spec__get_enum
#define get_enum_hint   spec__get_enum_hint
#define get_obj         spec__get_obj
#define get_path        spec__get_path
#define get_pair        spec__get_pair
#define last_linear     spec__last_linear
#define first_non_mlp   spec__first_non_mlp
#define layer_path      spec__layer_path
#define shape_str       spec__shape_str
#define shape_numel     spec__shape_numel
#define parse_model     spec__parse_model
#define parse_layers    spec__parse_layers
#define parse_preset    spec__parse_preset
#define check_expanded  spec__check_expanded
#define preset_to_json  spec__preset_to_json
#define parse_data_obj  spec__parse_data_obj
#define parse_data      spec__parse_data
#define data_names      spec__data_names
#define dtype_names     spec__dtype_names
#define sched_names     spec__sched_names
#define backend_names   spec__backend_names
#define comm_hook_names spec__comm_hook_names
#define precision_names spec__precision_names
#define nonfinite_names spec__nonfinite_names
#define parse_watch     spec__parse_watch
#define watch_to_json   spec__watch_to_json

/* An .npy file with more bytes of values than this is memory-mapped by the ranks, not
 * loaded (worker/data/npy.c's DATA_MAP_MIN): the memory estimate counts it as not held. */
#define SPEC_DATA_MAP_MIN   (64LL << 20)
#define SPEC_MAX_DEPTH      8           /* residuals inside residuals */
#define SPEC_MAX_KERNEL     1024        /* kernel, stride and padding of conv2d and pooling */
#define SPEC_MAX_HEADS      1024        /* attention heads */
#define SPEC_MAX_T          65536       /* positions entering an attention or position layer */
#define SPEC_MAX_NUMEL      (1LL << 32) /* elements of one sample entering or leaving a layer */
#define NORM_EPS_DEFAULT    1e-5        /* layernorm's and batchnorm's eps, PyTorch's default */
#define BN_MOMENTUM_DEFAULT 0.1         /* batchnorm's momentum, PyTorch's default */

/* ---- the enums' names, in enum order: read by the parser and by spec_print.c ---- */

extern const char *const data_names[4];      /* data_kind (spec_data.c) */
extern const char *const dtype_names[2];     /* tokens_dtype (spec_data.c) */
extern const char *const sched_names[3];     /* sched_kind (spec.c) */
extern const char *const backend_names[2];   /* comm_backend (spec.c) */
extern const char *const comm_hook_names[3]; /* comm_hook_kind (spec.c) */
extern const char *const precision_names[2]; /* precision_kind (spec.c) */
extern const char *const nonfinite_names[2]; /* nonfinite_mode (spec.c) */

/* ---- spec_getters.c: paths, descriptions and typed getters for error messages ----
 * Every getter leaves *out alone when the key is absent and not required, and on a wrong
 * value fills `err` with the JSON path and returns DDPD_ESPEC. */

/* Writes `s` as the inside of a JSON string, at most `max` bytes of input, and adds "..."
 * when it had to stop early. */
void quote_into(char *dst, size_t cap, const char *s, size_t len, size_t max);
/* `parent.key`, or `key` at the top (dst holds PATH_CAP bytes). */
void path_key(char *dst, const char *parent, const char *key);
/* `parent[i]` (dst holds PATH_CAP bytes). */
void path_index(char *dst, const char *parent, size_t i);
/* Shortest %g that reads back as the same double. */
void fmt_real(char *dst, size_t cap, double x);
/* What the user gave, for "got ..." in messages; returns buf. */
const char *describe(const json_t *v, char *buf, size_t cap);
ddpd_err fail(struct ddpd_error *err, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
ddpd_err fail_type(struct ddpd_error *err, const char *path, const char *want, const json_t *got);
/* Unknown keys are an error; `only` replaces the list of allowed keys in the message. */
ddpd_err check_keys(struct ddpd_error *err, json_t *obj, const char *parent, const char *const *allowed,
                    size_t n, const char *only);
ddpd_err missing(struct ddpd_error *err, const char *path, const char *want);
ddpd_err get_int(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, int64_t lo,
                 int64_t hi, bool required, int64_t *out);
ddpd_err get_int32(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, int lo, int hi,
                   int *out);
ddpd_err get_num(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, double lo,
                 bool lo_open, double hi, bool hi_open, const char *want, bool required, double *out);
ddpd_err get_bool(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, bool *out);
/* A string that fits in dst (cap bytes with the NUL), without NUL bytes or control
 * characters (text.h). */
ddpd_err get_str_value(struct ddpd_error *err, json_t *v, const char *path, char *dst, size_t cap);
ddpd_err get_enum(struct ddpd_error *err, json_t *obj, const char *parent, const char *key,
                  const char *const *names, size_t n, bool required, int *out);
/* get_enum with "(did you mean \"linear\"?)" after the error for a near miss (a layer's type). */
ddpd_err get_enum_hint(struct ddpd_error *err, json_t *obj, const char *parent, const char *key,
                       const char *const *names, size_t n, bool required, int *out);
/* An object member that must itself be an object; *out is NULL when absent. */
ddpd_err get_obj(struct ddpd_error *err, json_t *obj, const char *key, bool required, const char *example,
                 json_t **out);
/* A path relative to the data directory that does not leave it (dst holds SPEC_PATH_MAX). */
ddpd_err get_path(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, bool required,
                  char *dst);
/* An int, or a list of two ints, each in [lo, hi] (kernel, stride, padding: [h, w]). */
ddpd_err get_pair(struct ddpd_error *err, json_t *obj, const char *parent, const char *key, int64_t lo,
                  int64_t hi, bool required, int64_t out[2]);

/* ---- spec_layers.c: the model ---- */

/* Index of the last linear layer, or -1. */
int64_t last_linear(const struct spec *s);
/* The first layer that is not linear or an activation, or -1. */
int first_non_mlp(const struct spec *s);
/* "model[2].layers[1]" for layer i (dst holds PATH_CAP bytes). */
void layer_path(char *dst, const struct spec *s, int i);
/* "[32,4,4]" */
void shape_str(char *dst, size_t cap, int rank, const int64_t *shape);
/* The product of the dimensions, INT64_MAX when it overflows. */
int64_t shape_numel(int rank, const int64_t *shape);
/* `model` and `input_shape`: the layers and the shapes flowing through them. */
ddpd_err parse_model(struct ddpd_error *err, json_t *root, struct spec *s);

/* A top-level layer list at `path` into s->layers (from s->n_layers 0), keys and values
 * checked, shapes not yet inferred. */
ddpd_err parse_layers(struct ddpd_error *err, struct spec *s, json_t *list, const char *path);

/* ---- spec_preset.c: `model` as a preset ---- */

/* The preset object `model` into s->preset and its layer list into *list (a new reference). */
ddpd_err parse_preset(struct ddpd_error *err, json_t *model, struct spec *s, json_t **list);
/* The preset's `expanded`, when given, must parse to s's layers (what spec_to_json wrote). */
ddpd_err check_expanded(struct ddpd_error *err, json_t *model, const struct spec *s);
/* The preset as spec_to_json writes it, with `expanded` (stolen) beside its fields. */
json_t *preset_to_json(const struct spec *s, json_t *expanded);

/* ---- spec_data.c: the data ---- */

/* A data object at P ("data" or "eval.data"), into d. */
ddpd_err parse_data_obj(struct ddpd_error *err, json_t *obj, const char *P, struct spec *s,
                        struct spec_data *d);
ddpd_err parse_data(struct ddpd_error *err, json_t *root, struct spec *s);

/* ---- spec_watch.c: early_stop and checkpoint.keep_best ---- */

/* `early_stop` (top level) and `keep_best` of the object `checkpoint` (NULL when absent),
 * checked against the loss and eval already parsed. */
ddpd_err parse_watch(struct ddpd_error *err, json_t *root, json_t *checkpoint, struct spec *s);
/* The watch as spec_to_json writes it (a new reference; NULL when out of memory). */
json_t *watch_to_json(const struct spec_watch *w, bool early_stop);

#endif
