/* test_memory.c — the memory estimate (schema/spec.c spec_memory_estimate) against what a
 * rank really allocates: model_activation_bytes of the model model_new_err builds for the
 * estimate's micro-batch rows, and train_batch_bytes, the batch buffers train.c's setup
 * allocates. For a GPT, a conv net with BatchNorm, an MLP and a model with dropout, at
 * several batch sizes, with and without eval: the estimate's activations + batch are at
 * least the real figure and at most 25% above it (they agree but for batchnorm's running
 * statistics, which the estimate counts with the activations). */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "worker/dev.h"
#include "worker/model.h"
#include "worker/train.h"

static struct dev D;

#define NPY  "\"data\":{\"type\":\"npy\",\"x\":\"x.npy\",\"y\":\"y.npy\"}"
#define EVAL ",\"eval\":{\"data\":{\"type\":\"npy\",\"x\":\"ex.npy\",\"y\":\"ey.npy\"},\"every_steps\":2}"

/* A small GPT: embedding, position, two residual blocks (layernorm + causal attention;
 * layernorm + MLP with gelu), the final layernorm and the head. */
#define GPT                                                                                                  \
    "{\"model\":[{\"type\":\"embedding\",\"num\":11,\"dim\":8},{\"type\":\"position\",\"max\":6,\"dim\":8}," \
    "{\"type\":\"residual\",\"layers\":[{\"type\":\"layernorm\",\"dim\":8},{\"type\":\"attention\",\"dim\":" \
    "8,"                                                                                                     \
    "\"heads\":2,\"causal\":true}]},{\"type\":\"residual\",\"layers\":[{\"type\":\"layernorm\",\"dim\":8},"  \
    "{\"type\":\"linear\",\"in\":8,\"out\":32},{\"type\":\"gelu\"},{\"type\":\"linear\",\"in\":32,\"out\":"  \
    "8}]},"                                                                                                  \
    "{\"type\":\"layernorm\",\"dim\":8},{\"type\":\"linear\",\"in\":8,\"out\":11}],\"input_shape\":[6],"     \
    "\"loss\":\"cross_entropy\",\"optimizer\":{\"type\":\"adamw\"}," NPY ",\"steps\":10"
/* A conv net: two conv2d + BatchNorm, max pooling, a linear head. */
#define CNN                                                                                                  \
    "{\"model\":[{\"type\":\"conv2d\",\"in\":1,\"out\":4,\"kernel\":3,\"padding\":1},{\"type\":"             \
    "\"batchnorm\","                                                                                         \
    "\"features\":4},{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"kernel\":2},{\"type\":\"conv2d\",\"in\":" \
    "4,"                                                                                                     \
    "\"out\":6,\"kernel\":3},{\"type\":\"batchnorm\",\"features\":6},{\"type\":\"relu\"},{\"type\":"         \
    "\"flatten\"},{\"type\":\"linear\",\"in\":24,\"out\":10}],\"input_shape\":[1,8,8],\"loss\":"             \
    "\"cross_entropy\",\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1,\"momentum\":0.9}," NPY ",\"steps\":10"
#define MLP                                                                                                  \
    "{\"model\":[{\"type\":\"linear\",\"in\":16,\"out\":32},{\"type\":\"relu\"},{\"type\":\"linear\","       \
    "\"in\":32,\"out\":3}],\"loss\":\"mse\",\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},\"data\":{\"type\":" \
    "\"synthetic\",\"samples\":64},\"steps\":10"
#define DROPOUT                                                                                              \
    "{\"model\":[{\"type\":\"linear\",\"in\":12,\"out\":40},{\"type\":\"tanh\"},{\"type\":\"dropout\","      \
    "\"p\":0.25},{\"type\":\"linear\",\"in\":40,\"out\":5}],\"input_shape\":[12],\"loss\":\"cross_"          \
    "entropy\","                                                                                             \
    "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1}," NPY ",\"grad_accum\":3,\"steps\":10"

/* The estimate for `rows` samples (and `eval_rows` of eval data) against the model and
 * batch buffers a rank builds for it. */
static void check_model(const char *name, const char *json, int64_t batch, int64_t rows, int64_t eval_rows)
{
    char text[4096];
    struct spec s;
    struct ddpd_error e;
    snprintf(text, sizeof text, "%s,\"batch_size\":%lld%s}", json, (long long)batch, eval_rows ? EVAL : "");
    if (spec_parse(text, strlen(text), NULL, &s, &e) != DDPD_OK) {
        fprintf(stderr, "%s: %s: %s\n", name, e.path, e.message);
        CHECK(0);
        return;
    }
    struct spec_memory m;
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = rows, .eval_rows = eval_rows}, &m);
    /* The rows setup sizes everything by: the larger of the shard's and eval shard's batch. */
    int64_t R = spec_batch_rows(&s, rows);
    if (eval_rows && spec_batch_rows(&s, eval_rows) > R)
        R = spec_batch_rows(&s, eval_rows);
    CHECK_EQ_INT(m.rows, R);
    struct model *mod = model_new_err(D, &s, R, &e);
    CHECK(mod != NULL);
    if (!mod)
        return;
    const int64_t nb = spec_batches(rows, s.batch_size, s.data.drop_last);
    const int64_t kmax = s.grad_accum < nb ? s.grad_accum : nb > 0 ? nb : 1;
    const int64_t act = model_activation_bytes(mod), bat = train_batch_bytes(&s, R, kmax, eval_rows > 0);
    int64_t running = 0; /* batchnorm's running mean and var, num_batches_tracked */
    for (int i = 0; i < s.n_layers; i++)
        if (s.layers[i].kind == LAYER_BATCHNORM)
            running += 2 * 4 * s.layers[i].dim + 8;
    const int64_t real = act + bat, est = m.activations + m.batch;
    fprintf(
        stderr,
        "%-8s batch %3lld rows %3lld eval %3lld: real %lld (activations %lld, batch %lld), estimate %lld\n",
        name, (long long)batch, (long long)R, (long long)eval_rows, (long long)real, (long long)act,
        (long long)bat, (long long)est);
    CHECK_EQ_INT(m.activations, act + running);
    CHECK_EQ_INT(m.batch, bat);
    CHECK(real <= est);
    CHECK(est * 4 <= real * 5);
    model_free(mod);
}

static void test_estimate_bounds_allocation(void)
{
    static const struct {
        const char *name, *json;
    } models[] = {{"gpt", GPT}, {"cnn", CNN}, {"mlp", MLP}, {"dropout", DROPOUT}};
    static const int64_t batches[] = {1, 3, 8, 64};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        for (size_t j = 0; j < sizeof batches / sizeof batches[0]; j++) {
            check_model(models[i].name, models[i].json, batches[j], 40, 0);
            if (strcmp(models[i].name, "mlp") != 0) /* eval: a larger eval shard sizes the batch */
                check_model(models[i].name, models[i].json, batches[j], 5, 50);
        }
}

/* Eval data counts: its samples (a small .npy is loaded) and its shard's order, and it is
 * blamed at eval.data when it is what does not fit. */
static void test_eval_counted(void)
{
    char text[4096];
    struct spec s;
    struct ddpd_error e;
    snprintf(text, sizeof text, "%s,\"batch_size\":4%s}", DROPOUT, EVAL);
    CHECK_EQ_INT(spec_parse(text, strlen(text), NULL, &s, &e), DDPD_OK);
    struct spec_memory with, without;
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 100}, &without);
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 100, .eval_rows = 1000}, &with);
    CHECK_EQ_INT(without.eval, 0);
    CHECK_EQ_INT(with.eval, 1000 * 4 * (12 + 1) + 1000 * 8); /* x, the class ids, the order */
    CHECK_EQ_INT(with.data, without.data);
    /* eval's batch buffers (its logits, its loss) are counted with or without its rows */
    CHECK_EQ_INT(with.host, without.host + with.eval);
    CHECK_EQ_INT(with.batch, without.batch);
    CHECK_EQ_INT(spec_memory_check(&s, &with, without.host, "limit", DDPD_ESPEC, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "eval.data");
    CHECK(strstr(e.message, "eval data 58.6 KiB") != NULL);
}

int main(void)
{
    D = dev_cpu_new(1);
    test_estimate_bounds_allocation();
    test_eval_counted();
    dev_cpu_free(D);
    CHECK_DONE();
}
