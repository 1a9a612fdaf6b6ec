/* progress.h — the one-line progress display of `ddpd submit --follow`, `ddpd watch` and
 * `ddpd run` on a terminal: step/total, loss, the latest eval, samples/s, ETA and state,
 * redrawn in place with '\r', one final line at the end. Fed the job's events as JSON
 * objects; knows nothing of HTTP or of the launcher. Not thread-safe. */
#ifndef DDPD_PROGRESS_H
#define DDPD_PROGRESS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct progress;

/* A display on out (a terminal) for job `job` (0: a local run), whose spec (borrowed for
 * the call; NULL when unknown) gives the total steps, starting in `state` ("queued", or
 * NULL). Returns a new display (progress_free), or NULL when out of memory. */
struct progress *progress_new(FILE *out, int64_t job, const json_t *spec, const char *state);

/* Takes one event (borrowed; any kind, unknown ones are ignored) and redraws the line, at
 * most ten times a second unless the state changed. */
void progress_event(struct progress *p, const json_t *ev);

/* Draws the line when an event changed it since it was last drawn: after a batch of
 * events (what a read of the stream brought), so that the last of them shows. */
void progress_flush(struct progress *p);

/* Sets the state shown (borrowed string, copied) and redraws. */
void progress_set_state(struct progress *p, const char *state);

/* Draws the line one last time and ends it with a newline. */
void progress_finish(struct progress *p);

void progress_free(struct progress *p);

/* Draws `line` (NUL-terminated; cut in place to the terminal's width) over the line drawn
 * before on out, which was *width columns wide (0 at first; updated), and ends it with a
 * newline when `final`. The one drawing of every progress line (`ddpd tokenize`'s too). */
void progress_line(FILE *out, char *line, int *width, bool final);

/* The job's optimizer steps in all, as the dashboard counts them: `steps`, else `epochs`
 * times the steps of an epoch of the rank with the most micro-batches (`batches`, as the
 * start events say, or from a synthetic data set's size), else 0 (unknown). */
int64_t progress_total_steps(const json_t *spec, int64_t batches);

#endif
