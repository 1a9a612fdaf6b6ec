/* watch.c — early_stop and checkpoint.keep_best's decisions from one eval's metric
 * (watch.h). Lightning's rules, in double precision, with its defaults (check_finite on,
 * no stopping or divergence threshold). */
#include "watch.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

double watch_metric_of(const struct spec_watch *w, double loss, double accuracy)
{
    return w->metric == WATCH_EVAL_ACCURACY ? accuracy : loss;
}

bool watch_keep_best(const struct spec_watch *w, struct watch_state *st, int64_t step, double current)
{
    if (isnan(current))
        return false;
    bool better = st->step == 0 || (w->mode == WATCH_MIN ? current < st->best : current > st->best);
    if (better) {
        st->best = current;
        st->step = step;
    }
    return better;
}

bool watch_early_stop(const struct spec_watch *w, struct watch_state *st, int64_t step, double current,
                      char *reason, size_t cap)
{
    const char *name = watch_metric_name(w->metric);
    char best[96] = "no best yet";
    /* check_finite: a NaN or infinite metric stops the job at once, the best unchanged. */
    if (!isfinite(current)) {
        if (st->step > 0)
            snprintf(best, sizeof best, "best %" PRId64 " = %.6g", st->step, st->best);
        snprintf(reason, cap, "early_stopped at step %" PRId64 " (%s is not finite; %s)", step, name, best);
        return true;
    }
    /* Lightning negates min_delta for mode min and tests monitor_op(current - min_delta,
     * best): min improves when current < best - min_delta, max when current > best +
     * min_delta. Before the first improvement the best is ±inf, which any finite value
     * beats. */
    const double delta = w->mode == WATCH_MIN ? -w->min_delta : w->min_delta;
    bool better =
        st->step == 0 || (w->mode == WATCH_MIN ? current - delta < st->best : current - delta > st->best);
    if (better) {
        st->best = current;
        st->step = step;
        st->wait = 0;
        return false;
    }
    if (++st->wait < w->patience)
        return false;
    snprintf(reason, cap, "early_stopped at step %" PRId64 " (best %" PRId64 " = %.6g)", step, st->step,
             st->best);
    return true;
}
