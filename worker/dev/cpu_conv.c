/* dev/cpu_conv.c — the CPU reference of the conv-net ops (dev.h: struct dev_window, im2col,
 * col2im, max/avg pool2d, batchnorm): plain loops in the order dev.h fixes, which the
 * CUDA kernels (cuda/dev.cu) reproduce, so most agree to the bit. */

/* Contraction stays off: each multiply-add below rounds twice, as dev.h says. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "cpu_conv.h"

#include <math.h>
#include <string.h>

#include "../../base/check.h"
#include "window.h"

/* The outputs ox in [*x0, *x1) whose kernel column kj reads inside the image, i.e.
 * ix = ox*sw - pw + kj in [0, w) (an empty range when none does); returns kj - pw, so
 * that ix = ox*sw + the returned offset. im2col and col2im share it. */
static int64_t in_image_outputs(const struct dev_window *win, int64_t kj, int64_t w, int64_t ow, int64_t *x0,
                                int64_t *x1)
{
    const int64_t off = kj - win->pw;
    const int64_t lo = off >= 0 ? 0 : (-off + win->sw - 1) / win->sw;
    const int64_t hi = w - off <= 0 ? 0 : (w - off + win->sw - 1) / win->sw;
    *x0 = lo < ow ? lo : ow;
    *x1 = hi < ow ? hi : ow;
    *x1 = *x1 > *x0 ? *x1 : *x0;
    return off;
}

void cpu__im2col(void *ctx, float *col, const float *x, int64_t b, int64_t c, int64_t h, int64_t w,
                 const struct dev_window *win)
{
    (void)ctx;
    const int64_t oh = dev_window_out(h, win->kh, win->sh, win->ph),
                  ow = dev_window_out(w, win->kw, win->sw, win->pw);
    ASSERT(oh >= 1 && ow >= 1);
    for (int64_t i = 0; i < b * c; i++) {
        const float *plane = x + i * h * w;
        float *rows = col + i * win->kh * win->kw * oh * ow; /* the plane's kh*kw rows */
        for (int64_t ki = 0; ki < win->kh; ki++)
            for (int64_t kj = 0; kj < win->kw; kj++) {
                float *row = rows + (ki * win->kw + kj) * oh * ow;
                int64_t x0, x1;
                const int64_t off = in_image_outputs(win, kj, w, ow, &x0, &x1);
                for (int64_t oy = 0; oy < oh; oy++) {
                    const int64_t iy = oy * win->sh - win->ph + ki;
                    float *r = row + oy * ow;
                    if (iy < 0 || iy >= h) {
                        memset(r, 0, (size_t)ow * sizeof *r);
                        continue;
                    }
                    const int64_t base = iy * w + off; /* + ox*sw: in the image for ox in [x0, x1) */
                    for (int64_t ox = 0; ox < x0; ox++)
                        r[ox] = 0.0f;
                    if (win->sw == 1 && x1 > x0)
                        memcpy(r + x0, plane + base + x0, (size_t)(x1 - x0) * sizeof *r);
                    else
                        for (int64_t ox = x0; ox < x1; ox++)
                            r[ox] = plane[base + ox * win->sw];
                    for (int64_t ox = x1; ox < ow; ox++)
                        r[ox] = 0.0f;
                }
            }
    }
}

void cpu__col2im(void *ctx, float *dx, const float *col, int64_t b, int64_t c, int64_t h, int64_t w,
                 const struct dev_window *win)
{
    (void)ctx;
    const int64_t oh = dev_window_out(h, win->kh, win->sh, win->ph),
                  ow = dev_window_out(w, win->kw, win->sw, win->pw);
    ASSERT(oh >= 1 && ow >= 1);
    /* Rows of col in (ki, kj) order: each dx entry gets its terms in that order. */
    for (int64_t i = 0; i < b * c; i++) {
        float *plane = dx + i * h * w;
        const float *rows = col + i * win->kh * win->kw * oh * ow;
        for (int64_t ki = 0; ki < win->kh; ki++)
            for (int64_t kj = 0; kj < win->kw; kj++) {
                const float *row = rows + (ki * win->kw + kj) * oh * ow;
                /* As im2col: only the outputs ox in [x0, x1) came from inside the image. */
                int64_t x0, x1;
                const int64_t off = in_image_outputs(win, kj, w, ow, &x0, &x1);
                for (int64_t oy = 0; oy < oh; oy++) {
                    const int64_t iy = oy * win->sh - win->ph + ki;
                    if (iy < 0 || iy >= h)
                        continue;
                    const int64_t base = iy * w + off;
                    const float *r = row + oy * ow;
                    for (int64_t ox = x0; ox < x1; ox++)
                        plane[base + ox * win->sw] += r[ox];
                }
            }
    }
}

/* The scan's step: (m, at) takes (v, i) when v is greater or NaN, without a branch (on
 * data one mispredicts half the time). Later positions are offered after earlier ones. */
static inline void take_max(float *m, int32_t *at, float v, int32_t i)
{
    const uint32_t take = (uint32_t)(v > *m) | (uint32_t)isunordered(v, v);
    uint32_t vb, mb;
    memcpy(&vb, &v, 4);
    memcpy(&mb, m, 4);
    mb = (vb & -take) | (mb & (take - 1));
    memcpy(m, &mb, 4);
    *at = (int32_t)(((uint32_t)i & -take) | ((uint32_t)*at & (take - 1)));
}

/* dev_window_max without padding (the common case: a 2x2 pool of stride 2): every window
 * lies inside the image (floor mode), so none is clipped. Each output row's maxima are
 * built in place, one window position (ky, kx) at a time over all its outputs: the same
 * scan of each window, row by row, a value replacing the maximum when greater or NaN (so
 * the same maxima and indices), but the outputs of a row no longer wait on each other. */
static void maxpool_unpadded(float *restrict y, int32_t *restrict idx, const float *restrict x,
                             int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow,
                             const struct dev_window *win)
{
    const int64_t kh = win->kh, kw = win->kw, sh = win->sh, sw = win->sw;
    if (kh == 2 && kw == 2 && sh == 2 && sw == 2) {
        /* The usual 2x2 pool: each window's four values in registers. */
        for (int64_t p = 0; p < planes; p++) {
            const float *plane = x + p * h * w;
            for (int64_t oy = 0; oy < oh; oy++) {
                const float *r0 = plane + 2 * oy * w, *r1 = r0 + w;
                float *restrict yo = y + (p * oh + oy) * ow;
                int32_t *restrict io = idx + (p * oh + oy) * ow;
                for (int64_t ox = 0; ox < ow; ox++) {
                    /* The scan's rule is associative (a later NaN always wins, else the
                     * first maximum): the two rows' pairs, then the pair of them, give
                     * what the scan of the four gives, in half the dependent steps. */
                    const int32_t i0 = (int32_t)(2 * oy * w + 2 * ox), i1 = i0 + (int32_t)w;
                    float m = r0[2 * ox], n = r1[2 * ox];
                    int32_t at = i0, bt = i1;
                    take_max(&m, &at, r0[2 * ox + 1], i0 + 1);
                    take_max(&n, &bt, r1[2 * ox + 1], i1 + 1);
                    take_max(&m, &at, n, bt);
                    yo[ox] = m;
                    io[ox] = at;
                }
            }
        }
        return;
    }
    for (int64_t p = 0; p < planes; p++) {
        const float *plane = x + p * h * w;
        for (int64_t oy = 0; oy < oh; oy++) {
            float *restrict m = y + (p * oh + oy) * ow;
            int32_t *restrict best = idx + (p * oh + oy) * ow;
            for (int64_t ox = 0; ox < ow; ox++) {
                m[ox] = -INFINITY;
                best[ox] = (int32_t)(oy * sh * w + ox * sw);
            }
            for (int64_t ky = 0; ky < kh; ky++)
                for (int64_t kx = 0; kx < kw; kx++) {
                    const int64_t row = (oy * sh + ky) * w + kx;
                    for (int64_t ox = 0; ox < ow; ox++)
                        take_max(&m[ox], &best[ox], plane[row + ox * sw], (int32_t)(row + ox * sw));
                }
        }
    }
}

void cpu__maxpool2d_forward(void *ctx, float *y, int32_t *idx, const float *x, int64_t planes, int64_t h,
                            int64_t w, const struct dev_window *win)
{
    (void)ctx;
    const int64_t oh = dev_window_out(h, win->kh, win->sh, win->ph),
                  ow = dev_window_out(w, win->kw, win->sw, win->pw);
    ASSERT(oh >= 1 && ow >= 1 && h * w <= INT32_MAX);
    if (win->ph == 0 && win->pw == 0) {
        maxpool_unpadded(y, idx, x, planes, h, w, oh, ow, win);
        return;
    }
    for (int64_t p = 0; p < planes; p++) {
        const float *plane = x + p * h * w;
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                int64_t best;
                const int64_t o = (p * oh + oy) * ow + ox;
                y[o] = dev_window_max(win, plane, oy, ox, h, w, &best);
                idx[o] = (int32_t)best;
            }
    }
}

void cpu__maxpool2d_backward(void *ctx, float *dx, const float *dy, const int32_t *idx, int64_t planes,
                             int64_t h, int64_t w, const struct dev_window *win)
{
    (void)ctx;
    const int64_t oh = dev_window_out(h, win->kh, win->sh, win->ph),
                  ow = dev_window_out(w, win->kw, win->sw, win->pw);
    ASSERT(oh >= 1 && ow >= 1);
    memset(dx, 0, (size_t)(planes * h * w) * sizeof(float));
    for (int64_t p = 0; p < planes; p++)
        for (int64_t o = 0; o < oh * ow; o++)
            dx[p * h * w + idx[p * oh * ow + o]] += dy[p * oh * ow + o];
}

void cpu__avgpool2d_forward(void *ctx, float *y, const float *x, int64_t planes, int64_t h, int64_t w,
                            const struct dev_window *win)
{
    (void)ctx;
    const int64_t oh = dev_window_out(h, win->kh, win->sh, win->ph),
                  ow = dev_window_out(w, win->kw, win->sw, win->pw);
    ASSERT(oh >= 1 && ow >= 1);
    for (int64_t p = 0; p < planes; p++) {
        const float *plane = x + p * h * w;
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                y[(p * oh + oy) * ow + ox] =
                    dev_window_sum(win, plane, oy, ox, h, w) / (float)dev_window_divisor(win, oy, ox, h, w);
            }
    }
}

void cpu__avgpool2d_backward(void *ctx, float *dx, const float *dy, int64_t planes, int64_t h, int64_t w,
                             const struct dev_window *win)
{
    (void)ctx;
    const int64_t oh = dev_window_out(h, win->kh, win->sh, win->ph),
                  ow = dev_window_out(w, win->kw, win->sw, win->pw);
    ASSERT(oh >= 1 && ow >= 1);
    memset(dx, 0, (size_t)(planes * h * w) * sizeof(float));
    for (int64_t p = 0; p < planes; p++) {
        float *plane = dx + p * h * w;
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                const float g = dy[(p * oh + oy) * ow + ox] / (float)dev_window_divisor(win, oy, ox, h, w);
                int64_t y0, y1, x0, x1;
                dev_window_clip(win, oy, ox, h, w, &y0, &y1, &x0, &x1);
                for (int64_t iy = y0; iy < y1; iy++)
                    for (int64_t ix = x0; ix < x1; ix++)
                        plane[iy * w + ix] += g;
            }
    }
}

/* y = x * a + k over channel ch's entries, a = invstd * w, k = b - mean * a (float). */
static void bn_apply(float *y, const float *x, const float *w, const float *b, int64_t n, int64_t c,
                     int64_t s, int64_t ch, float mean, float invstd)
{
    const float a = invstd * (w ? w[ch] : 1.0f);
    const float k = (b ? b[ch] : 0.0f) - mean * a;
    for (int64_t i = 0; i < n; i++) {
        const float *xr = x + (i * c + ch) * s;
        float *yr = y + (i * c + ch) * s;
        for (int64_t j = 0; j < s; j++)
            yr[j] = xr[j] * a + k;
    }
}

void cpu__batchnorm_forward_train(void *ctx, float *y, float *mean, float *invstd, float *running_mean,
                                  float *running_var, const float *x, const float *w, const float *b,
                                  int64_t n, int64_t c, int64_t s, double eps, double momentum)
{
    (void)ctx;
    const int64_t m = n * s;
    for (int64_t ch = 0; ch < c; ch++) {
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < s; j++)
                sum += (double)x[(i * c + ch) * s + j];
        const double mu = sum / (double)m;
        double sq = 0.0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < s; j++) {
                const double d = (double)x[(i * c + ch) * s + j] - mu;
                sq += d * d;
            }
        const double var = sq / (double)m;
        mean[ch] = (float)mu;
        invstd[ch] = (float)(1.0 / sqrt(var + eps));
        if (running_mean)
            running_mean[ch] = (float)(momentum * mu + (1.0 - momentum) * (double)running_mean[ch]);
        if (running_var)
            running_var[ch] =
                (float)(momentum * (sq / (double)(m - 1)) + (1.0 - momentum) * (double)running_var[ch]);
        bn_apply(y, x, w, b, n, c, s, ch, mean[ch], invstd[ch]);
    }
}

void cpu__batchnorm_forward_eval(void *ctx, float *y, const float *x, const float *w, const float *b,
                                 const float *running_mean, const float *running_var, int64_t n, int64_t c,
                                 int64_t s, double eps)
{
    (void)ctx;
    for (int64_t ch = 0; ch < c; ch++)
        bn_apply(y, x, w, b, n, c, s, ch, running_mean[ch], 1.0f / sqrtf(running_var[ch] + (float)eps));
}

void cpu__batchnorm_backward(void *ctx, float *dx, float *dw, float *db, const float *dy, const float *x,
                             const float *mean, const float *invstd, const float *w, int64_t n, int64_t c,
                             int64_t s)
{
    (void)ctx;
    const int64_t m = n * s;
    for (int64_t ch = 0; ch < c; ch++) {
        const double mu = mean[ch], is = invstd[ch];
        double sdy = 0.0, dot = 0.0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < s; j++) {
                const int64_t e = (i * c + ch) * s + j;
                sdy += (double)dy[e];
                dot += ((double)x[e] - mu) * (double)dy[e];
            }
        const double gmean = sdy / (double)m, k = dot * is * is / (double)m;
        const double scale = is * (w ? (double)w[ch] : 1.0);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < s; j++) {
                const int64_t e = (i * c + ch) * s + j;
                dx[e] = (float)(((double)dy[e] - gmean - ((double)x[e] - mu) * k) * scale);
            }
        if (dw)
            dw[ch] += (float)(dot * is);
        if (db)
            db[ch] += (float)sdy;
    }
}
