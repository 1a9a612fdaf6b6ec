/* test_jobdoc.c — the worker's stdin document (schema/jobdoc.h): a document survives
 * jobdoc_to_json / jobdoc_from_json with every key, the optional keys read as unset when
 * absent or null, and each bad value is DDPD_ESPEC naming its key in err->path and in the
 * message. The planner's request is a job document read by jobdoc_plan_from_json (no
 * group needed, a rank's document is a request too); each of the planner's three answers
 * survives jobdoc_plan_answer_encode / jobdoc_plan_answer_decode; anything else is refused. */
#include <jansson.h>

#include "check.h"
#include "schema/jobdoc.h"

#define SPEC2                                                                                                \
    "{\"world_size\":2,\"model\":[{\"type\":\"linear\",\"in\":4,\"out\":2}],\"loss\":\"mse\","               \
    "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},\"data\":{\"type\":\"synthetic\",\"samples\":10},"          \
    "\"batch_size\":2,\"epochs\":1}"

static void full_doc(struct jobdoc *d)
{
    struct ddpd_error e;
    memset(d, 0, sizeof *d);
    CHECK_EQ_INT(spec_parse(SPEC2, strlen(SPEC2), NULL, &d->spec, &e), DDPD_OK);
    d->job = 7;
    d->attempt = 3;
    d->world_size = 2;
    d->rank = 1;
    snprintf(d->comm_backend, sizeof d->comm_backend, "cpu");
    snprintf(d->comm_id, sizeof d->comm_id, "00ff");
    snprintf(d->data_dir, sizeof d->data_dir, "/data");
    snprintf(d->out_dir, sizeof d->out_dir, "/var/jobs/7");
    snprintf(d->resume, sizeof d->resume, "/var/jobs/7/ckpt-4");
    snprintf(d->init_path, sizeof d->init_path, "/var/jobs/3/ckpt-200/model.safetensors");
    d->disk_quota = (int64_t)10 << 30;
    d->max_rank_memory = (int64_t)1 << 33;
    d->resume_force = true;
    d->stop_at = 12;
}

static void test_round_trip(void)
{
    struct jobdoc d, back;
    struct ddpd_error e;
    full_doc(&d);
    json_t *j = jobdoc_to_json(&d);
    CHECK(j != NULL);
    const char *keys[] = {
        "job",    "attempt",    "world_size",      "rank",         "comm",   "spec", "data_dir", "out_dir",
        "resume", "disk_quota", "max_rank_memory", "resume_force", "stop_at"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!json_object_get(j, keys[i]))
            CHECK__FAIL("jobdoc_to_json left out %s", keys[i]);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "comm"), "backend")), "cpu");
    CHECK_EQ_INT(jobdoc_from_json(j, &back, &e), DDPD_OK);
    CHECK_EQ_INT(back.job, 7);
    CHECK_EQ_INT(back.attempt, 3);
    CHECK_EQ_INT(back.world_size, 2);
    CHECK_EQ_INT(back.rank, 1);
    CHECK_EQ_STR(back.comm_backend, "cpu");
    CHECK_EQ_STR(back.comm_id, "00ff");
    CHECK_EQ_STR(back.data_dir, "/data");
    CHECK_EQ_STR(back.out_dir, "/var/jobs/7");
    CHECK_EQ_STR(back.resume, "/var/jobs/7/ckpt-4");
    CHECK(back.resume_force);
    CHECK_EQ_INT(back.stop_at, 12);
    CHECK_EQ_STR(back.init_path, "/var/jobs/3/ckpt-200/model.safetensors");
    CHECK_EQ_INT(back.disk_quota, (int64_t)10 << 30);
    CHECK_EQ_INT(back.max_rank_memory, (int64_t)1 << 33);
    CHECK_EQ_INT(back.spec.world_size, 2);
    CHECK_EQ_INT(back.spec.batch_size, 2);
    CHECK_EQ_INT(back.spec.n_layers, d.spec.n_layers);
    json_decref(j);

    /* Unset: no rank (Slurm), no group, no resume, no quota, no memory limit. */
    d.rank = -1;
    d.comm_backend[0] = d.comm_id[0] = d.resume[0] = d.init_path[0] = '\0';
    d.disk_quota = d.max_rank_memory = 0;
    d.resume_force = false;
    d.stop_at = 0;
    d.world_size = d.spec.world_size = 1;
    j = jobdoc_to_json(&d);
    CHECK(j && !json_object_get(j, "rank") && !json_object_get(j, "max_rank_memory") &&
          !json_object_get(j, "init_path") && !json_object_get(j, "resume_force") &&
          !json_object_get(j, "stop_at"));
    CHECK(json_is_null(json_object_get(j, "comm")) && json_is_null(json_object_get(j, "resume")) &&
          json_is_null(json_object_get(j, "disk_quota")));
    CHECK_EQ_INT(jobdoc_from_json(j, &back, &e), DDPD_OK);
    CHECK_EQ_INT(back.rank, -1);
    CHECK_EQ_STR(back.comm_backend, "");
    CHECK_EQ_STR(back.resume, "");
    CHECK(!back.resume_force);
    CHECK_EQ_STR(back.init_path, "");
    CHECK_EQ_INT(back.disk_quota, 0);
    CHECK_EQ_INT(back.max_rank_memory, 0);
    CHECK_EQ_INT(back.stop_at, 0);
    /* One rank ignores whatever `comm` holds. */
    json_object_set_new(j, "comm", json_string("garbage"));
    CHECK_EQ_INT(jobdoc_from_json(j, &back, &e), DDPD_OK);
    json_decref(j);
}

/* The full document with `key` set to the JSON `value` (NULL: removed) must fail naming
 * `path` with `words` in the message. */
static void bad(const char *key, const char *value, const char *path, const char *words)
{
    struct jobdoc d, back;
    struct ddpd_error e;
    full_doc(&d);
    json_t *j = jobdoc_to_json(&d);
    if (value)
        json_object_set_new(j, key, json_loads(value, JSON_DECODE_ANY, NULL));
    else
        json_object_del(j, key);
    ddpd_error_clear(&e);
    CHECK_EQ_INT(jobdoc_from_json(j, &back, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, path);
    if (!strstr(e.message, words))
        CHECK__FAIL("%s = %s: message '%s' lacks '%s'", key, value ? value : "(none)", e.message, words);
    json_decref(j);
}

static void test_bad_values(void)
{
    bad("world_size", NULL, "world_size", "world_size: expected an integer in [1, 1024]");
    bad("world_size", "0", "world_size", "world_size: expected an integer");
    bad("world_size", "\"2\"", "world_size", "world_size: expected an integer");
    bad("world_size", "3", "world_size", "the job document says 3 but the spec says 2");
    bad("rank", "2", "rank", "rank: expected an integer in [0, 1]");
    bad("rank", "-1", "rank", "rank: expected an integer");
    bad("rank", "null", "rank", "rank: expected an integer");
    bad("data_dir", "5", "data_dir", "data_dir: expected a string");
    bad("out_dir", "[]", "out_dir", "out_dir: expected a string");
    bad("resume_force", "1", "resume_force", "resume_force: expected true or false");
    bad("resume_force", "null", "resume_force", "resume_force: expected true or false");
    bad("resume", "true", "resume", "resume: expected a string");
    bad("disk_quota", "-1", "disk_quota", "disk_quota: expected an integer");
    bad("disk_quota", "1.5", "disk_quota", "disk_quota: expected an integer");
    bad("max_rank_memory", "null", "max_rank_memory", "max_rank_memory: expected an integer");
    bad("job", "\"7\"", "job", "job: expected an integer");
    bad("attempt", "-3", "attempt", "attempt: expected an integer");
    bad("stop_at", "-1", "stop_at", "stop_at: expected an integer");
    bad("stop_at", "\"12\"", "stop_at", "stop_at: expected an integer");
    bad("spec", NULL, "spec", "spec: the job document has no spec object");
    bad("spec", "[]", "spec", "spec: the job document has no spec object");
    bad("spec", "{\"world_size\":2}", "model", "");
    bad("comm", "null", "comm", "comm: 2 ranks need");
    bad("comm", "{\"backend\":\"gloo\",\"id\":\"00\"}", "comm", "comm: 2 ranks need");
    bad("comm", "{\"backend\":\"cpu\"}", "comm", "comm: 2 ranks need");
    bad("comm", "{\"backend\":\"nccl\",\"id\":7}", "comm", "comm: 2 ranks need");

    char long_path[JOBDOC_PATH_MAX + 3];
    memset(long_path, 'a', sizeof long_path);
    long_path[0] = long_path[sizeof long_path - 2] = '"';
    long_path[sizeof long_path - 1] = '\0';
    bad("out_dir", long_path, "out_dir", "out_dir: longer than 4095 bytes");

    struct jobdoc back;
    struct ddpd_error e;
    json_t *arr = json_array();
    CHECK_EQ_INT(jobdoc_from_json(arr, &back, &e), DDPD_ESPEC);
    json_decref(arr);

    /* What came before the bad key is kept: the worker names the failing rank. */
    struct jobdoc d;
    full_doc(&d);
    json_t *j = jobdoc_to_json(&d);
    json_object_set_new(j, "out_dir", json_integer(1));
    CHECK_EQ_INT(jobdoc_from_json(j, &back, &e), DDPD_ESPEC);
    CHECK_EQ_INT(back.world_size, 2);
    CHECK_EQ_INT(back.rank, 1);
    json_decref(j);

    /* Without a rank (Slurm's document) the group is needed all the same: only the
     * planner's reading leaves `comm` unread. */
    full_doc(&d);
    d.rank = -1;
    d.comm_backend[0] = '\0';
    j = jobdoc_to_json(&d);
    ddpd_error_clear(&e);
    CHECK_EQ_INT(jobdoc_from_json(j, &back, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "comm");
    CHECK_EQ_INT(jobdoc_plan_from_json(j, &back, &e), DDPD_OK);
    json_decref(j);
}

#define SPEC3                                                                                                \
    "{\"world_size\":3,\"model\":[{\"type\":\"linear\",\"in\":4,\"out\":2}],\"loss\":\"mse\","               \
    "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},\"data\":{\"type\":\"synthetic\",\"samples\":10},"          \
    "\"batch_size\":2,\"epochs\":1}"

static struct jobdoc req, back;
static struct jobdoc_plan_answer ans, got;

/* The request as the server builds it (api.c). */
static void make_request(void)
{
    struct ddpd_error e;
    memset(&req, 0, sizeof req);
    CHECK_EQ_INT(spec_parse(SPEC3, strlen(SPEC3), NULL, &req.spec, &e), DDPD_OK);
    req.world_size = 3;
    req.rank = -1; /* as api.c builds it: no rank, no group, no out_dir, no resume */
    snprintf(req.data_dir, sizeof req.data_dir, "/data");
    req.max_rank_memory = 123456789;
}

static void bad_request(const char *key, const char *value, const char *path)
{
    struct ddpd_error e;
    make_request();
    json_t *j = jobdoc_to_json(&req);
    if (value)
        json_object_set_new(j, key, json_loads(value, JSON_DECODE_ANY, NULL));
    else
        json_object_del(j, key);
    ddpd_error_clear(&e);
    CHECK(jobdoc_plan_from_json(j, &back, &e) != DDPD_OK);
    CHECK_EQ_STR(e.path, path);
    if (!strstr(e.message, key))
        CHECK__FAIL("%s: the message '%s' does not name the key", key, e.message);
    json_decref(j);
}

static void test_plan_request(void)
{
    struct ddpd_error e;
    make_request();
    json_t *j = jobdoc_to_json(&req);
    CHECK(j != NULL);
    CHECK_EQ_INT(jobdoc_plan_from_json(j, &back, &e), DDPD_OK);
    CHECK_EQ_INT(back.world_size, 3);
    CHECK_EQ_STR(back.data_dir, "/data");
    CHECK_EQ_INT(back.max_rank_memory, 123456789);
    CHECK_EQ_INT(back.spec.world_size, 3);
    CHECK_EQ_INT(back.spec.batch_size, 2);
    CHECK_EQ_INT(back.rank, -1);
    CHECK_EQ_STR(back.comm_backend, "");
    CHECK_EQ_STR(back.out_dir, "");
    /* Three ranks and no group: a plan, not a rank's document. */
    CHECK(json_is_null(json_object_get(j, "comm")));
    ddpd_error_clear(&e);
    CHECK_EQ_INT(jobdoc_from_json(j, &back, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "comm");
    CHECK_EQ_INT(jobdoc_plan_from_json(j, &back, &e), DDPD_OK);
    /* Without a limit the key may be absent. */
    json_object_del(j, "max_rank_memory");
    CHECK_EQ_INT(jobdoc_plan_from_json(j, &back, &e), DDPD_OK);
    CHECK_EQ_INT(back.max_rank_memory, 0);
    CHECK_EQ_STR(back.init_path, "");
    CHECK(!json_object_get(j, "init_path")); /* left out when there is none */
    /* init.from_job's weights, as the server found them. */
    snprintf(req.init_path, sizeof req.init_path, "/jobs/3/model.safetensors");
    json_t *k = jobdoc_to_json(&req);
    CHECK_EQ_INT(jobdoc_plan_from_json(k, &back, &e), DDPD_OK);
    CHECK_EQ_STR(back.init_path, "/jobs/3/model.safetensors");
    json_decref(k);
    /* A rank's document (more keys) is a request too; its group is not read, whatever
     * `comm` holds, and the other keys are. */
    json_object_set_new(j, "out_dir", json_string("/out"));
    json_object_set_new(j, "rank", json_integer(1));
    json_object_set_new(j, "comm", json_pack("{s:s, s:s}", "backend", "cpu", "id", "00ff"));
    CHECK_EQ_INT(jobdoc_plan_from_json(j, &back, &e), DDPD_OK);
    CHECK_EQ_INT(back.rank, 1);
    CHECK_EQ_STR(back.out_dir, "/out");
    CHECK_EQ_STR(back.comm_backend, "");
    json_object_set_new(j, "comm", json_string("garbage"));
    CHECK_EQ_INT(jobdoc_plan_from_json(j, &back, &e), DDPD_OK);
    json_decref(j);

    bad_request("world_size", NULL, "world_size");
    bad_request("world_size", "1025", "world_size");
    bad_request("data_dir", "7", "data_dir");
    bad_request("init_path", "7", "init_path");
    bad_request("max_rank_memory", "null", "max_rank_memory");
    bad_request("max_rank_memory", "-5", "max_rank_memory");
    bad_request("rank", "3", "rank");
    bad_request("out_dir", "[]", "out_dir");
    bad_request("world_size", "2", "world_size"); /* the spec says 3 */
    make_request();
    j = jobdoc_to_json(&req);
    json_object_set_new(j, "spec", json_pack("{s:i}", "world_size", 3));
    CHECK_EQ_INT(jobdoc_plan_from_json(j, &back, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "model");
    json_object_del(j, "spec");
    CHECK_EQ_INT(jobdoc_plan_from_json(j, &back, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "spec");
    json_decref(j);
}

static void round_trip(const struct jobdoc_plan_answer *a, int world_size)
{
    char *line = jobdoc_plan_answer_encode(a, 1.5);
    CHECK(line != NULL);
    CHECK(line && !strchr(line, '\n'));
    CHECK(line && jobdoc_plan_answer_decode(line, strlen(line), world_size, &got));
    free(line);
}

static void test_plan_answer(void)
{
    memset(&ans, 0, sizeof ans);
    ans.known = true;
    ans.world_size = 3;
    ans.batches[0] = 5;
    ans.batches[1] = 5;
    ans.batches[2] = 4000000000LL;
    char *line = jobdoc_plan_answer_encode(&ans, 0);
    CHECK_EQ_STR(line, "{\"batches\":[5,5,4000000000]}");
    free(line);
    round_trip(&ans, 3);
    CHECK_EQ_INT(got.code, DDPD_OK);
    CHECK(got.known);
    CHECK_EQ_INT(got.batches[2], 4000000000LL);

    ans.known = false;
    line = jobdoc_plan_answer_encode(&ans, 0);
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
    /* A data file changed since the checkpoint of a resume: its own code (409 from the
     * API, not bad_data's 422) and the field it names, which the kind "data" alone lost. */
    ans.code = DDPD_EDATACHANGED;
    snprintf(ans.path, sizeof ans.path, "data.path");
    snprintf(ans.message, sizeof ans.message, "data.path \"t.bin\" changed since the checkpoint at step 4");
    char *changed = jobdoc_plan_answer_encode(&ans, 2);
    CHECK(changed && strstr(changed, "\"kind\":\"data\"") && strstr(changed, "\"code\":\"data_changed\""));
    free(changed);
    round_trip(&ans, 3);
    CHECK_EQ_INT(got.code, DDPD_EDATACHANGED);
    CHECK_EQ_STR(got.path, "data.path");
    CHECK_EQ_STR(got.message, ans.message);
    /* A code that is not a rank's error (or none) reads as the kind says. */
    const char *odd[] = {"{\"event\":\"error\",\"rank\":0,\"kind\":\"data\",\"message\":\"m\",\"ts\":1,"
                         "\"code\":\"conflict\"}",
                         "{\"event\":\"error\",\"rank\":0,\"kind\":\"data\",\"message\":\"m\",\"ts\":1,"
                         "\"code\":\"ok\"}",
                         "{\"event\":\"error\",\"rank\":0,\"kind\":\"data\",\"message\":\"m\",\"ts\":1,"
                         "\"code\":7}"};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        CHECK(jobdoc_plan_answer_decode(odd[i], strlen(odd[i]), 3, &got));
        CHECK_EQ_INT(got.code, DDPD_EDATA);
    }

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
        if (jobdoc_plan_answer_decode(garbage[i], strlen(garbage[i]), 3, &got))
            CHECK__FAIL("'%s' read as an answer", garbage[i]);
}

int main(void)
{
    test_round_trip();
    test_bad_values();
    test_plan_request();
    test_plan_answer();
    CHECK_DONE();
}
