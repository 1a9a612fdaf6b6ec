/* job_state.c — the names of a job's states. */
#include "job_state.h"

#include <string.h>

static const char *const state_names[JOB_STATE_COUNT] = {
    "queued", "starting", "running", "succeeded", "failed", "cancelled", "preempted",
};

const char *job_state_name(job_state s)
{
    return (unsigned)s < JOB_STATE_COUNT ? state_names[s] : "?";
}

bool job_state_parse(const char *name, job_state *out)
{
    for (int i = 0; name && i < JOB_STATE_COUNT; i++)
        if (strcmp(name, state_names[i]) == 0) {
            *out = (job_state)i;
            return true;
        }
    return false;
}

bool job_state_is_final(job_state s)
{
    return (unsigned)s < JOB_STATE_COUNT && (JOB_STATES_FINAL & JOB_STATE_BIT(s)) != 0;
}

bool job_state_name_is_final(const char *name)
{
    job_state s;
    return job_state_parse(name, &s) && job_state_is_final(s);
}
