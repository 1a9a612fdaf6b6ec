/* spec.h — the job spec of CONTRACT.md §2 as a C value: parse, validate, print.
 * Knows jansson and nothing else: no HTTP, no SQLite, no CUDA. */
#ifndef DDPD_SPEC_H
#define DDPD_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* v2 (CONTRACT.md §2a): `model` and every residual's `layers` hold at most SPEC_MAX_LIST
 * entries, and the whole tree at most SPEC_MAX_LAYERS layers, nested ones counted. */
#define SPEC_MAX_LAYERS       256
#define SPEC_PRIORITY_DEFAULT 50
#define SPEC_MAX_LIST         64
#define SPEC_MAX_PARAMS       (4 * SPEC_MAX_LAYERS) /* attention has four tensors */
#define SPEC_MAX_RANK         4                     /* dims of one sample, batch not counted */
#define SPEC_MAX_WIDTH        1048576
#define SPEC_MAX_BODY         (1024 * 1024)
#define SPEC_MAX_TARGETS      64
#define SPEC_MAX_WORLD        1024
#define SPEC_PATH_MAX         1024
/* Synthetic data comes from a teacher of the model's shape in double precision: its
 * weights (not counting biases) are capped (2 GiB of doubles). */
#define SPEC_MAX_SYNTHETIC_WEIGHTS (1LL << 28)

/* LAYER_GELU_TANH is `gelu` with "approximate": "tanh" (its name is "gelu"). */
typedef enum {
    LAYER_LINEAR,
    LAYER_RELU,
    LAYER_TANH,
    LAYER_SIGMOID,
    LAYER_GELU,
    LAYER_GELU_TANH,
    LAYER_EMBEDDING,
    LAYER_POSITION,
    LAYER_LAYERNORM,
    LAYER_ATTENTION,
    LAYER_RESIDUAL,
    LAYER_DROPOUT,
    LAYER_CONV2D,
    LAYER_MAXPOOL2D,
    LAYER_AVGPOOL2D,
    LAYER_BATCHNORM,
    LAYER_FLATTEN,
} layer_kind;
typedef enum { LOSS_MSE, LOSS_CROSS_ENTROPY } loss_kind;
typedef enum { OPTIM_SGD, OPTIM_ADAMW } optim_kind;
typedef enum { SCHED_CONSTANT, SCHED_LINEAR, SCHED_COSINE } sched_kind;
typedef enum { DATA_SYNTHETIC, DATA_NPY, DATA_CSV, DATA_TOKENS } data_kind;
typedef enum { TOKENS_UINT16, TOKENS_INT32 } tokens_dtype;
typedef enum { DEVICE_CPU, DEVICE_CUDA } device_kind;
typedef enum { JOIN_AUTO, JOIN_TRUE, JOIN_FALSE } join_mode;
typedef enum { BACKEND_CPU, BACKEND_NCCL } comm_backend;
typedef enum { COMM_HOOK_NONE, COMM_HOOK_FP16, COMM_HOOK_BF16 } comm_hook_kind;
typedef enum { PRECISION_FP32, PRECISION_TF32 } precision_kind;
typedef enum { NONFINITE_FAIL, NONFINITE_CONTINUE } nonfinite_mode;
/* init.format: the names and layout of init.from's file (ddpd's own, or Hugging Face's
 * GPT-2: schema/gpt2.h). */
typedef enum { INIT_FORMAT_DDPD, INIT_FORMAT_GPT2 } init_format_kind;
/* The eval metric that early_stop and checkpoint.keep_best watch, and which way is better. */
typedef enum { WATCH_EVAL_LOSS, WATCH_EVAL_ACCURACY } watch_metric;
typedef enum { WATCH_MIN, WATCH_MAX } watch_mode;

/* early_stop or checkpoint.keep_best (spec_watch.c; the rules in docs/spec.md). */
struct spec_watch {
    bool on;
    watch_metric metric;
    watch_mode mode;  /* default: min for eval_loss, max for eval_accuracy */
    int64_t patience; /* early_stop: evaluations without improvement, default 3 */
    double min_delta; /* early_stop: default 0; keep_best: always 0 */
};

/* One layer of `model`. The tree is kept flat, in preorder: a residual comes before
 * its inner layers, which run from its index + 1 to its `end` (nested residuals
 * included). A v1 list is the same array with every parent -1.
 * The validator fills the shapes: in_shape/out_shape are one sample's shape (the batch
 * dimension not counted) entering and leaving the layer, inferred from `input_shape`
 * (or, for a model of linear layers and activations alone, from model[0].in). For
 * layers acting on the last dimension `in` and `out` are that width (v1 code reads
 * them); for conv2d they are the channels, for pooling and 2d batchnorm the channels
 * kept, for flatten the product, for embedding `num` and `dim`. */
struct spec_layer {
    layer_kind kind;
    int parent;   /* index of the enclosing residual, -1 at the top level */
    int end;      /* one past the last layer inside it (residual), else own index + 1 */
    char key[48]; /* state_dict prefix: "3", or "2.1" inside residual 2 */
    int64_t in, out;
    bool bias;       /* linear, layernorm, attention, conv2d; default true */
    int64_t num;     /* embedding: vocabulary size `num`; position: `max` */
    int64_t dim;     /* embedding, position, layernorm, attention: `dim`; batchnorm: `features` */
    int64_t heads;   /* attention */
    bool causal;     /* attention; default true */
    double eps;      /* layernorm, batchnorm; default 1e-5 */
    double momentum; /* batchnorm; default 0.1 */
    double p;        /* dropout */
    int64_t kernel[2], stride[2], padding[2]; /* conv2d, pooling: [h, w] */
    int in_rank, out_rank;
    int64_t in_shape[SPEC_MAX_RANK], out_shape[SPEC_MAX_RANK];
    /* linear with `tie` (issue 30): the index (into layers[]) of the embedding layer whose
     * [num, dim] table it uses as its [out, in] weight; -1 when not tied (every other
     * layer). A list built in code must set -1: spec_layer_tie reads it safely. */
    int tie;
};

struct spec_optim {
    optim_kind kind;
    double lr;
    double momentum, dampening, weight_decay; /* sgd; weight_decay also adamw */
    bool nesterov;
    double beta1, beta2, eps; /* adamw */
    /* optimizer.schedule; the default (constant, no warmup) keeps lr fixed */
    sched_kind schedule;
    int64_t warmup_steps; /* default 0 */
    double min_lr;        /* default 0 */
    int64_t total_steps;  /* default 0: the job's number of optimizer steps */
};

struct spec_data {
    data_kind kind;
    int64_t samples;                         /* synthetic */
    uint64_t seed;                           /* synthetic data and shuffling; default 0 */
    char x[SPEC_PATH_MAX], y[SPEC_PATH_MAX]; /* npy, relative to data_dir; may hold {rank} */
    char path[SPEC_PATH_MAX];                /* csv, tokens */
    int64_t block_size;                      /* tokens: T */
    tokens_dtype dtype;                      /* tokens: default uint16 */
    int n_targets;                           /* csv: target column names */
    char targets[SPEC_MAX_TARGETS][128];
    bool shuffle;   /* default true */
    bool drop_last; /* default false */
};

/* `eval` (§2a): off unless `every_steps` > 0. */
struct spec_eval {
    struct spec_data data;
    int64_t every_steps;
    int64_t max_batches; /* per rank; 0 = the whole shard */
};

struct spec_ddp {
    double bucket_cap_mb;              /* default 25 */
    join_mode join;                    /* default auto */
    bool divide_by_initial_world_size; /* default true */
    comm_backend backend;              /* default: nccl for cuda, cpu for cpu */
    bool backend_set;                  /* backend was given explicitly */
    double timeout_s;                  /* default 300 */
    comm_hook_kind comm_hook;          /* default none */
};

/* `model` given as a preset (issue 30, schema/spec_preset.c): its fields as the user gave
 * them with the defaults applied, kept so that the spec prints back as the preset; layers[]
 * holds its expansion. name "" when `model` is a list. */
struct spec_preset {
    char name[16]; /* "gpt" */
    int64_t layers, dim, heads, vocab, block_size;
    double dropout; /* 0 (the only value the gpt preset takes today) */
    bool bias, tie; /* default true, true */
};

struct spec {
    char name[128];     /* default "" */
    int world_size;     /* default 1 */
    device_kind device; /* default cpu unless the caller says otherwise (spec_parse's opts) */
    bool device_set;
    precision_kind precision;  /* GEMM inputs on cuda: exact fp32 (default) or TF32 */
    struct spec_preset preset; /* `model` as a preset, or name "" */
    int n_layers;              /* every layer, nested ones included (see struct spec_layer) */
    struct spec_layer layers[SPEC_MAX_LAYERS];
    /* input_shape: one sample's shape without the batch dimension. Given, or for a model
     * of linear layers and activations alone [model[0].in] (input_shape_set false). */
    int input_rank;
    int64_t input_shape[SPEC_MAX_RANK];
    bool input_shape_set;
    loss_kind loss;
    struct spec_optim optim;
    struct spec_data data;
    int64_t batch_size; /* required */
    int64_t epochs;     /* exactly one of epochs / steps is > 0 */
    int64_t steps;
    int64_t grad_accum; /* default 1 */
    double grad_clip;   /* 0 = off; else clip_grad_norm_ to this */
    struct spec_eval eval;
    struct spec_ddp ddp;
    uint64_t init_seed;            /* default 0 */
    char init_from[SPEC_PATH_MAX]; /* "" unless init.from */
    int64_t checkpoint_every;      /* 0 = only at the end */
    int64_t checkpoint_keep_last;  /* newest ckpt-N folders kept, >= 1; default 3 */
    struct spec_watch keep_best;   /* checkpoint.keep_best: the best eval's checkpoint, kept apart */
    struct spec_watch early_stop;  /* early_stop: end the job when the metric stops improving */
    int64_t log_every;             /* default 1 */
    int max_restarts;              /* default 0 */
    /* The shared cluster (docs/scheduling.md): the scheduler starts the highest priority
     * first (0..100, SPEC_PRIORITY_DEFAULT); a preemptible job (the default; only an admin
     * submits one that is not) may be stopped at a checkpoint for a job of strictly higher
     * priority and resumed later. time_limit: seconds of running (over all its attempts)
     * before it is cancelled with state reason time_limit; 0 none. preempt_grace: seconds a
     * preempted job has to reach its checkpoint before it is stopped and restarted from its
     * last one; 0 the server's default (--preempt-grace). */
    int priority;
    bool preemptible;
    double time_limit;
    double preempt_grace;
    nonfinite_mode on_nonfinite; /* a NaN/inf loss: fail the job at that step (default) or train on */
    /* init.from_job: another job's id, 0 unless given; init.step with it: that job's
     * checkpoint, or -1 for its final model (else its newest checkpoint). */
    int64_t init_from_job;
    int64_t init_from_step;
    init_format_kind init_format; /* with init.from; default ddpd */
    /* tokenizer: GPT-2's vocab.json and merges.txt, relative to data_dir; "" without one */
    char tokenizer_vocab[SPEC_PATH_MAX];
    char tokenizer_merges[SPEC_PATH_MAX];
};

struct spec_parse_opts {
    device_kind default_device; /* what `device` means when absent: cuda if the server has GPUs */
    /* A job file (`ddpd run`'s): its `tags` and `notes` (schema/jobmeta.h) are checked and
     * set aside, so that the file `ddpd submit` takes runs as it is. */
    bool job_file;
};

/* Parses and validates `text` (`len` bytes, need not be NUL-terminated).
 * On success fills `out` with every default applied and returns DDPD_OK.
 * On error returns DDPD_EJSON (err->line/column set), DDPD_ETOOBIG or DDPD_ESPEC
 * (err->path is the JSON path, err->message says what was expected and what came).
 * `opts` may be NULL (default device cpu). */
ddpd_err spec_parse(const char *text, size_t len, const struct spec_parse_opts *opts, struct spec *out,
                    struct ddpd_error *err);

/* The same from a jansson object (borrowed). Used for the `spec` member of the worker's
 * stdin document. */
struct json_t;
ddpd_err spec_from_json(struct json_t *obj, const struct spec_parse_opts *opts, struct spec *out,
                        struct ddpd_error *err);

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

/* The most rows one micro-batch of a rank whose shard holds `shard_rows` can have:
 * min(batch_size, shard_rows), and at least 1 so that buffers are never empty. Every
 * buffer sized by a batch is sized by this, never by batch_size alone (a batch_size near
 * INT64_MAX on a small data set is valid and must not size anything). */
int64_t spec_batch_rows(const struct spec *s, int64_t shard_rows);

/* What one rank of a job holds in memory, in bytes, by tensor (schema/README.md
 * "Memory"). The one estimate the server (at submit, `ddpd run` before it starts
 * the ranks) and each rank (at start, with its real shard) judge a job by. Every figure
 * saturates at INT64_MAX instead of wrapping. */
struct spec_memory {
    int64_t rows;        /* the largest micro-batch: spec_batch_rows of the largest shard,
                            of the data or of eval.data, whichever is larger */
    int64_t params;      /* weights and biases, float32 */
    int64_t grads;       /* their gradients */
    int64_t optim;       /* momentum buffers (sgd with momentum) or AdamW's two moments */
    int64_t buckets;     /* DDP's flat gradient buckets and its zero bucket (world > 1) */
    int64_t activations; /* the model's tensors for `rows` rows: model_activation_bytes
                            (worker/model.c) exactly, + batchnorm's running statistics */
    int64_t batch;       /* the batch's inputs, targets, labels, loss gradient, the step's
                            losses and eval's host logits, host and device */
    int64_t data;        /* the rank's data set in memory (not memory-mapped tokens files
                            and .npy files over 64 MiB of values), its sample order, the
                            synthetic teacher, and a CSV file while it is read */
    int64_t eval;        /* the same for the rank's shard of eval.data */
    int64_t staging;     /* host copies of parameters and optimizer state for checkpoints
                            and init.from */
    int64_t device;      /* of the above, what lives on the GPU (cuda jobs; 0 on cpu) */
    int64_t host;        /* the rest: what --max-rank-memory limits */
    int64_t total;
};

/* What the estimate is given about the data sets: `rows` samples of the data, the whole
 * set (sharded over the ranks) or with `rank_file` one rank's own {rank} file; the same
 * for eval.data (eval_rows 0: no eval, or its rows are not known yet); `file_bytes` the
 * largest data file that is read whole while loading (CSV), else 0. */
struct spec_memory_in {
    int64_t rows;
    bool rank_file;
    int64_t file_bytes;
    int64_t eval_rows;
    bool eval_rank_file;
};

/* Fills `m` for the data sets `in` describes. */
void spec_memory_estimate(const struct spec *s, const struct spec_memory_in *in, struct spec_memory *m);

/* DDPD_OK when m->host <= limit (limit <= 0: no limit). Else `code` (DDPD_ESPEC at submit,
 * DDPD_EDEVICE in a rank) at the field the largest part comes from (`model`,
 * `batch_size`, `data.samples`, `data`, `eval.data.samples` or `eval.data`), with a message that gives the
 * need, its parts and the limit; `limit_name` says where the limit comes from ("--max-rank-memory"). */
ddpd_err spec_memory_check(const struct spec *s, const struct spec_memory *m, int64_t limit,
                           const char *limit_name, ddpd_err code, struct ddpd_error *err);

/* Parameter count of the model (weights + biases). */
int64_t spec_param_count(const struct spec *s);
/* Input width (model[0].in; embedding: its num) and output width (the last dimension of
 * the model's output: the last linear's out in a v1 MLP). */
int64_t spec_in_width(const struct spec *s);
int64_t spec_out_width(const struct spec *s);

/* What one sample is to the data readers (v2):
 * spec_sample_numel: elements of one input sample (the product of input_shape);
 * spec_input_ids: the model starts with `embedding`, so inputs are integer ids (int32 in
 *   a batch) in [0, spec_vocab) instead of floats;
 * spec_target_numel: per sample, the mse target's elements (the product of the model's
 *   output shape) or, for cross_entropy, the class ids (1, or T for [T,C] logits);
 * spec_classes: cross_entropy's C, the last dimension of the output. */
int64_t spec_sample_numel(const struct spec *s);
bool spec_input_ids(const struct spec *s);
int64_t spec_vocab(const struct spec *s);
int64_t spec_target_numel(const struct spec *s);
int64_t spec_classes(const struct spec *s);
/* The top-level layer that produces the model's output (the last one of the preorder
 * tree's top level); borrowed, valid while s is; NULL when the model has no layers. */
const struct spec_layer *spec_output_layer(const struct spec *s);

/* The embedding layer whose table layer i uses as its weight (a linear with `tie`), or -1:
 * layers[i].tie when it names an earlier embedding of the linear's shape ([out, in] =
 * [num, dim]), which the validator guarantees; -1 for anything else, so that a list
 * built in code and zeroed (tie 0) is never tied by accident. */
int spec_layer_tie(const struct spec *s, int i);

/* For a flat list of linear layers and activations built in code (tests, tools): fills
 * what the validator would (parent, end, key, the shapes, input_shape) from each layer's
 * in/out. */
void spec_flat_layers(struct spec *s);

/* Where layer i is in the spec's JSON, "model[2].layers[1]", into dst[cap]. */
void spec_layer_path(const struct spec *s, int i, char *dst, size_t cap);

const char *layer_kind_name(layer_kind k);
const char *loss_kind_name(loss_kind k);
const char *device_kind_name(device_kind k);
const char *watch_metric_name(watch_metric m); /* "eval_loss" */
extern const char *const init_format_names[];  /* init_format_kind order */

#endif
