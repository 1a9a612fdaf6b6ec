/* hub.h — the event hub: each job's recent events in memory, encoded once as SSE frames
 * and NDJSON lines, and the live subscribers that stream them (CONTRACT.md §6, §7
 * `/v1/jobs/{id}/events`). Knows nothing of HTTP, SQLite or processes: the store keeps
 * every event, the HTTP layer moves bytes, and the hub tells it through callbacks when a
 * stream has something to send.
 *
 * The model. Per job, the hub keeps a bounded tail of the log (the newest events, by
 * count and bytes). A subscriber is a cursor into that tail: publishing appends once and
 * wakes the subscribers that are waiting, so its cost does not grow with the number of
 * subscribers that are busy sending. A subscriber's queue is the part of the tail it has
 * not taken yet; when that grows past its limits (count or bytes), or the part it needs
 * is evicted, the subscriber is dropped (never buffered without bound), and publishing
 * never waits for it.
 *
 * Threads. One thread publishes (the supervisor). Subscribing, pulling, unsubscribing,
 * hub_job_forget, hub_close_all and hub_stats_get may run on any thread, concurrently.
 * Each job has its own lock; a short registry lock only finds jobs. Callbacks
 * (on_ready, on_drop) run on the thread that caused them (usually the publisher), never
 * under a hub lock, and never after hub_unsubscribe has returned.
 *
 * Serving a job's events gap-free and duplicate-free (the recipe; server/stream.c is the
 * one caller that carries it out, paging the store's part, and joins the hub only once it
 * has caught up: everything else opens a stream there):
 *   The supervisor appends every event to the store BEFORE it publishes it here. Then:
 *   1. sub = hub_subscribe(hub, job, after_seq, ..., &from)    (attaches atomically)
 *   2. if from > after_seq + 1: store_flush(), then send the store's events with
 *      after_seq < seq < from, in order (store_events_read, stopping at seq >= from);
 *      then hub_sub_gap_filled(sub, last seq sent, whether one was the job's final
 *      `state` event (event_is_final)). Every event with seq < from was published
 *      before the subscription, so it was appended before it, so store_flush commits it.
 *      `from` is HUB_SEQ_UNKNOWN when the hub holds nothing of the job (a job that ran
 *      before a server restart, or not yet): read everything after after_seq; events
 *      published meanwhile that the store already returned are skipped by gap_filled.
 *      The hub cannot know the end of a job it never saw: when the store's job row is
 *      final and the gap held no final event (the client had it: after_seq is at or
 *      past it), end the stream at once. For that, the supervisor appends a job's final
 *      `state` event before it writes the final state into the job row.
 *   3. then pull: hub_sub_next until HUB_END (the stream is complete: close it) or
 *      HUB_DROPPED (close it; an SSE client resumes with Last-Event-ID); on HUB_AGAIN
 *      wait for on_ready / on_drop, which may come before the caller starts waiting. */
#ifndef DDPD_HUB_H
#define DDPD_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../schema/err.h"
#include "../schema/event.h"

/* The largest frame (one event in either format), so a buffer of this size always
 * takes at least one whole frame. */
#define HUB_FRAME_MAX (EVENT_LINE_MAX + 64)

/* `from` of hub_subscribe when the hub knows nothing of the job's past. */
#define HUB_SEQ_UNKNOWN INT64_MAX

typedef enum {
    HUB_FORMAT_SSE,    /* "id: <seq>\nevent: <kind>\ndata: <json>\n\n" */
    HUB_FORMAT_NDJSON, /* "<json>\n" */
} hub_format;

/* Sizes; zero fields take the defaults. */
struct hub_limits {
    size_t job_events;  /* events kept per job; default 10000 */
    size_t job_bytes;   /* bytes kept per job (both formats and overhead); default 8 MiB */
    size_t total_bytes; /* all jobs together; over it, the tails of finished jobs are
                           evicted first (oldest finished first), then running jobs'
                           oldest events down to a fair share each; default 256 MiB */
    size_t sub_events;  /* a subscriber's queue: events not yet taken; default job_events */
    size_t sub_bytes;   /* ... and their bytes; default job_bytes */
    size_t max_subs;    /* subscribers at once, all jobs; default 10000 */
};

struct hub;
struct hub_sub;

/* A new hub; `lim` is borrowed (NULL = defaults). Returns a new hub that the caller
 * frees with hub_free. Aborts only when out of memory. */
struct hub *hub_new(const struct hub_limits *lim);
/* Frees the hub and every event it holds. Every subscription must have been released
 * with hub_unsubscribe first (call hub_close_all to make their streams end). NULL is a
 * no-op. */
void hub_free(struct hub *h);

/* ---- publishing (one thread) ---- */

/* Appends `ev` to its job's tail and wakes the job's waiting subscribers. `ev` is
 * borrowed and must carry the server's fields (job, attempt, seq); `body` (len bytes,
 * borrowed, copied; no newline) is its JSON text as the store keeps it, or NULL to
 * encode `ev` here. Never blocks on a subscriber: a subscriber whose queue would
 * overflow is dropped (its on_drop runs before this returns). The job's final event
 * ends every stream of the job after it. Errors (nothing published):
 * DDPD_EINTERNAL (no server fields, a body with a newline), DDPD_ETOOBIG (body over
 * EVENT_LINE_MAX), DDPD_ECONFLICT (seq not above the job's previous one, or the job
 * already had its final event). */
ddpd_err hub_publish(struct hub *h, const struct event *ev, const char *body, size_t len);

/* Drops everything the hub holds of `job` (after DELETE). Its remaining subscribers are
 * dropped with reason "job deleted"; they still must be unsubscribed. */
void hub_job_forget(struct hub *h, int64_t job);

/* Drops every subscriber of every job with `reason` (borrowed, copied), e.g. at
 * shutdown, so that every stream closes. */
void hub_close_all(struct hub *h, const char *reason);

/* ---- subscribing (any thread) ---- */

struct hub_sub_opts {
    hub_format format;
    /* Called when a pull that returned HUB_AGAIN would now return something else (data,
     * the end, or the drop when on_drop is NULL); once per HUB_AGAIN. May be NULL (then
     * poll). Runs on the publisher's thread outside hub locks; it must be quick and must
     * not call hub_unsubscribe (it may call hub_sub_next). */
    void (*on_ready)(void *ctx);
    /* Called once when the subscriber is dropped; `reason` (borrowed for the call, also
     * kept for hub_sub_reason) says why, e.g. "slow subscriber: 10001 events behind".
     * Same rules as on_ready. May be NULL. */
    void (*on_drop)(void *ctx, const char *reason);
    void *ctx; /* borrowed; passed to the callbacks */
};

/* Subscribes to `job`'s events with seq > after_seq (0 = from the start). The job need
 * not have published anything yet. On DDPD_OK, *out is a new subscription (release with
 * hub_unsubscribe) and *from is the smallest seq the hub will deliver: the caller sends
 * the store's events with after_seq < seq < *from first (the recipe above); when
 * *from == after_seq + 1 there is no gap. `opts` is borrowed. Errors: DDPD_EBUSY (max_subs
 * reached). */
ddpd_err hub_subscribe(struct hub *h, int64_t job, int64_t after_seq, const struct hub_sub_opts *opts,
                       struct hub_sub **out, int64_t *from);

/* Tells the subscription that the caller sent the store's gap up to and including
 * `last_seq` (any event with seq <= last_seq is skipped from now on), and whether one of
 * them was the job's final event (then the stream ends: hub_sub_next returns HUB_END).
 * Call before the first hub_sub_next. */
void hub_sub_gap_filled(struct hub_sub *s, int64_t last_seq, bool saw_final);

typedef enum {
    HUB_DATA,    /* *len > 0 bytes were copied into buf */
    HUB_AGAIN,   /* nothing now; on_ready will be called once when there is */
    HUB_END,     /* the job's final event has been delivered: the stream is complete */
    HUB_DROPPED, /* the subscriber was dropped; hub_sub_reason says why */
} hub_pull;

/* Copies the next bytes of the stream into buf (cap bytes): as many whole frames as
 * fit, or, when cap is smaller than the next frame, its first cap bytes (the next call
 * continues it; a heartbeat may be sent only after HUB_AGAIN, never inside a frame).
 * One consumer thread per subscription at a time. */
hub_pull hub_sub_next(struct hub_sub *s, char *buf, size_t cap, size_t *len);

/* Why the subscriber was dropped; "" while it was not. Borrowed, valid until
 * hub_unsubscribe. */
const char *hub_sub_reason(const struct hub_sub *s);

/* Ends the subscription and frees it. When this returns, no callback of `s` is running
 * or will run. Must not be called from s's own callbacks. NULL is a no-op. */
void hub_unsubscribe(struct hub_sub *s);

/* ---- formats ---- */

/* Writes one event (seq, kind name such as "loss", its JSON body of len bytes) as a
 * frame of `fmt` into buf, exactly as the hub streams it; for events read from the
 * store. Returns the length (no NUL is added), or -1 when cap is too small. */
int hub_format_event(hub_format fmt, int64_t seq, const char *kind, const char *body, size_t len, char *buf,
                     size_t cap);

/* The keep-alive to send on an idle stream every 15 s: ": ping\n\n" for SSE (a
 * comment, ignored by EventSource); NULL for NDJSON, which has no comment syntax (a
 * blank line would break line-by-line JSON readers). Static storage; *len its length. */
const char *hub_heartbeat(hub_format fmt, size_t *len);

/* ---- counters (for /metrics) ---- */

struct hub_stats {
    uint64_t subscribers; /* now */
    uint64_t published;   /* events, since hub_new */
    uint64_t dropped;     /* subscribers dropped as slow or evicted (not forget/close) */
    uint64_t jobs;        /* jobs held now */
    uint64_t events;      /* events held now, all jobs */
    uint64_t bytes;       /* bytes held now, all jobs */
    uint64_t evicted;     /* events evicted from tails, since hub_new */
};
void hub_stats_get(struct hub *h, struct hub_stats *out);

#endif
