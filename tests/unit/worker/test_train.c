/* test_train.c — one rank's training loop with sizes from the spec near their limits:
 * a batch_size far beyond the data set trains on the whole shard (the batch buffers were
 * sized by batch_size and wrapped to a few bytes: an ASan heap overflow), grad_accum and
 * epochs near INT64_MAX do not overflow the step arithmetic, and a rank whose memory need
 * is over its limit stops before allocating with the sizes, as DDPD_EDEVICE (exit 4); the
 * batches a batchnorm layer would refuse are found before training (train_check_batches). */
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "base/file.h"
#include "worker/train.h"

static char root[2048];

static void setup(void)
{
    const char *base = getenv("DDPD_TEST_TMP");
    if (!base || !base[0])
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(root, sizeof root, "%s/train.XXXXXX", base);
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        exit(1);
    }
}

/* linear in -> hidden (relu, linear hidden -> out), synthetic samples, sgd. */
static void spec_net(struct spec *s, int64_t in, int64_t hidden, int64_t out, loss_kind loss, int64_t samples)
{
    memset(s, 0, sizeof *s);
    s->world_size = 1;
    s->n_layers = 3;
    s->layers[0] = (struct spec_layer){.kind = LAYER_LINEAR, .in = in, .out = hidden, .bias = true};
    s->layers[1] = (struct spec_layer){.kind = LAYER_RELU, .in = hidden, .out = hidden, .bias = false};
    s->layers[2] = (struct spec_layer){.kind = LAYER_LINEAR, .in = hidden, .out = out, .bias = true};
    spec_flat_layers(s);
    s->loss = loss;
    s->optim = (struct spec_optim){.kind = OPTIM_SGD, .lr = 0.01};
    s->data.kind = DATA_SYNTHETIC;
    s->data.samples = samples;
    s->data.shuffle = true;
    s->batch_size = 2;
    s->epochs = 1;
    s->grad_accum = 1;
    s->log_every = 1;
    s->ddp.bucket_cap_mb = 25;
}

static void spec_small(struct spec *s, int64_t in, int64_t out, loss_kind loss, int64_t samples)
{
    spec_net(s, in, 3, out, loss, samples);
}

static ddpd_err run(const struct spec *s, int64_t max_rank_memory, struct ddpd_error *err)
{
    static int n;
    char out[4200];
    snprintf(out, sizeof out, "%s/out-%d", root, n++);
    struct train_config cfg = {.spec = s,
                               .rank = 0,
                               .world_size = 1,
                               .data_dir = root,
                               .out_dir = out,
                               .dev = dev_cpu_new(1),
                               .max_rank_memory = max_rank_memory};
    memset(err, 0, sizeof *err);
    ddpd_err rc = train_run(&cfg, err);
    dev_cpu_free(cfg.dev);
    if (rc)
        fprintf(stderr, "    train_run: %s %s: %s\n", ddpd_err_name(rc), err->path, err->message);
    return rc;
}

static void test_huge_batch(void)
{
    struct spec s;
    struct ddpd_error err;
    /* The report's case: 2^62 rows per batch on 100 samples, 1 input. */
    spec_small(&s, 1, 1, LOSS_MSE, 100);
    s.batch_size = 4611686018427387904LL;
    CHECK_EQ_INT(run(&s, 0, &err), DDPD_OK);
    /* Variants: every size up to INT64_MAX, cross_entropy (labels), several steps over
     * epochs of one batch, drop_last off, a wider input. */
    const int64_t huge[] = {INT64_MAX, INT64_MAX - 1, (INT64_C(1) << 62) + 1, 1 << 30};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        spec_small(&s, 5, 4, i % 2 ? LOSS_CROSS_ENTROPY : LOSS_MSE, 37);
        s.batch_size = huge[i];
        s.epochs = 0;
        s.steps = 3;
        CHECK_EQ_INT(run(&s, 0, &err), DDPD_OK);
    }
    /* grad_accum near INT64_MAX: one step per epoch of all the batches (the step count
     * per epoch overflowed: (batches + grad_accum - 1) / grad_accum). */
    spec_small(&s, 2, 1, LOSS_MSE, 9);
    s.grad_accum = INT64_MAX;
    s.epochs = 2;
    CHECK_EQ_INT(run(&s, 0, &err), DDPD_OK);
    s.grad_accum = INT64_MAX - 1;
    s.batch_size = INT64_MAX;
    CHECK_EQ_INT(run(&s, 0, &err), DDPD_OK);
}

static void test_memory_limit(void)
{
    struct spec s;
    struct ddpd_error err;
    /* A job over the rank's limit stops before training, naming the sizes and the limit. */
    spec_net(&s, 512, 512, 10, LOSS_MSE, 10);
    CHECK_EQ_INT(run(&s, 64 << 10, &err), DDPD_EDEVICE);
    CHECK_EQ_STR(err.path, "model");
    CHECK(strstr(err.message, "model: rank 0: the job needs about ") == err.message);
    CHECK(strstr(err.message, "limit of 64.0 KiB per rank (the server's --max-rank-memory)") != NULL);
    CHECK_EQ_INT(ddpd_err_exit(err.code), 4);
    /* The data is blamed when the data is what is large. */
    spec_small(&s, 2, 1, LOSS_MSE, 200000);
    CHECK_EQ_INT(run(&s, 1 << 20, &err), DDPD_EDEVICE);
    CHECK_EQ_STR(err.path, "data.samples");
    /* Within the limit it runs. */
    spec_small(&s, 2, 1, LOSS_MSE, 20);
    CHECK_EQ_INT(run(&s, 64 << 20, &err), DDPD_OK);
}

/* The caller opens the compute backend (worker/main.c); train_run only borrows it and
 * refuses a config without one rather than choosing a device itself. */
/* A spec of `model` on `in_shape` npy data, batches of `batch`, 2 epochs unless `more`
 * (further top-level keys) gives steps; "drop" for `more` is drop_last and nothing else. */
static void parse_bn(struct spec *s, const char *model, const char *in_shape, int64_t batch, const char *more)
{
    const bool drop = strcmp(more, "drop") == 0;
    char text[2048];
    snprintf(text, sizeof text,
             "{\"model\":%s,\"input_shape\":%s,\"loss\":\"cross_entropy\",\"optimizer\":{\"type\":\"sgd\","
             "\"lr\":0.1},\"data\":{\"type\":\"npy\",\"x\":\"x.npy\",\"y\":\"y.npy\",\"drop_last\":%s},"
             "\"batch_size\":%lld%s%s}",
             model, in_shape, drop ? "true" : "false", (long long)batch,
             strstr(more, "steps") ? "" : ",\"epochs\":2", drop ? "" : more);
    struct ddpd_error err = {0};
    ddpd_err rc = spec_parse(text, strlen(text), NULL, s, &err);
    if (rc)
        fprintf(stderr, "    spec_parse: %s: %s\n", err.path, err.message);
    CHECK_EQ_INT(rc, DDPD_OK);
}

/* Refused with `path` and every one of `words` in the message, or accepted (path NULL). */
static void bn_case(const struct spec *s, int64_t rows, int world, const char *path, const char *w1,
                    const char *w2)
{
    struct ddpd_error err = {0};
    ddpd_err rc = train_check_batches(s, rows, world, &err);
    if (!path) {
        if (rc)
            fprintf(stderr, "    %lld rows, %d ranks: %s\n", (long long)rows, world, err.message);
        CHECK_EQ_INT(rc, DDPD_OK);
        return;
    }
    CHECK_EQ_INT(rc, DDPD_ESPEC);
    CHECK_EQ_STR(err.path, path);
    CHECK(strstr(err.message, "Expected more than 1 value per channel when training") != NULL);
    if (!strstr(err.message, w1) || (w2 && !strstr(err.message, w2)))
        fprintf(stderr, "    %lld rows, %d ranks: %s\n", (long long)rows, world, err.message);
    CHECK(strstr(err.message, w1) != NULL);
    CHECK(!w2 || strstr(err.message, w2) != NULL);
}

/* issue 28: the batches a job trains, known before it starts, against PyTorch's rule for
 * BatchNorm in training (more than 1 value per channel: N, or N·H·W). */
static void test_batchnorm_batches(void)
{
    static const char bn1[] =
        "[{\"type\":\"linear\",\"in\":3,\"out\":4},{\"type\":\"batchnorm\",\"features\":4},"
        "{\"type\":\"linear\",\"in\":4,\"out\":2}]";
    struct spec s;
    parse_bn(&s, bn1, "[3]", 2, "");
    bn_case(&s, 6, 1, NULL, NULL, NULL);
    bn_case(&s, 5, 1, "model[1]",
            "rank 0's last batch of every epoch (batch 3 of 3, in step 3 of the epoch) "
            "holds 1 of its 5 samples",
            "input size is [1, 4]");
    bn_case(&s, 1, 1, "model[1]", "(batch 1 of 1, in step 1 of the epoch) holds 1 of its 1 samples", NULL);
    /* Sharded: 9 rows over 2 ranks are 5 and 4 (rank 0 has the batch of one, join); 7
     * rows are 4 and 3 (rank 1 has it). */
    bn_case(&s, 9, 2, "model[1]", "rank 0's last batch", "holds 1 of its 5 samples");
    bn_case(&s, 7, 2, "model[1]", "rank 1's last batch of every epoch (batch 2 of 2", "of its 3 samples");
    bn_case(&s, 8, 2, NULL, NULL, NULL);
    /* grad_accum puts the batch in an earlier step. */
    parse_bn(&s, bn1, "[3]", 2, ",\"grad_accum\":2");
    bn_case(&s, 5, 1, "model[1]", "(batch 3 of 3, in step 2 of the epoch)", NULL);
    /* A step budget that ends before the batch never trains it; one that reaches it does. */
    parse_bn(&s, bn1, "[3]", 2, ",\"steps\":2");
    bn_case(&s, 5, 1, NULL, NULL, NULL);
    parse_bn(&s, bn1, "[3]", 2, ",\"steps\":3");
    bn_case(&s, 5, 1, "model[1]", "batch 3 of 3", NULL);
    parse_bn(&s, bn1, "[3]", 2, ",\"steps\":1,\"grad_accum\":2");
    bn_case(&s, 5, 1, NULL, NULL, NULL);
    /* drop_last leaves it out; batch_size 1 is every batch, drop_last or not. */
    parse_bn(&s, bn1, "[3]", 2, "drop");
    bn_case(&s, 5, 1, NULL, NULL, NULL);
    bn_case(&s, 9, 2, NULL, NULL, NULL);
    parse_bn(&s, bn1, "[3]", 1, "drop");
    bn_case(&s, 5, 1, "model[1]", "batches of batch_size 1 give it input size [1, 4]", "set batch_size to 2");
    /* BatchNorm2d counts N·H·W: one 3×3 image is 9 values per channel, one 1×1 image 1. */
    parse_bn(&s,
             "[{\"type\":\"conv2d\",\"in\":2,\"out\":4,\"kernel\":3,\"padding\":1},{\"type\":\"batchnorm\","
             "\"features\":4},{\"type\":\"flatten\"},{\"type\":\"linear\",\"in\":36,\"out\":2}]",
             "[2,3,3]", 1, "");
    bn_case(&s, 5, 1, NULL, NULL, NULL);
    parse_bn(&s,
             "[{\"type\":\"conv2d\",\"in\":2,\"out\":4,\"kernel\":3},{\"type\":\"batchnorm\",\"features\":4},"
             "{\"type\":\"flatten\"},{\"type\":\"linear\",\"in\":4,\"out\":2}]",
             "[2,3,3]", 2, "");
    bn_case(&s, 6, 1, NULL, NULL, NULL);
    bn_case(&s, 5, 1, "model[1]", "input size is [1, 4, 1, 1]", NULL);
    /* A layer inside a residual is named by its JSON path. */
    parse_bn(&s,
             "[{\"type\":\"linear\",\"in\":3,\"out\":4},{\"type\":\"residual\",\"layers\":[{\"type\":"
             "\"relu\"},{\"type\":\"batchnorm\",\"features\":4}]},{\"type\":\"linear\",\"in\":4,\"out\":2}]",
             "[3]", 2, "");
    bn_case(&s, 5, 1, "model[1].layers[1]", "model[1].layers[1] (batchnorm): rank 0's", NULL);
}

static void test_needs_backend(void)
{
    struct spec s;
    struct ddpd_error err = {0};
    spec_small(&s, 2, 1, LOSS_MSE, 20);
    struct train_config cfg = {.spec = &s, .rank = 0, .world_size = 1, .data_dir = root, .out_dir = root};
    CHECK_EQ_INT(train_run(&cfg, &err), DDPD_EINTERNAL);
    CHECK_EQ_STR(err.path, "device");
    CHECK(strstr(err.message, "no compute backend") != NULL);
}

/* A SIGUSR1 (cfg.preempt) before the loop is remembered and acted on at the first step:
 * ckpt-1 and no final model, preempted_at 1; also when step 1 is a checkpoint step anyway
 * (one checkpoint). When the step is the job's last, the job just finishes (issue 32). */
static int64_t preempt_run(const struct spec *s, const char *name, struct ddpd_error *err)
{
    char out[4200];
    snprintf(out, sizeof out, "%s/%s", root, name);
    volatile sig_atomic_t flag = 1;
    int64_t at = -1;
    struct train_config cfg = {.spec = s,
                               .rank = 0,
                               .world_size = 1,
                               .data_dir = root,
                               .out_dir = out,
                               .dev = dev_cpu_new(1),
                               .preempt = &flag,
                               .preempted_at = &at};
    memset(err, 0, sizeof *err);
    CHECK_EQ_INT(train_run(&cfg, err), DDPD_OK);
    dev_cpu_free(cfg.dev);
    return at;
}

static bool exists(const char *name, const char *file)
{
    char p[4400];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s/%s", root, name, file);
    return stat(p, &st) == 0;
}

static void test_preempt(void)
{
    struct spec s;
    struct ddpd_error err;
    spec_small(&s, 2, 1, LOSS_MSE, 20); /* 10 steps */
    CHECK_EQ_INT(preempt_run(&s, "pre", &err), 1);
    CHECK(exists("pre", "ckpt-1"));
    CHECK(!exists("pre", "ckpt-2"));
    CHECK(!exists("pre", "model.safetensors"));
    s.checkpoint_every = 1;
    CHECK_EQ_INT(preempt_run(&s, "pre-ckpt", &err), 1);
    CHECK(exists("pre-ckpt", "ckpt-1"));
    CHECK(!exists("pre-ckpt", "model.safetensors"));
    spec_small(&s, 2, 1, LOSS_MSE, 2); /* 1 step: the last */
    CHECK_EQ_INT(preempt_run(&s, "last", &err), 0);
    CHECK(exists("last", "model.safetensors"));
    CHECK(!exists("last", "ckpt-1"));
}

/* A pause (stop_at, an asha rung) resumed at its own checkpoint: the rank was killed after
 * it wrote ckpt-S and before it ended, and the attempt restarts from it. It has paused:
 * no step runs, no final model, not a run to the end (faults.test_asha_restart saw a
 * trial run on to max_steps). */
static void test_pause_resumed_at_its_checkpoint(void)
{
    struct spec s;
    struct ddpd_error err = {0};
    spec_small(&s, 2, 1, LOSS_MSE, 20); /* 10 steps */
    char out[4200], ck[4300];
    snprintf(out, sizeof out, "%s/pause", root);
    struct train_config cfg = {.spec = &s,
                               .rank = 0,
                               .world_size = 1,
                               .data_dir = root,
                               .out_dir = out,
                               .dev = dev_cpu_new(1),
                               .stop_at = 4};
    CHECK_EQ_INT(train_run(&cfg, &err), DDPD_OK);
    CHECK(exists("pause", "ckpt-4"));
    CHECK(!exists("pause", "model.safetensors"));
    snprintf(ck, sizeof ck, "%s/ckpt-4", out);
    cfg.resume = ck;
    CHECK_EQ_INT(train_run(&cfg, &err), DDPD_OK);
    CHECK(!exists("pause", "model.safetensors"));
    CHECK(!exists("pause", "ckpt-5"));
    dev_cpu_free(cfg.dev);
}

int main(void)
{
    setup();
    test_huge_batch();
    test_memory_limit();
    test_needs_backend();
    test_batchnorm_batches();
    test_preempt();
    test_pause_resumed_at_its_checkpoint();
    base_remove_tree(root);
    CHECK_DONE();
}
