/* test_sweep_plan.c — server/sweep/sweep_plan.c: dotted paths set where they point and
 * refused with the reason where they do not; the random generator against splitmix64's
 * published outputs for seed 0; a grid's trials in the documented order (paths sorted,
 * the last one fastest) with their specs; the errors' paths (a missing key, a value that
 * makes a bad spec, a range in a grid, a grid past the cap); the caller's check of each
 * trial, its refusal named by trial; the asha method (sweep_asha.c): its rungs, its
 * trials' steps, and successive halving's promotions on hand-worked rung results (ties by
 * the lower index, no metric never promoted, at least one kept). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/sweep/sweep.h"

static const char *BASE =
    "{\"model\":[{\"type\":\"linear\",\"in\":4,\"out\":2}],\"loss\":\"mse\","
    "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1,\"momentum\":0},"
    "\"data\":{\"type\":\"synthetic\",\"samples\":8,\"seed\":1},\"batch_size\":2,\"steps\":2}";

static void test_paths(void)
{
    json_t *doc = json_loads(BASE, 0, NULL);
    char why[256];
    CHECK(sweep_path_set(doc, "optimizer.lr", json_real(0.5), why, sizeof why));
    CHECK(json_real_value(json_object_get(json_object_get(doc, "optimizer"), "lr")) == 0.5);
    CHECK(sweep_path_set(doc, "model[0].out", json_integer(3), why, sizeof why));
    CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(json_object_get(doc, "model"), 0), "out")),
                 3);
    CHECK(sweep_path_set(doc, "model[0]", json_string("x"), why, sizeof why));
    CHECK_EQ_STR(json_string_value(json_array_get(json_object_get(doc, "model"), 0)), "x");
    CHECK(!sweep_path_set(doc, "optimizer.lrr", json_real(1), why, sizeof why));
    CHECK_EQ_STR(why, "no key \"lrr\" in optimizer");
    CHECK(!sweep_path_set(doc, "model[3]", json_real(1), why, sizeof why));
    CHECK_EQ_STR(why, "model has 1 items, no [3]");
    CHECK(!sweep_path_set(doc, "loss.x", json_real(1), why, sizeof why));
    CHECK_EQ_STR(why, "loss is not an object");
    CHECK(!sweep_path_set(doc, "loss[0]", json_real(1), why, sizeof why));
    CHECK_EQ_STR(why, "loss is not a list");
    CHECK(!sweep_path_set(doc, "model[-1]", json_real(1), why, sizeof why));
    CHECK(!sweep_path_set(doc, "optimizer.", json_real(1), why, sizeof why));
    CHECK(!sweep_path_set(doc, "", json_real(1), why, sizeof why));
    json_decref(doc);
}

static void test_generator(void)
{
    /* splitmix64 from state 0: its reference implementation's first three outputs. */
    uint64_t st = 0;
    CHECK(sweep_rand_next(&st) == 0xe220a8397b1dcdafull);
    CHECK(sweep_rand_next(&st) == 0x6e789e6aa1b965f4ull);
    CHECK(sweep_rand_next(&st) == 0x06c45d188009454full);
    st = 0;
    double u = sweep_rand_unit(&st);
    CHECK(u == (double)(0xe220a8397b1dcdafull >> 11) * 0x1.0p-53 && u >= 0 && u < 1);
}

/* A request over BASE with `rest` (the members after "spec"). */
static ddpd_err plan(const char *rest, struct sweep_plan *p, struct ddpd_error *err)
{
    char text[2048];
    snprintf(text, sizeof text, "{\"spec\":%s,%s}", BASE, rest);
    json_t *body = json_loads(text, 0, NULL);
    CHECK(body != NULL);
    ddpd_err rc = sweep_plan_from_json(body, NULL, NULL, NULL, p, err);
    json_decref(body);
    return rc;
}

static void test_grid(void)
{
    struct sweep_plan p;
    struct ddpd_error e;
    CHECK_EQ_INT(plan("\"method\":\"grid\",\"max_parallel\":3,\"parameters\":{\"optimizer.lr\":[0.1,0.2],"
                      "\"batch_size\":[1,2,4]}",
                      &p, &e),
                 DDPD_OK);
    CHECK_EQ_INT(p.n, 6);
    CHECK_EQ_INT(p.max_parallel, 3);
    CHECK(p.method == SWEEP_GRID && p.metric == SWEEP_METRIC_EVAL_LOSS && !p.maximize);
    static const char *want[6] = {"{\"batch_size\":1,\"optimizer.lr\":0.10000000000000001}",
                                  "{\"batch_size\":1,\"optimizer.lr\":0.20000000000000001}",
                                  "{\"batch_size\":2,\"optimizer.lr\":0.10000000000000001}",
                                  "{\"batch_size\":2,\"optimizer.lr\":0.20000000000000001}",
                                  "{\"batch_size\":4,\"optimizer.lr\":0.10000000000000001}",
                                  "{\"batch_size\":4,\"optimizer.lr\":0.20000000000000001}"};
    for (size_t i = 0; i < p.n && i < 6; i++) {
        json_t *a = json_loads(p.params[i], 0, NULL), *b = json_loads(want[i], 0, NULL);
        CHECK(json_equal(a, b));
        json_t *spec = json_loads(p.specs[i], 0, NULL);
        CHECK(json_equal(json_object_get(spec, "batch_size"), json_object_get(b, "batch_size")));
        CHECK(json_equal(json_object_get(json_object_get(spec, "optimizer"), "lr"),
                         json_object_get(b, "optimizer.lr")));
        json_decref(spec);
        json_decref(a);
        json_decref(b);
    }
    sweep_plan_free(&p);
}

static void test_errors(void)
{
    struct sweep_plan p;
    struct ddpd_error e;
    CHECK_EQ_INT(plan("\"method\":\"grid\",\"parameters\":{\"optimizer.lrr\":[1]}", &p, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "parameters[\"optimizer.lrr\"]");
    CHECK_EQ_STR(e.message, "no key \"lrr\" in optimizer");
    sweep_plan_free(&p);
    CHECK_EQ_INT(plan("\"method\":\"grid\",\"parameters\":{\"optimizer.lr\":[0.1,-1]}", &p, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "trials[1]");
    CHECK(strstr(e.message, "trial 1 {\"optimizer.lr\":-1}: optimizer.lr: ") == e.message);
    sweep_plan_free(&p);
    CHECK_EQ_INT(
        plan("\"method\":\"grid\",\"parameters\":{\"optimizer.lr\":{\"min\":0.1,\"max\":1}}", &p, &e),
        DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "parameters[\"optimizer.lr\"]");
    sweep_plan_free(&p);
    /* 10 x 10 x 11 = 1100 trials: past SWEEP_MAX_TRIALS, refused before any is made. */
    CHECK_EQ_INT(plan("\"method\":\"grid\",\"parameters\":{\"batch_size\":[1,1,1,1,1,1,1,1,1,1],"
                      "\"steps\":[1,1,1,1,1,1,1,1,1,1],\"optimizer.lr\":[1,1,1,1,1,1,1,1,1,1,1]}",
                      &p, &e),
                 DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "parameters");
    CHECK(strstr(e.message, "too large") != NULL);
    sweep_plan_free(&p);
    CHECK_EQ_INT(plan("\"method\":\"random\",\"count\":0,\"parameters\":{\"optimizer.lr\":[1]}", &p, &e),
                 DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "count");
    sweep_plan_free(&p);
    CHECK_EQ_INT(plan("\"method\":\"grid\",\"mode\":\"up\",\"parameters\":{\"optimizer.lr\":[1]}", &p, &e),
                 DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "mode");
    sweep_plan_free(&p);
}

/* The caller's check: refuses a batch of 4, counting the trials it saw. */
static ddpd_err no_batch_4(void *ctx, const struct spec *spec, struct ddpd_error *err)
{
    (*(int *)ctx)++;
    if (spec->batch_size == 4)
        return ddpd_error_set(err, DDPD_ESPEC, "batch_size", "4 is refused here");
    return DDPD_OK;
}

static void test_check_callback(void)
{
    json_t *body = json_loads("{\"method\":\"grid\",\"parameters\":{\"batch_size\":[1,2,4,8]}}", 0, NULL);
    json_object_set_new(body, "spec", json_loads(BASE, 0, NULL));
    struct sweep_plan p;
    struct ddpd_error e;
    int seen = 0;
    CHECK_EQ_INT(sweep_plan_from_json(body, NULL, no_batch_4, &seen, &p, &e), DDPD_ESPEC);
    CHECK_EQ_INT(seen, 3); /* trials 0, 1 and 2; none after the refusal */
    CHECK_EQ_STR(e.path, "trials[2]");
    CHECK_EQ_STR(e.message, "trial 2 {\"batch_size\":4}: batch_size: 4 is refused here");
    sweep_plan_free(&p);
    json_decref(body);
}

static void test_random_ranges(void)
{
    struct sweep_plan p;
    struct ddpd_error e;
    CHECK_EQ_INT(plan("\"method\":\"random\",\"count\":200,\"seed\":3,\"metric\":\"eval_accuracy\","
                      "\"parameters\":{\"optimizer.lr\":{\"min\":0.001,\"max\":0.1,\"log\":true},"
                      "\"batch_size\":{\"min\":1,\"max\":3,\"type\":\"int\"}}",
                      &p, &e),
                 DDPD_OK);
    CHECK(p.maximize); /* eval_accuracy's default mode */
    int seen[4] = {0};
    for (size_t i = 0; i < p.n; i++) {
        json_t *a = json_loads(p.params[i], 0, NULL);
        double lr = json_real_value(json_object_get(a, "optimizer.lr"));
        json_int_t b = json_integer_value(json_object_get(a, "batch_size"));
        CHECK(lr >= 0.001 && lr <= 0.1);
        CHECK(b >= 1 && b <= 3);
        if (b >= 1 && b <= 3)
            seen[b]++;
        json_decref(a);
    }
    CHECK(seen[1] > 0 && seen[2] > 0 && seen[3] > 0); /* both ends of an int range are drawn */
    sweep_plan_free(&p);
}

static void test_asha(void)
{
    struct sweep_asha a = {.min_steps = 4, .max_steps = 36, .rf = 3};
    int64_t st[SWEEP_ASHA_MAX_RUNGS];
    CHECK_EQ_INT(sweep_asha_rungs(&a, st), 3);
    CHECK(st[0] == 4 && st[1] == 12 && st[2] == 36);
    a.max_steps = 30; /* capped: 4, 12, then 30 */
    CHECK_EQ_INT(sweep_asha_rungs(&a, st), 3);
    CHECK(st[0] == 4 && st[1] == 12 && st[2] == 30);
    a = (struct sweep_asha){.min_steps = 10, .max_steps = 11, .rf = 2};
    CHECK_EQ_INT(sweep_asha_rungs(&a, st), 2);

    /* 9 entered, 8 paused (trial 6 failed at the rung, trial 3 has no metric): keep
     * floor(9/3) = 3; 0.6 tied between trials 4 and 7 at the cut, the lower index goes on. */
    struct sweep_rung_result r[] = {{0, true, 0.9}, {1, true, 0.4}, {2, true, 0.5}, {3, false, 0},
                                    {4, true, 0.6}, {5, true, 0.7}, {7, true, 0.6}, {8, true, 0.8}};
    bool pr[8];
    CHECK_EQ_INT(sweep_asha_promote(r, 8, 9, 3, false, pr), 3);
    CHECK(!pr[0] && pr[1] && pr[2] && !pr[3] && pr[4] && !pr[5] && !pr[6] && !pr[7]);
    /* mode max: the highest three. */
    CHECK_EQ_INT(sweep_asha_promote(r, 8, 9, 3, true, pr), 3);
    CHECK(pr[0] && pr[7] && pr[5] && !pr[1] && !pr[2] && !pr[4] && !pr[6]);
    /* 2 entered with factor 3: still one goes on; a rung whose trials all lack a metric promotes none. */
    CHECK_EQ_INT(sweep_asha_promote(r, 2, 2, 3, false, pr), 1);
    CHECK(pr[1] && !pr[0]);
    CHECK_EQ_INT(sweep_asha_promote(&r[3], 1, 1, 3, false, pr), 0);
    CHECK(!pr[0]);

    /* The plan: every trial's steps are max_steps (epochs dropped), a grid's lists without a count. */
    struct sweep_plan p;
    struct ddpd_error e;
    CHECK_EQ_INT(plan("\"method\":\"asha\",\"metric\":\"loss\",\"asha\":{\"min_steps\":2,\"max_steps\":8},"
                      "\"parameters\":{\"optimizer.lr\":[0.1,0.2]}",
                      &p, &e),
                 DDPD_OK);
    CHECK_EQ_INT((int)p.n, 2);
    CHECK(p.method == SWEEP_ASHA && p.asha.rf == 3 && p.asha.min_steps == 2 && p.asha.max_steps == 8);
    for (size_t i = 0; i < p.n; i++) {
        json_t *sp = json_loads(p.specs[i], 0, NULL);
        CHECK_EQ_INT(json_integer_value(json_object_get(sp, "steps")), 8);
        json_decref(sp);
    }
    sweep_plan_free(&p);
    CHECK_EQ_INT(plan("\"method\":\"asha\",\"metric\":\"loss\",\"asha\":{\"min_steps\":2,\"max_steps\":8},"
                      "\"parameters\":{\"optimizer.lr\":{\"min\":0.1,\"max\":0.2}}",
                      &p, &e),
                 DDPD_ESPEC); /* a range without a count: a grid's lists are needed */
    sweep_plan_free(&p);
    CHECK_EQ_INT(plan("\"method\":\"asha\",\"metric\":\"loss\",\"count\":3,\"seed\":1,"
                      "\"asha\":{\"min_steps\":2,\"max_steps\":8},"
                      "\"parameters\":{\"optimizer.lr\":{\"min\":0.1,\"max\":0.2}}",
                      &p, &e),
                 DDPD_OK);
    CHECK_EQ_INT((int)p.n, 3);
    sweep_plan_free(&p);
}

int main(void)
{
    test_paths();
    test_generator();
    test_grid();
    test_errors();
    test_check_callback();
    test_random_ranges();
    test_asha();
    CHECK_DONE();
}
