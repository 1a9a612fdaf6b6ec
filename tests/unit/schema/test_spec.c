/* test_spec.c — the job spec of CONTRACT.md §2: the seed example and the defaults parse
 * to the values the contract promises, every kind of invalid spec fails with its exact
 * path and message, and spec_to_json prints a spec that parses back to the same value. */
#include "check.h"

#include <jansson.h>

#include "schema/spec.h"

/* Pieces of a valid spec, to build specs that are wrong in exactly one place. */
#define MODEL                                       "\"model\":[{\"type\":\"linear\",\"in\":4,\"out\":2}]"
#define LOSS                                        "\"loss\":\"mse\""
#define OPTIM                                       "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1}"
#define DATA                                        "\"data\":{\"type\":\"synthetic\",\"samples\":10}"
#define BATCH                                       "\"batch_size\":2,\"epochs\":1"
#define SPEC(model, loss, optim, data, batch, more) "{" model "," loss "," optim "," data "," batch more "}"
/* A valid spec plus `more` (which starts with a comma). */
#define OK_PLUS(more) SPEC(MODEL, LOSS, OPTIM, DATA, BATCH, more)
/* The widest model the caps allow (2^40 + 2^21 weights). */
#define WIDE_MODEL                                                                                           \
    "\"model\":[{\"type\":\"linear\",\"in\":1048576,\"out\":1048576},{\"type\":\"relu\"},"                   \
    "{\"type\":\"linear\",\"in\":1048576,\"out\":2}]"
#define WITH_MODEL(m) SPEC("\"model\":" m, LOSS, OPTIM, DATA, BATCH, "")
#define WITH_OPTIM(o) SPEC(MODEL, LOSS, "\"optimizer\":" o, DATA, BATCH, "")
#define WITH_DATA(d)  SPEC(MODEL, LOSS, OPTIM, "\"data\":" d, BATCH, "")
#define WITH_CSV(loss, target)                                                                               \
    SPEC(MODEL, "\"loss\":\"" loss "\"", OPTIM,                                                              \
         "\"data\":{\"type\":\"csv\",\"path\":\"t.csv\",\"target\":" target "}", BATCH, "")

static const char *seed_example =
    "{\n"
    "  \"name\": \"seed-example\",\n"
    "  \"world_size\": 2,\n"
    "  \"device\": \"cpu\",\n"
    "  \"model\": [ {\"type\": \"linear\", \"in\": 10, \"out\": 5} ],\n"
    "  \"loss\": \"mse\",\n"
    "  \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01},\n"
    "  \"data\": {\"type\": \"synthetic\", \"samples\": 3000, \"seed\": 1},\n"
    "  \"batch_size\": 3,\n"
    "  \"epochs\": 1,\n"
    "  \"grad_accum\": 1,\n"
    "  \"ddp\": {\"bucket_cap_mb\": 25, \"join\": \"auto\", \"divide_by_initial_world_size\": true, "
    "\"timeout_s\": 300},\n"
    "  \"init\": {\"seed\": 0},\n"
    "  \"checkpoint\": {\"every_steps\": 0},\n"
    "  \"log_every\": 1,\n"
    "  \"max_restarts\": 0\n"
    "}\n";

static ddpd_err parse(const char *json, struct spec *s, struct ddpd_error *e)
{
    return spec_parse(json, strlen(json), NULL, s, e);
}

static void test_seed_example(void)
{
    struct spec s;
    struct ddpd_error e;
    CHECK_EQ_INT(parse(seed_example, &s, &e), DDPD_OK);
    CHECK_EQ_STR(e.message, "");
    CHECK_EQ_STR(s.name, "seed-example");
    CHECK_EQ_INT(s.world_size, 2);
    CHECK_EQ_INT(s.device, DEVICE_CPU);
    CHECK(s.device_set);
    CHECK_EQ_INT(s.n_layers, 1);
    CHECK_EQ_INT(s.layers[0].kind, LAYER_LINEAR);
    CHECK_EQ_INT(s.layers[0].in, 10);
    CHECK_EQ_INT(s.layers[0].out, 5);
    CHECK(s.layers[0].bias);
    CHECK_EQ_INT(s.loss, LOSS_MSE);
    CHECK_EQ_INT(s.optim.kind, OPTIM_SGD);
    CHECK(s.optim.lr == 0.01);
    CHECK(s.optim.momentum == 0 && s.optim.dampening == 0 && s.optim.weight_decay == 0);
    CHECK(!s.optim.nesterov);
    CHECK_EQ_INT(s.data.kind, DATA_SYNTHETIC);
    CHECK_EQ_INT(s.data.samples, 3000);
    CHECK_EQ_INT(s.data.seed, 1);
    CHECK(s.data.shuffle);
    CHECK(!s.data.drop_last);
    CHECK_EQ_INT(s.batch_size, 3);
    CHECK_EQ_INT(s.epochs, 1);
    CHECK_EQ_INT(s.steps, 0);
    CHECK_EQ_INT(s.grad_accum, 1);
    CHECK(s.ddp.bucket_cap_mb == 25);
    CHECK_EQ_INT(s.ddp.join, JOIN_AUTO);
    CHECK(s.ddp.divide_by_initial_world_size);
    CHECK_EQ_INT(s.ddp.backend, BACKEND_CPU);
    CHECK(!s.ddp.backend_set);
    CHECK(s.ddp.timeout_s == 300);
    CHECK_EQ_INT(s.init_seed, 0);
    CHECK_EQ_STR(s.init_from, "");
    CHECK_EQ_INT(s.checkpoint_every, 0);
    CHECK_EQ_INT(s.checkpoint_keep_last, 3);
    CHECK_EQ_INT(s.log_every, 1);
    CHECK_EQ_INT(s.max_restarts, 0);
    CHECK_EQ_INT(s.on_nonfinite, NONFINITE_FAIL);
    CHECK_EQ_INT(spec_param_count(&s), 55);
    CHECK_EQ_INT(spec_in_width(&s), 10);
    CHECK_EQ_INT(spec_out_width(&s), 5);
}

static void test_defaults(void)
{
    struct spec s;
    struct ddpd_error e;
    CHECK_EQ_INT(parse(OK_PLUS(""), &s, &e), DDPD_OK);
    CHECK_EQ_STR(s.name, "");
    CHECK_EQ_INT(s.world_size, 1);
    CHECK_EQ_INT(s.device, DEVICE_CPU);
    CHECK(!s.device_set);
    CHECK(s.layers[0].bias);
    CHECK(s.data.shuffle);
    CHECK(!s.data.drop_last);
    CHECK_EQ_INT(s.data.seed, 0);
    CHECK_EQ_INT(s.grad_accum, 1);
    CHECK_EQ_INT(s.log_every, 1);
    CHECK_EQ_INT(s.max_restarts, 0);
    CHECK_EQ_INT(s.checkpoint_every, 0);
    CHECK_EQ_INT(s.checkpoint_keep_last, 3); /* three checkpoints unless the spec says */
    CHECK(s.ddp.bucket_cap_mb == 25);
    CHECK_EQ_INT(s.ddp.join, JOIN_AUTO);
    CHECK(s.ddp.divide_by_initial_world_size);
    CHECK_EQ_INT(s.ddp.backend, BACKEND_CPU);
    CHECK(s.ddp.timeout_s == 300);
    CHECK_EQ_INT(s.init_seed, 0);
    CHECK_EQ_STR(s.init_from, "");

    /* The server's default device, and the backend that follows from it. */
    struct spec_parse_opts cuda = {.default_device = DEVICE_CUDA};
    const char *j = OK_PLUS("");
    CHECK_EQ_INT(spec_parse(j, strlen(j), &cuda, &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.device, DEVICE_CUDA);
    CHECK(!s.device_set);
    CHECK_EQ_INT(s.ddp.backend, BACKEND_NCCL);
    j = OK_PLUS(",\"device\":\"cpu\"");
    CHECK_EQ_INT(spec_parse(j, strlen(j), &cuda, &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.device, DEVICE_CPU);
    CHECK(s.device_set);
    CHECK_EQ_INT(s.ddp.backend, BACKEND_CPU);
    /* cuda with the CPU backend reduces host-staged copies: allowed. */
    j = OK_PLUS(",\"device\":\"cuda\",\"ddp\":{\"backend\":\"cpu\"}");
    CHECK_EQ_INT(spec_parse(j, strlen(j), NULL, &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.ddp.backend, BACKEND_CPU);
    CHECK(s.ddp.backend_set);

    /* AdamW's defaults are PyTorch's, except the contract's weight_decay 0.01 (= PyTorch's). */
    CHECK_EQ_INT(parse(WITH_OPTIM("{\"type\":\"adamw\"}"), &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.optim.kind, OPTIM_ADAMW);
    CHECK(s.optim.lr == 0.001);
    CHECK(s.optim.beta1 == 0.9 && s.optim.beta2 == 0.999);
    CHECK(s.optim.eps == 1e-8);
    CHECK(s.optim.weight_decay == 0.01);
}

static void test_valid_variants(void)
{
    struct spec s;
    struct ddpd_error e;
    /* Activations take their width from the layer before; the last layer may be one. */
    const char *j = WITH_MODEL("[{\"type\":\"linear\",\"in\":4,\"out\":8},{\"type\":\"relu\"},"
                               "{\"type\":\"gelu\"},{\"type\":\"linear\",\"in\":8,\"out\":2,"
                               "\"bias\":false},{\"type\":\"tanh\"},{\"type\":\"sigmoid\"}]");
    CHECK_EQ_INT(parse(j, &s, &e), DDPD_OK);
    CHECK_EQ_STR(e.path, "");
    CHECK_EQ_INT(s.n_layers, 6);
    CHECK_EQ_INT(s.layers[1].kind, LAYER_RELU);
    CHECK_EQ_INT(s.layers[1].in, 8);
    CHECK_EQ_INT(s.layers[1].out, 8);
    CHECK_EQ_INT(s.layers[2].kind, LAYER_GELU);
    CHECK(!s.layers[3].bias);
    CHECK_EQ_INT(s.layers[5].kind, LAYER_SIGMOID);
    CHECK_EQ_INT(s.layers[5].in, 2);
    CHECK_EQ_INT(spec_param_count(&s), 4 * 8 + 8 + 8 * 2);
    CHECK_EQ_INT(spec_in_width(&s), 4);
    CHECK_EQ_INT(spec_out_width(&s), 2);

    /* Numbers: integers are accepted where reals are expected. */
    CHECK_EQ_INT(parse(WITH_OPTIM("{\"type\":\"sgd\",\"lr\":1,\"momentum\":0.9,\"nesterov\":true}"), &s, &e),
                 DDPD_OK);
    CHECK(s.optim.lr == 1.0 && s.optim.momentum == 0.9 && s.optim.nesterov);

    /* csv with one target written as a string or a list, cross_entropy, per-rank files. */
    CHECK_EQ_INT(parse(WITH_CSV("mse", "[\"a\",\"b\"]"), &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.data.n_targets, 2);
    CHECK_EQ_STR(s.data.targets[1], "b");
    CHECK_EQ_STR(s.data.path, "t.csv");
    CHECK_EQ_INT(parse(WITH_CSV("cross_entropy", "\"label\""), &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.data.n_targets, 1);
    CHECK_EQ_STR(s.data.targets[0], "label");
    CHECK_EQ_INT(parse(WITH_DATA("{\"type\":\"npy\",\"x\":\"shards/x-{rank}.npy\",\"y\":"
                                 "\"./y-{rank}..npy\",\"shuffle\":false,\"drop_last\":true,\"seed\":7}"),
                       &s, &e),
                 DDPD_OK);
    CHECK_EQ_STR(s.data.x, "shards/x-{rank}.npy");
    CHECK_EQ_STR(s.data.y, "./y-{rank}..npy");
    CHECK(!s.data.shuffle && s.data.drop_last);
    CHECK_EQ_INT(s.data.seed, 7);

    j = OK_PLUS(",\"ddp\":{\"join\":false,\"bucket_cap_mb\":0.5},\"init\":{\"from\":\"w.safetensors\"}"
                ",\"max_restarts\":100,\"world_size\":1024,\"name\":\"\xc3\xa9t\xc3\xa9\"");
    CHECK_EQ_INT(parse(j, &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.ddp.join, JOIN_FALSE);
    CHECK(s.ddp.bucket_cap_mb == 0.5);
    CHECK_EQ_STR(s.init_from, "w.safetensors");
    CHECK_EQ_INT(s.max_restarts, 100);
    CHECK_EQ_INT(s.world_size, 1024);
    CHECK_EQ_STR(s.name, "\xc3\xa9t\xc3\xa9");

    /* init.from_job: another job's final model or newest checkpoint, or one step's. */
    j = OK_PLUS(",\"init\":{\"from_job\":7}");
    CHECK_EQ_INT(parse(j, &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.init_from_job, 7);
    CHECK_EQ_INT(s.init_from_step, -1);
    CHECK_EQ_STR(s.init_from, "");
    j = OK_PLUS(",\"init\":{\"from_job\":7,\"step\":200}");
    CHECK_EQ_INT(parse(j, &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.init_from_job, 7);
    CHECK_EQ_INT(s.init_from_step, 200);

    j = SPEC(MODEL, LOSS, OPTIM, DATA, "\"batch_size\":2,\"steps\":50", ",\"ddp\":{\"join\":true}");
    CHECK_EQ_INT(parse(j, &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.steps, 50);
    CHECK_EQ_INT(s.epochs, 0);
    CHECK_EQ_INT(s.ddp.join, JOIN_TRUE);

    /* 64 layers is the limit, not over it; width 1048576 is allowed. */
    char big[4096];
    size_t o = (size_t)snprintf(big, sizeof big,
                                "{\"model\":[{\"type\":\"linear\",\"in\":1048576,"
                                "\"out\":2}");
    for (int i = 1; i < SPEC_MAX_LIST; i++)
        o += (size_t)snprintf(big + o, sizeof big - o, ",{\"type\":\"relu\"}");
    snprintf(big + o, sizeof big - o, "]," LOSS "," OPTIM "," DATA "," BATCH "}");
    CHECK_EQ_INT(parse(big, &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.n_layers, 64);

    /* spec_from_json: the same validation on a jansson value. */
    json_t *root = json_loads(OK_PLUS(""), 0, NULL);
    CHECK_EQ_INT(spec_from_json(root, NULL, &s, &e), DDPD_OK);
    json_object_set_new(root, "batch_size", json_integer(0));
    CHECK_EQ_INT(spec_from_json(root, NULL, &s, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "batch_size");
    CHECK_EQ_STR(e.message, "expected a positive integer, got 0");
    json_decref(root);
    CHECK_EQ_INT(spec_from_json(NULL, NULL, &s, &e), DDPD_ESPEC);
    root = json_string("x");
    CHECK_EQ_INT(spec_from_json(root, NULL, &s, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.message, "expected a JSON object at the top level, got \"x\"");
    json_decref(root);
    /* jansson can hold strings with NUL bytes even though the parser refuses them. */
    root = json_loads(WITH_DATA("{\"type\":\"npy\",\"x\":\"a\",\"y\":\"b\"}"), 0, NULL);
    json_object_set_new(json_object_get(root, "data"), "x", json_stringn("a\0b", 3));
    CHECK_EQ_INT(spec_from_json(root, NULL, &s, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "data.x");
    CHECK_EQ_STR(e.message, "must not contain NUL bytes");
    json_decref(root);

    CHECK_EQ_STR(layer_kind_name(LAYER_GELU), "gelu");
    CHECK_EQ_STR(loss_kind_name(LOSS_CROSS_ENTROPY), "cross_entropy");
    CHECK_EQ_STR(device_kind_name(DEVICE_CUDA), "cuda");
    CHECK_EQ_STR(device_kind_name((device_kind)9), "unknown");
}

struct bad_case {
    const char *json; /* "@..." = built by make_json() */
    ddpd_err code;
    const char *path, *message;
    int line, column; /* EJSON only */
};

/* A row without line and column (they are checked for EJSON only). */
#define BAD(json, code, path, message)                                                                       \
    {                                                                                                        \
        json, code, path, message, 0, 0                                                                      \
    }

static const struct bad_case bad_cases[] = {
    /* JSON itself */
    {"{\n  \"loss\": \"mse\",\n}", DDPD_EJSON, "",
     "malformed JSON at line 3, column 1: string or '}' expected near '}'", 3, 1},
    {"", DDPD_EJSON, "", "malformed JSON at line 1, column 1: '[' or '{' expected near end of file", 1, 1},
    {OK_PLUS("") " x", DDPD_EJSON, "", "malformed JSON at line 1, column 162: end of file expected near 'x'",
     1, 162},
    {"{\"loss\":\"mse\",\n \"loss\":\"mse\"}", DDPD_EJSON, "",
     "malformed JSON at line 2, column 7: duplicate key \"loss\"", 2, 7},
    {"{\"optimizer\":{\"divide_by_initial_world_size\":1,\"divide_by_initial_world_size\":2}}", DDPD_EJSON,
     "", "malformed JSON at line 1, column 77: duplicate key \"divide_by_initial_world_size\"", 1, 77},
    {"{\"a\":1e999}", DDPD_EJSON, "",
     "malformed JSON at line 1, column 10: real number overflow near '1e999'", 1, 10},
    {"5", DDPD_EJSON, "", "malformed JSON at line 1, column 1: '[' or '{' expected near '5'", 1, 1},
    BAD("[" OK_PLUS("") "]", DDPD_ESPEC, "", "expected a JSON object at the top level, got an array"),
    BAD("@big", DDPD_ETOOBIG, "", "the spec is 1048577 bytes; the limit is 1048576 bytes (1 MiB)"),

    /* unknown keys at every level */
    BAD(OK_PLUS(",\"epoch\":1"), DDPD_ESPEC, "epoch",
        "unknown key (did you mean \"epochs\"? expected one of name, world_size, device, precision, "
        "model, loss, optimizer, data, batch_size, epochs, steps, grad_accum, ddp, init, checkpoint, "
        "log_every, max_restarts, on_nonfinite)"),
    BAD(OK_PLUS(",\"learning rate\":1"), DDPD_ESPEC, "[\"learning rate\"]",
        "unknown key (expected one of name, world_size, device, precision, model, loss, optimizer, "
        "data, batch_size, epochs, steps, grad_accum, ddp, init, checkpoint, log_every, max_restarts, "
        "on_nonfinite)"),
    BAD(WITH_OPTIM("{\"type\":\"sgd\",\"lr\":0.1,\"momentun\":0.9}"), DDPD_ESPEC, "optimizer.momentun",
        "unknown key (did you mean \"momentum\"? expected one of type, lr, momentum, dampening, "
        "weight_decay, nesterov)"),
    BAD(WITH_OPTIM("{\"type\":\"adamw\",\"momentum\":0.9}"), DDPD_ESPEC, "optimizer.momentum",
        "unknown key (expected one of type, lr, betas, eps, weight_decay)"),
    BAD(WITH_DATA("{\"type\":\"synthetic\",\"samples\":10,\"x\":\"a.npy\"}"), DDPD_ESPEC, "data.x",
        "unknown key (expected one of type, samples, seed, shuffle, drop_last)"),
    BAD(OK_PLUS(",\"ddp\":{\"bucket_cap\":1}"), DDPD_ESPEC, "ddp.bucket_cap",
        "unknown key (expected one of bucket_cap_mb, join, divide_by_initial_world_size, backend, "
        "timeout_s)"),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":4,\"out\":2,\"biass\":true}]"), DDPD_ESPEC, "model[0].biass",
        "unknown key (did you mean \"bias\"? expected one of type, in, out, bias)"),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":4,\"out\":2},{\"type\":\"relu\",\"in\":2}]"), DDPD_ESPEC,
        "model[1].in", "unknown key (a relu layer takes only \"type\")"),
    BAD(OK_PLUS(",\"init\":{\"seed\":1,\"from_file\":\"w\"}"), DDPD_ESPEC, "init.from_file",
        "unknown key (expected one of seed, from, from_job, step)"),
    BAD(OK_PLUS(",\"checkpoint\":{\"every\":5}"), DDPD_ESPEC, "checkpoint.every",
        "unknown key (expected one of every_steps, keep_last)"),
    BAD(OK_PLUS(",\"checkpoint\":{\"keep_lsat\":2}"), DDPD_ESPEC, "checkpoint.keep_lsat",
        "unknown key (did you mean \"keep_last\"? expected one of every_steps, keep_last)"),

    /* types of top-level values */
    BAD(SPEC(MODEL, LOSS, OPTIM, DATA, "\"batch_size\":\"3\",\"epochs\":1", ""), DDPD_ESPEC, "batch_size",
        "expected a positive integer, got \"3\""),
    BAD(SPEC(MODEL, LOSS, OPTIM, DATA, "\"batch_size\":3.5,\"epochs\":1", ""), DDPD_ESPEC, "batch_size",
        "expected a positive integer, got 3.5"),
    BAD(SPEC(MODEL, LOSS, OPTIM, DATA, "\"batch_size\":3.0,\"epochs\":1", ""), DDPD_ESPEC, "batch_size",
        "expected a positive integer, got 3.0"),
    BAD(SPEC(MODEL, LOSS, OPTIM, DATA, "\"batch_size\":0,\"epochs\":1", ""), DDPD_ESPEC, "batch_size",
        "expected a positive integer, got 0"),
    BAD(SPEC(MODEL, LOSS, OPTIM, DATA, "\"epochs\":1", ""), DDPD_ESPEC, "batch_size",
        "missing (expected a positive integer)"),
    BAD(OK_PLUS(",\"world_size\":2000"), DDPD_ESPEC, "world_size",
        "expected an integer from 1 to 1024, got 2000"),
    BAD(OK_PLUS(",\"world_size\":null"), DDPD_ESPEC, "world_size",
        "expected an integer from 1 to 1024, got null"),
    BAD(OK_PLUS(",\"device\":\"tpu\""), DDPD_ESPEC, "device", "expected one of cpu, cuda, got \"tpu\""),
    BAD(OK_PLUS(",\"name\":5"), DDPD_ESPEC, "name", "expected a string, got 5"),
    BAD(OK_PLUS(",\"name\":\""
                "0123456789012345678901234567890123456789012345678901234567890123"
                "456789012345678901234567890123456789012345678901234567890123456789\""),
        DDPD_ESPEC, "name", "expected a string of at most 127 bytes, got 130 bytes"),
    BAD(SPEC(MODEL, LOSS, OPTIM, DATA, "\"batch_size\":2,\"epochs\":1,\"steps\":10", ""), DDPD_ESPEC, "steps",
        "give either epochs or steps, not both"),
    BAD(SPEC(MODEL, LOSS, OPTIM, DATA, "\"batch_size\":2", ""), DDPD_ESPEC, "epochs",
        "missing (give either epochs or steps)"),
    BAD(SPEC(MODEL, LOSS, OPTIM, DATA, "\"batch_size\":2,\"epochs\":0", ""), DDPD_ESPEC, "epochs",
        "expected a positive integer, got 0"),
    BAD(SPEC(MODEL, LOSS, OPTIM, DATA, "\"batch_size\":2,\"steps\":-1", ""), DDPD_ESPEC, "steps",
        "expected a positive integer, got -1"),
    BAD(OK_PLUS(",\"grad_accum\":0"), DDPD_ESPEC, "grad_accum", "expected a positive integer, got 0"),
    BAD(OK_PLUS(",\"log_every\":true"), DDPD_ESPEC, "log_every", "expected a positive integer, got true"),
    BAD(OK_PLUS(",\"max_restarts\":101"), DDPD_ESPEC, "max_restarts",
        "expected an integer from 0 to 100, got 101"),
    BAD(OK_PLUS(",\"on_nonfinite\":\"ignore\""), DDPD_ESPEC, "on_nonfinite",
        "expected one of fail, continue, got \"ignore\""),
    BAD(OK_PLUS(",\"on_nonfinite\":false"), DDPD_ESPEC, "on_nonfinite",
        "expected one of fail, continue, got false"),
    BAD(OK_PLUS(",\"checkpoint\":{\"every_steps\":-1}"), DDPD_ESPEC, "checkpoint.every_steps",
        "expected a non-negative integer, got -1"),
    BAD(OK_PLUS(",\"checkpoint\":5"), DDPD_ESPEC, "checkpoint", "expected an object, got 5"),
    /* keep_last: at least the newest checkpoint stays (0 would prune what a restart needs). */
    BAD(OK_PLUS(",\"checkpoint\":{\"every_steps\":1,\"keep_last\":0}"), DDPD_ESPEC, "checkpoint.keep_last",
        "expected a positive integer, got 0"),
    BAD(OK_PLUS(",\"checkpoint\":{\"keep_last\":-3}"), DDPD_ESPEC, "checkpoint.keep_last",
        "expected a positive integer, got -3"),
    BAD(OK_PLUS(",\"checkpoint\":{\"keep_last\":2.5}"), DDPD_ESPEC, "checkpoint.keep_last",
        "expected a positive integer, got 2.5"),
    BAD(OK_PLUS(",\"checkpoint\":{\"keep_last\":\"all\"}"), DDPD_ESPEC, "checkpoint.keep_last",
        "expected a positive integer, got \"all\""),
    BAD(OK_PLUS(",\"checkpoint\":{\"keep_last\":null}"), DDPD_ESPEC, "checkpoint.keep_last",
        "expected a positive integer, got null"),

    /* model */
    BAD(SPEC(LOSS, OPTIM, DATA, BATCH, "\"grad_accum\":1", ""), DDPD_ESPEC, "model",
        "missing (expected a list of layers such as [{\"type\": \"linear\", \"in\": 10, \"out\": 1}])"),
    BAD(WITH_MODEL("{\"type\":\"linear\"}"), DDPD_ESPEC, "model", "expected a list of layers, got an object"),
    BAD(WITH_MODEL("[]"), DDPD_ESPEC, "model", "expected at least one layer, got an empty list"),
    BAD("@70layers", DDPD_ESPEC, "model", "at most 64 layers, got 70"),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":4,\"out\":2},5]"), DDPD_ESPEC, "model[1]",
        "expected a layer object such as {\"type\": \"relu\"}, got 5"),
    BAD(WITH_MODEL("[{\"in\":4,\"out\":2}]"), DDPD_ESPEC, "model[0].type",
        "missing (expected one of linear, relu, tanh, sigmoid, gelu)"),
    BAD(WITH_MODEL("[{\"type\":\"conv2d\",\"in\":4,\"out\":2}]"), DDPD_ESPEC, "model[0].type",
        "expected one of linear, relu, tanh, sigmoid, gelu, got \"conv2d\""),
    BAD(WITH_MODEL("[{\"type\":\"relu\"},{\"type\":\"linear\",\"in\":4,\"out\":2}]"), DDPD_ESPEC,
        "model[0].type",
        "the first layer must be \"linear\" (an activation takes its width from the layer before "
        "it), got \"relu\""),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":4,\"out\":32},{\"type\":\"relu\"},"
                   "{\"type\":\"linear\",\"in\":16,\"out\":2}]"),
        DDPD_ESPEC, "model[2].in", "expected 32 (model[0].out), got 16"),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":4,\"out\":2000000}]"), DDPD_ESPEC, "model[0].out",
        "expected an integer from 1 to 1048576, got 2000000"),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":0,\"out\":2}]"), DDPD_ESPEC, "model[0].in",
        "expected an integer from 1 to 1048576, got 0"),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":4}]"), DDPD_ESPEC, "model[0].out",
        "missing (expected an integer from 1 to 1048576)"),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":4,\"out\":2,\"bias\":\"yes\"}]"), DDPD_ESPEC,
        "model[0].bias", "expected true or false, got \"yes\""),

    /* loss */
    BAD(SPEC(MODEL, "\"grad_accum\":1", OPTIM, DATA, BATCH, ""), DDPD_ESPEC, "loss",
        "missing (expected one of mse, cross_entropy)"),
    BAD(SPEC(MODEL, "\"loss\":\"hinge\"", OPTIM, DATA, BATCH, ""), DDPD_ESPEC, "loss",
        "expected one of mse, cross_entropy, got \"hinge\""),
    BAD(SPEC("\"model\":[{\"type\":\"linear\",\"in\":4,\"out\":1},{\"type\":\"sigmoid\"}]",
             "\"loss\":\"cross_entropy\"", OPTIM, DATA, BATCH, ""),
        DDPD_ESPEC, "loss", "cross_entropy needs at least 2 outputs (model[0].out is 1)"),

    /* optimizer */
    BAD(SPEC(MODEL, LOSS, "\"grad_accum\":1", DATA, BATCH, ""), DDPD_ESPEC, "optimizer",
        "missing (expected an object such as {\"type\": \"sgd\", \"lr\": 0.01})"),
    BAD(WITH_OPTIM("\"sgd\""), DDPD_ESPEC, "optimizer", "expected an object, got \"sgd\""),
    BAD(WITH_OPTIM("{\"lr\":0.1}"), DDPD_ESPEC, "optimizer.type", "missing (expected one of sgd, adamw)"),
    BAD(WITH_OPTIM("{\"type\":\"adam\"}"), DDPD_ESPEC, "optimizer.type",
        "expected one of sgd, adamw, got \"adam\""),
    BAD(WITH_OPTIM("{\"type\":\"sgd\"}"), DDPD_ESPEC, "optimizer.lr", "missing (expected a positive number)"),
    BAD(WITH_OPTIM("{\"type\":\"sgd\",\"lr\":0}"), DDPD_ESPEC, "optimizer.lr",
        "expected a positive number, got 0"),
    BAD(WITH_OPTIM("{\"type\":\"adamw\",\"lr\":-0.001}"), DDPD_ESPEC, "optimizer.lr",
        "expected a positive number, got -0.001"),
    BAD(WITH_OPTIM("{\"type\":\"sgd\",\"lr\":\"1e-3\"}"), DDPD_ESPEC, "optimizer.lr",
        "expected a positive number, got \"1e-3\""),
    BAD(WITH_OPTIM("{\"type\":\"sgd\",\"lr\":0.1,\"momentum\":-0.9}"), DDPD_ESPEC, "optimizer.momentum",
        "expected a non-negative number, got -0.9"),
    BAD(WITH_OPTIM("{\"type\":\"sgd\",\"lr\":0.1,\"nesterov\":true}"), DDPD_ESPEC, "optimizer.nesterov",
        "nesterov momentum requires a momentum and zero dampening"),
    BAD(WITH_OPTIM("{\"type\":\"sgd\",\"lr\":0.1,\"nesterov\":true,\"momentum\":0.9,\"dampening\":0.1}"),
        DDPD_ESPEC, "optimizer.nesterov", "nesterov momentum requires a momentum and zero dampening"),
    BAD(WITH_OPTIM("{\"type\":\"sgd\",\"lr\":0.1,\"nesterov\":1}"), DDPD_ESPEC, "optimizer.nesterov",
        "expected true or false, got 1"),
    BAD(WITH_OPTIM("{\"type\":\"adamw\",\"betas\":[0.9]}"), DDPD_ESPEC, "optimizer.betas",
        "expected a list of 2 numbers, got 1"),
    BAD(WITH_OPTIM("{\"type\":\"adamw\",\"betas\":[0.9,1]}"), DDPD_ESPEC, "optimizer.betas[1]",
        "expected a number in [0, 1), got 1"),
    BAD(WITH_OPTIM("{\"type\":\"adamw\",\"betas\":{\"b1\":0.9}}"), DDPD_ESPEC, "optimizer.betas",
        "expected a list of 2 numbers, got an object"),
    BAD(WITH_OPTIM("{\"type\":\"adamw\",\"eps\":0}"), DDPD_ESPEC, "optimizer.eps",
        "expected a positive number, got 0"),
    BAD(WITH_OPTIM("{\"type\":\"adamw\",\"weight_decay\":-1e-2}"), DDPD_ESPEC, "optimizer.weight_decay",
        "expected a non-negative number, got -0.01"),

    /* data */
    BAD(SPEC(MODEL, LOSS, OPTIM, "\"grad_accum\":1", BATCH, ""), DDPD_ESPEC, "data",
        "missing (expected an object such as {\"type\": \"synthetic\", \"samples\": 1000})"),
    BAD(WITH_DATA("{\"type\":\"parquet\"}"), DDPD_ESPEC, "data.type",
        "expected one of synthetic, npy, csv, got \"parquet\""),
    BAD(WITH_DATA("{\"type\":\"synthetic\"}"), DDPD_ESPEC, "data.samples",
        "missing (expected a positive integer)"),
    BAD(WITH_DATA("{\"type\":\"synthetic\",\"samples\":10,\"seed\":-1}"), DDPD_ESPEC, "data.seed",
        "expected a non-negative integer, got -1"),
    BAD(WITH_DATA("{\"type\":\"synthetic\",\"samples\":10,\"shuffle\":\"no\"}"), DDPD_ESPEC, "data.shuffle",
        "expected true or false, got \"no\""),
    /* Synthetic data's teacher is capped at 2^28 weights: found at parse, not in the ranks. */
    BAD(SPEC(WIDE_MODEL, LOSS, OPTIM, DATA, BATCH, ""), DDPD_ESPEC, "data.type",
        "synthetic data is drawn from a teacher of the model's shape, at most 268435456 weights; the model "
        "has 1099513724928 (use npy or csv data)"),
    /* {rank} in one of x and y only: a rank would read its own x beside everyone's y. */
    BAD(WITH_DATA("{\"type\":\"npy\",\"x\":\"x-{rank}.npy\",\"y\":\"y.npy\"}"), DDPD_ESPEC, "data.y",
        "x and y must both hold {rank} (one file per rank) or neither (got x \"x-{rank}.npy\", y \"y.npy\")"),
    BAD(WITH_DATA("{\"type\":\"npy\",\"x\":\"x.npy\",\"y\":\"{rank}/y.npy\"}"), DDPD_ESPEC, "data.x",
        "x and y must both hold {rank} (one file per rank) or neither (got x \"x.npy\", y \"{rank}/y.npy\")"),
    BAD(WITH_DATA("{\"type\":\"npy\",\"y\":\"y.npy\"}"), DDPD_ESPEC, "data.x",
        "missing (expected a file path relative to the data directory)"),
    BAD(WITH_DATA("{\"type\":\"npy\",\"x\":\"../secret/x.npy\",\"y\":\"y.npy\"}"), DDPD_ESPEC, "data.x",
        "must stay inside the data directory (\"..\" not allowed)"),
    BAD(WITH_DATA("{\"type\":\"npy\",\"x\":\"x.npy\",\"y\":\"a/b/../../../y.npy\"}"), DDPD_ESPEC, "data.y",
        "must stay inside the data directory (\"..\" not allowed)"),
    BAD(WITH_DATA("{\"type\":\"npy\",\"x\":\"x.npy\",\"y\":\"a/..\"}"), DDPD_ESPEC, "data.y",
        "must stay inside the data directory (\"..\" not allowed)"),
    BAD(WITH_DATA("{\"type\":\"npy\",\"x\":\"/etc/passwd\",\"y\":\"y.npy\"}"), DDPD_ESPEC, "data.x",
        "must be relative to the data directory, got \"/etc/passwd\""),
    BAD(WITH_DATA("{\"type\":\"npy\",\"x\":\"\",\"y\":\"y.npy\"}"), DDPD_ESPEC, "data.x",
        "expected a file path, got an empty string"),
    BAD(WITH_DATA("{\"type\":\"npy\",\"x\":[\"x.npy\"],\"y\":\"y.npy\"}"), DDPD_ESPEC, "data.x",
        "expected a string, got an array"),
    BAD(WITH_DATA("{\"type\":\"csv\",\"target\":\"y\"}"), DDPD_ESPEC, "data.path",
        "missing (expected a file path relative to the data directory)"),
    BAD(WITH_DATA("{\"type\":\"csv\",\"path\":\"t.csv\"}"), DDPD_ESPEC, "data.target",
        "missing (expected a column name or a list of column names)"),
    BAD(WITH_CSV("mse", "[]"), DDPD_ESPEC, "data.target",
        "expected at least one column name, got an empty list"),
    BAD(WITH_CSV("mse", "[\"a\",5]"), DDPD_ESPEC, "data.target[1]", "expected a string, got 5"),
    BAD(WITH_CSV("mse", "[\"a\",\"a\"]"), DDPD_ESPEC, "data.target[1]",
        "column \"a\" is already data.target[0]"),
    BAD(WITH_CSV("mse", "\"y\""), DDPD_ESPEC, "data.target",
        "mse needs 2 target columns (model[0].out), got 1"),
    BAD(WITH_CSV("cross_entropy", "[\"a\",\"b\"]"), DDPD_ESPEC, "data.target",
        "cross_entropy needs exactly one target column (the class id), got 2"),

    /* ddp */
    BAD(OK_PLUS(",\"ddp\":[]"), DDPD_ESPEC, "ddp", "expected an object, got an array"),
    BAD(OK_PLUS(",\"ddp\":{\"bucket_cap_mb\":-1}"), DDPD_ESPEC, "ddp.bucket_cap_mb",
        "expected a number greater than 0 and at most 1024, got -1"),
    BAD(OK_PLUS(",\"ddp\":{\"bucket_cap_mb\":2048}"), DDPD_ESPEC, "ddp.bucket_cap_mb",
        "expected a number greater than 0 and at most 1024, got 2048"),
    BAD(OK_PLUS(",\"ddp\":{\"timeout_s\":0}"), DDPD_ESPEC, "ddp.timeout_s",
        "expected a number of seconds greater than 0 and at most 86400, got 0"),
    BAD(OK_PLUS(",\"ddp\":{\"timeout_s\":1e6}"), DDPD_ESPEC, "ddp.timeout_s",
        "expected a number of seconds greater than 0 and at most 86400, got 1000000.0"),
    BAD(OK_PLUS(",\"ddp\":{\"join\":\"sometimes\"}"), DDPD_ESPEC, "ddp.join",
        "expected true, false or \"auto\", got \"sometimes\""),
    BAD(OK_PLUS(",\"ddp\":{\"divide_by_initial_world_size\":0}"), DDPD_ESPEC,
        "ddp.divide_by_initial_world_size", "expected true or false, got 0"),
    BAD(OK_PLUS(",\"ddp\":{\"backend\":\"gloo\"}"), DDPD_ESPEC, "ddp.backend",
        "expected one of cpu, nccl, got \"gloo\""),
    BAD(OK_PLUS(",\"device\":\"cpu\",\"ddp\":{\"backend\":\"nccl\"}"), DDPD_ESPEC, "ddp.backend",
        "nccl needs device \"cuda\" (device is \"cpu\")"),
    BAD(OK_PLUS(",\"device\":\"cuda\",\"precision\":\"fp16\""), DDPD_ESPEC, "precision",
        "expected one of fp32, tf32, got \"fp16\""),
    BAD(OK_PLUS(",\"device\":\"cuda\",\"precision\":32"), DDPD_ESPEC, "precision",
        "expected one of fp32, tf32, got 32"),
    BAD(OK_PLUS(",\"device\":\"cpu\",\"precision\":\"tf32\""), DDPD_ESPEC, "precision",
        "tf32 needs device \"cuda\" (device is \"cpu\")"),

    /* init */
    BAD(OK_PLUS(",\"init\":{\"seed\":1,\"from\":\"w.safetensors\"}"), DDPD_ESPEC, "init.from",
        "give one of seed, from and from_job, not two"),
    BAD(OK_PLUS(",\"init\":{}"), DDPD_ESPEC, "init.seed", "missing (give one of seed, from and from_job)"),
    BAD(OK_PLUS(",\"init\":{\"seed\":1,\"from\":\"w\",\"from_job\":3}"), DDPD_ESPEC, "init.from_job",
        "give one of seed, from and from_job, not all three"),
    BAD(OK_PLUS(",\"init\":{\"seed\":1,\"step\":3}"), DDPD_ESPEC, "init.step",
        "a checkpoint's step goes with from_job only"),
    BAD(OK_PLUS(",\"init\":{\"from_job\":0}"), DDPD_ESPEC, "init.from_job",
        "expected a positive integer, got 0"),
    BAD(OK_PLUS(",\"init\":{\"from_job\":\"3\"}"), DDPD_ESPEC, "init.from_job",
        "expected a positive integer, got \"3\""),
    BAD(OK_PLUS(",\"init\":{\"from_job\":3,\"step\":-1}"), DDPD_ESPEC, "init.step",
        "expected a non-negative integer, got -1"),
    BAD(OK_PLUS(",\"init\":{\"from\":\"../w.safetensors\"}"), DDPD_ESPEC, "init.from",
        "must stay inside the data directory (\"..\" not allowed)"),
    BAD(OK_PLUS(",\"init\":{\"seed\":1.5}"), DDPD_ESPEC, "init.seed",
        "expected a non-negative integer, got 1.5"),
    BAD(OK_PLUS(",\"init\":\"random\""), DDPD_ESPEC, "init", "expected an object, got \"random\""),
};

/* The rows too big to write out. Returns a malloc'ed string. */
static char *make_json(const char *what)
{
    char *buf;
    if (strcmp(what, "@big") == 0) {
        /* Valid JSON, one byte over the limit: the size is checked before parsing. */
        size_t n = SPEC_MAX_BODY + 1;
        buf = malloc(n + 1);
        memset(buf, ' ', n);
        memcpy(buf, OK_PLUS(""), strlen(OK_PLUS("")));
        buf[n] = '\0';
        return buf;
    }
    /* "@70layers" */
    size_t cap = 4096, o = 0;
    buf = malloc(cap);
    o += (size_t)snprintf(buf + o, cap - o, "{\"model\":[{\"type\":\"linear\",\"in\":4,\"out\":2}");
    for (int i = 1; i < 70; i++)
        o += (size_t)snprintf(buf + o, cap - o, ",{\"type\":\"tanh\"}");
    snprintf(buf + o, cap - o, "]," LOSS "," OPTIM "," DATA "," BATCH "}");
    return buf;
}

static int test_invalid(void)
{
    int n = (int)(sizeof bad_cases / sizeof bad_cases[0]);
    for (int i = 0; i < n; i++) {
        const struct bad_case *c = &bad_cases[i];
        char *made = c->json[0] == '@' ? make_json(c->json) : NULL;
        const char *json = made ? made : c->json;
        struct spec s;
        struct ddpd_error e;
        int before = check__failures;
        ddpd_err rc = spec_parse(json, strlen(json), NULL, &s, &e);
        CHECK_EQ_INT(rc, c->code);
        CHECK_EQ_INT(e.code, c->code);
        CHECK_EQ_STR(e.path, c->path);
        CHECK_EQ_STR(e.message, c->message);
        if (c->code == DDPD_EJSON) {
            CHECK_EQ_INT(e.line, c->line);
            CHECK_EQ_INT(e.column, c->column);
        }
        if (check__failures != before)
            fprintf(stderr, "    in invalid case %d: %.300s\n", i, json);
        free(made);
    }
    return n;
}

/* Every field, with device_set/backend_set left out: printing makes them explicit. */
static void check_same(const struct spec *a, const struct spec *b)
{
    struct spec x = *a, y = *b;
    x.device_set = y.device_set = false;
    x.ddp.backend_set = y.ddp.backend_set = false;
    CHECK(memcmp(&x, &y, sizeof x) == 0);
    CHECK_EQ_STR(x.name, y.name);
    CHECK_EQ_INT(x.n_layers, y.n_layers);
    CHECK(x.optim.lr == y.optim.lr && x.ddp.bucket_cap_mb == y.ddp.bucket_cap_mb);
}

static void test_round_trip(void)
{
    const char *specs[] = {
        seed_example,
        OK_PLUS(""),
        SPEC("\"model\":[{\"type\":\"linear\",\"in\":3,\"out\":7,\"bias\":false},{\"type\":\"gelu\"},"
             "{\"type\":\"linear\",\"in\":7,\"out\":3},{\"type\":\"tanh\"}]",
             "\"loss\":\"mse\"",
             "\"optimizer\":{\"type\":\"adamw\",\"lr\":0.1,\"betas\":[0.5,0.75],\"eps\":1e-6,"
             "\"weight_decay\":0}",
             "\"data\":{\"type\":\"csv\",\"path\":\"d/t.csv\",\"target\":[\"a\",\"b\",\"c\"],"
             "\"shuffle\":false}",
             "\"batch_size\":17,\"steps\":1000",
             ",\"ddp\":{\"bucket_cap_mb\":0.1,\"join\":true,\"backend\":\"cpu\",\"timeout_s\":1.5,"
             "\"divide_by_initial_world_size\":false},\"device\":\"cuda\",\"precision\":\"tf32\",\"world_"
             "size\":8,"
             "\"init\":{\"from\":\"init/"
             "{rank}.safetensors\"},\"checkpoint\":{\"every_steps\":100,\"keep_last\":7},"
             "\"log_every\":10,\"max_restarts\":3,\"name\":\"q\\\"uote\\n\",\"grad_accum\":4,"
             "\"on_nonfinite\":\"continue\""),
        SPEC("\"model\":[{\"type\":\"linear\",\"in\":2,\"out\":3}]", "\"loss\":\"cross_entropy\"",
             "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.3,\"momentum\":0.9,\"nesterov\":true,"
             "\"weight_decay\":1e-4}",
             "\"data\":{\"type\":\"npy\",\"x\":\"x.npy\",\"y\":\"y.npy\",\"drop_last\":true,"
             "\"seed\":9007199254740993}",
             BATCH, ",\"ddp\":{\"join\":false},\"init\":{\"seed\":42}"),
        OK_PLUS(",\"init\":{\"from_job\":7}"),
        OK_PLUS(",\"init\":{\"from_job\":7,\"step\":0}"),
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        struct spec a, b;
        struct ddpd_error e;
        CHECK_EQ_INT(parse(specs[i], &a, &e), DDPD_OK);
        json_t *j = spec_to_json(&a);
        CHECK(j != NULL);
        char *text = json_dumps(j, JSON_COMPACT);
        CHECK(text != NULL);
        CHECK_EQ_INT(parse(text, &b, &e), DDPD_OK);
        CHECK_EQ_STR(e.message, "");
        check_same(&a, &b);
        /* Every key is written out, so the printed spec is a fixed point. */
        json_t *j2 = spec_to_json(&b);
        CHECK(json_equal(j, j2));
        CHECK_EQ_INT(json_object_size(j), 18 - 1); /* epochs or steps, not both */
        free(text);
        json_decref(j);
        json_decref(j2);
    }

    /* csv: one target prints as a string, several as a list. */
    struct spec s;
    struct ddpd_error e;
    CHECK_EQ_INT(parse(WITH_CSV("cross_entropy", "[\"label\"]"), &s, &e), DDPD_OK);
    json_t *j = spec_to_json(&s);
    CHECK(json_is_string(json_object_get(json_object_get(j, "data"), "target")));
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "init"), "seed")), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "ddp"), "join")), "auto");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "ddp"), "backend")), "cpu");
    CHECK(json_object_get(j, "steps") == NULL);
    /* checkpoint.keep_last is printed with its default, and a given one as given. */
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "checkpoint"), "keep_last")), 3);
    json_decref(j);
    CHECK_EQ_INT(parse(OK_PLUS(",\"checkpoint\":{\"keep_last\":9223372036854775807}"), &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.checkpoint_keep_last, INT64_MAX);
    CHECK_EQ_INT(s.checkpoint_every, 0);
    j = spec_to_json(&s);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "checkpoint"), "keep_last")),
                 INT64_MAX);
    json_decref(j);
}

/* Sizes near the limits: the batch arithmetic never overflows (it is signed overflow, UB,
 * for rows + batch - 1 near INT64_MAX), and a batch is never larger than the shard. */
static void test_sizes_near_limits(void)
{
    const int64_t M = INT64_MAX;
    CHECK_EQ_INT(spec_batches(M, M, false), 1);
    CHECK_EQ_INT(spec_batches(M, M - 1, false), 2);
    CHECK_EQ_INT(spec_batches(M, M - 1, true), 1);
    CHECK_EQ_INT(spec_batches(M, 1, false), M);
    CHECK_EQ_INT(spec_batches(100, 4611686018427387904LL, false), 1);
    CHECK_EQ_INT(spec_batches(100, 4611686018427387904LL, true), 0);
    CHECK_EQ_INT(spec_batches(M - 1, 2, false), M / 2);
    CHECK_EQ_INT(spec_batches(0, 3, false), 0);
    CHECK_EQ_INT(spec_batches(7, 3, false), 3);
    CHECK_EQ_INT(spec_batches(7, 3, true), 2);
    CHECK_EQ_INT(spec_shard_rows(M, 0, 1024), M / 1024 + 1);
    CHECK_EQ_INT(spec_shard_rows(M, 1023, 1024), M / 1024);

    struct spec s;
    struct ddpd_error e;
    CHECK_EQ_INT(
        parse(SPEC(MODEL, LOSS, OPTIM, "\"data\":{\"type\":\"synthetic\",\"samples\":9223372036854775807}",
                   "\"batch_size\":9223372036854775807,\"epochs\":1", ""),
              &s, &e),
        DDPD_OK);
    CHECK_EQ_INT(spec_batches(s.data.samples, s.batch_size, s.data.drop_last), 1);
    CHECK_EQ_INT(parse(SPEC(MODEL, LOSS, OPTIM, "\"data\":{\"type\":\"synthetic\",\"samples\":100}",
                            "\"batch_size\":4611686018427387904,\"epochs\":1", ""),
                       &s, &e),
                 DDPD_OK);
    CHECK_EQ_INT(spec_batch_rows(&s, 100), 100);
    CHECK_EQ_INT(spec_batch_rows(&s, 0), 1);
    s.batch_size = 3;
    CHECK_EQ_INT(spec_batch_rows(&s, 100), 3);

    /* The memory estimate: the seed-like spec, by hand. linear 4->2 with bias: 10 params. */
    struct spec_memory m;
    CHECK_EQ_INT(parse(OK_PLUS(""), &s, &e), DDPD_OK);
    spec_memory_estimate(&s, 10, false, 0, &m);
    CHECK_EQ_INT(m.rows, 2);
    CHECK_EQ_INT(m.params, 40);
    CHECK_EQ_INT(m.grads, 40);
    CHECK_EQ_INT(m.optim, 0);   /* sgd without momentum keeps no state */
    CHECK_EQ_INT(m.buckets, 0); /* one rank: no DDP */
    CHECK_EQ_INT(m.activations, 2 * 4 * (2 + 2 * 4));
    CHECK_EQ_INT(m.batch, 2 * 4 * (4 + 2 + 1) + 2 * 4 * (4 + 4 + 1));
    CHECK(m.data >= 10 * 4 * (4 + 2) + 10 * 8 + 10 * 8);
    CHECK_EQ_INT(m.staging, 40);
    CHECK_EQ_INT(m.device, 0);
    CHECK_EQ_INT(m.host, m.total);
    CHECK_EQ_INT(spec_memory_check(&s, &m, m.host, "--max-rank-memory", DDPD_ESPEC, &e), DDPD_OK);
    CHECK_EQ_INT(spec_memory_check(&s, &m, 0, "--max-rank-memory", DDPD_ESPEC, &e), DDPD_OK);
    CHECK_EQ_INT(spec_memory_check(&s, &m, m.host - 1, "--max-rank-memory", DDPD_ESPEC, &e), DDPD_ESPEC);

    /* AdamW keeps two moments; 2 ranks add the buckets. */
    CHECK_EQ_INT(
        parse(SPEC(MODEL, LOSS, "\"optimizer\":{\"type\":\"adamw\"}", DATA, BATCH, ",\"world_size\":2"), &s,
              &e),
        DDPD_OK);
    spec_memory_estimate(&s, 10, false, 0, &m);
    CHECK_EQ_INT(m.optim, 80);
    CHECK_EQ_INT(m.buckets, 80);
    CHECK_EQ_INT(m.staging, 120);

    /* The largest model the caps allow saturates instead of wrapping, and is refused
     * at the model with the sizes and the limit in the message. */
    CHECK_EQ_INT(parse(SPEC(WIDE_MODEL, LOSS, OPTIM,
                            "\"data\":{\"type\":\"npy\",\"x\":\"x.npy\",\"y\":\"y.npy\"}", BATCH, ""),
                       &s, &e),
                 DDPD_OK);
    CHECK_EQ_INT(spec_param_count(&s), 1048576LL * 1048576 + 1048576 + 2 * 1048576 + 2);
    spec_memory_estimate(&s, INT64_MAX, false, INT64_MAX, &m);
    CHECK_EQ_INT(m.total, INT64_MAX);
    CHECK_EQ_INT(m.data, INT64_MAX);
    spec_memory_estimate(&s, 10, false, 0, &m);
    CHECK_EQ_INT(m.params, (1048576LL * 1048576 + 3 * 1048576 + 2) * 4);
    CHECK_EQ_INT(spec_memory_check(&s, &m, 8LL << 30, "--max-rank-memory", DDPD_ESPEC, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "model");
    CHECK(strstr(e.message, "the job needs about 12.0 TiB of memory per rank (parameters 4.0 TiB") != NULL);
    CHECK(strstr(e.message, "more than the limit of 8.0 GiB per rank (--max-rank-memory)") != NULL);

    /* A huge batch on a huge data set is blamed on the batch, huge data on the data. */
    CHECK_EQ_INT(parse(SPEC(MODEL, LOSS, OPTIM,
                            "\"data\":{\"type\":\"npy\",\"x\":\"x.npy\",\"y\":\"y.npy\","
                            "\"shuffle\":false}",
                            "\"batch_size\":1000000000,\"epochs\":1", ""),
                       &s, &e),
                 DDPD_OK);
    spec_memory_estimate(&s, 1000000000, true, 0, &m);
    CHECK_EQ_INT(m.rows, 1000000000);
    CHECK_EQ_INT(spec_memory_check(&s, &m, 1 << 30, "limit", DDPD_EDEVICE, &e), DDPD_EDEVICE);
    CHECK_EQ_STR(e.path, "batch_size");
    s.batch_size = 10;
    spec_memory_estimate(&s, 1000000000, true, 0, &m);
    CHECK_EQ_INT(spec_memory_check(&s, &m, 1 << 30, "limit", DDPD_ESPEC, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "data");
    CHECK(strstr(e.message, "micro-batches of 10 rows") != NULL);
    s.device = DEVICE_CUDA; /* the model and activations are on the GPU */
    spec_memory_estimate(&s, 10, true, 0, &m);
    CHECK(m.device > 0 && m.host < m.total && m.host + m.device == m.total);
}

int main(void)
{
    test_seed_example();
    test_defaults();
    test_valid_variants();
    int n = test_invalid();
    test_round_trip();
    test_sizes_near_limits();
    fprintf(stderr, "%d invalid specs\n", n);
    CHECK_DONE();
}
