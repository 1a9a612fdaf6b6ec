/* dev/window.h — a pooling/conv window's arithmetic (struct dev_window, dev.h), written once
 * for the CPU reference (cpu_conv.c) and the CUDA kernels (cuda/dev.cu) so both clip the
 * same way. Pure integer helpers: no memory, no checks (callers validate the window). */
#ifndef DDPD_DEV_WINDOW_H
#define DDPD_DEV_WINDOW_H

#include <math.h>
#include <stdint.h>

#include "../dev.h"

#ifdef __CUDACC__
#define DEV_WINDOW_FN __host__ __device__ static inline
#else
#define DEV_WINDOW_FN static inline
#endif

/* Outputs along one axis of `in` entries: (in + 2p - k) / s + 1. */
DEV_WINDOW_FN int64_t dev_window_out(int64_t in, int64_t k, int64_t s, int64_t p)
{
    return (in + 2 * p - k) / s + 1;
}

/* The in-image part [y0, y1) x [x0, x1) of output (oy, ox)'s window over an h x w plane
 * (the padding dropped); empty when the window lies wholly in the padding. */
DEV_WINDOW_FN void dev_window_clip(const struct dev_window *win, int64_t oy, int64_t ox, int64_t h, int64_t w,
                                   int64_t *y0, int64_t *y1, int64_t *x0, int64_t *x1)
{
    const int64_t ty = oy * win->sh - win->ph, tx = ox * win->sw - win->pw;
    *y1 = ty + win->kh < h ? ty + win->kh : h;
    *x1 = tx + win->kw < w ? tx + win->kw : w;
    *y0 = ty < 0 ? 0 : ty;
    *x0 = tx < 0 ? 0 : tx;
}

/* Max pooling of output (oy, ox) over plane[h,w]: the window's in-image part scanned row
 * by row, a value replacing the maximum when greater or NaN (ties keep the first). The
 * maximum, and in *best its index iy*w + ix (the first in-image position for a window
 * of -inf). */
DEV_WINDOW_FN float dev_window_max(const struct dev_window *win, const float *plane, int64_t oy, int64_t ox,
                                   int64_t h, int64_t w, int64_t *best)
{
    int64_t y0, y1, x0, x1;
    dev_window_clip(win, oy, ox, h, w, &y0, &y1, &x0, &x1);
    float m = -INFINITY;
    *best = y0 * w + x0;
    for (int64_t iy = y0; iy < y1; iy++)
        for (int64_t ix = x0; ix < x1; ix++) {
            const float v = plane[iy * w + ix];
            if (v > m || isnan(v)) {
                m = v;
                *best = iy * w + ix;
            }
        }
    return m;
}

/* The float sum of output (oy, ox)'s in-image entries of plane[h,w], row by row. */
DEV_WINDOW_FN float dev_window_sum(const struct dev_window *win, const float *plane, int64_t oy, int64_t ox,
                                   int64_t h, int64_t w)
{
    int64_t y0, y1, x0, x1;
    dev_window_clip(win, oy, ox, h, w, &y0, &y1, &x0, &x1);
    float s = 0.0f;
    for (int64_t iy = y0; iy < y1; iy++)
        for (int64_t ix = x0; ix < x1; ix++)
            s += plane[iy * w + ix];
    return s;
}

/* Average pooling's divisor with count_include_pad (PyTorch's): output (oy, ox)'s window
 * clipped to the padded image, so a window that runs past the padding counts less. */
DEV_WINDOW_FN int64_t dev_window_divisor(const struct dev_window *win, int64_t oy, int64_t ox, int64_t h,
                                         int64_t w)
{
    const int64_t y0 = oy * win->sh - win->ph, x0 = ox * win->sw - win->pw;
    const int64_t y1 = y0 + win->kh < h + win->ph ? y0 + win->kh : h + win->ph;
    const int64_t x1 = x0 + win->kw < w + win->pw ? x0 + win->kw : w + win->pw;
    return (y1 - y0) * (x1 - x0);
}

#endif
