/* dev/cpu_conv.h — the CPU backend's conv-net ops (dev/cpu_conv.c), for cpu.c's table:
 * cross-file internals of the CPU backend (cpu__), nobody else calls them. Their contract
 * is dev.h's (struct dev_window and the v2 conv-net slots). */
#ifndef DDPD_CPU_CONV_H
#define DDPD_CPU_CONV_H

#include "../dev.h"

void cpu__im2col(void *ctx, float *col, const float *x, int64_t b, int64_t c, int64_t h, int64_t w,
                 const struct dev_window *win);
void cpu__col2im(void *ctx, float *dx, const float *col, int64_t b, int64_t c, int64_t h, int64_t w,
                 const struct dev_window *win);
void cpu__maxpool2d_forward(void *ctx, float *y, int32_t *idx, const float *x, int64_t planes, int64_t h,
                            int64_t w, const struct dev_window *win);
void cpu__maxpool2d_backward(void *ctx, float *dx, const float *dy, const int32_t *idx, int64_t planes,
                             int64_t h, int64_t w, const struct dev_window *win);
void cpu__avgpool2d_forward(void *ctx, float *y, const float *x, int64_t planes, int64_t h, int64_t w,
                            const struct dev_window *win);
void cpu__avgpool2d_backward(void *ctx, float *dx, const float *dy, int64_t planes, int64_t h, int64_t w,
                             const struct dev_window *win);
void cpu__batchnorm_forward_train(void *ctx, float *y, float *mean, float *invstd, float *running_mean,
                                  float *running_var, const float *x, const float *w, const float *b,
                                  int64_t n, int64_t c, int64_t s, double eps, double momentum);
void cpu__batchnorm_forward_eval(void *ctx, float *y, const float *x, const float *w, const float *b,
                                 const float *running_mean, const float *running_var, int64_t n, int64_t c,
                                 int64_t s, double eps);
void cpu__batchnorm_backward(void *ctx, float *dx, float *dw, float *db, const float *dy, const float *x,
                             const float *mean, const float *invstd, const float *w, int64_t n, int64_t c,
                             int64_t s);

#endif
