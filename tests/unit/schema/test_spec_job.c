/* test_spec_job.c — the spec's job-level keys: early_stop and checkpoint.keep_best (issue
 * 31, spec_watch.c), and the shared cluster's priority, preemptible, time_limit and
 * preempt_grace (issue 32): defaults, every bad value named with its path and message,
 * and the printed form parsing back to the same values. */
#include "check.h"

#include <jansson.h>

#include "schema/spec.h"
#include "spec_pieces.h"

/* early_stop and checkpoint.keep_best (issue 31, spec_watch.c): defaults, every bad field
 * named with its message, and spec_to_json's form parsing back to the same watches. */
#define CLASSIFIER                                                                                           \
    "\"model\":[{\"type\":\"linear\",\"in\":4,\"out\":3}],\"loss\":\"cross_entropy\"," OPTIM "," DATA        \
    "," BATCH
#define WITH_EVAL(more)                                                                                      \
    "{" CLASSIFIER ",\"eval\":{\"data\":"                                                                    \
    "{\"type\":\"synthetic\",\"samples\":6},\"every_steps\":2}" more "}"

static void test_watch(void)
{
    struct spec s;
    struct ddpd_error e;
    CHECK_EQ_INT(parse(WITH_EVAL(",\"early_stop\":{\"metric\":\"eval_loss\"}"), &s, &e), DDPD_OK);
    CHECK(s.early_stop.on && !s.keep_best.on);
    CHECK_EQ_INT(s.early_stop.metric, WATCH_EVAL_LOSS);
    CHECK_EQ_INT(s.early_stop.mode, WATCH_MIN);
    CHECK_EQ_INT(s.early_stop.patience, 3); /* Lightning's defaults */
    CHECK(s.early_stop.min_delta == 0);
    CHECK_EQ_INT(
        parse(WITH_EVAL(",\"checkpoint\":{\"keep_best\":{\"metric\":\"eval_accuracy\"}},"
                        "\"early_stop\":{\"metric\":\"eval_accuracy\",\"mode\":\"min\",\"patience\":0,"
                        "\"min_delta\":-0.5}"),
              &s, &e),
        DDPD_OK);
    CHECK(s.keep_best.on && s.keep_best.metric == WATCH_EVAL_ACCURACY && s.keep_best.mode == WATCH_MAX);
    CHECK(s.early_stop.mode == WATCH_MIN && s.early_stop.patience == 0 && s.early_stop.min_delta == -0.5);
    json_t *j = spec_to_json(&s);
    char *text = json_dumps(j, 0);
    struct spec back;
    CHECK_EQ_INT(parse(text, &back, &e), DDPD_OK);
    CHECK(!memcmp(&back.keep_best, &s.keep_best, sizeof s.keep_best));
    CHECK(!memcmp(&back.early_stop, &s.early_stop, sizeof s.early_stop));
    free(text);
    json_decref(j);

    static const struct {
        const char *json, *path, *message;
    } bad[] = {
        {WITH_EVAL(",\"early_stop\":{\"mode\":\"min\"}"), "early_stop.metric",
         "missing (expected one of eval_loss, eval_accuracy)"},
        {WITH_EVAL(",\"early_stop\":{\"metric\":\"loss\"}"), "early_stop.metric",
         "expected one of eval_loss, eval_accuracy, got \"loss\""},
        {WITH_EVAL(",\"early_stop\":{\"metric\":\"eval_loss\",\"mode\":\"lower\"}"), "early_stop.mode",
         "expected one of min, max, got \"lower\""},
        {WITH_EVAL(",\"early_stop\":{\"metric\":\"eval_loss\",\"patience\":-1}"), "early_stop.patience",
         "expected a non-negative integer, got -1"},
        {WITH_EVAL(",\"early_stop\":{\"metric\":\"eval_loss\",\"min_delta\":\"0.1\"}"),
         "early_stop.min_delta", "expected a finite number, got \"0.1\""},
        {WITH_EVAL(",\"early_stop\":{\"metric\":\"eval_loss\",\"patiense\":2}"), "early_stop.patiense",
         "unknown key (did you mean \"patience\"? expected one of metric, mode, patience, min_delta)"},
        {WITH_EVAL(",\"early_stop\":true"), "early_stop",
         "expected an object such as {\"metric\": \"eval_loss\", \"patience\": 3}, got true"},
        {OK_PLUS(",\"early_stop\":{\"metric\":\"eval_loss\"}"), "early_stop",
         "watches eval_loss, which needs eval (eval.every_steps >= 1 with eval.data); the spec has no eval"},
        {OK_PLUS(",\"checkpoint\":{\"keep_best\":{\"metric\":\"eval_loss\"}}"), "checkpoint.keep_best",
         "watches eval_loss, which needs eval (eval.every_steps >= 1 with eval.data); the spec has no eval"},
        {WITH_EVAL(",\"checkpoint\":{\"keep_best\":{\"metric\":\"eval_loss\",\"patience\":2}}"),
         "checkpoint.keep_best.patience", "unknown key (expected one of metric, mode)"},
        {WITH_EVAL(",\"checkpoint\":{\"keep_best\":\"eval_loss\"}"), "checkpoint.keep_best",
         "expected an object such as {\"metric\": \"eval_loss\"}, got \"eval_loss\""},
        {"{" MODEL "," LOSS "," OPTIM "," DATA "," BATCH
         ",\"eval\":{\"data\":{\"type\":\"synthetic\",\"samples\":6},\"every_steps\":2},"
         "\"checkpoint\":{\"keep_best\":{\"metric\":\"eval_accuracy\"}}}",
         "checkpoint.keep_best.metric",
         "eval_accuracy needs a classifier (loss \"cross_entropy\"), the loss is \"mse\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ_INT(parse(bad[i].json, &s, &e), DDPD_ESPEC);
        CHECK_EQ_STR(e.path, bad[i].path);
        CHECK_EQ_STR(e.message, bad[i].message);
    }
}

/* The scheduling fields (docs/scheduling.md). */
static void test_cluster(void)
{
    struct spec s;
    struct ddpd_error e;
    CHECK_EQ_INT(parse(OK_PLUS(""), &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.priority, SPEC_PRIORITY_DEFAULT);
    CHECK(s.preemptible && s.time_limit == 0 && s.preempt_grace == 0);
    CHECK_EQ_INT(parse(OK_PLUS(",\"priority\":100,\"preemptible\":false,\"time_limit\":90.5,"
                               "\"preempt_grace\":7"),
                       &s, &e),
                 DDPD_OK);
    CHECK(s.priority == 100 && !s.preemptible && s.time_limit == 90.5 && s.preempt_grace == 7);
    json_t *j = spec_to_json(&s);
    CHECK(json_integer_value(json_object_get(j, "priority")) == 100);
    CHECK(json_is_false(json_object_get(j, "preemptible")));
    char *text = json_dumps(j, 0);
    struct spec back;
    CHECK_EQ_INT(parse(text, &back, &e), DDPD_OK);
    check_same(&s, &back);
    free(text);
    json_decref(j);
    /* Without a limit or a grace the printed spec leaves them out. */
    CHECK_EQ_INT(parse(OK_PLUS(""), &s, &e), DDPD_OK);
    j = spec_to_json(&s);
    CHECK(!json_object_get(j, "time_limit") && !json_object_get(j, "preempt_grace"));
    json_decref(j);

    static const struct {
        const char *json, *path;
    } bad[] = {
        {OK_PLUS(",\"priority\":101"), "priority"},
        {OK_PLUS(",\"priority\":-1"), "priority"},
        {OK_PLUS(",\"priority\":5.5"), "priority"},
        {OK_PLUS(",\"priority\":\"high\""), "priority"},
        {OK_PLUS(",\"preemptible\":1"), "preemptible"},
        {OK_PLUS(",\"time_limit\":0"), "time_limit"},
        {OK_PLUS(",\"time_limit\":-5"), "time_limit"},
        {OK_PLUS(",\"preempt_grace\":0"), "preempt_grace"},
        {OK_PLUS(",\"preempt_grace\":86401"), "preempt_grace"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ_INT(parse(bad[i].json, &s, &e), DDPD_ESPEC);
        CHECK_EQ_STR(e.path, bad[i].path);
        CHECK(e.message[0] != '\0');
    }
}

int main(void)
{
    test_watch();
    test_cluster();
    CHECK_DONE();
}
