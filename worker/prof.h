/* prof.h — a rank's per-op profile (bench/profile, issue 33). With DDPD_PROFILE set to a
 * folder, train.c wraps its compute backend in a table that times every op (waiting for
 * the device after each, so a CUDA op's time is its own) and files the time under the op's
 * name and the current scope: the layer family and direction model.c is running, or a
 * part of the step train.c names (loss, optimizer, the DDP wait). At the end the rank
 * writes DIR/profile-rank-R.json. Off (the default) nothing is wrapped and a scope change
 * is one branch on a static flag: no clock is read. Not thread-safe: the training thread
 * only. Knows the backend table, nothing of layers, data or DDP. */
#ifndef DDPD_PROF_H
#define DDPD_PROF_H

#include <stdbool.h>
#include <stdint.h>

#include "dev.h"

/* Scopes beyond the layers': a layer's scope is PROF_LAYER(kind, backward). */
enum {
    PROF_NONE = 0,
    PROF_DATA,      /* the host's batch and its copy to the device */
    PROF_LOSS,      /* the loss and its gradient */
    PROF_RESIDUAL,  /* a residual's add (forward) and its gradient's add or copy (backward) */
    PROF_ZERO_GRAD, /* gradients zeroed */
    PROF_DDP,       /* DDP's per-step work: forward_begin, bucket copies, the all-reduce wait */
    PROF_CLIP,      /* gradient clipping */
    PROF_OPTIM,     /* the optimizer update */
    PROF_LOG,       /* losses read back, events, checks after the step */
    PROF_SCOPES_FIXED
};
#define PROF_LAYER(kind, backward) (PROF_SCOPES_FIXED + 2 * (int)(kind) + ((backward) ? 1 : 0))

extern bool prof__on;

/* Reads DDPD_PROFILE; true when this rank profiles. Call once before prof_wrap. */
bool prof_init(int rank);
/* The backend to run on: `d` itself when profiling is off, else the timing wrapper of it
 * (valid until prof_finish). */
struct dev prof_wrap(struct dev d);
/* Sets the scope the next ops are filed under; returns the previous one. */
int prof__scope(int scope);
static inline int prof_scope(int scope)
{
    return prof__on ? prof__scope(scope) : PROF_NONE;
}
static inline void prof_scope_restore(int prev)
{
    if (prof__on)
        (void)prof__scope(prev);
}
/* Host time outside the backend's ops (the DDP wait, a log): prof_now() then
 * prof_add(name, t0) files the time since t0 under `name` (a static string) in the scope. */
double prof__now(void);
void prof__add(const char *name, double t0);
static inline double prof_now(void)
{
    return prof__on ? prof__now() : 0.0;
}
static inline void prof_add(const char *name, double t0)
{
    if (prof__on)
        prof__add(name, t0);
}
/* One optimizer step ended. The first PROF_WARMUP steps are not counted (caches, pages). */
#define PROF_WARMUP 2
void prof__step(void);
static inline void prof_step(void)
{
    if (prof__on)
        prof__step();
}
/* Writes DIR/profile-rank-R.json (steps, the counted steps' wall time, and one row per
 * scope and op: calls, seconds) and stops profiling. A write that fails says so on stderr
 * and nothing else: a profile never fails the job. */
void prof_finish(void);

#endif
