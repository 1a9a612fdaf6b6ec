/* test_cause.c — the choice of an attempt's failed rank (server/cause.h): the rank where
 * the failure began, whatever order the launcher saw the ends in. Each case is tried in
 * every order of the ends (and of their wall-clock times where no event stamps them):
 * the answer may depend on what the ranks said and how they ended, never on that order. */
#include "check.h"
#include "server/cause.h"

#define N 3

/* One rank's end: failed with `exit`, and its error event when kind is not NULL. */
static struct cause_rank end(enum cause_exit exit, const char *kind, double ts, bool secondary,
                             const char *msg)
{
    struct cause_rank r = {.failed = true, .exit = exit};
    if (kind) {
        r.has_error = true;
        r.secondary = secondary;
        r.ts = ts;
        snprintf(r.kind, sizeof r.kind, "%s", kind);
        snprintf(r.message, sizeof r.message, "%s", msg);
    }
    return r;
}

/* Every order in which the launcher could have seen the ends of ranks[0..N): `want` in each. */
static void picks_in_every_order(struct cause_rank ranks[N], int want, const char *what)
{
    static const int perms[6][N] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int p = 0; p < 6; p++) {
        for (int i = 0; i < N; i++) {
            ranks[perms[p][i]].order = i + 1;
            ranks[perms[p][i]].ended_at = 100.0 + i * 0.05; /* the reaper's 50 ms */
        }
        int got = cause_pick(ranks, N);
        if (got != want)
            CHECK__FAIL("%s: seen in order %d,%d,%d: picked rank %d, expected %d", what, perms[p][0],
                        perms[p][1], perms[p][2], got, want);
    }
}

/* The case: rank 2's optimizer file is missing; it writes its data error, aborts,
 * and its peers fail of it. However late rank 2 ended, and even when the launcher's signal
 * ended it (143), its error is the cause, and the exit code is its kind's. */
static void test_missing_file_under_any_order(void)
{
    struct cause_rank r[N];
    r[0] = end(CAUSE_EXIT_LOST_PEER, "comm", 10.002, true,
               "rank 0: rank 2 reported: rank 2 aborted its communicator");
    r[1] = end(CAUSE_EXIT_LOST_PEER, "comm", 10.001, true,
               "rank 1: rank 2 reported: rank 2 aborted its communicator");
    for (int e = CAUSE_EXIT_OWN; e <= CAUSE_EXIT_STOPPED; e++) {
        r[2] = end((enum cause_exit)e, "data", 10.0, false, "ckpt-8/optim-rank-2.safetensors: cannot open");
        picks_in_every_order(r, 2, "data error beside its echoes");
    }
    CHECK_EQ_INT(cause_exit_code(&r[2], 143), 2);
    /* The stamp does not matter either: a clock a little behind on rank 0 cannot make an
     * echo the cause. */
    r[0].ts = 9.0;
    picks_in_every_order(r, 2, "an echo stamped before the cause");
    /* A peer that the launcher's SIGTERM stopped before it could fail writes nothing. */
    r[1] = end(CAUSE_EXIT_STOPPED, NULL, 0, false, NULL);
    picks_in_every_order(r, 2, "a peer stopped without an event");
}

/* A rank killed from outside (SIGKILL, the out-of-memory killer) writes no event: its
 * death is the cause, and its peers' comm errors are echoes, marked or not (NCCL's are
 * not), even when stamped before the launcher reaped the dead rank. */
static void test_killed_rank_without_an_event(void)
{
    struct cause_rank r[N];
    r[0] = end(CAUSE_EXIT_LOST_PEER, "comm", 50.0, true, "rank 0: peer rank 1 closed the connection");
    r[1] = end(CAUSE_EXIT_OWN, NULL, 0, false, NULL);
    r[2] = end(CAUSE_EXIT_LOST_PEER, "comm", 50.0, false, "nccl: all-reduce: remote process exited");
    picks_in_every_order(r, 1, "a killed rank");
    CHECK_EQ_INT(cause_exit_code(&r[1], 137), 137);
}

/* Two failures of their own: the earlier one (by the ranks' stamps), whatever was reaped
 * first; equal stamps go to the lower rank. */
static void test_earliest_own_failure(void)
{
    struct cause_rank r[N];
    r[0] = end(CAUSE_EXIT_OWN, "io", 7.5, false, "disk full");
    r[1] = end(CAUSE_EXIT_LOST_PEER, "comm", 7.4, true, "rank 1: rank 2 reported: x");
    r[2] = end(CAUSE_EXIT_OWN, "data", 7.2, false, "x.npy: truncated");
    picks_in_every_order(r, 2, "the earlier of two data/io errors");
    r[0].ts = 7.2;
    picks_in_every_order(r, 0, "equal stamps");
    CHECK_EQ_INT(cause_exit_code(&r[0], 1), 1);
}

/* No rank failed of its own: a collective that timed out first-hand is the cause, not the
 * peers that heard of it, nor the ranks the launcher then stopped (whose `cancelled`
 * errors come later). */
static void test_a_timeout_and_its_echoes(void)
{
    struct cause_rank r[N];
    r[0] = end(CAUSE_EXIT_STOPPED, "cancelled", 31.0, false, "cancelled by SIGTERM");
    r[1] = end(CAUSE_EXIT_LOST_PEER, "comm", 30.0, false,
               "rank 1: allreduce timed out after 30.0 s waiting for rank 0");
    r[2] = end(CAUSE_EXIT_LOST_PEER, "comm", 29.0, true, "rank 2: rank 1 reported: allreduce timed out");
    picks_in_every_order(r, 1, "a timeout");
    CHECK_EQ_INT(cause_exit_code(&r[1], 3), 3);
    /* A rank cancelled from outside (not by the launcher) is the cause of its peers'
     * cancels, which are marked secondary. */
    r[0] = end(CAUSE_EXIT_OWN, "cancelled", 40.0, false, "cancelled by SIGTERM");
    r[1] = end(CAUSE_EXIT_OWN, "cancelled", 39.0, true, "rank 1: rank 0 reported: it was cancelled");
    r[2] = end(CAUSE_EXIT_OWN, "cancelled", 39.5, true, "rank 2: rank 0 reported: it was cancelled");
    picks_in_every_order(r, 0, "a cancel");
    CHECK_EQ_INT(cause_exit_code(&r[0], 5), 5);
}

/* Echoes only (no event says more): an exit of its own, then a lost peer, then a rank
 * stopped, and among equals the first seen. */
static void test_echoes_only(void)
{
    struct cause_rank r[N];
    r[0] = end(CAUSE_EXIT_STOPPED, NULL, 0, false, NULL);
    r[1] = end(CAUSE_EXIT_LOST_PEER, NULL, 0, false, NULL);
    r[2] = end(CAUSE_EXIT_STOPPED, "cancelled", 5.0, true, "rank 2: rank 1 reported: it was cancelled");
    picks_in_every_order(r, 1, "a lost peer before ranks stopped");
    r[1].exit = CAUSE_EXIT_STOPPED;
    r[0].order = 2, r[1].order = 3, r[2].order = 1;
    CHECK_EQ_INT(cause_pick(r, N), 2);
    r[2].order = 0; /* unknown: last */
    CHECK_EQ_INT(cause_pick(r, N), 0);
    CHECK_EQ_INT(cause_exit_code(&r[0], 143), 143);
}

static void test_no_failure(void)
{
    struct cause_rank r[N] = {{0}};
    CHECK_EQ_INT(cause_pick(r, N), -1);
    CHECK_EQ_INT(cause_pick(r, 0), -1);
    r[1] = end(CAUSE_EXIT_OWN, NULL, 0, false, NULL); /* the only failure, time unknown */
    CHECK_EQ_INT(cause_pick(r, N), 1);
}

/* The lines a rank writes: only an `error` event is noted, the last one kept; an unknown
 * kind keeps the process's exit code. */
static void test_note_line(void)
{
    struct cause_rank r = {0};
    const char *loss =
        "{\"event\":\"loss\",\"rank\":0,\"step\":1,\"epoch\":0,\"loss\":0.5,\"samples_per_s\":1,\"ts\":1}";
    const char *first =
        "{\"event\":\"error\",\"rank\":0,\"kind\":\"comm\",\"message\":\"a\",\"secondary\":true,"
        "\"ts\":2.5}";
    const char *second = "{\"event\":\"error\",\"rank\":0,\"kind\":\"data\",\"message\":\"b\",\"ts\":3}";
    cause_note_line(&r, loss, strlen(loss));
    cause_note_line(&r, "not json", 8);
    CHECK(!r.has_error);
    cause_note_line(&r, first, strlen(first));
    CHECK(r.has_error && r.secondary && r.ts == 2.5);
    CHECK_EQ_STR(r.kind, "comm");
    CHECK_EQ_STR(r.message, "a");
    cause_note_line(&r, second, strlen(second));
    CHECK(r.has_error && !r.secondary && r.ts == 3);
    CHECK_EQ_STR(r.kind, "data");
    CHECK_EQ_STR(r.message, "b");
    snprintf(r.kind, sizeof r.kind, "future");
    CHECK_EQ_INT(cause_exit_code(&r, 7), 7);
}

/* A preempted attempt (issue 32): ranks that ended 6 at the checkpoint, others 0; any
 * failure beside them makes it a failure, named as before. */
static void test_preempted(void)
{
    struct cause_rank r[N] = {{0}};
    CHECK(!cause_preempted(r, N)); /* every rank 0: done, not preempted */
    r[0].preempted = r[2].preempted = true;
    CHECK(cause_preempted(r, N));
    CHECK_EQ_INT(cause_pick(r, N), -1); /* nobody to blame */
    r[1] = end(CAUSE_EXIT_OWN, NULL, 0, false, NULL);
    CHECK(!cause_preempted(r, N));
    CHECK_EQ_INT(cause_pick(r, N), 1);
}

int main(void)
{
    test_missing_file_under_any_order();
    test_killed_rank_without_an_event();
    test_earliest_own_failure();
    test_a_timeout_and_its_echoes();
    test_echoes_only();
    test_no_failure();
    test_note_line();
    test_preempted();
    CHECK_DONE();
}
