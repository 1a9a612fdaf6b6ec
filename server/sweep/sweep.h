/* sweep.h — hyper-parameter sweeps (POST /v1/sweeps): a sweep's request checked and
 * expanded into its trials (sweep_plan.c, pure: knows jansson and the spec, nothing of
 * HTTP or the store), and the controller that runs the trials as ordinary jobs, at most
 * max_parallel at once, with all its state in the store so that a restarted server goes
 * on with the sweep (sweep_control.c). */
#ifndef DDPD_SWEEP_H
#define DDPD_SWEEP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../schema/err.h"
#include "../../schema/spec.h"

struct json_t;
struct store;
struct super;

/* Caps on what a client sizes. */
#define SWEEP_MAX_TRIALS   1000        /* trials of one sweep (a grid's product, a random count) */
#define SWEEP_MAX_PARAMS   32          /* parameters of one sweep */
#define SWEEP_MAX_VALUES   1000        /* values in one parameter's list */
#define SWEEP_MAX_PARALLEL 64          /* max_parallel */
#define SWEEP_PATH_MAX     128         /* bytes of one parameter's path */
#define SWEEP_MAX_BYTES    (64u << 20) /* the trials' specs together, as stored */

/* The method and the metric of a sweep, as its request names them. */
typedef enum { SWEEP_GRID, SWEEP_RANDOM, SWEEP_ASHA } sweep_method;
typedef enum { SWEEP_METRIC_EVAL_LOSS, SWEEP_METRIC_EVAL_ACCURACY, SWEEP_METRIC_LOSS } sweep_metric;

const char *sweep_method_name(sweep_method m);
const char *sweep_metric_name(sweep_metric m);
bool sweep_metric_parse(const char *name, sweep_metric *out);

/* The asha method's request ("asha": {"min_steps", "reduction_factor", "max_steps"}): rungs
 * at min_steps * reduction_factor^k below max_steps, then max_steps. */
#define SWEEP_ASHA_MAX_RUNGS 64
struct sweep_asha {
    int64_t min_steps, max_steps;
    int rf; /* reduction_factor, 2..SWEEP_ASHA_MAX_RF */
};
#define SWEEP_ASHA_MAX_RF 64

/* A request checked and expanded: every trial's spec (the base with the trial's values
 * set) passed spec_from_json. Owns its arrays: release with sweep_plan_free. */
struct sweep_plan {
    sweep_method method;
    sweep_metric metric;
    bool maximize;          /* mode "max" */
    struct sweep_asha asha; /* method asha */
    int max_parallel;       /* 1..SWEEP_MAX_PARALLEL */
    size_t n;               /* trials */
    char **params;          /* [n] JSON text: {"<dotted.path>": value, ...} */
    char **specs;           /* [n] JSON text: the trial's spec as the request wrote it, values set */
    size_t bytes;           /* of params and specs together, at most SWEEP_MAX_BYTES */
};

/* Checks a POST /v1/sweeps body (borrowed) and expands it into *out (zeroed first;
 * release with sweep_plan_free, also after an error). `po` is the server's spec options.
 * `check` (may be NULL) runs on every trial's spec once it is valid.
 * Errors: DDPD_ESPEC with err->path the request's key: `parameters["optimizer.lrr"]` for
 * a path the base spec does not have, `spec.<path>` for a base that is not a valid spec,
 * `trials[i]` (the message naming the trial's values and the spec's field) for a value
 * that makes a trial's spec invalid or that `check` refuses; DDPD_ETOOBIG (413) when the trials' specs take
 * more than SWEEP_MAX_BYTES together; DDPD_ENOMEM. */
/* The caller's own check of each trial's valid spec (borrowed for the call): DDPD_OK, or
 * an error whose path is the spec's key (the plan names the trial around it). */
typedef ddpd_err (*sweep_trial_check_fn)(void *ctx, const struct spec *spec, struct ddpd_error *err);
ddpd_err sweep_plan_from_json(struct json_t *body, const struct spec_parse_opts *po,
                              sweep_trial_check_fn check, void *ctx, struct sweep_plan *out,
                              struct ddpd_error *err);
void sweep_plan_free(struct sweep_plan *p);

/* Sets the value at `path` (dotted keys with [i] list indexes: "optimizer.lr",
 * "model[2].out") in `root` to `value` (stolen). Every key but the last must exist, and
 * every index must be in its list; the last key of an object may be new. Returns false
 * with why[cap] ("no key \"lrr\" in optimizer") when the path does not fit the document. */
bool sweep_path_set(struct json_t *root, const char *path, struct json_t *value, char *why, size_t cap);

/* The random method's generator (documented in docs/api.md "Sweeps"): splitmix64 from
 * `seed`; sweep_rand_unit returns the next number in [0, 1) (the top 53 bits). */
uint64_t sweep_rand_next(uint64_t *state);
double sweep_rand_unit(uint64_t *state);

/* ---- the ASHA rule (sweep_asha.c) ---- */

/* Checks the request's "asha" object `v` (borrowed) into *out. DDPD_ESPEC naming
 * `asha.<key>`. */
ddpd_err sweep_asha_from_json(const struct json_t *v, struct sweep_asha *out, struct ddpd_error *err);
/* The rungs' steps into steps[SWEEP_ASHA_MAX_RUNGS], ascending, the last max_steps;
 * returns how many. */
int sweep_asha_rungs(const struct sweep_asha *a, int64_t *steps);

/* One trial's outcome at a rung: its index and its metric (has_metric false for none,
 * such as a job that failed). */
struct sweep_rung_result {
    int idx;
    bool has_metric;
    double metric;
};
/* Synchronous successive halving at one rung, once every one of the `entered` trials
 * that ran to it has ended its job there: res[n] are those that paused there. Sets
 * promote[i] for the best max(1, floor(entered / rf)) of those with a finite metric,
 * ranked by the metric (the lower for min, the higher for maximize), ties by the lower
 * index; returns how many. Pure: a restarted server decides the same. */
size_t sweep_asha_promote(const struct sweep_rung_result *res, size_t n, size_t entered, int rf,
                          bool maximize, bool *promote);

/* ---- the controller (sweep_control.c) ---- */

struct sweeper;

/* Starts the controller thread over `store` and `super` (borrowed, they outlive it): it
 * looks at the running sweeps when kicked (sweeper_kick) and every 250 ms, records each
 * trial's job's end and metric, and submits the next trials while fewer than
 * max_parallel of the sweep's jobs are queued or running. A sweep whose trials have all
 * ended is `succeeded`. Returns a new sweeper (sweeper_stop frees it), or NULL with err. */
struct sweeper *sweeper_start(struct store *store, struct super *super, struct ddpd_error *err);
/* Wakes the controller now (a sweep was added or cancelled). NULL is a no-op. */
void sweeper_kick(struct sweeper *w);
/* Cancels sweep `id`: its state `cancelled`, its trials without a job `cancelled`, its
 * queued or running jobs cancelled. DDPD_ENOTFOUND, DDPD_ECONFLICT (it has ended). */
ddpd_err sweeper_cancel(struct sweeper *w, int64_t id, struct ddpd_error *err);
/* Stops and joins the thread and frees it; before super_stop. NULL is a no-op. */
void sweeper_stop(struct sweeper *w);

#endif
