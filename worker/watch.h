/* watch.h — what the job decides from each eval's metric (docs/spec.md writes the rules
 * down): early_stop, exactly PyTorch Lightning's EarlyStopping (check_finite on), and
 * checkpoint.keep_best, ModelCheckpoint's save_top_k=1. Pure arithmetic on the metric
 * every rank holds after the eval's all-gather, so every rank decides the same; the state
 * travels in checkpoints (checkpoint.h), so a resumed job decides as an uninterrupted one.
 * Knows no files, no collectives. */
#ifndef DDPD_WATCH_H
#define DDPD_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../schema/spec.h"

/* A watch's state: the best value so far and its step (step 0: no eval has improved yet,
 * Lightning's best = ±inf), and the evaluations since it improved (early_stop's wait). */
struct watch_state {
    double best;
    int64_t step, wait;
};

/* The metric `w` watches out of an eval's loss and accuracy. */
double watch_metric_of(const struct spec_watch *w, double loss, double accuracy);

/* keep_best: whether `current` beats the best so far (strictly; NaN never does, as
 * ModelCheckpoint treats NaN as the worst value); when it does, it becomes the best, at
 * `step`. */
bool watch_keep_best(const struct spec_watch *w, struct watch_state *st, int64_t step, double current);

/* early_stop after the eval of `step`: Lightning's _evaluate_stopping_criteria. True when
 * the job stops here; then reason[cap] says why ("early_stopped at step S (best S' = v)"). */
bool watch_early_stop(const struct spec_watch *w, struct watch_state *st, int64_t step, double current,
                      char *reason, size_t cap);

#endif
