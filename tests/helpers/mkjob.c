/* mkjob.c — a test helper: one job with a long event history, written through the store
 * (store_event_append, as the supervisor does), for the tests and measurements of
 * streaming a long history (api/test_stream.py, tests/README.md). Not a product program.
 *
 * Usage: ddpd_test_mkjob DB EVENTS [succeeded|running]
 *   Opens (creating) the database DB, inserts a job with its `queued` event (seq 1), a
 *   `running` state event, loss events from rank 0 (one per step) up to seq EVENTS - 1,
 *   and with `succeeded` (the default) the final `succeeded` state event as seq EVENTS
 *   and the row's final state; with `running` the job is left running (a server started
 *   on DB then ends it as "server restarted"). Prints the job's id. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../schema/event.h"
#include "../../server/store.h"

static int fail(const char *what, const struct ddpd_error *e)
{
    fprintf(stderr, "ddpd_test_mkjob: %s: %s\n", what, e->message);
    return 1;
}

static ddpd_err append(struct store *s, struct event *ev)
{
    char body[EVENT_LINE_MAX];
    struct ddpd_error e;
    int n = event_encode(ev, body, sizeof body);
    if (n < 0)
        return DDPD_EINTERNAL;
    ddpd_err rc;
    /* The queue may be full for a moment (the writer is behind): wait and retry. */
    while ((rc = store_event_append(s, ev, body, (size_t)n, &e)) == DDPD_EBUSY)
        ;
    if (rc)
        fprintf(stderr, "ddpd_test_mkjob: append seq %" PRId64 ": %s\n", ev->seq, e.message);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: ddpd_test_mkjob DB EVENTS [succeeded|running]\n");
        return 2;
    }
    char *end;
    long long n = strtoll(argv[2], &end, 10);
    bool final = argc < 4 || !strcmp(argv[3], "succeeded");
    if (*end || n < 3 || (argc == 4 && !final && strcmp(argv[3], "running"))) {
        fprintf(stderr, "ddpd_test_mkjob: EVENTS must be >= 3, the state succeeded or running\n");
        return 2;
    }
    struct ddpd_error e;
    struct store *s = store_open(argv[1], &e);
    if (!s)
        return fail("open", &e);
    static const char spec[] = "{\"name\":\"long\",\"world_size\":1}";
    struct store_job_new jn = {
        .name = "long", .spec = spec, .world_size = 1, .device = DEVICE_CPU, .queued_event = true};
    int64_t id;
    double created;
    if (store_job_insert(s, &jn, &id, &created, &e) || store_attempt_begin(s, id, 1, NULL, &e))
        return fail("insert", &e);
    struct store_job_update u = {
        .fields = STORE_SET_STATE | STORE_SET_ATTEMPT, .state = JOB_STATE_RUNNING, .attempt = 1};
    struct store_rank sr = {.attempt = 1, .rank = 0, .pid = 1};
    snprintf(sr.state, sizeof sr.state, "running");
    if (store_job_update(s, id, &u, NULL, &e) || store_rank_put(s, id, &sr, &e))
        return fail("start", &e);

    struct event ev = {.kind = EVENT_STATE,
                       .rank = -1,
                       .ts = created,
                       .has_server_fields = true,
                       .job = id,
                       .attempt = 1,
                       .seq = 2};
    snprintf(ev.state, sizeof ev.state, "running");
    if (append(s, &ev))
        return 1;
    for (int64_t seq = 3; seq < n; seq++) {
        ev = (struct event){.kind = EVENT_LOSS,
                            .rank = 0,
                            .step = seq - 2,
                            .epoch = (seq - 2) / 1000,
                            .loss = 1.0 / (double)seq,
                            .samples_per_s = 51234.5,
                            .ts = created + 1e-3 * (double)seq,
                            .has_server_fields = true,
                            .job = id,
                            .attempt = 1,
                            .seq = seq};
        if (append(s, &ev))
            return 1;
    }
    if (final) {
        ev = (struct event){.kind = EVENT_STATE,
                            .rank = -1,
                            .ts = created + 1e-3 * (double)n,
                            .has_server_fields = true,
                            .job = id,
                            .attempt = 1,
                            .seq = n};
        snprintf(ev.state, sizeof ev.state, "succeeded");
        if (append(s, &ev))
            return 1;
    }
    if (store_flush(s, &e))
        return fail("flush", &e);
    if (final) {
        /* As the supervisor: the final event is stored before the row says so. */
        struct store_job_update f = {.fields = STORE_SET_STATE, .state = JOB_STATE_SUCCEEDED};
        if (store_job_update(s, id, &f, NULL, &e))
            return fail("finish", &e);
    }
    store_close(s);
    printf("%" PRId64 "\n", id);
    return 0;
}
