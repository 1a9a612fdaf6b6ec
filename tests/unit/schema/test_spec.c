/* test_spec.c — the job spec of CONTRACT.md §2: the seed example and the defaults parse
 * to the values the contract promises, every kind of invalid spec fails with its exact
 * path and message, and spec_to_json prints a spec that parses back to the same value.
 * The model families of §2a are test_spec_v2.c's; the job-level keys (early_stop,
 * keep_best, the scheduling fields) test_spec_job.c's. */
#include "check.h"

#include <jansson.h>

#include "schema/spec.h"
#include "schema/text.h"
#include "spec_pieces.h"

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
    CHECK_EQ_INT(s.ddp.comm_hook, COMM_HOOK_NONE);
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
    CHECK_EQ_INT(s.init_format, INIT_FORMAT_DDPD);
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
    /* jansson's json_stringn_nocheck holds bytes that are not UTF-8; they are refused too. */
    root = json_loads(OK_PLUS(""), 0, NULL);
    json_object_set_new(root, "name", json_stringn_nocheck("ab\xC0\x80", 4));
    CHECK_EQ_INT(spec_from_json(root, NULL, &s, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "name");
    CHECK_EQ_STR(e.message, "invalid UTF-8 at byte 3");
    json_decref(root);
    /* Text that is not ASCII is welcome: accents, CJK, emoji, a no-break space (U+00A0,
     * just past C1). */
    CHECK_EQ_INT(
        parse(OK_PLUS(",\"name\":\"na\\u00efve \\u2013 \\u65e5\\u672c \\ud83d\\ude80\\u00a0x\""), &s, &e),
        DDPD_OK);
    CHECK_EQ_STR(s.name, "na\xC3\xAFve \xE2\x80\x93 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x9A\x80\xC2\xA0x");

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

#define TYPES                                                                                                \
    "linear, relu, tanh, sigmoid, gelu, embedding, position, layernorm, attention, residual, dropout, "      \
    "conv2d, maxpool2d, avgpool2d, batchnorm, flatten"

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
        "model, input_shape, loss, optimizer, data, eval, batch_size, epochs, steps, grad_accum, grad_clip, "
        "ddp, init, checkpoint, log_every, max_restarts, on_nonfinite, tokenizer, early_stop, priority, "
        "preemptible, time_limit, "
        "preempt_grace)"),
    BAD(OK_PLUS(",\"learning rate\":1"), DDPD_ESPEC, "[\"learning rate\"]",
        "unknown key (expected one of name, world_size, device, precision, model, input_shape, loss, "
        "optimizer, data, eval, batch_size, epochs, steps, grad_accum, grad_clip, ddp, init, checkpoint, "
        "log_every, max_restarts, on_nonfinite, tokenizer, early_stop, priority, preemptible, time_limit, "
        "preempt_grace)"),
    /* a key echoed in a message carries no terminal control: C0, DEL and C1 come out escaped */
    BAD(OK_PLUS(",\"a\\u001b[2J\\u007f\\u009b\":1"), DDPD_ESPEC, "[\"a\\u001b[2J\\u007f\\u009b\"]",
        "unknown key (expected one of name, world_size, device, precision, model, input_shape, loss, "
        "optimizer, data, eval, batch_size, epochs, steps, grad_accum, grad_clip, ddp, init, checkpoint, "
        "log_every, max_restarts, on_nonfinite, tokenizer, early_stop, priority, preemptible, time_limit, "
        "preempt_grace)"),
    BAD(WITH_OPTIM("{\"type\":\"sgd\",\"lr\":0.1,\"momentun\":0.9}"), DDPD_ESPEC, "optimizer.momentun",
        "unknown key (did you mean \"momentum\"? expected one of type, lr, momentum, dampening, "
        "weight_decay, nesterov, schedule)"),
    BAD(WITH_OPTIM("{\"type\":\"adamw\",\"momentum\":0.9}"), DDPD_ESPEC, "optimizer.momentum",
        "unknown key (expected one of type, lr, betas, eps, weight_decay, schedule)"),
    BAD(WITH_DATA("{\"type\":\"synthetic\",\"samples\":10,\"x\":\"a.npy\"}"), DDPD_ESPEC, "data.x",
        "unknown key (expected one of type, samples, seed, shuffle, drop_last)"),
    BAD(OK_PLUS(",\"ddp\":{\"bucket_cap\":1}"), DDPD_ESPEC, "ddp.bucket_cap",
        "unknown key (expected one of bucket_cap_mb, join, divide_by_initial_world_size, backend, "
        "timeout_s, comm_hook)"),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":4,\"out\":2,\"biass\":true}]"), DDPD_ESPEC, "model[0].biass",
        "unknown key (did you mean \"bias\"? expected one of type, in, out, bias, tie)"),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":4,\"out\":2},{\"type\":\"relu\",\"in\":2}]"), DDPD_ESPEC,
        "model[1].in", "unknown key (a relu layer takes only \"type\")"),
    BAD(OK_PLUS(",\"init\":{\"seed\":1,\"from_file\":\"w\"}"), DDPD_ESPEC, "init.from_file",
        "unknown key (expected one of seed, from, from_job, step, format)"),
    /* init.format (issue 30): ddpd's own or Hugging Face's GPT-2, with init.from only; gpt2
     * needs a GPT-2-shaped model (schema/gpt2.c; the shapes are tests/api/test_gpt2_hf_route.py's). */
    BAD(OK_PLUS(",\"init\":{\"from\":\"w.safetensors\",\"format\":\"hf\"}"), DDPD_ESPEC, "init.format",
        "expected one of ddpd, gpt2, got \"hf\""),
    BAD(OK_PLUS(",\"init\":{\"from_job\":3,\"format\":\"gpt2\"}"), DDPD_ESPEC, "init.format",
        "\"gpt2\" goes with init.from (a job's weights are in ddpd's own format)"),
    BAD(OK_PLUS(",\"init\":{\"seed\":3,\"format\":\"gpt2\"}"), DDPD_ESPEC, "init.format",
        "\"gpt2\" goes with init.from (a file to read)"),
    BAD(OK_PLUS(",\"init\":{\"from\":\"w.safetensors\",\"format\":\"gpt2\"}"), DDPD_ESPEC, "model[0]",
        "init.format \"gpt2\" reads a Hugging Face GPT-2, but model[0] is a linear where GPT-2 has an "
        "embedding "
        "(wte)"),
    BAD(OK_PLUS(",\"checkpoint\":{\"every\":5}"), DDPD_ESPEC, "checkpoint.every",
        "unknown key (expected one of every_steps, keep_last, keep_best)"),
    BAD(OK_PLUS(",\"checkpoint\":{\"keep_lsat\":2}"), DDPD_ESPEC, "checkpoint.keep_lsat",
        "unknown key (did you mean \"keep_last\"? expected one of every_steps, keep_last, keep_best)"),

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
    /* No string of a spec holds a control character (issue 28): a name with ESC[2J or an
     * OSC title sequence cleared or retitled the terminal of whoever ran `ddpd jobs`. Bytes
     * count from 1; tab and newline are control characters too; C1 is refused as code
     * points (U+009B is CSI), so "\\u00e9" before it is two bytes. */
    BAD(OK_PLUS(",\"name\":\"job-\\u001b[2J\""), DDPD_ESPEC, "name",
        "control character U+001B at byte 5 is not allowed"),
    BAD(OK_PLUS(",\"name\":\"\\u001b]0;pwned\\u0007\""), DDPD_ESPEC, "name",
        "control character U+001B at byte 1 is not allowed"),
    BAD(OK_PLUS(",\"name\":\"a\\tb\""), DDPD_ESPEC, "name",
        "control character U+0009 at byte 2 is not allowed"),
    BAD(OK_PLUS(",\"name\":\"a\\nb\""), DDPD_ESPEC, "name",
        "control character U+000A at byte 2 is not allowed"),
    BAD(OK_PLUS(",\"name\":\"ab\\u007f\""), DDPD_ESPEC, "name",
        "control character U+007F at byte 3 is not allowed"),
    BAD(OK_PLUS(",\"name\":\"\\u00e9\\u009b2J\""), DDPD_ESPEC, "name",
        "control character U+009B at byte 3 is not allowed"),
    BAD(WITH_CSV("mse", "[\"a\",\"b\\u001b[31m\"]"), DDPD_ESPEC, "data.target[1]",
        "control character U+001B at byte 2 is not allowed"),
    BAD(WITH_DATA("{\"type\":\"csv\",\"path\":\"t\\u001b.csv\",\"target\":\"y\"}"), DDPD_ESPEC, "data.path",
        "control character U+001B at byte 2 is not allowed"),
    BAD(WITH_DATA("{\"type\":\"npy\",\"x\":\"x\\u0085.npy\",\"y\":\"y.npy\"}"), DDPD_ESPEC, "data.x",
        "control character U+0085 at byte 2 is not allowed"),
    BAD(OK_PLUS(",\"init\":{\"from\":\"w\\r.safetensors\"}"), DDPD_ESPEC, "init.from",
        "control character U+000D at byte 2 is not allowed"),
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
        "missing (expected a list of layers such as [{\"type\": \"linear\", \"in\": 10, \"out\": 1}], or a "
        "preset such as {\"preset\": \"gpt\", ...})"),
    BAD(WITH_MODEL("{\"type\":\"linear\"}"), DDPD_ESPEC, "model",
        "expected a list of layers, or a preset such as {\"preset\": \"gpt\", ...}, got an object without "
        "\"preset\""),
    BAD(WITH_MODEL("[]"), DDPD_ESPEC, "model", "expected at least one layer, got an empty list"),
    BAD("@70layers", DDPD_ESPEC, "model", "at most 64 layers, got 70"),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":4,\"out\":2},5]"), DDPD_ESPEC, "model[1]",
        "expected a layer object such as {\"type\": \"relu\"}, got 5"),
    BAD(WITH_MODEL("[{\"in\":4,\"out\":2}]"), DDPD_ESPEC, "model[0].type",
        "missing (expected one of " TYPES ")"),
    BAD(WITH_MODEL("[{\"type\":\"conv3d\",\"in\":4,\"out\":2}]"), DDPD_ESPEC, "model[0].type",
        "expected one of " TYPES ", got \"conv3d\" (did you mean \"conv2d\"?)"),
    /* Issue 31: a misspelt layer type gets the hint a misspelt key gets; a far one none. */
    BAD(WITH_MODEL("[{\"type\":\"lienar\",\"in\":4,\"out\":2}]"), DDPD_ESPEC, "model[0].type",
        "expected one of " TYPES ", got \"lienar\" (did you mean \"linear\"?)"),
    BAD(WITH_MODEL("[{\"type\":\"linear\",\"in\":4,\"out\":2},{\"type\":\"layer_norm\",\"dim\":2}]"),
        DDPD_ESPEC, "model[1].type",
        "expected one of " TYPES ", got \"layer_norm\" (did you mean \"layernorm\"?)"),
    BAD(WITH_MODEL("[{\"type\":\"transformer\",\"in\":4,\"out\":2}]"), DDPD_ESPEC, "model[0].type",
        "expected one of " TYPES ", got \"transformer\""),
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
        "expected one of synthetic, npy, csv, tokens, got \"parquet\""),
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
    BAD(OK_PLUS(",\"ddp\":{\"comm_hook\":\"fp8\"}"), DDPD_ESPEC, "ddp.comm_hook",
        "expected one of none, fp16, bf16, got \"fp8\""),
    BAD(OK_PLUS(",\"ddp\":{\"comm_hook\":true}"), DDPD_ESPEC, "ddp.comm_hook",
        "expected one of none, fp16, bf16, got true"),
    BAD(OK_PLUS(",\"device\":\"cuda\",\"ddp\":{\"comm_hook\":\"fp16\"}"), DDPD_ESPEC, "ddp.comm_hook",
        "\"fp16\" needs device \"cpu\" (device is \"cuda\")"),
    BAD(OK_PLUS(",\"device\":\"cuda\",\"ddp\":{\"comm_hook\":\"bf16\",\"backend\":\"cpu\"}"), DDPD_ESPEC,
        "ddp.comm_hook", "\"bf16\" needs device \"cpu\" (device is \"cuda\")"),
    BAD(OK_PLUS(",\"ddp\":{\"comm_hook\":\"fp16\",\"divide_by_initial_world_size\":false}"), DDPD_ESPEC,
        "ddp.comm_hook",
        "\"fp16\" divides by the world size, as PyTorch's hook does: it cannot apply with "
        "ddp.divide_by_initial_world_size false"),
    BAD(OK_PLUS(",\"device\":\"cuda\",\"precision\":\"fp16\""), DDPD_ESPEC, "precision",
        "expected one of fp32, tf32, got \"fp16\""),
    BAD(OK_PLUS(",\"device\":\"cuda\",\"precision\":32"), DDPD_ESPEC, "precision",
        "expected one of fp32, tf32, got 32"),
    BAD(OK_PLUS(",\"device\":\"cpu\",\"precision\":\"tf32\""), DDPD_ESPEC, "precision",
        "tf32 needs device \"cuda\" (device is \"cpu\")"),

    /* tokenizer */
    BAD(GPT_WITH(ADAMW, TOKENS, ",\"tokenizer\":{\"vocab\":\"v.json\"}"), DDPD_ESPEC, "tokenizer.merges",
        "missing (expected a file path relative to the data directory)"),
    BAD(GPT_WITH(ADAMW, TOKENS, ",\"tokenizer\":{\"vocab\":\"/v.json\",\"merges\":\"m.txt\"}"), DDPD_ESPEC,
        "tokenizer.vocab", "must be relative to the data directory, got \"/v.json\""),
    BAD(GPT_WITH(ADAMW, TOKENS, ",\"tokenizer\":{\"vocab\":\"v.json\",\"merges\":\"m.txt\",\"bpe\":1}"),
        DDPD_ESPEC, "tokenizer.bpe", "unknown key (expected one of vocab, merges)"),
    BAD(GPT_WITH(ADAMW, TOKENS, ",\"tokenizer\":\"gpt2\""), DDPD_ESPEC, "tokenizer",
        "expected an object, got \"gpt2\""),
    BAD(OK_PLUS(",\"tokenizer\":{\"vocab\":\"v.json\",\"merges\":\"m.txt\"}"), DDPD_ESPEC, "tokenizer",
        "a tokenizer needs a model that reads token ids (its first layer embedding)"),

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
    BAD(OK_PLUS(",\"init\":\"random\""), DDPD_ESPEC, "init",
        "expected an object, got \"random\""), /* v2 layers: keys, nesting, shapes (CONTRACT.md §2a) */
    BAD(V2CE("[" EMB ",{\"type\":\"layernorm\",\"dim\":4,\"epsilon\":1}]", "[3]"), DDPD_ESPEC,
        "model[1].epsilon", "unknown key (expected one of type, dim, eps, bias)"),
    BAD(V2CE("[" EMB ",{\"type\":\"residual\",\"layers\":[{\"type\":\"attention\",\"dim\":4,\"head\":2}]}]",
             "[3]"),
        DDPD_ESPEC, "model[1].layers[0].head",
        "unknown key (did you mean \"heads\"? expected one of type, dim, heads, causal, bias)"),
    BAD(V2CE("[" EMB ",{\"type\":\"residual\",\"layers\":[]}]", "[3]"), DDPD_ESPEC, "model[1].layers",
        "expected at least one layer, got an empty list"),
    BAD(V2CE("[" EMB ",{\"type\":\"residual\"}]", "[3]"), DDPD_ESPEC, "model[1].layers",
        "missing (expected a non-empty list of layers)"),
    BAD(V2CE("[" EMB ",{\"type\":\"residual\",\"layers\":{\"type\":\"relu\"}}]", "[3]"), DDPD_ESPEC,
        "model[1].layers", "expected a list of layers, got an object"),
    /* tie (issue 30): an embedding before the linear, of its shape */
    BAD(V2CE("[" EMB ",{\"type\":\"linear\",\"in\":4,\"out\":8,\"tie\":\"5\"}]", "[3]"), DDPD_ESPEC,
        "model[1].tie",
        "expected the key of an embedding layer before it, such as \"0\", got \"5\": "
        "no layer before model[1] has that key"),
    BAD(V2CE("[" EMB ",{\"type\":\"linear\",\"in\":4,\"out\":8,\"tie\":1}]", "[3]"), DDPD_ESPEC,
        "model[1].tie",
        "expected the key of an embedding layer before it, such as \"0\", got \"1\": "
        "no layer before model[1] has that key"),
    BAD(V2CE("[" EMB ",{\"type\":\"layernorm\",\"dim\":4},{\"type\":\"linear\",\"in\":4,\"out\":8,"
             "\"tie\":\"1\"}]",
             "[3]"),
        DDPD_ESPEC, "model[2].tie",
        "expected the key of an embedding layer before it, such as \"0\", got \"1\": "
        "model[1] is layernorm, not embedding"),
    BAD(V2CE("[" EMB ",{\"type\":\"linear\",\"in\":4,\"out\":7,\"tie\":\"0\"}]", "[3]"), DDPD_ESPEC,
        "model[1].tie",
        "a tied linear uses the embedding's [num, dim] table as its [out, in] weight: "
        "model[0] is [8, 4], this linear's [out, in] is [7, 4]"),
    BAD(V2CE("[" EMB ",{\"type\":\"linear\",\"in\":4,\"out\":8,\"tie\":true}]", "[3]"), DDPD_ESPEC,
        "model[1].tie", "expected the key of an embedding layer before it, such as \"0\", got true"),
    BAD(V2CE("[" EMB ",{\"type\":\"linear\",\"in\":4,\"out\":8,\"tie\":-1}]", "[3]"), DDPD_ESPEC,
        "model[1].tie", "expected the key of an embedding layer before it, such as \"0\", got -1"),
    /* the gpt preset (issue 30): each field at model.<field> */
    BAD(PRESET("\"preset\":\"gpt2\",\"layers\":1"), DDPD_ESPEC, "model.preset",
        "expected one of gpt, got \"gpt2\""),
    BAD(PRESET("\"preset\":\"gpt\",\"layers\":2,\"dim\":768,\"heads\":5,\"vocab\":8,\"block_size\":3"),
        DDPD_ESPEC, "model.heads", "dim 768 is not a multiple of heads 5"),
    BAD(PRESET("\"preset\":\"gpt\",\"layers\":2,\"dim\":8,\"head\":2,\"vocab\":8,\"block_size\":3"),
        DDPD_ESPEC, "model.head",
        "unknown key (did you mean \"heads\"? expected one of preset, layers, dim, heads, vocab, block_size, "
        "dropout, bias, tie, expanded)"),
    BAD(PRESET("\"preset\":\"gpt\",\"layers\":30,\"dim\":8,\"heads\":2,\"vocab\":8,\"block_size\":3"),
        DDPD_ESPEC, "model.layers", "expected an integer from 1 to 29, got 30"),
    BAD(PRESET("\"preset\":\"gpt\",\"layers\":1,\"dim\":8,\"heads\":2,\"block_size\":3"), DDPD_ESPEC,
        "model.vocab", "missing (expected an integer from 1 to 1048576)"),
    BAD(PRESET("\"preset\":\"gpt\",\"layers\":1,\"dim\":8,\"heads\":2,\"vocab\":8,\"block_size\":3,"
               "\"dropout\":0.1"),
        DDPD_ESPEC, "model.dropout",
        "the gpt preset takes only 0: nanoGPT's dropout also drops attention probabilities (attn_dropout), "
        "which ddpd's attention layer does not do; write the layer list by hand for dropout layers alone"),
    BAD(PRESET("\"preset\":\"gpt\",\"layers\":1,\"dim\":8,\"heads\":2,\"vocab\":8,\"block_size\":3,"
               "\"expanded\":[{\"type\":\"embedding\",\"num\":8,\"dim\":8}]"),
        DDPD_ESPEC, "model.expanded",
        "differs from the gpt preset's layers (it is written by ddpd, to show them: leave it out or give the "
        "preset's own)"),
    BAD("@residual65", DDPD_ESPEC, "model[1].layers", "at most 64 layers, got 65"),
    BAD("@300layers", DDPD_ESPEC, "model[5].layers[10]",
        "at most 256 layers in the whole model, the residuals' layers counted"),
    BAD("@deep", DDPD_ESPEC,
        "model[1].layers[1].layers[1].layers[1].layers[1].layers[1].layers[1].layers[1].layers[1].layers",
        "residuals nest at most 8 deep"),
    BAD(V2CE("[" EMB ",{\"type\":\"position\",\"max\":3,\"dim\":4},{\"type\":\"residual\",\"layers\":[{"
             "\"type\":\"layernorm\",\"dim\":4}]},{\"type\":\"residual\",\"layers\":[{\"type\":"
             "\"layernorm\",\"dim\":4},{\"type\":\"layernorm\",\"dim\":2}]}]",
             "[3]"),
        DDPD_ESPEC, "model[3].layers[1].dim", "expected 4 (the width entering it), got 2"),
    BAD(V2CE("[{\"type\":\"conv2d\",\"in\":3,\"out\":32,\"kernel\":3,\"padding\":1},{\"type\":\"relu\"},{"
             "\"type\":\"maxpool2d\",\"kernel\":2},{\"type\":\"batchnorm\",\"features\":32},{\"type\":"
             "\"flatten\"},{\"type\":\"linear\",\"in\":256,\"out\":10}]",
             "[3,8,8]"),
        DDPD_ESPEC, "model[5].in", "expected 512 (flatten of [32,4,4]), got 256"),
    BAD(V2MSE("[{\"type\":\"residual\",\"layers\":[{\"type\":\"linear\",\"in\":4,\"out\":8}]}]", "[3,4]"),
        DDPD_ESPEC, "model[0]",
        "the output of its layers [3,8] must have the shape of its input [3,4] (x + layers(x))"),
    BAD(V2CE("[" EMB ",{\"type\":\"attention\",\"dim\":4,\"heads\":3}]", "[3]"), DDPD_ESPEC, "model[1].heads",
        "expected a divisor of dim 4, got 3"),
    BAD(V2CE("[" EMB ",{\"type\":\"position\",\"max\":2,\"dim\":4}]", "[3]"), DDPD_ESPEC, "model[1].max",
        "expected at least 3 (T of the input [3,4]), got 2"),
    BAD(V2CE("[{\"type\":\"linear\",\"in\":3,\"out\":4}," EMB "]", "[3]"), DDPD_ESPEC, "model[1].type",
        "embedding must be the first layer of the model (it reads the input's ids)"),
    BAD(V2CE("[{\"type\":\"residual\",\"layers\":[" EMB "]}]", "[3]"), DDPD_ESPEC, "model[0].layers[0].type",
        "embedding must be the first layer of the model (it reads the input's ids)"),
    BAD(V2CE("[{\"type\":\"attention\",\"dim\":8,\"heads\":2}]", "[3,8,8]"), DDPD_ESPEC, "model[0]",
        "an attention layer acts on [T,dim] (one sample), got [3,8,8]"),
    BAD(V2CE("[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":3}]", "[64]"), DDPD_ESPEC, "model[0]",
        "a conv2d layer acts on [C,H,W] (one sample), got [64]"),
    BAD(V2CE("[{\"type\":\"avgpool2d\",\"kernel\":3}]", "[4,4]"), DDPD_ESPEC, "model[0]",
        "an avgpool2d layer acts on [C,H,W] (one sample), got [4,4]"),
    BAD(V2CE("[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":3}]", "[3,8,8]"), DDPD_ESPEC, "model[0].in",
        "expected 3 (the channels entering it), got 1"),
    BAD(V2CE("[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":[3,7],\"padding\":1}]", "[1,8,4]"),
        DDPD_ESPEC, "model[0].kernel",
        "kernel [3,7] does not fit the input [1,8,4] with padding [1,1]: the output would be smaller than 1"),
    /* The message names the limit, kernel / 2 per dimension (issue 28: it used to show the
     * kernel itself, "at most half the kernel [2,2], got [2,2]"). */
    BAD(V2CE("[{\"type\":\"maxpool2d\",\"kernel\":3,\"padding\":2}]", "[1,8,8]"), DDPD_ESPEC,
        "model[0].padding", "expected at most [1,1] (half the kernel [3,3]), got [2,2]"),
    BAD(V2CE("[{\"type\":\"maxpool2d\",\"kernel\":2,\"padding\":2}]", "[1,8,8]"), DDPD_ESPEC,
        "model[0].padding", "expected at most [1,1] (half the kernel [2,2]), got [2,2]"),
    BAD(V2CE("[{\"type\":\"avgpool2d\",\"kernel\":[2,5],\"padding\":[0,3]}]", "[1,8,8]"), DDPD_ESPEC,
        "model[0].padding", "expected at most [1,2] (half the kernel [2,5]), got [0,3]"),
    BAD(V2CE("[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":[3]}]", "[1,8,8]"), DDPD_ESPEC,
        "model[0].kernel", "expected a list of 2 integers [h, w], got 1"),
    BAD(V2CE("[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":0}]", "[1,8,8]"), DDPD_ESPEC,
        "model[0].kernel", "expected an integer from 1 to 1024 or a list of 2 of them [h, w], got 0"),
    BAD(V2CE("[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":[3,0]}]", "[1,8,8]"), DDPD_ESPEC,
        "model[0].kernel[1]", "expected an integer from 1 to 1024, got 0"),
    BAD(V2CE("[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":3,\"stride\":2000}]", "[1,8,8]"),
        DDPD_ESPEC, "model[0].stride",
        "expected an integer from 1 to 1024 or a list of 2 of them [h, w], got 2000"),
    BAD(V2CE("[{\"type\":\"conv2d\",\"in\":1,\"out\":2}]", "[1,8,8]"), DDPD_ESPEC, "model[0].kernel",
        "missing (expected an integer from 1 to 1024 or a list of 2 of them [h, w])"),
    BAD(V2CE("[" EMB ",{\"type\":\"batchnorm\",\"features\":4}]", "[3]"), DDPD_ESPEC, "model[1]",
        "a batchnorm layer acts on [features] or [features,H,W] (one sample), got [3,4]"),
    BAD(V2CE("[{\"type\":\"batchnorm\",\"features\":3}]", "[1,8,8]"), DDPD_ESPEC, "model[0].features",
        "expected 1 (the channels entering it), got 3"),
    BAD(V2CE("[{\"type\":\"batchnorm\",\"features\":3,\"momentum\":1.5}]", "[3,8,8]"), DDPD_ESPEC,
        "model[0].momentum", "expected a number in [0, 1], got 1.5"),
    BAD(V2CE("[" EMB ",{\"type\":\"dropout\",\"p\":1}]", "[3]"), DDPD_ESPEC, "model[1].p",
        "expected a number in [0, 1), got 1"),
    BAD(V2CE("[" EMB ",{\"type\":\"dropout\"}]", "[3]"), DDPD_ESPEC, "model[1].p",
        "missing (expected a number in [0, 1))"),
    BAD(V2CE("[" EMB ",{\"type\":\"gelu\",\"approximate\":\"fast\"}]", "[3]"), DDPD_ESPEC,
        "model[1].approximate", "expected one of none, tanh, got \"fast\""),
    BAD(V2CE("[" EMB ",{\"type\":\"flatten\",\"dim\":1}]", "[3]"), DDPD_ESPEC, "model[1].dim",
        "unknown key (a flatten layer takes only \"type\")"),
    BAD(V2CE("[" EMB ",{\"type\":\"layernorm\",\"dim\":4,\"eps\":0}]", "[3]"), DDPD_ESPEC, "model[1].eps",
        "expected a positive number, got 0"),
    BAD(V2CE("[" EMB "]", "[1,2,3,4]"), DDPD_ESPEC, "model[0]",
        "embedding adds a dimension: it takes the ids of one sample in at most 3 dimensions, got [1,2,3,4]"),

    /* input_shape */
    BAD("{\"model\":[" EMB "]," V2_TAIL "}", DDPD_ESPEC, "input_shape",
        "missing (expected the shape of one sample's ids, such as [64]: the model starts with embedding)"),
    BAD("{\"model\":[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":3}]," V2_TAIL "}", DDPD_ESPEC,
        "input_shape",
        "missing (expected the shape of one sample without the batch dimension, such as [1,28,28]: model[0] "
        "is conv2d)"),
    BAD("{\"model\":[{\"type\":\"layernorm\",\"dim\":4}]," V2_TAIL "}", DDPD_ESPEC, "input_shape",
        "missing (expected the shape of one sample without the batch dimension, such as [64]: model[0] is "
        "layernorm, which takes its shape from its input)"),
    BAD(V2CE("[" EMB "]", "[]"), DDPD_ESPEC, "input_shape",
        "expected a list of 1 to 4 integers from 1 to 1048576, got a list of 0"),
    BAD(V2CE("[" EMB "]", "[1,1,1,1,1]"), DDPD_ESPEC, "input_shape",
        "expected a list of 1 to 4 integers from 1 to 1048576, got a list of 5"),
    BAD(V2CE("[" EMB "]", "[3,0]"), DDPD_ESPEC, "input_shape[1]",
        "expected an integer from 1 to 1048576, got 0"),
    BAD(V2CE("[" EMB "]", "\"3\""), DDPD_ESPEC, "input_shape",
        "expected a list of 1 to 4 integers from 1 to 1048576, got \"3\""),
    BAD(V2CE("[{\"type\":\"flatten\"}]", "[1048576,1048576]"), DDPD_ESPEC, "input_shape",
        "one sample of [1048576,1048576] has more than 4294967296 elements"),
    BAD(V2MSE("[{\"type\":\"linear\",\"in\":4,\"out\":2},{\"type\":\"relu\"}]", "[2,4]"), DDPD_ESPEC,
        "input_shape", "expected [4] (model[0].in) for a model of linear layers and activations, got [2,4]"),

    /* losses on v2 outputs */
    BAD(V2CE("[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":3}]", "[1,8,8]"), DDPD_ESPEC, "loss",
        "cross_entropy needs logits [C] or [T,C] per sample, the model's output is [2,6,6]"),
    BAD(V2CE("[" EMB ",{\"type\":\"linear\",\"in\":4,\"out\":1}]", "[3]"), DDPD_ESPEC, "loss",
        "cross_entropy needs at least 2 classes, the model's output is [3,1]"),

    /* data for v2 models */
    BAD(GPT_WITH(ADAMW, "{\"type\":\"synthetic\",\"samples\":10}", ""), DDPD_ESPEC, "data.type",
        "synthetic data feeds only models of linear layers and activations (model[0] is embedding); use npy "
        "or tokens data"),
    BAD(V2_CONV_DATA("{\"type\":\"csv\",\"path\":\"t.csv\",\"target\":\"y\"}"), DDPD_ESPEC, "data.type",
        "csv data feeds only models of linear layers and activations (model[0] is conv2d); use npy data"),
    BAD(SPEC(MODEL, LOSS, OPTIM, "\"data\":{\"type\":\"tokens\",\"path\":\"t.bin\",\"block_size\":4}", BATCH,
             ""),
        DDPD_ESPEC, "data.type",
        "tokens data holds integer ids: the model must start with embedding (model[0] is linear)"),
    BAD(GPT_WITH(ADAMW, "{\"type\":\"tokens\",\"path\":\"t.bin\",\"block_size\":4}", ""), DDPD_ESPEC,
        "data.block_size", "expected input_shape [4] for samples of block_size 4, got input_shape [3]"),
    BAD(GPT_WITH(ADAMW, "{\"type\":\"tokens\",\"path\":\"t.bin\"}", ""), DDPD_ESPEC, "data.block_size",
        "missing (expected an integer from 1 to 65536)"),
    BAD(GPT_WITH(ADAMW, "{\"type\":\"tokens\",\"path\":\"t.bin\",\"block_size\":3,\"dtype\":\"uint8\"}", ""),
        DDPD_ESPEC, "data.dtype", "expected one of uint16, int32, got \"uint8\""),
    BAD(GPT_WITH(ADAMW, "{\"type\":\"tokens\",\"path\":\"t.bin\",\"block_size\":3,\"x\":\"a\"}", ""),
        DDPD_ESPEC, "data.x",
        "unknown key (expected one of type, path, block_size, dtype, seed, shuffle, drop_last)"),
    BAD("{\"model\":" GPT_MODEL ",\"input_shape\":[3],\"loss\":\"mse\",\"optimizer\":" ADAMW
        ",\"data\":" TOKENS ",\"batch_size\":2,\"steps\":10}",
        DDPD_ESPEC, "data.type",
        "tokens data gives each sample [3] next-token targets: it needs loss cross_entropy on logits [3,C] "
        "(the loss is mse, the model's output [3,8])"),

    /* eval */
    BAD(GPT_WITH(ADAMW, TOKENS, ",\"eval\":{\"every_steps\":5}"), DDPD_ESPEC, "eval.data",
        "missing (expected a data object such as {\"type\": \"npy\", \"x\": \"val_x.npy\", \"y\": "
        "\"val_y.npy\"})"),
    BAD(GPT_WITH(ADAMW, TOKENS, ",\"eval\":{\"data\":" TOKENS "}"), DDPD_ESPEC, "eval.every_steps",
        "missing (expected a positive integer)"),
    BAD(GPT_WITH(ADAMW, TOKENS, ",\"eval\":{\"data\":" TOKENS ",\"every_steps\":0}"), DDPD_ESPEC,
        "eval.every_steps", "expected a positive integer, got 0"),
    BAD(GPT_WITH(ADAMW, TOKENS, ",\"eval\":{\"data\":" TOKENS ",\"every_steps\":5,\"max_batches\":0}"),
        DDPD_ESPEC, "eval.max_batches", "expected a positive integer, got 0"),
    BAD(GPT_WITH(ADAMW, TOKENS, ",\"eval\":{\"data\":" TOKENS ",\"every\":5}"), DDPD_ESPEC, "eval.every",
        "unknown key (expected one of data, every_steps, max_batches)"),
    BAD(GPT_WITH(ADAMW, TOKENS,
                 ",\"eval\":{\"data\":{\"type\":\"tokens\",\"path\":\"v.bin\",\"block_size\":3,\"shuffle\":"
                 "true},\"every_steps\":5}"),
        DDPD_ESPEC, "eval.data.shuffle", "expected false (eval data is never shuffled), got true"),
    BAD(GPT_WITH(ADAMW, TOKENS,
                 ",\"eval\":{\"data\":{\"type\":\"synthetic\",\"samples\":5},\"every_steps\":5}"),
        DDPD_ESPEC, "eval.data.type",
        "synthetic data feeds only models of linear layers and activations (model[0] is embedding); use npy "
        "or tokens data"),
    BAD(GPT_WITH(ADAMW, TOKENS,
                 ",\"eval\":{\"data\":{\"type\":\"tokens\",\"path\":\"v.bin\",\"block_size\":2},\"every_"
                 "steps\":5}"),
        DDPD_ESPEC, "eval.data.block_size",
        "expected input_shape [2] for samples of block_size 2, got input_shape [3]"),
    BAD(GPT_WITH(ADAMW, TOKENS, ",\"eval\":[]"), DDPD_ESPEC, "eval", "expected an object, got an array"),
    BAD(OK_PLUS(
            ",\"eval\":{\"data\":{\"type\":\"csv\",\"path\":\"t.csv\",\"target\":\"y\"},\"every_steps\":1}"),
        DDPD_ESPEC, "eval.data.target", "mse needs 2 target columns (model[0].out), got 1"),

    /* optimizer.schedule, grad_clip */
    BAD(GPT_WITH("{\"type\":\"adamw\",\"schedule\":{\"type\":\"step\"}}", TOKENS, ""), DDPD_ESPEC,
        "optimizer.schedule.type", "expected one of constant, linear, cosine, got \"step\""),
    BAD(GPT_WITH("{\"type\":\"adamw\",\"schedule\":{\"warmup_steps\":2}}", TOKENS, ""), DDPD_ESPEC,
        "optimizer.schedule.type", "missing (expected one of constant, linear, cosine)"),
    BAD(GPT_WITH("{\"type\":\"adamw\",\"schedule\":{\"type\":\"cosine\",\"min_lr\":0.01}}", TOKENS, ""),
        DDPD_ESPEC, "optimizer.schedule.min_lr",
        "expected a number from 0 to optimizer.lr (0.001), got 0.01"),
    BAD(GPT_WITH("{\"type\":\"adamw\",\"schedule\":{\"type\":\"cosine\",\"warmup_steps\":-1}}", TOKENS, ""),
        DDPD_ESPEC, "optimizer.schedule.warmup_steps", "expected a non-negative integer, got -1"),
    BAD(GPT_WITH(
            "{\"type\":\"adamw\",\"schedule\":{\"type\":\"cosine\",\"warmup_steps\":5,\"total_steps\":5}}",
            TOKENS, ""),
        DDPD_ESPEC, "optimizer.schedule.warmup_steps", "expected fewer than total_steps (5), got 5"),
    BAD(GPT_WITH("{\"type\":\"adamw\",\"schedule\":{\"type\":\"linear\",\"warmup_steps\":10}}", TOKENS, ""),
        DDPD_ESPEC, "optimizer.schedule.warmup_steps",
        "expected fewer than the job's steps (10: total_steps defaults to them), got 10"),
    BAD(GPT_WITH("{\"type\":\"adamw\",\"schedule\":{\"type\":\"linear\",\"total_steps\":0}}", TOKENS, ""),
        DDPD_ESPEC, "optimizer.schedule.total_steps", "expected a positive integer, got 0"),
    BAD(GPT_WITH("{\"type\":\"sgd\",\"lr\":0.1,\"schedule\":{\"type\":\"linear\",\"warmup\":1}}", TOKENS, ""),
        DDPD_ESPEC, "optimizer.schedule.warmup",
        "unknown key (expected one of type, warmup_steps, min_lr, total_steps)"),
    BAD(GPT_WITH("{\"type\":\"sgd\",\"lr\":0.1,\"schedule\":\"cosine\"}", TOKENS, ""), DDPD_ESPEC,
        "optimizer.schedule",
        "expected an object such as {\"type\": \"cosine\", \"warmup_steps\": 100}, got \"cosine\""),
    BAD(OK_PLUS(",\"grad_clip\":0"), DDPD_ESPEC, "grad_clip", "expected a positive number, got 0"),
    BAD(OK_PLUS(",\"grad_clip\":\"1\""), DDPD_ESPEC, "grad_clip", "expected a positive number, got \"1\""),
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
    if (strcmp(what, "@residual65") == 0 || strcmp(what, "@300layers") == 0 || strcmp(what, "@deep") == 0) {
        size_t cap = 65536, o = 0;
        buf = malloc(cap);
        o += (size_t)snprintf(buf + o, cap - o, "{\"model\":[{\"type\":\"linear\",\"in\":4,\"out\":4}");
        if (what[1] == 'r') { /* one residual of 65 layers */
            o +=
                (size_t)snprintf(buf + o, cap - o, ",{\"type\":\"residual\",\"layers\":[{\"type\":\"relu\"}");
            for (int i = 1; i < 65; i++)
                o += (size_t)snprintf(buf + o, cap - o, ",{\"type\":\"relu\"}");
            o += (size_t)snprintf(buf + o, cap - o, "]}");
        } else if (what[1] == '3') { /* 5 residuals of 60 layers: 306 in all */
            for (int r = 0; r < 5; r++) {
                o += (size_t)snprintf(buf + o, cap - o,
                                      ",{\"type\":\"residual\",\"layers\":[{\"type\":\"relu\"}");
                for (int i = 1; i < 60; i++)
                    o += (size_t)snprintf(buf + o, cap - o, ",{\"type\":\"tanh\"}");
                o += (size_t)snprintf(buf + o, cap - o, "]}");
            }
        } else { /* residuals 9 deep */
            for (int d = 0; d < 9; d++)
                o += (size_t)snprintf(buf + o, cap - o,
                                      ",{\"type\":\"residual\",\"layers\":[{\"type\":\"relu\"}");
            for (int d = 0; d < 9; d++)
                o += (size_t)snprintf(buf + o, cap - o, "]}");
        }
        snprintf(buf + o, cap - o, "]," LOSS "," OPTIM "," DATA "," BATCH "}");
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
             "\"log_every\":10,\"max_restarts\":3,\"name\":\"q\\\"uo\\\\te \\u00e9\",\"grad_accum\":4,"
             "\"on_nonfinite\":\"continue\""),
        SPEC("\"model\":[{\"type\":\"linear\",\"in\":2,\"out\":3}]", "\"loss\":\"cross_entropy\"",
             "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.3,\"momentum\":0.9,\"nesterov\":true,"
             "\"weight_decay\":1e-4}",
             "\"data\":{\"type\":\"npy\",\"x\":\"x.npy\",\"y\":\"y.npy\",\"drop_last\":true,"
             "\"seed\":9007199254740993}",
             BATCH, ",\"ddp\":{\"join\":false},\"init\":{\"seed\":42}"),
        OK_PLUS(",\"init\":{\"from_job\":7}"),
        OK_PLUS(",\"init\":{\"from_job\":7,\"step\":0}"),
        OK_PLUS(",\"ddp\":{\"comm_hook\":\"fp16\"}"),
        OK_PLUS(",\"ddp\":{\"comm_hook\":\"bf16\",\"join\":true}"),
        OK_PLUS(",\"ddp\":{\"comm_hook\":\"none\"}"),
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
        CHECK_EQ_INT(json_object_size(j), 20 - 1); /* epochs or steps, not both */
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
    /* ddp.comm_hook prints only when set, so that a spec without one prints as before. */
    CHECK(json_object_get(json_object_get(j, "ddp"), "comm_hook") == NULL);
    json_decref(j);
    CHECK_EQ_INT(parse(OK_PLUS(",\"ddp\":{\"comm_hook\":\"bf16\"}"), &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.ddp.comm_hook, COMM_HOOK_BF16);
    j = spec_to_json(&s);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "ddp"), "comm_hook")), "bf16");
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
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 10, .rank_file = false, .file_bytes = 0}, &m);
    CHECK_EQ_INT(m.rows, 2);
    CHECK_EQ_INT(m.params, 40);
    CHECK_EQ_INT(m.grads, 40);
    CHECK_EQ_INT(m.optim, 0);   /* sgd without momentum keeps no state */
    CHECK_EQ_INT(m.buckets, 0); /* one rank: no DDP */
    CHECK_EQ_INT(m.activations, 2 * 4 * (2 + 2 * 4));
    /* host x, y, labels and two loss copies; device x, y, labels, loss gradient, loss */
    CHECK_EQ_INT(m.batch, 4 * (2 * (4 + 2 * 2) + 2) + 4 * (2 * (4 + 2 * 2 + 2) + 1));
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
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 10, .rank_file = false, .file_bytes = 0}, &m);
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
    spec_memory_estimate(
        &s, &(struct spec_memory_in){.rows = INT64_MAX, .rank_file = false, .file_bytes = INT64_MAX}, &m);
    CHECK_EQ_INT(m.total, INT64_MAX);
    CHECK_EQ_INT(m.data, INT64_MAX);
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 10, .rank_file = false, .file_bytes = 0}, &m);
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
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 1000000000, .rank_file = true, .file_bytes = 0},
                         &m);
    CHECK_EQ_INT(m.rows, 1000000000);
    CHECK_EQ_INT(spec_memory_check(&s, &m, 1 << 30, "limit", DDPD_EDEVICE, &e), DDPD_EDEVICE);
    CHECK_EQ_STR(e.path, "batch_size");
    s.batch_size = 10;
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 1000000000, .rank_file = true, .file_bytes = 0},
                         &m);
    CHECK_EQ_INT(spec_memory_check(&s, &m, 1 << 30, "limit", DDPD_ESPEC, &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "data");
    CHECK(strstr(e.message, "micro-batches of 10 rows") != NULL);
    s.device = DEVICE_CUDA; /* the model and activations are on the GPU */
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 10, .rank_file = true, .file_bytes = 0}, &m);
    CHECK(m.device > 0 && m.host < m.total && m.host + m.device == m.total);
}

/* text.h directly: where the first unshowable thing is and what it is, for each kind. */
static void test_showable_text(void)
{
    static const struct {
        const char *s;
        size_t at;  /* == strlen(s): none */
        int32_t cp; /* -1: not UTF-8 */
    } cases[] = {
        {"", 0, 0},
        {"plain ascii ~!", 14, 0},
        {"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x9A\x80", 9, 0}, /* é € 🚀 */
        {"\xC2\xA0", 2, 0},                             /* U+00A0: the first after C1 */
        {"\xEF\xBF\xBD", 3, 0},                         /* U+FFFD */
        {"\xF4\x8F\xBF\xBF", 4, 0},                     /* U+10FFFF */
        {"a\x1b[2J", 1, 0x1B},
        {"\x1b]0;t\x07", 0, 0x1B},
        {"ab\t", 2, 0x09},
        {"\n", 0, 0x0A},
        {"\x1f", 0, 0x1F},
        {"x\x7f", 1, 0x7F},
        {"\xC2\x80", 0, 0x80},
        {"\xC3\xA9\xC2\x9B", 2, 0x9B},
        {"\xC2\x9F", 0, 0x9F},
        {"ab\xC0\x80", 2, -1},           /* overlong NUL */
        {"\xC1\xBF", 0, -1},             /* overlong DEL */
        {"\xE0\x80\x9B", 0, -1},         /* overlong CSI */
        {"\xED\xA0\x80", 0, -1},         /* a surrogate */
        {"\xF4\x90\x80\x80", 0, -1},     /* past U+10FFFF */
        {"\xF8\x88\x80\x80\x80", 0, -1}, /* five bytes */
        {"ok\xE6\x97", 2, -1},           /* cut short */
        {"\x80", 0, -1},                 /* a lone continuation byte */
        {"\xC3(", 0, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t cp = 0;
        size_t len = strlen(cases[i].s);
        CHECK_EQ_INT(text_find_unshowable(cases[i].s, len, &cp), cases[i].at);
        if (cases[i].at < len)
            CHECK_EQ_INT(cp, cases[i].cp);
    }
    /* The length is the caller's: a NUL inside is a control character, not the end. */
    int32_t cp = 0;
    CHECK_EQ_INT(text_find_unshowable("ab\0c", 4, &cp), 2);
    CHECK_EQ_INT(cp, 0);
    struct ddpd_error e;
    CHECK_EQ_INT(text_check_showable("tag-\x1b", 5, "tags[2]", &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.path, "tags[2]");
    CHECK_EQ_STR(e.message, "control character U+001B at byte 5 is not allowed");
    CHECK_EQ_INT(text_check_showable("\xFF", 1, "name", &e), DDPD_ESPEC);
    CHECK_EQ_STR(e.message, "invalid UTF-8 at byte 1");
    CHECK_EQ_INT(text_check_showable("fine", 4, "name", NULL), DDPD_OK);
}

int main(void)
{
    test_showable_text();
    test_seed_example();
    test_defaults();
    test_valid_variants();
    int n = test_invalid();
    test_round_trip();
    test_sizes_near_limits();
    fprintf(stderr, "%d invalid specs\n", n);
    CHECK_DONE();
}
