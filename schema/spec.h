/* spec.h — the job spec of CONTRACT.md §2 as a C value: parse, validate, print.
 * Knows jansson and nothing else: no HTTP, no SQLite, no CUDA. */
#ifndef DDPD_SPEC_H
#define DDPD_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define SPEC_MAX_LAYERS 64
#define SPEC_MAX_WIDTH 1048576
#define SPEC_MAX_BODY (1024 * 1024)
#define SPEC_MAX_TARGETS 64
#define SPEC_MAX_WORLD 1024
#define SPEC_PATH_MAX 1024

typedef enum { LAYER_LINEAR, LAYER_RELU, LAYER_TANH, LAYER_SIGMOID, LAYER_GELU } layer_kind;
typedef enum { LOSS_MSE, LOSS_CROSS_ENTROPY } loss_kind;
typedef enum { OPTIM_SGD, OPTIM_ADAMW } optim_kind;
typedef enum { DATA_SYNTHETIC, DATA_NPY, DATA_CSV } data_kind;
typedef enum { DEVICE_CPU, DEVICE_CUDA } device_kind;
typedef enum { JOIN_AUTO, JOIN_TRUE, JOIN_FALSE } join_mode;
typedef enum { BACKEND_CPU, BACKEND_NCCL } comm_backend;
typedef enum { PRECISION_FP32, PRECISION_TF32 } precision_kind;
typedef enum { NONFINITE_FAIL, NONFINITE_CONTINUE } nonfinite_mode;

/* One entry of `model`. For activations `in == out` = the width they act on
 * (filled in by the validator from the previous linear layer). */
struct spec_layer {
    layer_kind kind;
    int64_t in, out;
    bool bias; /* linear only; default true */
};

struct spec_optim {
    optim_kind kind;
    double lr;
    double momentum, dampening, weight_decay; /* sgd; weight_decay also adamw */
    bool nesterov;
    double beta1, beta2, eps; /* adamw */
};

struct spec_data {
    data_kind kind;
    int64_t samples; /* synthetic */
    uint64_t seed;   /* synthetic data and shuffling; default 0 */
    char x[SPEC_PATH_MAX], y[SPEC_PATH_MAX]; /* npy, relative to data_dir; may hold {rank} */
    char path[SPEC_PATH_MAX];                /* csv */
    int n_targets;                           /* csv: target column names */
    char targets[SPEC_MAX_TARGETS][128];
    bool shuffle;   /* default true */
    bool drop_last; /* default false */
};

struct spec_ddp {
    double bucket_cap_mb; /* default 25 */
    join_mode join;       /* default auto */
    bool divide_by_initial_world_size; /* default true */
    comm_backend backend; /* default: nccl for cuda, cpu for cpu */
    bool backend_set;     /* backend was given explicitly */
    double timeout_s;     /* default 300 */
};

struct spec {
    char name[128];       /* default "" */
    int world_size;       /* default 1 */
    device_kind device;   /* default cpu unless the caller says otherwise (spec_parse's opts) */
    bool device_set;
    precision_kind precision; /* GEMM inputs on cuda: exact fp32 (default) or TF32 */
    int n_layers;
    struct spec_layer layers[SPEC_MAX_LAYERS];
    loss_kind loss;
    struct spec_optim optim;
    struct spec_data data;
    int64_t batch_size;   /* required */
    int64_t epochs;       /* exactly one of epochs / steps is > 0 */
    int64_t steps;
    int64_t grad_accum;   /* default 1 */
    struct spec_ddp ddp;
    uint64_t init_seed;   /* default 0 */
    char init_from[SPEC_PATH_MAX]; /* "" unless init.from */
    int64_t checkpoint_every; /* 0 = only at the end */
    int64_t checkpoint_keep_last; /* newest ckpt-N folders kept, >= 1; default 3 */
    int64_t log_every;    /* default 1 */
    int max_restarts;     /* default 0 */
    nonfinite_mode on_nonfinite; /* a NaN/inf loss: fail the job at that step (default) or train on */
};

struct spec_parse_opts {
    device_kind default_device; /* what `device` means when absent: cuda if the server has GPUs */
};

/* Parses and validates `text` (`len` bytes, need not be NUL-terminated).
 * On success fills `out` with every default applied and returns DDPD_OK.
 * On error returns DDPD_EJSON (err->line/column set), DDPD_ETOOBIG or DDPD_ESPEC
 * (err->path is the JSON path, err->message says what was expected and what came).
 * `opts` may be NULL (default device cpu). */
ddpd_err spec_parse(const char *text, size_t len, const struct spec_parse_opts *opts,
                    struct spec *out, struct ddpd_error *err);

/* The same from a jansson object (borrowed). Used for the `spec` member of the worker's
 * stdin document. */
struct json_t;
ddpd_err spec_from_json(struct json_t *obj, const struct spec_parse_opts *opts,
                        struct spec *out, struct ddpd_error *err);

/* The spec as a JSON object with every default written out; parses back to an equal
 * spec. Returns a new reference, or NULL when memory ran out (never a partial spec). */
struct json_t *spec_to_json(const struct spec *s);

/* spec_to_json's object as compact JSON text: a new string the caller frees, or NULL when
 * memory ran out. (jansson's json_dumps can return damaged text, a key left out, when an
 * allocation fails inside it: it ignores the failure of its own buffer while writing a
 * key. spec_dumps writes through json_dump_callback into a buffer of its own whose
 * failures it sees, so what a caller stores is always the spec.) */
char *spec_dumps(const struct spec *s);

/* How ranks share the data (schema/README.md "Sharding"): rank r of `world` takes the
 * samples at positions r, r+world, ... of `rows`, in batches of `batch`, the last one
 * short unless drop_last. The worker reads with these; the server plans with them. */
int64_t spec_shard_rows(int64_t rows, int rank, int world);
int64_t spec_batches(int64_t rows, int64_t batch, bool drop_last);

/* With ddp.join false every rank must have the same number of batches per epoch
 * (`counts`: world_size of them): DDPD_ESPEC naming ddp.join otherwise, with its own
 * sentence for a rank without a batch (join would run it). The server, `ddpd run` and the
 * ranks check with it. */
ddpd_err spec_check_batch_counts(const struct spec *s, const int64_t *counts, struct ddpd_error *err);

/* Parameter count of the model (weights + biases). */
int64_t spec_param_count(const struct spec *s);
/* Input width (model[0].in) and output width (last linear's out). */
int64_t spec_in_width(const struct spec *s);
int64_t spec_out_width(const struct spec *s);

const char *layer_kind_name(layer_kind k);
const char *loss_kind_name(loss_kind k);
const char *device_kind_name(device_kind k);

#endif
