/* store_impl.h — what the store's own files share (not part of store.h's contract): the
 * loss-curve downsampler (store_curve.c) that store.c feeds from SQL. Nothing outside
 * server/store*.c includes this. */
#ifndef DDPD_STORE_IMPL_H
#define DDPD_STORE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct store_metrics;

/* The downsampling of one job's loss curve (store_metrics_get's contract in store.h):
 * the mean over ranks per step and each rank's series, bucketed over [lo, hi]. Pure
 * bookkeeping: knows no SQL, not thread-safe. */
struct store__curve;

/* A new curve over the steps lo..hi (lo <= hi) kept to max_points per series (already
 * clamped by the caller). Caller frees with store__curve_free. */
struct store__curve *store__curve_new(int64_t lo, int64_t hi, int max_points);

/* One stored row, in (step, rank) order: `rank`'s loss at `step`; has_value false for a
 * non-finite loss (stored NULL), which counts for nothing. Rows of ranks outside
 * 0..STORE_METRICS_MAX_RANKS-1 are left out. */
void store__curve_add(struct store__curve *c, int64_t step, int rank, bool has_value, double v);

/* Closes the curve into *out (zeroed by the caller): the mean, then each rank with
 * points, their first and last step and the number of points. *out owns the arrays
 * (store_metrics_free); the curve is left empty. */
void store__curve_finish(struct store__curve *c, struct store_metrics *out);

/* NULL is a no-op. */
void store__curve_free(struct store__curve *c);

#endif
