/* evpipe.h — the event pipeline between the ranks (and the supervisor) and the clients: a
 * rank's stdout line is decoded and numbered, an event is stored (appended to the store),
 * committed with the others of its turn, and only then published to the hub, so that
 * whatever a client saw survives a crash of the server and a stream that attaches later
 * finds every earlier event in the store. The end of a job that the store did not take (a
 * full disk) is kept and tried again until it is stored. Takes a store and a hub, knows
 * nothing of the supervisor (a rank's `start` reaches it through a callback); one thread
 * (the supervisor's). */
#ifndef DDPD_EVPIPE_H
#define DDPD_EVPIPE_H

#include <stdbool.h>

#include "../schema/event.h"
#include "store.h"

struct hub;
struct evpipe;

/* How often an end the store did not take is tried again (seconds). */
#define EVPIPE_RETRY_S 1.0

/* Borrows `store` and `hub` for its life. NULL when out of memory. */
struct evpipe *evpipe_new(struct store *store, struct hub *hub);
/* Drops what is queued or unsaved (call evpipe_drain and evpipe_retry first). NULL: no-op. */
void evpipe_free(struct evpipe *p);

/* One job's events as they enter the pipeline: the supervisor's own (evpipe_publish) and
 * its ranks' stdout lines (evpipe_rank_line, a launcher's on_line). The pipeline stamps
 * each with the job, the attempt and the next seq. A plain value the supervisor keeps per
 * job: it sets `attempt` when an attempt begins and `next_seq` when it loads a job. */
struct evpipe_source {
    struct evpipe *pipe;
    int64_t job;
    int attempt;
    int64_t next_seq; /* the next event's seq: from 1, across the job's attempts */
    /* Called after a rank's `start` event is queued (the job's state follows it); may be
     * NULL. */
    void (*on_start)(void *ctx, int rank);
    void *ctx;
};

/* Stamps `ev` with the server fields (job, attempt, the next seq; ts now when 0) and
 * queues it (evpipe_add). */
void evpipe_publish(struct evpipe_source *src, struct event *ev);
/* One stdout line of rank `rank` (len bytes, no newline), with `src` the job's source:
 * launch_opts.on_line. Decoded, its rank taken from the pipe it came on (not from the
 * line), published; a line that is not an event is logged and dropped. */
void evpipe_rank_line(void *src, int rank, const char *line, size_t len);

/* Queues `ev` (server fields set: job, attempt, seq, ts) for the hub after the next
 * commit; it is stored already when `stored`, else appended to the store now (a failure
 * is logged). */
void evpipe_add(struct evpipe *p, const struct event *ev, bool stored);
/* Commits what evpipe_add queued (one transaction for everything of this turn), then
 * hands it to the hub for the live streams; a final event whose commit failed is kept
 * for evpipe_retry (and published all the same: a stream must end when its job does). */
void evpipe_drain(struct evpipe *p);

/* A job ended, but the store did not take all of its end: `ev` is its final state event
 * (as published), `row_saved` whether its row and its attempt's end were stored,
 * `restarts` and `error` (copied; NULL for none) what its row must say, and ranks[0..n)
 * the ranks' end rows the store refused (stolen; NULL for none). Tried again with
 * evpipe_retry until stored, or dropped when the job is deleted meanwhile. */
void evpipe_end_unsaved(struct evpipe *p, const struct event *ev, bool row_saved, int restarts,
                        const char *error, struct store_rank *ranks, int nranks);
/* Tries again the unsaved ends that are due (every one when `all`): the event first, then
 * the ranks, the attempt's end and the row. After a try that fails the others wait
 * EVPIPE_RETRY_S. Cheap when nothing waits. */
void evpipe_retry(struct evpipe *p, bool all);
/* Logs every end still unsaved (at shutdown: the next server marks them failed). */
void evpipe_report_unsaved(const struct evpipe *p);

#endif
