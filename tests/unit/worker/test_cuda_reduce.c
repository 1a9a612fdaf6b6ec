/* test_cuda_reduce.c — the CUDA backend's reductions at the sizes they are for (issue 34):
 * the losses and sums of squares past one block's and past the grid's reach against the
 * CPU backend, the same bits when run again, sumsq_group against one sumsq per tensor,
 * gradient clipping's fused norm (one group call, no per-tensor wait) against the
 * per-tensor path and the CPU, and, on the emulated device, the launches' grids (hundreds
 * of blocks where there was one). With DDPD_TEST_BIG_REDUCTIONS=1 also at GPT-2's sizes
 * ([8192, 50304] logits, GPT-2 small's 150 gradients: ~5 GB of memory and minutes on the
 * emulated device, so not in CI; scripts/gpu-check.sh runs them on a GPU).
 * Exits 77 (skipped) where no CUDA device is visible. */
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "cuda_bufs.h"
#include "worker/dev.h"
#include "worker/model.h"
#include "worker/optim.h"
#include "worker/rng.h"

/* ---- the losses and sums past one block and past the grid ---- */

/* Past one block (the old kernel's whole grid) and past the grid's 1,024 blocks (each
 * block then strides): the same tolerance, and the same bits when run again. */
static void test_mse_multiblock(void)
{
    const struct {
        int64_t m, n;
    } big[] = {{3, 700001}, {4099, 1025}, {1, 1}};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        const int64_t m = big[i].m, n = big[i].n, t = m * n;
        float *p = host_randn(t, 1), *y = host_randn(t, 1), *dp = malloc((size_t)t * sizeof(float));
        float loss, l2;
        float *gp = up(p, t), *gy = up(y, t), *gdp = G.ops->alloc(G.ctx, (size_t)t * sizeof(float));
        float *gl = G.ops->alloc(G.ctx, sizeof(float));
        C.ops->mse(C.ctx, p, y, m, n, dp, &loss);
        G.ops->mse(G.ctx, gp, gy, m, n, gdp, gl);
        float *hdp = down(gdp, t);
        G.ops->to_host(G.ctx, &l2, gl, sizeof l2);
        char what[80];
        snprintf(what, sizeof what, "mse loss %lldx%lld", (long long)m, (long long)n);
        close_to(what, &l2, &loss, 1, 0, 2e-7);
        close_to("mse grad (multi-block)", hdp, dp, t, 0, 0);
        float again;
        gdp = G.ops->alloc(G.ctx, (size_t)t * sizeof(float));
        G.ops->mse(G.ctx, gp, gy, m, n, gdp, gl);
        G.ops->to_host(G.ctx, &again, gl, sizeof again);
        CHECK(memcmp(&again, &l2, sizeof again) == 0);
        G.ops->free(G.ctx, gdp);
        G.ops->free(G.ctx, gl);
        G.ops->free(G.ctx, gp);
        G.ops->free(G.ctx, gy);
        free(p), free(y), free(dp), free(hdp);
    }
}

/* The loss of the same logits twice: the same bits (the grid depends on the sizes only). */
static void test_reductions_repeat(void)
{
    const int64_t m = 4100, n = 13;
    float *x = host_randn(m * n, 2);
    int32_t *lab = malloc((size_t)m * sizeof(int32_t));
    for (int64_t r = 0; r < m; r++)
        lab[r] = (int32_t)rng_below(&R, (uint64_t)n);
    float *gx = up(x, m * n), *gdx = G.ops->alloc(G.ctx, (size_t)(m * n) * sizeof(float));
    int32_t *glab = G.ops->alloc(G.ctx, (size_t)m * sizeof(int32_t));
    G.ops->to_device(G.ctx, glab, lab, (size_t)m * sizeof(int32_t));
    float *gl = G.ops->alloc(G.ctx, 2 * sizeof(float)), l[2];
    G.ops->cross_entropy(G.ctx, gx, glab, m, n, gdx, gl);
    G.ops->cross_entropy(G.ctx, gx, glab, m, n, gdx, gl + 1);
    G.ops->to_host(G.ctx, l, gl, sizeof l);
    CHECK(memcmp(&l[0], &l[1], sizeof l[0]) == 0);
    const double a = G.ops->sumsq(G.ctx, gx, m * n), b = G.ops->sumsq(G.ctx, gx, m * n);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    G.ops->free(G.ctx, gx);
    G.ops->free(G.ctx, gdx);
    G.ops->free(G.ctx, glab);
    G.ops->free(G.ctx, gl);
    free(x), free(lab);
}

/* ---- sums of squares of many tensors, and gradient clipping's fused norm (issue 34) ---- */

/* sumsq_group against one sumsq per tensor (the same bits) and the CPU's (rounding of a
 * double sum): 150 tensors (three launches of 64), empty and one-element ones, odd sizes,
 * one past a tensor's 1,024 blocks. */
static void test_sumsq_group(void)
{
    enum { NG = 150 };
    int64_t n[NG];
    float *h[NG];
    const float *d[NG];
    double got[NG];
    for (int t = 0; t < NG; t++) {
        n[t] = t == 0 ? 0 : t == 1 ? 1 : t == 77 ? 4194311 : t == 3 ? 4097 : 1 + (int64_t)rng_below(&R, 5000);
        h[t] = host_randn(n[t], 0.5);
        d[t] = up(h[t], n[t]);
    }
    G.ops->sumsq_group(G.ctx, NG, d, n, got);
    int bits = 0, near = 0;
    for (int t = 0; t < NG; t++) {
        const double one = G.ops->sumsq(G.ctx, d[t], n[t]), cpu = C.ops->sumsq(C.ctx, h[t], n[t]);
        bits += memcmp(&one, &got[t], sizeof one) == 0;
        near += fabs(got[t] - cpu) <= 1e-12 * cpu;
        if (!(fabs(got[t] - cpu) <= 1e-12 * cpu))
            fprintf(stderr, "sumsq_group tensor %d of %lld: cuda %.17g, cpu %.17g\n", t, (long long)n[t],
                    got[t], cpu);
        G.ops->free(G.ctx, (float *)d[t]);
        free(h[t]);
    }
    CHECK_EQ_INT(bits, NG);
    CHECK_EQ_INT(near, NG);
}

static struct dev_ops counting;
static int sumsq_calls, group_calls;
static double counting_sumsq(void *ctx, const float *x, int64_t n)
{
    sumsq_calls++;
    return G.ops->sumsq(ctx, x, n);
}
static void counting_group(void *ctx, int count, const float *const *x, const int64_t *n, double *out)
{
    group_calls++;
    G.ops->sumsq_group(ctx, count, x, n, out);
}

/* A model of 64 linear layers (128 tensors: two launches), the first 2049 -> 2048 (past
 * one tensor's 1,024 blocks), the rest small and odd; its gradients set to `grads` (one
 * host array per parameter) unless that is NULL. */
static struct model *clip_model(struct dev d, struct spec *s, float **grads)
{
    memset(s, 0, sizeof *s);
    s->n_layers = 64;
    int64_t in = 2049;
    for (int i = 0; i < 64; i++) {
        const int64_t out = i == 0 ? 2048 : 3 + (i * 7) % 29;
        s->layers[i] = (struct spec_layer){.kind = LAYER_LINEAR, .in = in, .out = out, .bias = true};
        in = out;
    }
    spec_flat_layers(s);
    struct model *m = model_new(d, s, 1);
    CHECK(m != NULL);
    for (int i = 0; m && grads && i < model_param_count(m); i++) {
        struct param *p = model_param(m, i);
        d.ops->to_device(d.ctx, p->grad, grads[i], (size_t)p->numel * sizeof(float));
    }
    return m;
}

/* optim_clip_grad_norm: one fused pass (sumsq_group called once, no per-tensor sumsq) whose
 * norm is the per-tensor path's to the bit and the CPU's within float rounding of the
 * per-tensor norms; the clipped gradients agree too. */
static void test_clip_fused(void)
{
    static struct spec sc, sg, sp;
    struct model *mc = clip_model(C, &sc, NULL); /* its gradients are drawn below */
    if (!mc)
        return;
    const int np = model_param_count(mc);
    float **grads = calloc((size_t)np, sizeof *grads);
    for (int i = 0; i < np; i++) {
        struct param *p = model_param(mc, i);
        grads[i] = host_randn(p->numel, 0.05);
        memcpy(p->grad, grads[i], (size_t)p->numel * sizeof(float));
    }
    counting = *G.ops;
    counting.sumsq = counting_sumsq;
    counting.sumsq_group = counting_group;
    struct model *mg = clip_model((struct dev){&counting, G.ctx}, &sg, grads);
    struct dev_ops plain = *G.ops;
    plain.sumsq_group = NULL; /* the per-tensor path on the same device */
    struct model *mp = clip_model((struct dev){&plain, G.ctx}, &sp, grads);
    struct spec_optim so = {.kind = OPTIM_SGD, .lr = 0.1};
    struct optim *oc = optim_new(&so, mc), *og = optim_new(&so, mg), *op = optim_new(&so, mp);
    sumsq_calls = group_calls = 0;
    const double nc = optim_clip_grad_norm(oc, 1.0), ng = optim_clip_grad_norm(og, 1.0);
    CHECK_EQ_INT(group_calls, 1);
    CHECK_EQ_INT(sumsq_calls, 0);
    const double np_ = optim_clip_grad_norm(op, 1.0);
    CHECK(memcmp(&ng, &np_, sizeof ng) == 0);
    CHECK_NEAR(ng, nc, 0, 1e-6);
    CHECK(ng > 1.0); /* it clipped */
    for (int i = 0; i < np; i++) {
        struct param *pc = model_param(mc, i), *pg = model_param(mg, i);
        float *h = malloc((size_t)pg->numel * sizeof(float));
        G.ops->to_host(G.ctx, h, pg->grad, (size_t)pg->numel * sizeof(float));
        char what[96];
        snprintf(what, sizeof what, "clipped gradient %s", pc->name);
        close_to(what, h, pc->grad, pc->numel, 1e-12, 2e-6);
        free(h);
        free(grads[i]);
    }
    free(grads);
    optim_free(oc), optim_free(og), optim_free(op);
    model_free(mc), model_free(mg), model_free(mp);
}

/* `test_cuda --shapes`, a fresh process with the emulator's launch log on: the losses and
 * sums of squares of GPT-2-loss-like sizes, whose launches the parent reads. */
static int shapes_main(void)
{
    struct ddpd_error err;
    struct dev g = dev_cuda_new(0, false, &err);
    if (!g.ops)
        return 1;
    const int64_t rows = 8192, cls = 3, n = 4194311;
    float *x = g.ops->alloc(g.ctx, (size_t)n * sizeof(float)),
          *y = g.ops->alloc(g.ctx, (size_t)n * sizeof(float));
    float *dx = g.ops->alloc(g.ctx, (size_t)n * sizeof(float)), *loss = g.ops->alloc(g.ctx, sizeof(float));
    int32_t *lab = g.ops->alloc(g.ctx, (size_t)rows * sizeof(int32_t));
    g.ops->cross_entropy(g.ctx, x, lab, rows, cls, dx, loss);
    g.ops->mse(g.ctx, x, y, 1, n, dx, loss);
    const float *t[70];
    int64_t tn[70];
    double out[70];
    for (int i = 0; i < 70; i++)
        t[i] = x, tn[i] = i == 0 ? n : 5;
    g.ops->sumsq_group(g.ctx, 70, t, tn, out);
    g.ops->synchronize(g.ctx);
    g.ops->free(g.ctx, x);
    g.ops->free(g.ctx, y);
    g.ops->free(g.ctx, dx);
    g.ops->free(g.ctx, loss);
    g.ops->free(g.ctx, lab);
    dev_cuda_free(g); /* LeakSanitizer's exit status would read as a failure */
    return 0;
}

/* The largest grid.x the launch log shows for `kernel`, and how many launches it had. */
static unsigned launch_grid(const char *log, const char *kernel, int *launches)
{
    char pat[96];
    snprintf(pat, sizeof pat, "launch %s grid (", kernel);
    unsigned most = 0;
    *launches = 0;
    for (const char *p = strstr(log, pat); p; p = strstr(p + 1, pat)) {
        const unsigned v = (unsigned)strtoul(p + strlen(pat), NULL, 10);
        most = v > most ? v : most;
        ++*launches;
    }
    return most;
}

/* The reductions spread over the GPU: a loss over 8,192 rows, an mse and a sum of squares
 * over 4 M elements each run on hundreds of blocks, where they once ran on one block of
 * 1,024 threads (one SM of a hundred); a group of 70 tensors is two launches of k_sumsq
 * (64 tensors each at most), not one per tensor. Only the emulator logs launches. */
static void test_launch_shapes(void)
{
    struct dev_cuda_info info;
    memset(&info, 0, sizeof info);
    if (!dev_cuda_device_info(0, &info) || !info.emulated) {
        fprintf(stderr, "launch shapes: a real GPU logs no launches, skipped\n");
        return;
    }
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        setenv("DDPD_CUDA_EMU_LAUNCH_LOG", "1", 1);
        execl("/proc/self/exe", "test_cuda_reduce", "--shapes", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    size_t cap = 1 << 16, len = 0;
    char *log = malloc(cap);
    ssize_t r;
    while ((r = read(fds[0], log + len, cap - 1 - len)) > 0)
        if ((len += (size_t)r) == cap - 1)
            log = realloc(log, cap *= 2);
    log[len] = '\0';
    close(fds[0]);
    int status = 0, ce, mse, sq;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    const unsigned gce = launch_grid(log, "k_cross_entropy", &ce), gmse = launch_grid(log, "k_mse", &mse);
    const unsigned gsq = launch_grid(log, "k_sumsq", &sq);
    fprintf(stderr, "launch shapes: k_cross_entropy %u blocks, k_mse %u, k_sumsq %u (%d launches)\n", gce,
            gmse, gsq, sq);
    CHECK(ce == 1 && gce >= 128);
    CHECK(mse == 1 && gmse >= 128);
    CHECK(gsq >= 128);
    CHECK_EQ_INT(sq, 2);
    free(log);
}

/* ---- GPT-2's sizes (DDPD_TEST_BIG_REDUCTIONS=1) ---- */

/* The sum of squares of x[n] in long double: the reference at sizes where the CPU's own
 * double sum drifts (412 M terms: ~5e-12 of the sum, one rounding per term), while the
 * GPU's, a few thousand terms per thread and then a tree, stays within ~2e-13. */
static double sumsq_ref(const float *x, int64_t n)
{
    long double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (long double)((double)x[i] * (double)x[i]); /* each square exact in double */
    return (double)s;
}

/* Cross entropy and the sum of squares of [m,n] logits, frugally: the host keeps the CPU's
 * gradient only while the GPU works, and the GPU's comes back a slice at a time. */
static void ce_big(int64_t m, int64_t n)
{
    fprintf(stderr, "big: cross_entropy and sumsq of [%lld, %lld]\n", (long long)m, (long long)n);
    float *x = host_randn(m * n, 2), *dx = malloc((size_t)(m * n) * sizeof(float));
    int32_t *lab = malloc((size_t)m * sizeof(int32_t));
    for (int64_t r = 0; r < m; r++)
        lab[r] = (int32_t)rng_below(&R, (uint64_t)n);
    float *gx = up(x, m * n);
    float loss, gloss;
    const double cs = sumsq_ref(x, m * n);
    C.ops->cross_entropy(C.ctx, x, lab, m, n, dx, &loss);
    free(x);
    int32_t *glab = G.ops->alloc(G.ctx, (size_t)m * sizeof(int32_t));
    G.ops->to_device(G.ctx, glab, lab, (size_t)m * sizeof(int32_t));
    float *gdx = G.ops->alloc(G.ctx, (size_t)(m * n) * sizeof(float)),
          *gl = G.ops->alloc(G.ctx, sizeof(float));
    G.ops->cross_entropy(G.ctx, gx, glab, m, n, gdx, gl);
    G.ops->to_host(G.ctx, &gloss, gl, sizeof gloss);
    const double gs = G.ops->sumsq(G.ctx, gx, m * n);
    G.ops->free(G.ctx, gx);
    close_to("cross_entropy loss (big)", &gloss, &loss, 1, 1e-6, 1e-6);
    CHECK_NEAR(gs, cs, 0, 1e-12);
    const int64_t rows = 256;
    float *slice = malloc((size_t)(rows * n) * sizeof(float));
    for (int64_t r = 0; r < m; r += rows) {
        const int64_t k = m - r < rows ? m - r : rows;
        G.ops->to_host(G.ctx, slice, gdx + r * n, (size_t)(k * n) * sizeof(float));
        close_to("cross_entropy grad (big)", slice, dx + r * n, k * n, 4e-7 / (double)m, 1e-6);
    }
    G.ops->free(G.ctx, gdx);
    G.ops->free(G.ctx, gl);
    G.ops->free(G.ctx, glab);
    free(slice), free(dx), free(lab);
}

/* The sums of squares of a GPT-2-small-shaped parameter set (150 tensors, 163 M floats with
 * the untied head) in one group, against the long double reference. */
static void clip_big(void)
{
    int64_t n[160];
    int k = 0;
    n[k++] = 50304 * 768, n[k++] = 1024 * 768;
    for (int b = 0; b < 12; b++) {
        const int64_t shapes[] = {768, 768, 768 * 2304, 2304, 768 * 768,  768,
                                  768, 768, 768 * 3072, 3072, 3072 * 768, 768};
        for (int i = 0; i < 12; i++)
            n[k++] = shapes[i];
    }
    n[k++] = 768, n[k++] = 768, n[k++] = 768 * 50304, n[k++] = 50304;
    fprintf(stderr, "big: sumsq_group of %d GPT-2-small tensors\n", k);
    float *h[160];
    const float *d[160];
    double got[160];
    for (int t = 0; t < k; t++) {
        h[t] = host_randn(n[t], 0.01);
        d[t] = up(h[t], n[t]);
    }
    G.ops->sumsq_group(G.ctx, k, d, n, got);
    for (int t = 0; t < k; t++) {
        CHECK_NEAR(got[t], sumsq_ref(h[t], n[t]), 0, 1e-12);
        G.ops->free(G.ctx, (float *)d[t]);
        free(h[t]);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--shapes"))
        return shapes_main();
    const char *big_env = getenv("DDPD_TEST_BIG_REDUCTIONS");
    const bool big = big_env && !strcmp(big_env, "1");
    if (big) /* the emulated device's 1 GiB does not hold [8192, 50304] twice */
        setenv("DDPD_CUDA_EMU_MEMORY_MIB", "6144", 0);
    if (!dev_cuda_available()) {
        fprintf(stderr, "no CUDA device visible: skipped\n");
        return SKIP;
    }
    struct ddpd_error err;
    ddpd_error_clear(&err);
    rng_seed(&R, 11);
    C = dev_cpu_new(1);
    G = dev_cuda_new(0, false, &err);
    if (!G.ops) {
        fprintf(stderr, "dev_cuda_new: %s\n", err.message);
        return 1;
    }
    fprintf(stderr, "GPU 0: %s\n", dev_cuda_name(G));
    test_mse_multiblock();
    test_reductions_repeat();
    test_sumsq_group();
    test_clip_fused();
    test_launch_shapes();
    if (big) {
        ce_big(8192, 50304);
        clip_big();
    }
    dev_cuda_free(G);
    dev_cpu_free(C);
    CHECK_DONE();
}
