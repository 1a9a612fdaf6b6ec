/* test_plan.c — the planner's lines (schema/plan.h): a request survives
 * plan_request_to_json / plan_request_from_json and a job document is a request too; each
 * of the three answers survives plan_answer_encode / plan_answer_decode; anything else is
 * refused. */
#include <jansson.h>

#include "check.h"
#include "schema/plan.h"

#define SPEC3                                                                                                \
    "{\"world_size\":3,\"model\":[{\"type\":\"linear\",\"in\":4,\"out\":2}],\"loss\":\"mse\","               \
    "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},\"data\":{\"type\":\"synthetic\",\"samples\":10},"          \
    "\"batch_size\":2,\"epochs\":1}"

static struct plan_request req, back;
static struct plan_answer ans, got;

static void make_request(void)
{
    struct ddpd_error e;
    memset(&req, 0, sizeof req);
    CHECK_EQ_INT(spec_parse(SPEC3, strlen(SPEC3), NULL, &req.spec, &e), DDPD_OK);
    req.world_size = 3;
    snprintf(req.data_dir, sizeof req.data_dir, "/data");
    req.max_rank_memory = 123456789;
}

static void bad_request(const char *key, const char *value, const char *path)
{
    struct ddpd_error e;
    make_request();
    json_t *j = plan_request_to_json(&req);
    if (value)
        json_object_set_new(j, key, json_loads(value, JSON_DECODE_ANY, NULL));
    else
        json_object_del(j, key);
    ddpd_error_clear(&e);
    CHECK(plan_request_from_json(j, &back, &e) != DDPD_OK);
    CHECK_EQ_STR(e.path, path);
    if (!strstr(e.message, key))
        CHECK__FAIL("%s: the message '%s' does not name the key", key, e.message);
    json_decref(j);
}

static void test_request(void)
{
    struct ddpd_error e;
    make_request();
    json_t *j = plan_request_to_json(&req);
    CHECK(j != NULL);
    CHECK_EQ_INT(plan_request_from_json(j, &back, &e), DDPD_OK);
    CHECK_EQ_INT(back.world_size, 3);
    CHECK_EQ_STR(back.data_dir, "/data");
    CHECK_EQ_INT(back.max_rank_memory, 123456789);
    CHECK_EQ_INT(back.spec.world_size, 3);
    CHECK_EQ_INT(back.spec.batch_size, 2);
    /* Without a limit the key may be absent. */
    json_object_del(j, "max_rank_memory");
    CHECK_EQ_INT(plan_request_from_json(j, &back, &e), DDPD_OK);
    CHECK_EQ_INT(back.max_rank_memory, 0);
    CHECK_EQ_STR(back.init_path, "");
    CHECK(!json_object_get(j, "init_path")); /* left out when there is none */
    /* init.from_job's weights, as the server found them. */
    snprintf(req.init_path, sizeof req.init_path, "/jobs/3/model.safetensors");
    json_t *k = plan_request_to_json(&req);
    CHECK_EQ_INT(plan_request_from_json(k, &back, &e), DDPD_OK);
    CHECK_EQ_STR(back.init_path, "/jobs/3/model.safetensors");
    json_decref(k);
    /* A job document (more keys) is a request too. */
    json_object_set_new(j, "out_dir", json_string("/out"));
    json_object_set_new(j, "rank", json_integer(1));
    CHECK_EQ_INT(plan_request_from_json(j, &back, &e), DDPD_OK);
    json_decref(j);

    bad_request("world_size", NULL, "world_size");
    bad_request("world_size", "1025", "world_size");
    bad_request("data_dir", "7", "data_dir");
    bad_request("init_path", "7", "init_path");
    bad_request("max_rank_memory", "null", "max_rank_memory");
    bad_request("max_rank_memory", "-5", "max_rank_memory");
    make_request();
    j = plan_request_to_json(&req);
    json_object_set_new(j, "spec", json_pack("{s:i}", "world_size", 3));
    CHECK_EQ_INT(plan_request_from_json(j, &back, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "model");
    json_decref(j);
}

static void round_trip(const struct plan_answer *a, int world_size)
{
    char *line = plan_answer_encode(a, 1.5);
    CHECK(line != NULL);
    CHECK(line && !strchr(line, '\n'));
    CHECK(line && plan_answer_decode(line, strlen(line), world_size, &got));
    free(line);
}

static void test_answer(void)
{
    memset(&ans, 0, sizeof ans);
    ans.known = true;
    ans.world_size = 3;
    ans.batches[0] = 5;
    ans.batches[1] = 5;
    ans.batches[2] = 4000000000LL;
    char *line = plan_answer_encode(&ans, 0);
    CHECK_EQ_STR(line, "{\"batches\":[5,5,4000000000]}");
    free(line);
    round_trip(&ans, 3);
    CHECK_EQ_INT(got.code, DDPD_OK);
    CHECK(got.known);
    CHECK_EQ_INT(got.batches[2], 4000000000LL);

    ans.known = false;
    line = plan_answer_encode(&ans, 0);
    CHECK_EQ_STR(line, "{\"batches\":null}");
    free(line);
    round_trip(&ans, 3);
    CHECK_EQ_INT(got.code, DDPD_OK);
    CHECK(!got.known);

    /* A spec error carries its path; a data error reads back as data. */
    memset(&ans, 0, sizeof ans);
    ans.code = DDPD_ESPEC;
    snprintf(ans.path, sizeof ans.path, "model[0].in");
    snprintf(ans.message, sizeof ans.message, "expected 3 \"features\"");
    round_trip(&ans, 3);
    CHECK_EQ_INT(got.code, DDPD_ESPEC);
    CHECK_EQ_STR(got.path, "model[0].in");
    CHECK_EQ_STR(got.message, "expected 3 \"features\"");
    ans.code = DDPD_EDATA;
    round_trip(&ans, 3);
    CHECK_EQ_INT(got.code, DDPD_EDATA);
    CHECK_EQ_STR(got.path, ""); /* only a spec error names a field */
    /* A path that would need escaping is left out, never sent damaged. */
    ans.code = DDPD_ESPEC;
    snprintf(ans.path, sizeof ans.path, "[\"odd key\"]");
    round_trip(&ans, 3);
    CHECK_EQ_INT(got.code, DDPD_ESPEC);
    CHECK_EQ_STR(got.path, "");

    /* Not answers. */
    const char *garbage[] = {
        "",
        "not json",
        "{\"batches\":[1,2]}",    /* another world size */
        "{\"batches\":[1,2,-1]}", /* not a count */
        "{\"batches\":[1,2,\"3\"]}",
        "{\"batches\":7}",
        "{\"event\":\"loss\",\"rank\":0,\"step\":1,\"epoch\":0,\"loss\":1,\"samples_per_s\":1,\"ts\":1}",
    };
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++)
        if (plan_answer_decode(garbage[i], strlen(garbage[i]), 3, &got))
            CHECK__FAIL("'%s' read as an answer", garbage[i]);
}

int main(void)
{
    test_request();
    test_answer();
    CHECK_DONE();
}
