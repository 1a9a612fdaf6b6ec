/* test_watch.c — early_stop's and keep_best's decisions (worker/watch.c) on sequences
 * worked out by hand with Lightning's EarlyStopping rule (docs/spec.md "Early stopping"):
 * patience, min_delta in both modes and with either sign, patience 0, a NaN or an infinite
 * metric (check_finite), and keep_best's strict improvement that NaN never makes. */
#include "check.h"

#include <math.h>

#include "worker/watch.h"

/* Feeds values[0..n) at steps 5, 10, ...; the step it stops at (0: never), reason in why. */
static int64_t run(const struct spec_watch *w, const double *values, int n, struct watch_state *st, char *why)
{
    *st = (struct watch_state){0};
    for (int i = 0; i < n; i++)
        if (watch_early_stop(w, st, 5 * (i + 1), values[i], why, 256))
            return 5 * (i + 1);
    return 0;
}

int main(void)
{
    char why[256];
    struct watch_state st;
    struct spec_watch w = {.on = true, .metric = WATCH_EVAL_LOSS, .mode = WATCH_MIN, .patience = 2};

    /* min, patience 2: best 1.0 at 10; 1.1 and 1.0 (not < 1.0) do not improve: stop at 20. */
    const double a[] = {2.0, 1.0, 1.1, 1.0, 0.5};
    CHECK_EQ_INT(run(&w, a, 5, &st, why), 20);
    CHECK_EQ_STR(why, "early_stopped at step 20 (best 10 = 1)");
    CHECK_EQ_INT(st.step, 10);
    CHECK_EQ_INT(st.wait, 2);

    /* min_delta 0.3 for min: 1.8 is not below 2.0 - 0.3, 1.6 is; then 1.5, 1.4 are not. */
    w.min_delta = 0.3;
    const double b[] = {2.0, 1.8, 1.6, 1.5, 1.4};
    CHECK_EQ_INT(run(&w, b, 5, &st, why), 25);
    CHECK_EQ_STR(why, "early_stopped at step 25 (best 15 = 1.6)");

    /* A negative min_delta (used with its sign, as Lightning): a slightly worse value counts. */
    w.min_delta = -0.2;
    const double c[] = {1.0, 1.1, 1.25, 1.5, 1.6};
    /* 1.1 < 1.0 + 0.2 and 1.25 < 1.1 + 0.2 improve; 1.5 and 1.6 are not < 1.25 + 0.2. */
    CHECK_EQ_INT(run(&w, c, 5, &st, why), 25);
    CHECK_EQ_STR(why, "early_stopped at step 25 (best 15 = 1.25)");

    /* max with min_delta 0.1: improves when v > best + 0.1. */
    w = (struct spec_watch){
        .on = true, .metric = WATCH_EVAL_ACCURACY, .mode = WATCH_MAX, .patience = 1, .min_delta = 0.1};
    const double d[] = {0.5, 0.65, 0.7};
    CHECK_EQ_INT(run(&w, d, 3, &st, why), 15);
    CHECK_EQ_STR(why, "early_stopped at step 15 (best 10 = 0.65)");

    /* patience 0: the first evaluation that does not improve stops. */
    w = (struct spec_watch){.on = true, .metric = WATCH_EVAL_LOSS, .mode = WATCH_MIN, .patience = 0};
    const double e[] = {3.0, 2.0, 2.0};
    CHECK_EQ_INT(run(&w, e, 3, &st, why), 15);

    /* check_finite: NaN or inf stops at once, even with patience left; the first eval too. */
    w.patience = 10;
    const double f[] = {3.0, NAN};
    CHECK_EQ_INT(run(&w, f, 2, &st, why), 10);
    CHECK_EQ_STR(why, "early_stopped at step 10 (eval_loss is not finite; best 5 = 3)");
    const double g[] = {INFINITY};
    CHECK_EQ_INT(run(&w, g, 1, &st, why), 5);
    CHECK_EQ_STR(why, "early_stopped at step 5 (eval_loss is not finite; no best yet)");

    /* keep_best: strictly better only; the first finite value is; NaN never is. */
    struct spec_watch kb = {.on = true, .metric = WATCH_EVAL_LOSS, .mode = WATCH_MIN};
    st = (struct watch_state){0};
    CHECK(!watch_keep_best(&kb, &st, 5, NAN));
    CHECK(watch_keep_best(&kb, &st, 10, 2.0));
    CHECK(!watch_keep_best(&kb, &st, 15, 2.0));
    CHECK(watch_keep_best(&kb, &st, 20, 1.5));
    CHECK(!watch_keep_best(&kb, &st, 25, NAN));
    CHECK_EQ_INT(st.step, 20);
    kb.mode = WATCH_MAX;
    CHECK(watch_keep_best(&kb, &st, 30, 1.6) && !watch_keep_best(&kb, &st, 35, 1.0));
    CHECK_EQ_INT(st.step, 30);
    CHECK(watch_metric_of(&kb, 1.0, 0.25) == 1.0);
    kb.metric = WATCH_EVAL_ACCURACY;
    CHECK(watch_metric_of(&kb, 1.0, 0.25) == 0.25);
    CHECK_DONE();
}
