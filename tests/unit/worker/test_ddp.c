/* test_ddp.c — the reducer: the bucket assignment rule (DDP.md §2.1, PyTorch's verified
 * outputs), W=1 DDP bitwise equal to plain training, W ranks on equal shards equal to
 * one process on the concatenated batch, bitwise-identical replicas after every synced
 * step (W = 2, 3, 4), no_sync accumulation, and a model mismatch reported on every rank. */
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>

#include "check.h"
#include "examples/spawn.h"
#include "worker/ddp.h"
#include "worker/model.h"
#include "worker/optim.h"
#include "worker/rng.h"

static void test_assign(void)
{
    /* DDP.md §2.1 (E3): float32 sizes [100,200,100,50] elements. */
    int64_t bytes[4] = {400, 800, 400, 200};
    int b[4];
    int64_t l400[1] = {400}, l1000[1] = {1000};
    CHECK_EQ_INT(ddp_assign_buckets(bytes, 4, l400, 1, b), 4);
    CHECK(b[0] == 0 && b[1] == 1 && b[2] == 2 && b[3] == 3);
    CHECK_EQ_INT(ddp_assign_buckets(bytes, 4, l1000, 1, b), 2);
    CHECK(b[0] == 0 && b[1] == 0 && b[2] == 1 && b[3] == 1);
    /* Two limits: the first bucket closes at 400, later ones at 1000. */
    int64_t l2[2] = {400, 1000};
    CHECK_EQ_INT(ddp_assign_buckets(bytes, 4, l2, 2, b), 3);
    CHECK(b[0] == 0 && b[1] == 1 && b[2] == 1 && b[3] == 2);
    CHECK_EQ_INT(ddp_assign_buckets(bytes, 0, l2, 2, b), 0);
}

/* The MLP every multi-rank case trains: 6 -> 16 -> relu -> 16 -> tanh -> 3. */
static void mlp_spec(struct spec *s)
{
    memset(s, 0, sizeof *s);
    s->n_layers = 5;
    s->layers[0] = (struct spec_layer){.kind = LAYER_LINEAR, .in = 6, .out = 16, .bias = true};
    s->layers[1] = (struct spec_layer){.kind = LAYER_RELU, .in = 16, .out = 16, .bias = false};
    s->layers[2] = (struct spec_layer){.kind = LAYER_LINEAR, .in = 16, .out = 16, .bias = true};
    s->layers[3] = (struct spec_layer){.kind = LAYER_TANH, .in = 16, .out = 16, .bias = false};
    s->layers[4] = (struct spec_layer){.kind = LAYER_LINEAR, .in = 16, .out = 3, .bias = true};
    spec_flat_layers(s);
    s->init_seed = 3;
}

enum { STEPS = 6, B = 3, IN = 6, OUT = 3, MAXW = 4 }; /* 12 rows: W = 1..4 divide them */

/* Global batch of step t: MAXW*B rows, the same in every process. */
static void global_batch(int t, float *x, float *y)
{
    struct rng g;
    rng_seed2(&g, 99, (uint64_t)t);
    for (int i = 0; i < MAXW * B * IN; i++)
        x[i] = (float)rng_normal(&g);
    for (int i = 0; i < MAXW * B * OUT; i++)
        y[i] = (float)rng_normal(&g);
}

/* Shared with the parent: every rank's parameters after every step, and a status. */
struct shared {
    int64_t numel;
    float params[MAXW][STEPS][512];
    int ok[MAXW];
    int buckets;
};
static struct shared *sh;
static int cur_world;
static bool with_no_sync;

static int train_rank(int rank, int world, struct comm *comm)
{
    struct spec s;
    mlp_spec(&s);
    s.init_seed = 3 + (uint64_t)rank; /* DDP must broadcast rank 0's weights */
    struct spec_optim sgd = {.kind = OPTIM_SGD, .lr = 0.05, .momentum = 0.9};
    struct dev dev = dev_cpu_new(1);
    struct model *m = model_new(dev, &s, B * MAXW);
    struct optim *o = optim_new(&sgd, m);
    struct ddpd_error err;
    struct ddp_opts opts = {.bucket_cap_mb = 0.0005, .divide_by_initial_world_size = true};
    struct ddp *d = ddp_new(m, comm, &opts, &err);
    if (!d) {
        fprintf(stderr, "rank %d: %s\n", rank, err.message);
        return 1;
    }
    float x[MAXW * B * IN], y[MAXW * B * OUT], dpred[MAXW * B * OUT], loss;
    int rows = MAXW * B / world; /* equal shards of the global batch */
    for (int t = 0; t < STEPS; t++) {
        global_batch(t, x, y);
        model_zero_grad(m);
        /* With no_sync: the shard in two halves, the first half not synced. */
        int parts = with_no_sync ? 2 : 1;
        for (int p = 0; p < parts; p++) {
            int r0 = rank * rows + p * rows / parts, n = rows / parts;
            bool prev = false;
            if (p + 1 < parts)
                prev = ddp_no_sync_enter(d);
            if (ddp_forward_begin(d, &err))
                goto fail;
            const float *out = model_forward(m, x + r0 * IN, n);
            dev.ops->mse(dev.ctx, out, y + r0 * OUT, n, OUT, dpred, &loss);
            model_backward(m, dpred, ddp_grad_ready, d);
            if (ddp_backward_end(d, &err))
                goto fail;
            if (p + 1 < parts)
                ddp_no_sync_exit(d, prev);
        }
        optim_step(o);
        float *dst = sh->params[rank][t];
        for (int i = 0, k = 0; i < model_param_count(m); i++) {
            struct param *pp = model_param(m, i);
            memcpy(dst + k, pp->data, (size_t)pp->numel * sizeof(float));
            k += (int)pp->numel;
        }
    }
    sh->numel = model_numel(m);
    sh->ok[rank] = 1;
    ddp_free(d);
    optim_free(o);
    model_free(m);
    dev_cpu_free(dev);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, err.message);
    return 1;
}

/* Single process on the whole global batch, optionally through DDP with W=1. */
static void train_single(float out[STEPS][512], bool use_ddp, bool no_sync)
{
    struct spec s;
    mlp_spec(&s);
    struct spec_optim sgd = {.kind = OPTIM_SGD, .lr = 0.05, .momentum = 0.9};
    struct dev dev = dev_cpu_new(1);
    struct model *m = model_new(dev, &s, B * MAXW);
    struct optim *o = optim_new(&sgd, m);
    struct comm *c = NULL;
    struct ddp *d = NULL;
    struct ddpd_error err;
    if (use_ddp) {
        struct comm_id id;
        memset(&id, 0, sizeof id);
        c = comm_new(&comm_cpu_ops, &id, 0, 1, 5.0, &err);
        struct ddp_opts opts = {.bucket_cap_mb = 0.0005, .divide_by_initial_world_size = true};
        d = c ? ddp_new(m, c, &opts, &err) : NULL;
        CHECK(d != NULL);
    }
    float x[MAXW * B * IN], y[MAXW * B * OUT], dpred[MAXW * B * OUT], loss;
    for (int t = 0; t < STEPS; t++) {
        global_batch(t, x, y);
        model_zero_grad(m);
        int parts = no_sync ? 2 : 1, n = MAXW * B / parts;
        for (int p = 0; p < parts; p++) {
            bool prev = false;
            if (d && p + 1 < parts)
                prev = ddp_no_sync_enter(d);
            if (d)
                ddp_forward_begin(d, &err);
            const float *o2 = model_forward(m, x + p * n * IN, n);
            dev.ops->mse(dev.ctx, o2, y + p * n * OUT, n, OUT, dpred, &loss);
            model_backward(m, dpred, d ? ddp_grad_ready : NULL, d);
            if (d) {
                CHECK_EQ_INT(ddp_backward_end(d, &err), DDPD_OK);
                if (p + 1 < parts)
                    ddp_no_sync_exit(d, prev);
            }
        }
        optim_step(o);
        for (int i = 0, k = 0; i < model_param_count(m); i++) {
            struct param *pp = model_param(m, i);
            memcpy(out[t] + k, pp->data, (size_t)pp->numel * sizeof(float));
            k += (int)pp->numel;
        }
    }
    ddp_free(d);
    comm_free(c);
    optim_free(o);
    model_free(m);
    dev_cpu_free(dev);
}

static void test_w1_bitwise(void)
{
    static float plain[STEPS][512], viaddp[STEPS][512];
    train_single(plain, false, false);
    train_single(viaddp, true, false);
    CHECK(memcmp(plain, viaddp, sizeof plain) == 0);
}

static void test_world(int world, bool no_sync)
{
    static float ref[STEPS][512];
    memset(sh, 0, sizeof *sh);
    cur_world = world;
    with_no_sync = no_sync;
    CHECK_EQ_INT(example_spawn(world, train_rank), 0);
    /* Same loss on the concatenated batch: the mean over W shards of means equals the
     * mean over the whole batch; the no_sync halves add up to twice the gradient. */
    train_single(ref, false, no_sync);
    int bad_replica = 0;
    double worst = 0;
    for (int t = 0; t < STEPS; t++) {
        for (int r = 1; r < world; r++)
            bad_replica += memcmp(sh->params[0][t], sh->params[r][t], (size_t)sh->numel * 4) != 0;
        for (int i = 0; i < sh->numel; i++) {
            double a = sh->params[0][t][i], b = ref[t][i];
            double rel = fabs(a - b) / (1e-5 + fabs(b));
            if (rel > worst)
                worst = rel;
        }
    }
    fprintf(stderr, "W=%d no_sync=%d: worst relative difference to one process %.3g\n", world, no_sync,
            worst);
    CHECK_EQ_INT(bad_replica, 0);
    CHECK(worst < 1e-4);
    for (int r = 0; r < world; r++)
        CHECK(sh->ok[r]);
}

static int mismatch_rank(int rank, int world, struct comm *comm)
{
    (void)world;
    struct spec s;
    mlp_spec(&s);
    if (rank == 1)
        s.layers[2].out = s.layers[4].in = 17; /* a different model on rank 1 */
    struct dev dev = dev_cpu_new(1);
    struct model *m = model_new(dev, &s, 4);
    struct ddpd_error err;
    struct ddp_opts opts = {.bucket_cap_mb = 25, .divide_by_initial_world_size = true};
    struct ddp *d = ddp_new(m, comm, &opts, &err);
    int rc = 1;
    if (!d && strstr(err.message, "parameter 2.weight is [16, 16] on rank 0 but [17, 16] on rank 1"))
        rc = 0;
    else
        fprintf(stderr, "rank %d: unexpected: %s\n", rank, d ? "no error" : err.message);
    ddp_free(d);
    model_free(m);
    dev_cpu_free(dev);
    return rc;
}

/* The plan PyTorch 1.13 arrives at after its rebuild (DDP.md §2.3, E3) for the MLP
 * 512 -> 1024 -> 1024 -> 256 -> 10: reverse registration order, first bucket closed on
 * crossing 1 MiB, then bucket_cap_mb. */
static void test_plan(double cap_mb, int nb, const int *expect_params, const int64_t *expect_bytes)
{
    struct spec s;
    memset(&s, 0, sizeof s);
    int64_t w[5] = {512, 1024, 1024, 256, 10};
    for (int i = 0; i < 4; i++) {
        s.layers[s.n_layers++] =
            (struct spec_layer){.kind = LAYER_LINEAR, .in = w[i], .out = w[i + 1], .bias = true};
        if (i < 3)
            s.layers[s.n_layers++] =
                (struct spec_layer){.kind = LAYER_RELU, .in = w[i + 1], .out = w[i + 1], .bias = false};
    }
    spec_flat_layers(&s);
    struct dev dev = dev_cpu_new(1);
    struct model *m = model_new(dev, &s, 1);
    struct comm_id id;
    memset(&id, 0, sizeof id);
    struct ddpd_error err;
    struct comm *c = comm_new(&comm_cpu_ops, &id, 0, 1, 5.0, &err);
    struct ddp_opts opts = {.bucket_cap_mb = cap_mb, .divide_by_initial_world_size = true};
    struct ddp *d = c ? ddp_new(m, c, &opts, &err) : NULL;
    CHECK(d != NULL);
    if (d) {
        CHECK_EQ_INT(ddp_bucket_count(d), nb);
        for (int b = 0, k = 0; b < nb && b < ddp_bucket_count(d); b++) {
            int idx[8];
            int64_t bytes;
            int n = ddp_bucket_params(d, b, idx, 8, &bytes);
            CHECK_EQ_INT(bytes, expect_bytes[b]);
            for (int i = 0; i < n; i++, k++)
                CHECK_EQ_INT(idx[i], expect_params[k]);
        }
    }
    ddp_free(d);
    comm_free(c);
    model_free(m);
    dev_cpu_free(dev);
}

int main(void)
{
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    test_assign();
    /* Parameter indices: 0.weight 0, 0.bias 1, 2.weight 2, 2.bias 3, 4.* 4-5, 6.* 6-7. */
    const int p25[] = {7, 6, 5, 4, 3, 2, 1, 0};
    const int64_t b25[] = {1059880, 6299648};
    test_plan(25, 2, p25, b25);
    const int64_t b4[] = {1059880, 4198400, 2101248};
    test_plan(4, 3, p25, b4);
    test_w1_bitwise();
    for (int w = 2; w <= 4; w++)
        test_world(w, false);
    test_world(2, true);
    CHECK_EQ_INT(example_spawn(2, mismatch_rank), 0);
    CHECK_DONE();
}
