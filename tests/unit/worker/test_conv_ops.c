/* test_conv_ops.c — the CPU reference of the conv-net ops (dev/cpu_conv.c, dev.h's
 * struct dev_window and conv-net slots), checked two ways:
 *  - against naive loops written from their definitions: a conv2d through im2col equals
 *    the direct sum, col2im is im2col's adjoint, the pools' backwards are the gradients of
 *    their forwards, batchnorm [B,C] equals [B,C,1,1], maxpool's fast paths give the bits
 *    of window.h's scan on ties, NaN and infinities;
 *  - against PyTorch 1.13 itself (/usr/bin/python3 at test time: F.unfold, F.fold,
 *    max_pool2d with indices, avg_pool2d, native_batch_norm, autograd), on odd shapes
 *    with stride and padding. The tolerance of each comparison is given where it is made.
 * Exits 77 (skipped) only for the PyTorch part, when python3 with torch is missing. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "base/file.h"
#include "worker/dev.h"
#include "worker/dev/window.h"
#include "worker/rng.h"

#define SKIP 77

static struct dev C;
static struct rng R;
static char tmpdir[4096];

static float *randn(int64_t n, double scale)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(scale * rng_normal(&R));
    return x;
}

static float *zeros(int64_t n)
{
    return calloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

static int64_t osz(int64_t in, int64_t k, int64_t s, int64_t p)
{
    return (in + 2 * p - k) / s + 1;
}

/* |got - want| <= atol + rtol*|want| everywhere, NaN matching NaN; reports the worst. */
static void close_to(const char *what, const float *got, const float *want, int64_t n, double atol,
                     double rtol)
{
    int64_t bad = -1;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(want[i])) {
            if (!(isnan(got[i]) && isnan(want[i])) && bad < 0)
                bad = i, worst = INFINITY;
            continue;
        }
        const double lim = atol + rtol * fabs((double)want[i]);
        const double e = fabs((double)got[i] - want[i]);
        if (e > lim && (lim == 0 ? INFINITY : e / lim) > worst)
            bad = i, worst = lim == 0 ? INFINITY : e / lim;
    }
    check__count++;
    if (bad >= 0)
        CHECK__FAIL("%s: entry %lld of %lld: %.9g vs %.9g", what, (long long)bad, (long long)n, got[bad],
                    want[bad]);
}

/* The windows tried: 1x1, stride > kernel (gaps), overlapping windows with padding,
 * non-square everything. */
struct wcase {
    int64_t b, c, h, w;
    struct dev_window win;
};
static const struct wcase WCASES[] = {
    {1, 1, 1, 1, {1, 1, 1, 1, 0, 0}}, {2, 3, 5, 4, {2, 2, 2, 2, 0, 0}}, {1, 2, 7, 6, {3, 2, 2, 1, 1, 1}},
    {3, 1, 6, 9, {3, 3, 1, 2, 1, 0}}, {2, 2, 8, 5, {2, 3, 3, 1, 0, 1}}, {1, 3, 4, 4, {1, 1, 2, 2, 0, 0}},
    {2, 1, 9, 7, {5, 3, 2, 2, 2, 1}},
};
#define NW (int)(sizeof WCASES / sizeof WCASES[0])

/* ---- naive checks ---- */

/* conv2d = im2col + matrix product equals the direct sum over channels and window. */
static void test_im2col_conv(void)
{
    for (int t = 0; t < NW; t++) {
        const struct wcase *k = &WCASES[t];
        const struct dev_window *win = &k->win;
        const int64_t oh = osz(k->h, win->kh, win->sh, win->ph), ow = osz(k->w, win->kw, win->sw, win->pw);
        const int64_t o = 3, kk = k->c * win->kh * win->kw, l = oh * ow;
        float *x = randn(k->b * k->c * k->h * k->w, 1), *wt = randn(o * kk, 1);
        float *col = randn(k->b * kk * l, 1); /* overwritten entirely */
        C.ops->im2col(C.ctx, col, x, k->b, k->c, k->h, k->w, win);
        int bad = 0;
        for (int64_t i = 0; i < k->b; i++)
            for (int64_t oc = 0; oc < o; oc++)
                for (int64_t p = 0; p < l; p++) {
                    double viacol = 0, direct = 0;
                    for (int64_t r = 0; r < kk; r++)
                        viacol += (double)wt[oc * kk + r] * col[(i * kk + r) * l + p];
                    const int64_t oy = p / ow, ox = p % ow;
                    for (int64_t ci = 0; ci < k->c; ci++)
                        for (int64_t a = 0; a < win->kh; a++)
                            for (int64_t bb = 0; bb < win->kw; bb++) {
                                const int64_t iy = oy * win->sh - win->ph + a,
                                              ix = ox * win->sw - win->pw + bb;
                                if (iy >= 0 && iy < k->h && ix >= 0 && ix < k->w)
                                    direct += (double)wt[oc * kk + (ci * win->kh + a) * win->kw + bb] *
                                              x[((i * k->c + ci) * k->h + iy) * k->w + ix];
                            }
                    /* The same products in the same order, in double: equal. */
                    bad += viacol != direct;
                }
        CHECK_EQ_INT(bad, 0);
        free(x), free(wt), free(col);
    }
}

/* <im2col(x), g> = <x, col2im(g)>, and col2im adds onto what dx holds. */
static void test_col2im_adjoint(void)
{
    for (int t = 0; t < NW; t++) {
        const struct wcase *k = &WCASES[t];
        const struct dev_window *win = &k->win;
        const int64_t nx = k->b * k->c * k->h * k->w;
        const int64_t ncol = k->b * k->c * win->kh * win->kw * osz(k->h, win->kh, win->sh, win->ph) *
                             osz(k->w, win->kw, win->sw, win->pw);
        float *x = randn(nx, 1), *g = randn(ncol, 1), *col = zeros(ncol), *dx = randn(nx, 1);
        float *dx0 = malloc((size_t)nx * sizeof(float));
        memcpy(dx0, dx, (size_t)nx * sizeof(float));
        C.ops->im2col(C.ctx, col, x, k->b, k->c, k->h, k->w, win);
        C.ops->col2im(C.ctx, dx, g, k->b, k->c, k->h, k->w, win);
        double lhs = 0, rhs = 0;
        for (int64_t i = 0; i < ncol; i++)
            lhs += (double)col[i] * g[i];
        for (int64_t i = 0; i < nx; i++)
            rhs += (double)x[i] * ((double)dx[i] - dx0[i]);
        /* dx - dx0 rounds each entry once more than the sum it holds: float accuracy. */
        CHECK_NEAR(lhs, rhs, 1e-4, 1e-5);
        free(x), free(g), free(col), free(dx), free(dx0);
    }
}

/* The pools' backwards against finite differences would be loose; instead against the
 * definition: maxpool's dx routes each dy to the argmax the forward reported, which must
 * hold the window's maximum; avgpool's dx spreads dy/divisor over the window. */
static void test_pools_naive(void)
{
    for (int t = 0; t < NW; t++) {
        const struct wcase *k = &WCASES[t];
        const struct dev_window *win = &k->win;
        if (win->ph * 2 > win->kh || win->pw * 2 > win->kw)
            continue;
        const int64_t planes = k->b * k->c, oh = osz(k->h, win->kh, win->sh, win->ph);
        const int64_t ow = osz(k->w, win->kw, win->sw, win->pw), nx = planes * k->h * k->w,
                      ny = planes * oh * ow;
        float *x = randn(nx, 1), *y = zeros(ny), *dy = randn(ny, 1), *dx = randn(nx, 1);
        float *want = zeros(nx), *ya = zeros(ny);
        int32_t *idx = calloc((size_t)ny, sizeof(int32_t));
        x[0] = x[nx - 1]; /* a tie somewhere */
        C.ops->maxpool2d_forward(C.ctx, y, idx, x, planes, k->h, k->w, win);
        C.ops->maxpool2d_backward(C.ctx, dx, dy, idx, planes, k->h, k->w, win);
        C.ops->avgpool2d_forward(C.ctx, ya, x, planes, k->h, k->w, win);
        int bad_max = 0, bad_avg = 0;
        for (int64_t p = 0; p < planes; p++)
            for (int64_t oy = 0; oy < oh; oy++)
                for (int64_t ox = 0; ox < ow; ox++) {
                    const int64_t o = (p * oh + oy) * ow + ox;
                    float m = -INFINITY;
                    int64_t first = -1;
                    double sum = 0;
                    for (int64_t a = 0; a < win->kh; a++)
                        for (int64_t bb = 0; bb < win->kw; bb++) {
                            const int64_t iy = oy * win->sh - win->ph + a, ix = ox * win->sw - win->pw + bb;
                            if (iy < 0 || iy >= k->h || ix < 0 || ix >= k->w)
                                continue;
                            const float v = x[(p * k->h + iy) * k->w + ix];
                            if (v > m)
                                m = v, first = iy * k->w + ix;
                            sum += v;
                        }
                    bad_max += y[o] != m || idx[o] != first;
                    want[p * k->h * k->w + idx[o]] += dy[o];
                    /* Every window here lies inside the padded image: divisor kh*kw. */
                    bad_avg += fabs(ya[o] - sum / (double)(win->kh * win->kw)) > 1e-6;
                }
        CHECK_EQ_INT(bad_max, 0);
        CHECK_EQ_INT(bad_avg, 0);
        /* The same additions in the same order (output order onto 0): exact. */
        close_to("maxpool2d_backward vs the argmax routing", dx, want, nx, 0, 0);
        /* avgpool backward is the transpose of the forward: <avg(x), dy> = <x, avg'(dy)>. */
        C.ops->avgpool2d_backward(C.ctx, dx, dy, planes, k->h, k->w, win);
        double lhs = 0, rhs = 0;
        for (int64_t i = 0; i < ny; i++)
            lhs += (double)ya[i] * dy[i];
        for (int64_t i = 0; i < nx; i++)
            rhs += (double)x[i] * dx[i];
        CHECK_NEAR(lhs, rhs, 1e-4, 1e-5);
        free(x), free(y), free(dy), free(dx), free(want), free(ya), free(idx);
    }
}

/* BatchNorm against its definition in double, and [B,C] = [B,C,1,1]. */
/* The CPU's unpadded maxpool paths (a general one and the 2x2 stride-2 one, issue 29)
 * give the bits and indices of dev_window_max's scan, which the CUDA kernel runs too: on
 * data full of ties, NaN and infinities, a value replacing the maximum when greater or
 * NaN (so the last NaN of a window, else its first maximum). */
static void test_maxpool_scan_rule(void)
{
    static const struct dev_window wins[] = {{2, 2, 2, 2, 0, 0}, {3, 3, 2, 2, 0, 0}, {3, 2, 1, 2, 0, 0},
                                             {2, 2, 1, 1, 0, 0}, {2, 2, 2, 2, 1, 1}, {1, 1, 1, 1, 0, 0}};
    static const float vals[] = {NAN, -INFINITY, INFINITY, 0.0f, 1.0f, 1.0f, -2.0f, 0.5f};
    for (size_t t = 0; t < sizeof wins / sizeof wins[0]; t++) {
        const struct dev_window *win = &wins[t];
        const int64_t planes = 5, h = 7, w = 9, oh = dev_window_out(h, win->kh, win->sh, win->ph),
                      ow = dev_window_out(w, win->kw, win->sw, win->pw), nx = planes * h * w,
                      ny = planes * oh * ow;
        float *x = zeros(nx), *y = zeros(ny);
        int32_t *idx = calloc((size_t)ny, sizeof(int32_t));
        for (int64_t i = 0; i < nx; i++)
            x[i] = vals[rng_below(&R, sizeof vals / sizeof vals[0])];
        C.ops->maxpool2d_forward(C.ctx, y, idx, x, planes, h, w, win);
        int bad = 0;
        for (int64_t p = 0; p < planes; p++)
            for (int64_t oy = 0; oy < oh; oy++)
                for (int64_t ox = 0; ox < ow; ox++) {
                    int64_t best;
                    const float m = dev_window_max(win, x + p * h * w, oy, ox, h, w, &best);
                    const int64_t o = (p * oh + oy) * ow + ox;
                    bad += memcmp(&m, &y[o], sizeof m) != 0 || idx[o] != best;
                }
        CHECK_EQ_INT(bad, 0);
        free(x), free(y), free(idx);
    }
}

static void test_batchnorm_naive(void)
{
    const int64_t shapes[][3] = {{2, 1, 1}, {4, 3, 1}, {2, 3, 20}, {5, 2, 7}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        const int64_t n = shapes[t][0], c = shapes[t][1], s = shapes[t][2], tot = n * c * s, m = n * s;
        float *x = randn(tot, 2), *w = randn(c, 1), *b = randn(c, 1), *rm = randn(c, 1), *rv = randn(c, 1);
        for (int64_t i = 0; i < c; i++)
            rv[i] = 0.5f + fabsf(rv[i]);
        float *rm0 = malloc((size_t)c * sizeof(float)), *rv0 = malloc((size_t)c * sizeof(float));
        memcpy(rm0, rm, (size_t)c * sizeof(float));
        memcpy(rv0, rv, (size_t)c * sizeof(float));
        float *y = zeros(tot), *mean = zeros(c), *invstd = zeros(c), *dy = randn(tot, 1), *dx = zeros(tot);
        float *dw = zeros(c), *db = zeros(c), *ye = zeros(tot);
        C.ops->batchnorm_forward_train(C.ctx, y, mean, invstd, rm, rv, x, w, b, n, c, s, 1e-5, 0.1);
        C.ops->batchnorm_backward(C.ctx, dx, dw, db, dy, x, mean, invstd, w, n, c, s);
        int bad = 0;
        for (int64_t ch = 0; ch < c; ch++) {
            double mu = 0, var = 0, sdy = 0, dot = 0;
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < s; j++)
                    mu += x[(i * c + ch) * s + j];
            mu /= (double)m;
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < s; j++) {
                    const int64_t e = (i * c + ch) * s + j;
                    var += (x[e] - mu) * (x[e] - mu);
                    sdy += dy[e];
                    dot += (x[e] - mu) * dy[e];
                }
            var /= (double)m;
            const double is = 1 / sqrt(var + 1e-5);
            bad += fabs(mean[ch] - mu) > 1e-6 * (1 + fabs(mu)) || fabs(invstd[ch] - is) > 1e-6 * is;
            bad += fabs(rm[ch] - (0.9 * rm0[ch] + 0.1 * mu)) > 1e-6 * (1 + fabs(rm[ch]));
            bad += fabs(rv[ch] - (0.9 * rv0[ch] + 0.1 * var * (double)m / (double)(m - 1))) >
                   1e-6 * (1 + rv[ch]);
            bad += fabs(dw[ch] - dot * is) > 1e-5 * (1 + fabs(dot * is)) ||
                   fabs(db[ch] - sdy) > 1e-5 * (1 + fabs(sdy));
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < s; j++) {
                    const int64_t e = (i * c + ch) * s + j;
                    const double xh = (x[e] - mu) * is;
                    bad += fabs(y[e] - (xh * w[ch] + b[ch])) > 1e-5 * (1 + fabs(xh * w[ch] + b[ch]));
                    /* dx = w * is * (dy - mean(dy) - xh * mean(dy * xh)) */
                    const double want = w[ch] * is * (dy[e] - sdy / (double)m - xh * dot * is / (double)m);
                    bad += fabs(dx[e] - want) > 1e-5 * (1 + fabs(want));
                }
        }
        CHECK_EQ_INT(bad, 0);
        /* Eval: running statistics, nothing updated. */
        memcpy(rm0, rm, (size_t)c * sizeof(float));
        C.ops->batchnorm_forward_eval(C.ctx, ye, x, w, b, rm, rv, n, c, s, 1e-5);
        bad = 0;
        for (int64_t e = 0; e < tot; e++) {
            const int64_t ch = (e / s) % c;
            const double want = (x[e] - rm[ch]) / sqrt(rv[ch] + 1e-5) * w[ch] + b[ch];
            bad += fabs(ye[e] - want) > 1e-5 * (1 + fabs(want));
        }
        CHECK_EQ_INT(bad, 0);
        CHECK(memcmp(rm0, rm, (size_t)c * sizeof(float)) == 0);
        /* affine false (w, b NULL) and no running stats: y = xhat. */
        if (s == 1) {
            float *y2 = zeros(tot), *m2 = zeros(c), *i2 = zeros(c);
            C.ops->batchnorm_forward_train(C.ctx, y2, m2, i2, NULL, NULL, x, NULL, NULL, n, c, 1, 1e-5, 0.1);
            bad = 0;
            for (int64_t e = 0; e < tot; e++)
                bad += fabsf(y2[e] - (x[e] - m2[e % c]) * i2[e % c]) > 1e-5f * (1 + fabsf(y2[e]));
            CHECK_EQ_INT(bad, 0);
            free(y2), free(m2), free(i2);
        }
        free(x), free(w), free(b), free(rm), free(rv), free(rm0), free(rv0), free(y), free(mean),
            free(invstd);
        free(dy), free(dx), free(dw), free(db), free(ye);
    }
}

/* ---- PyTorch 1.13 ----
 * The test writes cases.txt (one case per line: its kind, sizes, then its inputs as
 * %.9g numbers, which read back as the same floats), conv_torch.py answers one line of numbers
 * per case, which are compared with the CPU ops on the same inputs. */

static const char TORCH_PY[] =
    "import sys, torch\n"
    "import torch.nn.functional as F\n"
    "torch.set_num_threads(1)\n"
    "def t(v, shape):\n"
    "    return torch.tensor([float(z) for z in v], dtype=torch.float32).reshape(shape)\n"
    "def out(*ts):\n"
    "    print(' '.join('%.9g' % z for x in ts for z in x.reshape(-1).tolist()))\n"
    "for line in open(sys.argv[1]):\n"
    "    f = line.split()\n"
    "    kind, d = f[0], [int(z) for z in f[1:11]]\n"
    "    b, c, h, w, kh, kw, sh, sw, ph, pw = d\n"
    "    v = f[11:]\n"
    "    nx = b * c * h * w\n"
    "    x = t(v[:nx], (b, c, h, w)).requires_grad_(True)\n"
    "    rest = v[nx:]\n"
    "    win = dict(stride=(sh, sw), padding=(ph, pw))\n"
    "    if kind == 'unfold':\n"
    "        col = F.unfold(x, (kh, kw), **win)\n"
    "        g = t(rest, col.shape)\n"
    "        out(col.detach(), F.fold(g, (h, w), (kh, kw), **win))\n"
    "    elif kind == 'maxpool':\n"
    "        y, i = F.max_pool2d(x, (kh, kw), return_indices=True, **win)\n"
    "        y.backward(t(rest, y.shape))\n"
    "        out(y.detach(), i.float(), x.grad)\n"
    "    elif kind == 'avgpool':\n"
    "        y = F.avg_pool2d(x, (kh, kw), count_include_pad=True, **win)\n"
    "        y.backward(t(rest, y.shape))\n"
    "        out(y.detach(), x.grad)\n"
    "    elif kind == 'batchnorm':\n"
    "        wt = t(rest[:c], (c,)).requires_grad_(True)\n"
    "        bi = t(rest[c:2 * c], (c,)).requires_grad_(True)\n"
    "        rm, rv = t(rest[2 * c:3 * c], (c,)), t(rest[3 * c:4 * c], (c,))\n"
    "        dy = t(rest[4 * c:], x.shape)\n"
    "        xin = x if h * w > 1 else x.reshape(b, c)\n"
    "        y, sm, si = torch.native_batch_norm(xin, wt, bi, rm, rv, True, 0.1, 1e-5)\n"
    "        y.backward(dy.reshape(y.shape))\n"
    "        ye = F.batch_norm(xin.detach(), rm, rv, wt.detach(), bi.detach(), False, 0.1, 1e-5)\n"
    "        out(y.detach(), sm, si, rm, rv, x.grad, wt.grad, bi.grad, ye)\n";

static void put(FILE *fp, const float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        fprintf(fp, " %.9g", (double)v[i]);
}

/* One case's inputs, the CPU's outputs (concatenated as PyTorch prints them), and the
 * tolerance of each output part. */
struct tcase {
    char line_kind[16];
    struct wcase k;
    float *in[6];
    int64_t in_n[6];
    float *out;
    int64_t out_n;
    int parts;
    int64_t part_n[9];
    double atol[9], rtol[9];
    const char *part_name[9];
};

static void part(struct tcase *tc, const char *name, int64_t n, double atol, double rtol)
{
    tc->part_name[tc->parts] = name;
    tc->part_n[tc->parts] = n;
    tc->atol[tc->parts] = atol;
    tc->rtol[tc->parts] = rtol;
    tc->parts++;
}

static void make_case(struct tcase *tc, const char *kind, const struct wcase *k)
{
    memset(tc, 0, sizeof *tc);
    snprintf(tc->line_kind, sizeof tc->line_kind, "%s", kind);
    tc->k = *k;
    const struct dev_window *win = &k->win;
    const int64_t planes = k->b * k->c, nx = planes * k->h * k->w;
    const int64_t oh = osz(k->h, win->kh, win->sh, win->ph), ow = osz(k->w, win->kw, win->sw, win->pw);
    const int64_t ny = planes * oh * ow, ncol = ny * win->kh * win->kw;
    float *x = randn(nx, 1);
    tc->in[0] = x, tc->in_n[0] = nx;
    if (!strcmp(kind, "unfold")) {
        float *g = randn(ncol, 1);
        tc->in[1] = g, tc->in_n[1] = ncol;
        tc->out_n = ncol + nx;
        tc->out = zeros(tc->out_n);
        C.ops->im2col(C.ctx, tc->out, x, k->b, k->c, k->h, k->w, win);
        C.ops->col2im(C.ctx, tc->out + ncol, g, k->b, k->c, k->h, k->w, win);
        /* unfold is a copy: exact. fold adds in (ki, kj) order onto 0, as PyTorch's
         * col2im does: exact. */
        part(tc, "im2col vs F.unfold", ncol, 0, 0);
        part(tc, "col2im vs F.fold", nx, 0, 0);
    } else if (!strcmp(kind, "maxpool")) {
        x[nx / 2] = x[0]; /* a possible tie */
        float *dy = randn(ny, 1);
        tc->in[1] = dy, tc->in_n[1] = ny;
        tc->out_n = 2 * ny + nx;
        tc->out = zeros(tc->out_n);
        int32_t *idx = calloc((size_t)ny, sizeof(int32_t));
        C.ops->maxpool2d_forward(C.ctx, tc->out, idx, x, planes, k->h, k->w, win);
        for (int64_t i = 0; i < ny; i++)
            tc->out[ny + i] = (float)idx[i];
        C.ops->maxpool2d_backward(C.ctx, tc->out + 2 * ny, dy, idx, planes, k->h, k->w, win);
        free(idx);
        /* Selections and a scatter-add in PyTorch's order: exact. */
        part(tc, "maxpool2d y", ny, 0, 0);
        part(tc, "maxpool2d indices", ny, 0, 0);
        part(tc, "maxpool2d dx", nx, 0, 0);
    } else if (!strcmp(kind, "avgpool")) {
        float *dy = randn(ny, 1);
        tc->in[1] = dy, tc->in_n[1] = ny;
        tc->out_n = ny + nx;
        tc->out = zeros(tc->out_n);
        C.ops->avgpool2d_forward(C.ctx, tc->out, x, planes, k->h, k->w, win);
        C.ops->avgpool2d_backward(C.ctx, tc->out + ny, dy, planes, k->h, k->w, win);
        /* PyTorch sums the window in the same order and divides once; its backward may
         * vectorise the adds: a rounding or two of the terms' size. */
        part(tc, "avgpool2d y", ny, 1e-7, 2e-7);
        part(tc, "avgpool2d dx", nx, 1e-7, 1e-6);
    } else { /* batchnorm over [b, c, h*w] */
        const int64_t c = k->c, s = k->h * k->w;
        float *wt = randn(c, 1), *bi = randn(c, 1), *rm = randn(c, 1), *rv = randn(c, 1), *dy = randn(nx, 1);
        for (int64_t i = 0; i < c; i++)
            rv[i] = 0.5f + fabsf(rv[i]);
        tc->in[1] = wt, tc->in[2] = bi, tc->in[3] = rm, tc->in[4] = rv, tc->in[5] = dy;
        tc->in_n[1] = tc->in_n[2] = tc->in_n[3] = tc->in_n[4] = c, tc->in_n[5] = nx;
        tc->out_n = 3 * nx + 6 * c;
        tc->out = zeros(tc->out_n);
        float *o = tc->out, *rm2 = o + nx + 2 * c, *rv2 = rm2 + c, *dw = o + 2 * nx + 4 * c;
        memcpy(rm2, rm, (size_t)c * sizeof(float));
        memcpy(rv2, rv, (size_t)c * sizeof(float));
        C.ops->batchnorm_forward_train(C.ctx, o, o + nx, o + nx + c, rm2, rv2, x, wt, bi, k->b, c, s, 1e-5,
                                       0.1);
        C.ops->batchnorm_backward(C.ctx, o + nx + 4 * c, dw, dw + c, dy, x, o + nx, o + nx + c, wt, k->b, c,
                                  s);
        C.ops->batchnorm_forward_eval(C.ctx, o + 2 * nx + 6 * c, x, wt, bi, rm2, rv2, k->b, c, s, 1e-5);
        /* PyTorch takes the statistics in double too (the same values up to the sum's
         * order) but applies and differentiates in float, partly fused: a few ulp of
         * the results' size (|y| ~ 3, |dx| ~ invstd * |dy| ~ 1). */
        part(tc, "batchnorm y", nx, 2e-6, 2e-6);
        part(tc, "batchnorm save_mean", c, 1e-7, 1e-7);
        part(tc, "batchnorm save_invstd", c, 0, 2e-7);
        part(tc, "batchnorm running_mean", c, 1e-7, 2e-7);
        part(tc, "batchnorm running_var", c, 1e-7, 2e-7);
        part(tc, "batchnorm dx", nx, 2e-6, 2e-6);
        part(tc, "batchnorm dweight", c, 2e-6, 2e-6);
        part(tc, "batchnorm dbias", c, 2e-6, 2e-6);
        part(tc, "batchnorm eval y", nx, 2e-6, 2e-6);
    }
}

static void free_case(struct tcase *tc)
{
    for (int i = 0; i < 6; i++)
        free(tc->in[i]);
    free(tc->out);
}

static int test_torch(void)
{
    static const char *kinds[] = {"unfold", "maxpool", "avgpool", "batchnorm"};
    enum { NK = 4 };
    struct tcase cases[NK * NW];
    int nc = 0;
    for (int k = 0; k < NK; k++)
        for (int t = 0; t < NW; t++) {
            const struct wcase *w = &WCASES[t];
            const bool pool = k == 1 || k == 2;
            if (pool && (w->win.ph * 2 > w->win.kh || w->win.pw * 2 > w->win.kw))
                continue; /* PyTorch refuses pads over half the kernel */
            if (k == 3 && w->b * w->h * w->w < 2)
                continue; /* batchnorm needs two values per channel */
            make_case(&cases[nc++], kinds[k], w);
        }
    char path[4200], cmd[8600];
    snprintf(path, sizeof path, "%s/cases.txt", tmpdir);
    FILE *fp = fopen(path, "w");
    CHECK(fp != NULL);
    if (!fp)
        return 1;
    for (int i = 0; i < nc; i++) {
        const struct wcase *k = &cases[i].k;
        fprintf(fp, "%s %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld", cases[i].line_kind,
                (long long)k->b, (long long)k->c, (long long)k->h, (long long)k->w, (long long)k->win.kh,
                (long long)k->win.kw, (long long)k->win.sh, (long long)k->win.sw, (long long)k->win.ph,
                (long long)k->win.pw);
        for (int j = 0; j < 6; j++)
            put(fp, cases[i].in[j], cases[i].in_n[j]);
        fputc('\n', fp);
    }
    fclose(fp);
    snprintf(path, sizeof path, "%s/conv_torch.py", tmpdir);
    fp = fopen(path, "w");
    CHECK(fp != NULL);
    if (!fp)
        return 1;
    fputs(TORCH_PY, fp);
    fclose(fp);
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 /usr/bin/python3 '%s/conv_torch.py' '%s/cases.txt'", tmpdir,
             tmpdir);
    if (system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0) {
        fprintf(stderr, "no /usr/bin/python3 with torch: the PyTorch comparison is skipped\n");
        for (int i = 0; i < nc; i++)
            free_case(&cases[i]);
        return SKIP;
    }
    FILE *py = popen(cmd, "r");
    CHECK(py != NULL);
    if (!py)
        return 1;
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    for (int i = 0; i < nc; i++) {
        struct tcase *tc = &cases[i];
        if (!fgets(line, (int)cap, py)) {
            CHECK__FAIL("conv_torch.py answered %d of %d cases", i, nc);
            break;
        }
        float *want = zeros(tc->out_n);
        char *p = line, *end;
        int64_t got = 0;
        for (; got < tc->out_n; got++) {
            want[got] = strtof(p, &end);
            if (end == p)
                break;
            p = end;
        }
        CHECK_EQ_INT(got, tc->out_n);
        int64_t off = 0;
        for (int j = 0; j < tc->parts; j++) {
            char what[160];
            snprintf(what, sizeof what, "%s (b=%lld c=%lld %lldx%lld, k %lldx%lld s %lldx%lld p %lldx%lld)",
                     tc->part_name[j], (long long)tc->k.b, (long long)tc->k.c, (long long)tc->k.h,
                     (long long)tc->k.w, (long long)tc->k.win.kh, (long long)tc->k.win.kw,
                     (long long)tc->k.win.sh, (long long)tc->k.win.sw, (long long)tc->k.win.ph,
                     (long long)tc->k.win.pw);
            close_to(what, tc->out + off, want + off, tc->part_n[j], tc->atol[j], tc->rtol[j]);
            off += tc->part_n[j];
        }
        free(want);
    }
    free(line);
    CHECK_EQ_INT(pclose(py), 0);
    for (int i = 0; i < nc; i++)
        free_case(&cases[i]);
    return 0;
}

int main(void)
{
    const char *base = getenv("DDPD_TEST_TMP");
    if (!base || !base[0])
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(tmpdir, sizeof tmpdir, "%s/conv.XXXXXX", base);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    rng_seed(&R, 18);
    C = dev_cpu_new(1);
    test_im2col_conv();
    test_col2im_adjoint();
    test_pools_naive();
    test_maxpool_scan_rule();
    test_batchnorm_naive();
    const int torch = test_torch();
    dev_cpu_free(C);
    base_remove_tree(tmpdir);
    if (torch == SKIP && !check__failures) {
        fprintf(stderr, "%d checks passed; PyTorch part skipped\n", check__count);
        return SKIP;
    }
    CHECK_DONE();
}
