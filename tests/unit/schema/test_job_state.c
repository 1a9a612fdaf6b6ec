/* test_job_state.c — the job states (schema/job_state.h): each name parses back to its
 * state, nothing else parses, exactly succeeded/failed/cancelled are final, and a `state`
 * event ends a stream exactly when its state is final (event_is_final). */
#include "check.h"
#include "schema/event.h"
#include "schema/job_state.h"

int main(void)
{
    static const char *const names[JOB_STATE_COUNT] = {"queued", "starting",  "running",  "succeeded",
                                                       "failed", "cancelled", "preempted"};
    for (int i = 0; i < JOB_STATE_COUNT; i++) {
        job_state s = (job_state)-1;
        CHECK_EQ_STR(job_state_name((job_state)i), names[i]);
        CHECK(job_state_parse(names[i], &s));
        CHECK_EQ_INT(s, i);
        bool final = i == JOB_STATE_SUCCEEDED || i == JOB_STATE_FAILED || i == JOB_STATE_CANCELLED;
        CHECK_EQ_INT(job_state_is_final((job_state)i), final);
        CHECK_EQ_INT(job_state_name_is_final(names[i]), final);
        CHECK_EQ_INT((JOB_STATES_FINAL & JOB_STATE_BIT(i)) != 0, final);
    }
    CHECK_EQ_STR(job_state_name(JOB_STATE_COUNT), "?");
    CHECK_EQ_STR(job_state_name((job_state)-1), "?");
    CHECK(!job_state_is_final(JOB_STATE_COUNT));
    job_state s = JOB_STATE_QUEUED;
    CHECK(!job_state_parse("Running", &s));
    CHECK(!job_state_parse("running ", &s));
    CHECK(!job_state_parse("", &s));
    CHECK(!job_state_parse(NULL, &s));
    CHECK(!job_state_parse("exited", &s));
    CHECK_EQ_INT(s, JOB_STATE_QUEUED);
    CHECK(!job_state_name_is_final("exited"));
    CHECK(!job_state_name_is_final(NULL));

    struct event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = EVENT_STATE;
    snprintf(ev.state, sizeof ev.state, "cancelled");
    CHECK(event_is_final(&ev));
    snprintf(ev.state, sizeof ev.state, "running");
    CHECK(!event_is_final(&ev));
    ev.kind = EVENT_DONE; /* a rank's done is not the job's end */
    snprintf(ev.state, sizeof ev.state, "succeeded");
    CHECK(!event_is_final(&ev));
    CHECK_DONE();
}
