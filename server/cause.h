/* cause.h — which rank's failure ended an attempt: the one where the failure began, not
 * its echoes. When a rank fails, its peers fail too within milliseconds, of the failure
 * (a collective that lost the rank: exit 3) or of the launcher stopping them (SIGTERM,
 * SIGKILL), and their exits reach the launcher in any order. Each launcher
 * (launch_local.c, launch_slurm.c) waits for every rank to end, notes each rank's end and
 * last `error` event here, and reports the rank cause_pick names: so `ddpd run`'s exit
 * code, a job's `error` and its state reason name the same failure however the exits
 * interleave. Pure: no I/O, no clock, no signals. */
#ifndef DDPD_CAUSE_H
#define DDPD_CAUSE_H

#include <stdbool.h>
#include <stddef.h>

#include "../schema/event.h"

/* What a rank's exit status says by itself. */
enum cause_exit {
    CAUSE_EXIT_OWN,       /* a failure of its own (an exit code, a signal nobody here sent) */
    CAUSE_EXIT_LOST_PEER, /* exit 3: a collective failed, usually because a peer did */
    CAUSE_EXIT_STOPPED,   /* ended by the signal that stopped the group, or its answer to it */
};

/* One rank's end, as its launcher saw it. Zeroed: a rank that has not failed. */
struct cause_rank {
    bool failed;          /* it ended other than with exit code 0 or RANK_EXIT_PREEMPTED */
    bool preempted;       /* it ended with RANK_EXIT_PREEMPTED (6): stopped at the checkpoint a
                             preemption asked for, which is no failure and no rank's fault */
    enum cause_exit exit; /* how its exit status reads (when failed) */
    int order;            /* 1, 2, ...: its place among the ends the launcher saw; 0 unknown */
    double ended_at;      /* wall-clock seconds when the launcher saw it end; 0 unknown */
    /* Its last `error` event (has_error), as the rank wrote it. */
    bool has_error, secondary;
    char kind[16];
    double ts;
    char message[EVENT_TEXT_MAX];
};

/* Notes one stdout line of the rank: an `error` event replaces the one noted before (a
 * rank writes one as it dies); any other line changes nothing. */
void cause_note_line(struct cause_rank *r, const char *line, size_t len);

/* The index of the rank whose failure is the attempt's cause, -1 when none failed. In
 * this order:
 *   1. a failure of the rank's own: an error event that is not `secondary` and whose kind
 *      is not `comm` or `cancelled`, or an end without an error event that its exit status
 *      calls its own (a crash, the out-of-memory killer): the earliest, by the event's
 *      `ts` or, without one, by when the launcher saw it end;
 *   2. a failure of the group seen first-hand: a `comm` or `cancelled` error event that
 *      is not `secondary` (a collective timed out; a rank told to stop): the earliest by
 *      `ts`;
 *   3. anything else (echoes only): an exit of its own before a lost peer before a rank
 *      stopped, then the first the launcher saw.
 * Ties go to the lower rank. */
int cause_pick(const struct cause_rank *ranks, int n);

/* Whether an attempt whose ranks all ended was preempted: no rank failed and at least one
 * ended with RANK_EXIT_PREEMPTED (the others, 0: a rank that was done already). */
bool cause_preempted(const struct cause_rank *ranks, int n);

/* The exit code rank r's failure stands for: that of its error event's kind (CONTRACT.md
 * §6: a rank stopped after it wrote a `data` error reports 2, not the signal's 143),
 * else `exit_code`, the one its process ended with. */
int cause_exit_code(const struct cause_rank *r, int exit_code);

#endif
