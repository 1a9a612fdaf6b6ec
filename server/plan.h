/* plan.h — the check a job passes before it is queued or started: `ddpd-worker --plan`
 * reads the spec and the data (the server never links the worker's data readers) and
 * answers every rank's batches per epoch, or the error a rank would die of.
 *
 * A planner keeps up to `procs` `ddpd-worker --plan` processes running and sends each
 * request down one of them as a line, so a submission costs a pipe round trip, not a
 * fork and exec of a process that maps OpenBLAS (~10-40 ms). A planner process that
 * dies, hangs past its deadline or answers garbage is killed and replaced on next use.
 * Thread-safe: concurrent callers use different processes (or wait for a free one). */
#ifndef DDPD_PLAN_H
#define DDPD_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "../schema/err.h"

struct json_t;
struct planner;

/* `worker` (copied) is the path of ddpd-worker; `procs` >= 1. Starts nothing yet. */
struct planner *planner_new(const char *worker, int procs);
/* Ends every planner process (closes its stdin, reaps it). NULL is a no-op. */
void planner_free(struct planner *p);

/* Asks for the plan of `doc` ({spec, data_dir, world_size}), within timeout_s (waiting
 * for a free process included). On DDPD_OK, *known is false when only the ranks can tell
 * ({rank} files); else counts[0..world_size) are set. A bad spec or data file comes back
 * as the worker's error (DDPD_ESPEC / DDPD_EDATA) with its message; DDPD_EIO when no
 * answer came. */
ddpd_err planner_plan(struct planner *p, struct json_t *doc, int world_size, double timeout_s, int64_t *counts,
                      bool *known, struct ddpd_error *err);

/* One plan through a process started for it alone (`ddpd run`). */
ddpd_err plan_once(const char *worker, struct json_t *doc, int world_size, double timeout_s, int64_t *counts,
                   bool *known, struct ddpd_error *err);

#endif
