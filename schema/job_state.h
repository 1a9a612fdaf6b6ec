/* job_state.h — a job's states (CONTRACT.md §7): the store, the API and the `state`
 * events carry them as the names below. One list, one parser, and which states end a
 * job. Knows no SQL, no HTTP. */
#ifndef DDPD_JOB_STATE_H
#define DDPD_JOB_STATE_H

#include <stdbool.h>

typedef enum {
    JOB_STATE_QUEUED,
    JOB_STATE_STARTING,
    JOB_STATE_RUNNING,
    JOB_STATE_SUCCEEDED,
    JOB_STATE_FAILED,
    JOB_STATE_CANCELLED,
    JOB_STATE_PREEMPTED, /* stopped at a checkpoint for a job of higher priority; waits to resume */
    JOB_STATE_COUNT
} job_state;

/* Sets of states, as bit masks: JOB_STATE_BIT(JOB_STATE_QUEUED) | ... */
#define JOB_STATE_BIT(s)  (1u << (s))
#define JOB_STATES_ALL    ((1u << JOB_STATE_COUNT) - 1)
#define JOB_STATES_ACTIVE (JOB_STATE_BIT(JOB_STATE_STARTING) | JOB_STATE_BIT(JOB_STATE_RUNNING))
/* The states of a job that waits for slots: queued, and preempted (queued again). */
#define JOB_STATES_WAITING (JOB_STATE_BIT(JOB_STATE_QUEUED) | JOB_STATE_BIT(JOB_STATE_PREEMPTED))
#define JOB_STATES_FINAL                                                                                     \
    (JOB_STATE_BIT(JOB_STATE_SUCCEEDED) | JOB_STATE_BIT(JOB_STATE_FAILED) |                                  \
     JOB_STATE_BIT(JOB_STATE_CANCELLED))

const char *job_state_name(job_state s); /* "running"; "?" when out of range */
/* Parses "running" into *out. False for anything else (exact, lower case). */
bool job_state_parse(const char *name, job_state *out);
/* True for succeeded, failed and cancelled: the job will not run again. */
bool job_state_is_final(job_state s);
/* True when `name` is the name of a final state ("succeeded", "failed", "cancelled"). */
bool job_state_name_is_final(const char *name);

#endif
