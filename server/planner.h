/* planner.h — the check a job passes before it is queued or started: `ddpd-worker --plan`
 * reads the spec and the data (the server never links the worker's data readers) and
 * answers every rank's batches per epoch, or the error a rank would die of.
 *
 * A planner keeps up to `procs` `ddpd-worker --plan` processes running and sends each
 * request down one of them as a line, so a submission costs a pipe round trip, not a
 * fork and exec of a process that maps OpenBLAS (~10-40 ms). A planner process that
 * dies, hangs past its deadline or answers garbage is killed and replaced on next use.
 * Thread-safe: concurrent callers use different processes (or wait for a free one).
 *
 * The server never plans on an HTTP thread (a data file that blocks on open, a FIFO or a
 * hung network mount, would hold the thread for the whole deadline): it queues the plan
 * with planner_plan_async, answers the request later (http_defer), and the planner's own
 * threads run the plan and call back. */
#ifndef DDPD_PLANNER_H
#define DDPD_PLANNER_H

#include <stdbool.h>
#include <stdint.h>

#include "../schema/err.h"

struct json_t;
struct planner;

/* `worker` (copied) is the path of ddpd-worker; `procs` >= 1. Starts nothing yet. */
struct planner *planner_new(const char *worker, int procs);
/* Ends every planner process (closes its stdin, reaps it). NULL is a no-op. */
void planner_free(struct planner *p);

/* Asks for the plan of `doc` (a job document, read by jobdoc_plan_from_json), within
 * timeout_s (waiting for a free process included). On DDPD_OK, *known is false when only
 * the ranks can tell ({rank} files); else counts[0..world_size) are set. A bad spec or
 * data file comes back as the worker's error (DDPD_ESPEC / DDPD_EDATA) with its message;
 * DDPD_EDATA (path "data") when the process did not answer within the deadline (it is
 * killed: it was stuck on the job's data); DDPD_EBUSY when no process came free in time;
 * DDPD_EIO when it ended or answered garbage. */
ddpd_err planner_plan(struct planner *p, struct json_t *doc, int world_size, double timeout_s,
                      int64_t *counts, bool *known, struct ddpd_error *err);

/* The most ranks and the most queued or running plans of planner_plan_async. */
#define PLAN_MAX_WORLD 1024
#define PLAN_QUEUE_MAX 256

/* Called once per planner_plan_async, on a planner thread, with planner_plan's outcome;
 * `counts` (world_size entries when `known`) and `err` are borrowed for the call. */
typedef void (*planner_done_fn)(void *ctx, ddpd_err rc, const int64_t *counts, bool known,
                                const struct ddpd_error *err);

/* Queues the plan of `doc` (stolen, also on error) for one of the planner's threads, which
 * calls done(ctx, ...) once it has the answer or timeout_s after this call. Never blocks
 * on a process. Errors (done is then never called): DDPD_EBUSY when PLAN_QUEUE_MAX plans
 * are waiting or running or the planner is being freed, DDPD_ENOMEM, DDPD_EINTERNAL.
 * planner_free waits for the running plans (each within its deadline) and calls done with
 * DDPD_EBUSY for those still queued. */
ddpd_err planner_plan_async(struct planner *p, struct json_t *doc, int world_size, double timeout_s,
                            planner_done_fn done, void *ctx, struct ddpd_error *err);

/* One plan through a process started for it alone (`ddpd run`). */
ddpd_err planner_plan_once(const char *worker, struct json_t *doc, int world_size, double timeout_s,
                           int64_t *counts, bool *known, struct ddpd_error *err);

#endif
