/* test_event.c — the events of CONTRACT.md §6: every kind survives encode → decode, the
 * text has the contract's keys in a stable order, a non-finite loss travels as null with
 * "nonfinite": true, strings are escaped, and bad lines fail naming the key. */
#include "check.h"

#include <float.h>

#include "schema/event.h"

static char line[EVENT_LINE_MAX];

static int encode(const struct event *ev)
{
    int n = event_encode(ev, line, sizeof line);
    CHECK(n > 0);
    CHECK_EQ_INT(n, n > 0 ? (long long)strlen(line) : n);
    return n;
}

/* encode → decode; the decoded event is *out. */
static void round_trip(const struct event *ev, struct event *out)
{
    struct ddpd_error e;
    int n = encode(ev);
    CHECK_EQ_INT(event_decode(line, (size_t)(n > 0 ? n : 0), out, &e), DDPD_OK);
    if (e.code != DDPD_OK)
        fprintf(stderr, "    %s: %s\n    line: %s\n", e.path, e.message, line);
}

static int same_bits(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

static void test_exact_text(void)
{
    struct event ev = {.kind = EVENT_START,
                       .rank = 0,
                       .world_size = 2,
                       .device = "cpu",
                       .params = 55,
                       .batches = 1000,
                       .ts = 1764680000.123};
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"start\",\"rank\":0,\"world_size\":2,\"device\":\"cpu\","
                       "\"params\":55,\"batches\":1000,\"ts\":1764680000.123000}");
    ev.activation_bytes = 123456;
    encode(&ev);
    CHECK_EQ_STR(line,
                 "{\"event\":\"start\",\"rank\":0,\"world_size\":2,\"device\":\"cpu\","
                 "\"params\":55,\"batches\":1000,\"activation_bytes\":123456,\"ts\":1764680000.123000}");
    {
        struct event back;
        struct ddpd_error e = {0};
        CHECK_EQ_INT(event_decode(line, strlen(line), &back, &e), DDPD_OK);
        CHECK_EQ_INT(back.activation_bytes, 123456);
    }

    ev = (struct event){.kind = EVENT_LOSS,
                        .rank = 0,
                        .step = 17,
                        .epoch = 0,
                        .loss = 0.2345,
                        .samples_per_s = 51234.5,
                        .ts = 2.5};
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"loss\",\"rank\":0,\"step\":17,\"epoch\":0,\"loss\":0.2345,"
                       "\"samples_per_s\":51234.5,\"ts\":2.500000}");

    /* §2a: lr and grad_norm on a loss event; the eval event */
    ev = (struct event){.kind = EVENT_LOSS,
                        .rank = 1,
                        .step = 3,
                        .loss = 0.5,
                        .samples_per_s = 2,
                        .lr = 0.0025,
                        .has_lr = true,
                        .grad_norm = 1.25,
                        .has_grad_norm = true,
                        .ts = 2.5};
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"loss\",\"rank\":1,\"step\":3,\"epoch\":0,\"loss\":0.5,"
                       "\"samples_per_s\":2.0,\"lr\":0.0025,\"grad_norm\":1.25,\"ts\":2.500000}");
    struct event back;
    CHECK_EQ_INT(event_decode(line, strlen(line), &back, NULL), DDPD_OK);
    CHECK(back.has_lr && back.lr == 0.0025 && back.has_grad_norm && back.grad_norm == 1.25);
    ev = (struct event){.kind = EVENT_EVAL,
                        .rank = 0,
                        .step = 40,
                        .loss = 0.125,
                        .accuracy = 0.75,
                        .has_accuracy = true,
                        .samples = 1797,
                        .ts = 4};
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"eval\",\"rank\":0,\"step\":40,\"loss\":0.125,\"accuracy\":0.75,"
                       "\"samples\":1797,\"ts\":4.000000}");
    CHECK_EQ_INT(event_decode(line, strlen(line), &back, NULL), DDPD_OK);
    CHECK(back.kind == EVENT_EVAL && back.step == 40 && back.loss == 0.125 && back.has_accuracy &&
          back.accuracy == 0.75 && back.samples == 1797);
    ev.has_accuracy = false; /* mse: no accuracy */
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"eval\",\"rank\":0,\"step\":40,\"loss\":0.125,\"samples\":1797,"
                       "\"ts\":4.000000}");
    CHECK_EQ_INT(event_decode(line, strlen(line), &back, NULL), DDPD_OK);
    CHECK(!back.has_accuracy && !back.has_lr);

    ev = (struct event){.kind = EVENT_JOIN, .rank = 1, .step = 499, .ts = 3};
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"join\",\"rank\":1,\"step\":499,\"ts\":3.000000}");

    ev = (struct event){.kind = EVENT_CHECKPOINT,
                        .rank = 0,
                        .step = 500,
                        .ts = 4,
                        .path = "var/jobs/42/ckpt-500/model.safetensors"};
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"checkpoint\",\"rank\":0,\"step\":500,"
                       "\"path\":\"var/jobs/42/ckpt-500/model.safetensors\",\"ts\":4.000000}");

    ev = (struct event){
        .kind = EVENT_DONE, .rank = 0, .steps = 1000, .loss = 0.0123, .seconds = 3.21, .ts = 5};
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"done\",\"rank\":0,\"steps\":1000,\"loss\":0.0123,"
                       "\"seconds\":3.21,\"ts\":5.000000}");

    ev = (struct event){.kind = EVENT_ERROR,
                        .rank = 1,
                        .error_kind = "comm",
                        .ts = 6,
                        .message = "rank 0 closed the connection during allreduce of bucket 2"};
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"error\",\"rank\":1,\"kind\":\"comm\",\"message\":\"rank 0 "
                       "closed the connection during allreduce of bucket 2\",\"ts\":6.000000}");
    /* A consequence of another rank's failure says so (optional key, only when true). */
    ev.secondary = true;
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"error\",\"rank\":1,\"kind\":\"comm\",\"message\":\"rank 0 "
                       "closed the connection during allreduce of bucket 2\",\"secondary\":true,"
                       "\"ts\":6.000000}");
    CHECK_EQ_INT(event_decode(line, strlen(line), &back, NULL), DDPD_OK);
    CHECK(back.kind == EVENT_ERROR && back.secondary && back.ts == 6);

    /* The server's events: no rank; server fields right after "event". */
    ev = (struct event){.kind = EVENT_STATE,
                        .rank = -1,
                        .state = "running",
                        .ts = 7,
                        .has_server_fields = true,
                        .job = 42,
                        .attempt = 1,
                        .seq = 9};
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"state\",\"job\":42,\"attempt\":1,\"seq\":9,"
                       "\"state\":\"running\",\"ts\":7.000000}");
    snprintf(ev.state, sizeof ev.state, "failed");
    snprintf(ev.message, sizeof ev.message, "server restarted");
    encode(&ev);
    CHECK_EQ_STR(line, "{\"event\":\"state\",\"job\":42,\"attempt\":1,\"seq\":9,"
                       "\"state\":\"failed\",\"error\":\"server restarted\",\"ts\":7.000000}");
}

static void test_round_trip_kinds(void)
{
    struct event in, out;

    in = (struct event){.kind = EVENT_START,
                        .rank = 3,
                        .world_size = 4,
                        .device = "cuda",
                        .params = 123456789012LL,
                        .batches = 77,
                        .ts = 1764680000.5};
    round_trip(&in, &out);
    CHECK_EQ_INT(out.kind, EVENT_START);
    CHECK_EQ_INT(out.rank, 3);
    CHECK_EQ_INT(out.world_size, 4);
    CHECK_EQ_STR(out.device, "cuda");
    CHECK_EQ_INT(out.params, 123456789012LL);
    CHECK_EQ_INT(out.batches, 77);
    CHECK(out.ts == 1764680000.5);
    CHECK(!out.has_server_fields);

    in = (struct event){.kind = EVENT_LOSS,
                        .rank = 1,
                        .step = 17,
                        .epoch = 2,
                        .loss = 1.0 / 3,
                        .samples_per_s = 51234.5,
                        .ts = 1764680000.25};
    round_trip(&in, &out);
    CHECK_EQ_INT(out.kind, EVENT_LOSS);
    CHECK_EQ_INT(out.rank, 1);
    CHECK_EQ_INT(out.step, 17);
    CHECK_EQ_INT(out.epoch, 2);
    CHECK(same_bits(out.loss, 1.0 / 3));
    CHECK(!out.nonfinite);
    CHECK(out.samples_per_s == 51234.5);
    CHECK(out.ts == 1764680000.25);

    in = (struct event){.kind = EVENT_JOIN, .rank = 2, .step = 499, .ts = 1};
    round_trip(&in, &out);
    CHECK_EQ_INT(out.kind, EVENT_JOIN);
    CHECK_EQ_INT(out.rank, 2);
    CHECK_EQ_INT(out.step, 499);

    in = (struct event){.kind = EVENT_CHECKPOINT,
                        .rank = 0,
                        .step = 500,
                        .ts = 1,
                        .path = "var/jobs/42/ckpt-500/model.safetensors"};
    round_trip(&in, &out);
    CHECK_EQ_INT(out.kind, EVENT_CHECKPOINT);
    CHECK_EQ_INT(out.step, 500);
    CHECK_EQ_STR(out.path, in.path);

    in = (struct event){
        .kind = EVENT_DONE, .rank = 0, .steps = 1000, .loss = 0.0123, .seconds = 3.21, .ts = 1};
    round_trip(&in, &out);
    CHECK_EQ_INT(out.kind, EVENT_DONE);
    CHECK_EQ_INT(out.steps, 1000);
    CHECK(same_bits(out.loss, 0.0123));
    CHECK(out.seconds == 3.21);

    in = (struct event){
        .kind = EVENT_ERROR, .rank = 1, .error_kind = "device", .ts = 1, .message = "CUDA out of memory"};
    round_trip(&in, &out);
    CHECK_EQ_INT(out.kind, EVENT_ERROR);
    CHECK_EQ_INT(out.rank, 1);
    CHECK_EQ_STR(out.error_kind, "device");
    CHECK_EQ_STR(out.message, "CUDA out of memory");

    in = (struct event){.kind = EVENT_STATE,
                        .rank = -1,
                        .state = "succeeded",
                        .ts = 1,
                        .has_server_fields = true,
                        .job = 1LL << 40,
                        .attempt = 2,
                        .seq = 12345};
    round_trip(&in, &out);
    CHECK_EQ_INT(out.kind, EVENT_STATE);
    CHECK_EQ_INT(out.rank, -1);
    CHECK_EQ_STR(out.state, "succeeded");
    CHECK_EQ_STR(out.message, "");
    CHECK(out.has_server_fields);
    CHECK_EQ_INT(out.job, 1LL << 40);
    CHECK_EQ_INT(out.attempt, 2);
    CHECK_EQ_INT(out.seq, 12345);

    /* Server fields on a worker event. */
    in = (struct event){.kind = EVENT_JOIN,
                        .rank = 5,
                        .step = 3,
                        .ts = 1,
                        .has_server_fields = true,
                        .job = 7,
                        .attempt = 1,
                        .seq = 0};
    round_trip(&in, &out);
    CHECK(out.has_server_fields);
    CHECK_EQ_INT(out.job, 7);
    CHECK_EQ_INT(out.rank, 5);
    CHECK(strncmp(line, "{\"event\":\"join\",\"job\":7,\"attempt\":1,\"seq\":0,\"rank\":5,", 52) == 0);
}

static void test_loss_bits(void)
{
    const double values[] = {0.1,
                             1.0 / 3,
                             2.0,
                             0.0,
                             -0.0,
                             5e-324,
                             DBL_MIN,
                             DBL_MAX,
                             -DBL_MAX,
                             1e-300,
                             123456.789,
                             9007199254740993.0,
                             1e17,
                             0.30000000000000004,
                             2.220446049250313e-16,
                             -7.5};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        struct event in = {.kind = EVENT_LOSS, .rank = 0, .step = 1, .loss = values[i], .ts = 1};
        struct event out;
        round_trip(&in, &out);
        CHECK(same_bits(out.loss, values[i]));
        if (!same_bits(out.loss, values[i]))
            fprintf(stderr, "    loss %.17g came back as %.17g: %s\n", values[i], out.loss, line);
        in.kind = EVENT_DONE;
        round_trip(&in, &out);
        CHECK(same_bits(out.loss, values[i]));
    }
}

static void test_nonfinite(void)
{
    const double values[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < 3; i++) {
        struct event in = {
            .kind = EVENT_LOSS, .rank = 0, .step = 4, .loss = values[i], .samples_per_s = 10, .ts = 1};
        struct event out;
        round_trip(&in, &out);
        CHECK(strstr(line, "\"loss\":null,\"nonfinite\":true") != NULL);
        CHECK(out.nonfinite);
        CHECK(isnan(out.loss));
        in.kind = EVENT_DONE;
        round_trip(&in, &out);
        CHECK(strstr(line, "\"loss\":null,\"nonfinite\":true") != NULL);
        CHECK(out.nonfinite);
        CHECK(isnan(out.loss));
    }
    /* The flag alone is enough to send null. */
    struct event in = {.kind = EVENT_LOSS, .loss = 1.5, .nonfinite = true, .ts = 1}, out;
    round_trip(&in, &out);
    CHECK(strstr(line, "\"loss\":null,\"nonfinite\":true") != NULL);
    /* A finite loss has no nonfinite key. */
    in.nonfinite = false;
    round_trip(&in, &out);
    CHECK(strstr(line, "nonfinite") == NULL);
    CHECK(!out.nonfinite);
    /* Other non-finite numbers are null too, and read back as NaN. */
    in = (struct event){.kind = EVENT_LOSS, .loss = 1, .samples_per_s = INFINITY, .ts = 1};
    round_trip(&in, &out);
    CHECK(strstr(line, "\"samples_per_s\":null") != NULL);
    CHECK(isnan(out.samples_per_s));
    /* Huge numbers do not print hundreds of digits. */
    in = (struct event){.kind = EVENT_LOSS, .loss = 1, .samples_per_s = 1e300, .ts = 1e300};
    round_trip(&in, &out);
    CHECK(strlen(line) < 200);
    CHECK(out.samples_per_s == 1e300 && out.ts == 1e300);
}

static void test_escaping(void)
{
    const char *msg = "say \"hi\" \\ back\\slash\nnew line\ttab\r\x01\x1f end \xc3\xbcnic\xc3\xb6"
                      "de \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x8e\x89 /slash\x7f";
    struct event in = {.kind = EVENT_ERROR, .rank = 0, .error_kind = "internal", .ts = 1}, out;
    snprintf(in.message, sizeof in.message, "%s", msg);
    round_trip(&in, &out);
    CHECK_EQ_STR(out.message, msg);
    CHECK(strstr(line, "say \\\"hi\\\" \\\\ back\\\\slash\\nnew line\\ttab\\r\\u0001\\u001f end "
                       "\xc3\xbcnic\xc3\xb6"
                       "de \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x8e\x89") != NULL);

    /* Bytes that are not UTF-8 (a message cut mid-character) become U+FFFD, so the line
     * stays JSON that decodes. */
    snprintf(in.message, sizeof in.message, "bad \xff byte, cut \xe6\x97");
    round_trip(&in, &out);
    CHECK(strstr(line, "bad \\ufffd byte, cut \\ufffd\\ufffd\"") != NULL);
    CHECK_EQ_STR(out.message, "bad \xef\xbf\xbd byte, cut \xef\xbf\xbd\xef\xbf\xbd");
    /* Overlong and surrogate encodings are not UTF-8 either. */
    snprintf(in.message, sizeof in.message, "\xc0\xaf \xed\xa0\x80");
    round_trip(&in, &out);
    CHECK(strstr(line, "\"\\ufffd\\ufffd \\ufffd\\ufffd\\ufffd\"") != NULL);

    /* Paths and state strings are escaped too. */
    in = (struct event){.kind = EVENT_CHECKPOINT,
                        .rank = 0,
                        .step = 1,
                        .ts = 1,
                        .path = "dir with \"quotes\"/model.safetensors"};
    round_trip(&in, &out);
    CHECK_EQ_STR(out.path, in.path);

    /* The worst case fits EVENT_LINE_MAX: every string full, every byte a control char. */
    for (int k = EVENT_START; k <= EVENT_STATE; k++) {
        struct event ev = {.kind = (event_kind)k,
                           .rank = 1 << 30,
                           .world_size = 1 << 30,
                           .params = INT64_MAX,
                           .batches = INT64_MIN,
                           .step = INT64_MIN,
                           .epoch = INT64_MAX,
                           .loss = -DBL_MIN,
                           .samples_per_s = -DBL_MAX,
                           .steps = INT64_MAX,
                           .seconds = -DBL_MAX,
                           .ts = -DBL_MAX,
                           .has_server_fields = true,
                           .job = INT64_MIN,
                           .attempt = INT64_MIN,
                           .seq = INT64_MIN};
        memset(ev.device, 1, sizeof ev.device - 1);
        memset(ev.path, 1, sizeof ev.path - 1);
        memset(ev.error_kind, 1, sizeof ev.error_kind - 1);
        memset(ev.message, 1, sizeof ev.message - 1);
        memset(ev.state, 1, sizeof ev.state - 1);
        int n = event_encode(&ev, line, sizeof line);
        CHECK(n > 0 && n < EVENT_LINE_MAX);
        /* Fields need not be NUL-terminated: the encoder reads at most their size. */
        memset(ev.message, 'a', sizeof ev.message);
        memset(ev.device, 'a', sizeof ev.device);
        CHECK(event_encode(&ev, line, sizeof line) > 0);
    }
}

static void test_cap(void)
{
    struct event ev = {
        .kind = EVENT_LOSS, .rank = 0, .step = 17, .loss = 0.25, .samples_per_s = 100, .ts = 1764680000.123};
    char buf[512];
    int n = event_encode(&ev, buf, sizeof buf);
    CHECK(n > 0);
    /* Too small by any amount, including the NUL: -1, and nothing past cap is touched. */
    for (int cap = 0; cap <= n; cap++) {
        char small[512];
        memset(small, '#', sizeof small);
        CHECK_EQ_INT(event_encode(&ev, small, (size_t)cap), -1);
        CHECK(small[cap] == '#');
    }
    char exact[512];
    CHECK_EQ_INT(event_encode(&ev, exact, (size_t)n + 1), n);
    CHECK_EQ_STR(exact, buf);
    ev.kind = (event_kind)99;
    CHECK_EQ_INT(event_encode(&ev, buf, sizeof buf), -1);
}

struct bad_line {
    const char *line;
    const char *path, *message;
};

static const struct bad_line bad_lines[] = {
    {"{\"rank\":0,\"ts\":1}", "event", "missing (expected the event's kind)"},
    {"{\"event\":5,\"ts\":1}", "event", "expected a string, got an integer"},
    {"{\"event\":\"epoch\",\"rank\":0,\"ts\":1}", "event",
     "unknown event \"epoch\" (expected one of start, loss, join, checkpoint, done, error, eval, state)"},
    {"{\"event\":\"loss\",\"step\":1,\"epoch\":0,\"loss\":1,\"samples_per_s\":1,\"ts\":1}", "rank",
     "missing (expected an integer)"},
    {"{\"event\":\"loss\",\"rank\":-1,\"step\":1,\"epoch\":0,\"loss\":1,\"samples_per_s\":1,"
     "\"ts\":1}",
     "rank", "expected an integer from 0 to 2147483647, got -1"},
    {"{\"event\":\"loss\",\"rank\":0,\"step\":\"1\",\"epoch\":0,\"loss\":1,\"samples_per_s\":1,"
     "\"ts\":1}",
     "step", "expected an integer, got a string"},
    {"{\"event\":\"loss\",\"rank\":0,\"step\":1.5,\"epoch\":0,\"loss\":1,\"samples_per_s\":1,"
     "\"ts\":1}",
     "step", "expected an integer, got a real number"},
    {"{\"event\":\"loss\",\"rank\":0,\"step\":1,\"epoch\":0,\"samples_per_s\":1,\"ts\":1}", "loss",
     "missing (expected a number or null)"},
    {"{\"event\":\"loss\",\"rank\":0,\"step\":1,\"epoch\":0,\"loss\":\"nan\",\"samples_per_s\":1,"
     "\"ts\":1}",
     "loss", "expected a number or null, got a string"},
    {"{\"event\":\"loss\",\"rank\":0,\"step\":1,\"epoch\":0,\"loss\":1,\"nonfinite\":true,"
     "\"samples_per_s\":1,\"ts\":1}",
     "nonfinite", "is true but loss is a number"},
    {"{\"event\":\"loss\",\"rank\":0,\"step\":1,\"epoch\":0,\"loss\":null,\"nonfinite\":1,"
     "\"samples_per_s\":1,\"ts\":1}",
     "nonfinite", "expected true or false, got an integer"},
    {"{\"event\":\"loss\",\"rank\":0,\"step\":1,\"epoch\":0,\"loss\":1,\"samples_per_s\":1}", "ts",
     "missing (expected a number or null)"},
    {"{\"event\":\"start\",\"rank\":0,\"world_size\":2,\"device\":\"a-very-long-device\","
     "\"params\":1,\"batches\":1,\"ts\":1}",
     "device", "expected a string of at most 15 bytes, got 18 bytes"},
    {"{\"event\":\"start\",\"rank\":0,\"world_size\":0,\"device\":\"cpu\",\"params\":1,"
     "\"batches\":1,\"ts\":1}",
     "world_size", "expected an integer from 1 to 2147483647, got 0"},
    {"{\"event\":\"checkpoint\",\"rank\":0,\"step\":1,\"path\":[],\"ts\":1}", "path",
     "expected a string, got an array"},
    {"{\"event\":\"error\",\"rank\":0,\"message\":\"x\",\"ts\":1}", "kind", "missing (expected a string)"},
    {"{\"event\":\"error\",\"rank\":0,\"kind\":\"comm\",\"message\":\"x\",\"secondary\":1,\"ts\":1}",
     "secondary", "expected true or false, got an integer"},
    {"{\"event\":\"state\",\"state\":\"failed\",\"error\":false,\"ts\":1}", "error",
     "expected a string, got a boolean"},
    {"{\"event\":\"join\",\"job\":1,\"rank\":0,\"step\":1,\"ts\":1}", "attempt",
     "missing (expected an integer)"},
    {"[1,2]", "", "expected an event object, got an array"},
    {"{\"event\":\"join\",", "",
     "malformed JSON at line 1, column 16: string or '}' expected near end of file"},
    {"not json", "", "malformed JSON at line 1, column 3: '[' or '{' expected near 'not'"},
};

static void test_decode_errors(void)
{
    for (size_t i = 0; i < sizeof bad_lines / sizeof bad_lines[0]; i++) {
        struct event ev;
        struct ddpd_error e;
        int before = check__failures;
        ddpd_err rc = event_decode(bad_lines[i].line, strlen(bad_lines[i].line), &ev, &e);
        CHECK_EQ_INT(rc, DDPD_EJSON);
        CHECK_EQ_STR(e.path, bad_lines[i].path);
        CHECK_EQ_STR(e.message, bad_lines[i].message);
        if (check__failures != before)
            fprintf(stderr, "    in bad line %zu: %s\n", i, bad_lines[i].line);
    }
    struct event ev;
    struct ddpd_error e;
    const char *s = "{\"event\":\"join\",\n\"rank\":}";
    CHECK_EQ_INT(event_decode(s, strlen(s), &ev, &e), DDPD_EJSON);
    CHECK_EQ_INT(e.line, 2);
    CHECK_EQ_INT(e.column, 8);

    /* Unknown keys are ignored (forward compatible); the line need not be NUL-terminated. */
    s = "{\"event\":\"join\",\"rank\":1,\"step\":2,\"ts\":3,\"future\":{\"x\":[1]}}garbage";
    CHECK_EQ_INT(event_decode(s, strlen(s) - 7, &ev, &e), DDPD_OK);
    CHECK_EQ_INT(ev.step, 2);
    /* null loss sets nonfinite even without the flag. */
    s = "{\"event\":\"done\",\"rank\":0,\"steps\":3,\"loss\":null,\"seconds\":1,\"ts\":1}";
    CHECK_EQ_INT(event_decode(s, strlen(s), &ev, &e), DDPD_OK);
    CHECK(ev.nonfinite && isnan(ev.loss));
    /* Integers are numbers. */
    s = "{\"event\":\"done\",\"rank\":0,\"steps\":3,\"loss\":2,\"seconds\":1,\"ts\":1}";
    CHECK_EQ_INT(event_decode(s, strlen(s), &ev, &e), DDPD_OK);
    CHECK(ev.loss == 2.0 && !ev.nonfinite);
}

/* The launcher blames a rank with its last error event: any valid JSON of one counts. */
static void test_error_message(void)
{
    char msg[64] = "unchanged";
    const char *compact = "{\"event\":\"error\",\"rank\":1,\"kind\":\"comm\","
                          "\"message\":\"peer gone\",\"ts\":1}";
    const char *spaced = "{\"rank\": 0, \"event\": \"error\", \"kind\": \"data\", "
                         "\"message\": \"bad row\", \"ts\": 2.5}";
    const char *loss = "{\"event\":\"loss\",\"rank\":0,\"step\":1,\"epoch\":0,\"loss\":0.5,"
                       "\"samples_per_s\":1,\"ts\":1}";
    const char *named = "{\"event\":\"done\",\"rank\":0,\"steps\":1,\"loss\":0.5,\"seconds\":1,"
                        "\"ts\":1,\"x\":\"error\"}";
    CHECK(!event_error_message(loss, strlen(loss), msg, sizeof msg));
    CHECK(!event_error_message(named, strlen(named), msg, sizeof msg));
    CHECK(!event_error_message("not json \"error\"", 16, msg, sizeof msg));
    CHECK_EQ_STR(msg, "unchanged");
    CHECK(event_error_message(compact, strlen(compact), msg, sizeof msg));
    CHECK_EQ_STR(msg, "peer gone");
    CHECK(event_error_message(spaced, strlen(spaced), msg, sizeof msg));
    CHECK_EQ_STR(msg, "bad row");
    const char *escaped = "{\"event\":\"\\u0065rror\",\"rank\":1,\"kind\":\"comm\","
                          "\"message\":\"x\",\"ts\":1}";
    CHECK(event_error_message(escaped, strlen(escaped), msg, sizeof msg));
    CHECK_EQ_STR(msg, "x");
    CHECK(event_error_message(compact, strlen(compact), msg, 5));
    CHECK_EQ_STR(msg, "peer");

    /* The whole event, for the launcher's choice of the cause (server/cause.h). */
    struct event ev;
    CHECK(!event_error_decode(loss, strlen(loss), &ev));
    CHECK(event_error_decode(spaced, strlen(spaced), &ev));
    CHECK(ev.rank == 0 && ev.ts == 2.5 && !ev.secondary);
    CHECK_EQ_STR(ev.error_kind, "data");
    const char *echo = "{\"event\":\"error\",\"rank\":2,\"kind\":\"comm\",\"message\":\"rank 1 reported: x\","
                       "\"secondary\":true,\"ts\":3}";
    CHECK(event_error_decode(echo, strlen(echo), &ev));
    CHECK(ev.rank == 2 && ev.secondary && ev.ts == 3);
}

int main(void)
{
    test_exact_text();
    test_round_trip_kinds();
    test_loss_bits();
    test_nonfinite();
    test_escaping();
    test_cap();
    test_decode_errors();
    test_error_message();
    CHECK_EQ_STR(event_kind_name(EVENT_CHECKPOINT), "checkpoint");
    CHECK_EQ_STR(event_kind_name(EVENT_STATE), "state");
    CHECK_EQ_STR(event_kind_name((event_kind)42), "unknown");
    CHECK_DONE();
}
