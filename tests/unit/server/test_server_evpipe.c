/* test_server_evpipe.c — server/evpipe.c with a real store and hub: an event is in the
 * store once drained; an end the store did not take (its row, its ranks' rows) is stored
 * by evpipe_retry; the end of a job deleted meanwhile is dropped, not retried forever. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "server/evpipe.h"
#include "server/hub.h"
#include "server/store.h"

static int64_t new_job(struct store *s)
{
    struct ddpd_error e;
    struct store_job_new jn = {.name = "t", .spec = "{}", .world_size = 2, .device = DEVICE_CPU};
    int64_t id = 0;
    CHECK_EQ_INT(store_job_insert(s, &jn, &id, NULL, &e), DDPD_OK);
    return id;
}

static struct event state_event(int64_t job, int64_t seq, const char *state)
{
    struct event ev = {.kind = EVENT_STATE,
                       .rank = -1,
                       .has_server_fields = true,
                       .job = job,
                       .attempt = 1,
                       .seq = seq,
                       .ts = 1764680000.0 + (double)seq};
    snprintf(ev.state, sizeof ev.state, "%s", state);
    return ev;
}

static int64_t max_seq(struct store *s, int64_t job)
{
    int64_t seq = -1;
    CHECK_EQ_INT(store_event_max_seq(s, job, &seq, NULL), DDPD_OK);
    return seq;
}

int main(void)
{
    const char *base = getenv("DDPD_TEST_TMP");
    char dir[600], db[700];
    snprintf(dir, sizeof dir, "%s/evpipe-XXXXXX", base ? base : "/tmp");
    if (base)
        mkdir(base, 0755);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(db, sizeof db, "%s/ddpd.db", dir);
    struct ddpd_error e;
    struct store *st = store_open(db, &e);
    struct hub *hub = hub_new(NULL);
    struct evpipe *p = evpipe_new(st, hub);
    CHECK(st && hub && p);
    if (!st || !hub || !p)
        return 1;

    /* Added, then in the store once drained (the job's queued event is seq 1). */
    int64_t a = new_job(st);
    CHECK_EQ_INT(store_flush(st, NULL), DDPD_OK);
    int64_t before = max_seq(st, a);
    struct event ev = state_event(a, before + 1, "starting");
    evpipe_add(p, &ev, false);
    evpipe_drain(p);
    CHECK_EQ_INT(max_seq(st, a), before + 1);

    /* An end whose row and ranks the store did not take: stored by the retry. */
    CHECK_EQ_INT(store_attempt_begin(st, a, 1, NULL, NULL), DDPD_OK);
    struct event fin = state_event(a, before + 2, "failed");
    evpipe_add(p, &fin, false);
    evpipe_drain(p);
    struct store_rank *ranks = calloc(2, sizeof *ranks);
    for (int r = 0; r < 2; r++) {
        ranks[r] = (struct store_rank){.attempt = 1, .rank = r, .has_exit_code = true, .exit_code = 3 + r};
        snprintf(ranks[r].state, sizeof ranks[r].state, "failed");
    }
    evpipe_end_unsaved(p, &fin, false, 1, "rank 1 failed", ranks, 2);
    evpipe_retry(p, true);
    struct store_job j;
    memset(&j, 0, sizeof j);
    CHECK_EQ_INT(store_job_get(st, a, &j, &e), DDPD_OK);
    CHECK_EQ_INT(j.state, JOB_STATE_FAILED);
    CHECK_EQ_INT(j.restarts, 1);
    CHECK_EQ_STR(j.error, "rank 1 failed");
    CHECK_EQ_INT((int)j.n_ranks, 2);
    if (j.n_ranks == 2)
        CHECK_EQ_INT(j.ranks[1].exit_code, 4);
    store_job_clear(&j);

    /* The end of a job deleted meanwhile is dropped: the retry stores nothing of it. */
    int64_t b = new_job(st);
    CHECK_EQ_INT(store_flush(st, NULL), DDPD_OK);
    struct store_job_update u = {.fields = STORE_SET_STATE, .state = JOB_STATE_CANCELLED};
    CHECK_EQ_INT(store_job_update(st, b, &u, NULL, &e), DDPD_OK);
    struct event fb = state_event(b, max_seq(st, b) + 1, "cancelled");
    evpipe_end_unsaved(p, &fb, false, 0, NULL, NULL, 0);
    CHECK_EQ_INT(store_job_delete(st, b, JOB_STATES_FINAL, &e), DDPD_OK);
    evpipe_retry(p, true);
    memset(&j, 0, sizeof j);
    CHECK_EQ_INT(store_job_get(st, b, &j, NULL), DDPD_ENOTFOUND);
    store_job_clear(&j);
    evpipe_report_unsaved(p); /* nothing left to report */

    evpipe_free(p);
    evpipe_free(NULL);
    hub_free(hub);
    store_close(st);
    char path[800];
    snprintf(path, sizeof path, "%s/ddpd.db", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/ddpd.db-wal", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/ddpd.db-shm", dir);
    unlink(path);
    rmdir(dir);
    CHECK_DONE();
}
