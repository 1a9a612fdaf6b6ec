/* stream.h — one client's stream of one job's events (CONTRACT.md §7
 * `/v1/jobs/{id}/events`): the history paged from the store as the client reads it, then
 * the live events from the hub, with no event lost or sent twice at the seam. Knows
 * nothing of HTTP: the caller pulls bytes when its client can take them and is woken
 * through a callback when a pull that found nothing would now find something.
 *
 * Memory. A stream holds at most one page of history (page_bytes of event bodies plus
 * one frame; 64 KiB by default), whatever the length of the job's history and however
 * slowly its client reads: the next page is read only when the previous one was taken.
 * While it pages the history it holds no hub subscription (so a long history read
 * while the job runs cannot make the hub drop it as slow); it subscribes when it has
 * caught up with the store, fills the short gap between what it read and what the hub
 * holds from the store (hub.h's recipe), and from then on pulls from the hub.
 *
 * The end. The stream ends (STREAM_END) after the job's final `state` event, or at once
 * when the job had finished and the client had that event already. Any other end
 * (a read error, the job deleted, the hub dropping a slow client, shutdown) is
 * STREAM_CLOSED, after a last `stream_error` frame that says why: SSE
 * `event: stream_error` (no `id:`, so Last-Event-ID stays the last event's: the client
 * resumes from there) with data {"event":"stream_error","job":N,"message":"..."}, or that
 * JSON line in NDJSON (resume with after= the last line's seq). It never ends a stream as if the job had
 * finished when it does not know so.
 *
 * Keep-alives. A stream with a heartbeat interval sends hub_heartbeat's keep-alive from
 * stream_next when it has nothing else and its client had nothing for that long (a
 * write to a closed connection is how a server finds a client that went away). The
 * streams handle (`struct streams`) opens such streams and owns the thread that wakes
 * the idle ones, so that their pull runs and sends it.
 *
 * Threads. stream_next is called by one thread at a time (the pull of the stream's
 * connection); `wake` runs on the hub's publisher thread (never under a hub lock) or on
 * the streams' heartbeat thread (under the streams' list lock: it must not open or
 * free a stream); stream_free may run on any thread once no stream_next runs. Reads of
 * the store run on the pulling thread (a reader connection: they never wait for the
 * writer), apart from one store_flush when the stream joins the hub's live tail. */
#ifndef DDPD_STREAM_H
#define DDPD_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "../schema/err.h"
#include "hub.h"

struct store;
struct stream;

struct stream_opts {
    hub_format format;
    size_t page_events; /* events per page read from the store; 0 = 1000 */
    size_t page_bytes;  /* event bodies per page; 0 = 64 KiB (a page always takes one event) */
    /* Called when a stream_next that returned STREAM_AGAIN would now return something
     * else (or, for a stream of `struct streams`, when a keep-alive is due); runs on the
     * hub's publisher thread or the streams' heartbeat thread (see Threads); must be
     * quick and must not call stream_* or streams_* functions. May be NULL (then poll). */
    void (*wake)(void *ctx);
    void *ctx; /* borrowed, passed to wake */
    /* Seconds without a byte for the client after which stream_next, having nothing
     * else, returns the format's keep-alive (hub_heartbeat); 0 = never. */
    double heartbeat_s;
};

/* Opens the stream of `job`'s events with seq > after (0 = from its first; values past
 * 2^62, where no seq gets, are taken as 2^62). `h` and `s`
 * are borrowed and must outlive the stream; `o` is borrowed. On DDPD_OK *out is a new
 * stream that the caller frees with stream_free. Errors: DDPD_EBUSY (the hub's
 * subscriber limit), DDPD_ENOMEM; err says which. The job's existence is the caller's
 * check. */
ddpd_err stream_open(struct hub *h, struct store *s, int64_t job, int64_t after, const struct stream_opts *o,
                     struct stream **out, struct ddpd_error *err);

typedef enum {
    STREAM_DATA,   /* *len > 0 bytes were copied into buf */
    STREAM_AGAIN,  /* nothing now; wake will be called once when there is */
    STREAM_END,    /* the job's last event has been sent: the stream is complete */
    STREAM_CLOSED, /* ended otherwise, its stream_error frame sent: stream_why says why */
} stream_pull;

/* ---- the streams of a server: one handle for the hub, the store and the keep-alives ---- */

struct streams;

/* Starts the streams of a server over `h` and `s` (borrowed; they must outlive it) and
 * its heartbeat thread, which every few seconds wakes each open stream whose client had
 * nothing for heartbeat_s seconds (0 = 15), so that its pull sends a keep-alive. On
 * DDPD_OK *out is a new handle that the caller frees with streams_free. Errors:
 * DDPD_ENOMEM, DDPD_EINTERNAL (no thread); err says which. */
ddpd_err streams_new(struct hub *h, struct store *s, double heartbeat_s, struct streams **out,
                     struct ddpd_error *err);

/* Opens the stream of `job`'s events with seq > after in `format`, as stream_open does,
 * with the handle's keep-alives; `wake(ctx)` is called as stream_opts says (ctx
 * borrowed, valid until stream_free). On DDPD_OK *out is a new stream that the caller
 * frees with stream_free before streams_free. Errors as stream_open's. The job's
 * existence is the caller's check. Any thread. */
ddpd_err streams_open(struct streams *ss, int64_t job, int64_t after, hub_format format,
                      void (*wake)(void *ctx), void *ctx, struct stream **out, struct ddpd_error *err);

/* Stops the heartbeat thread and frees the handle. Every stream opened through it must
 * have been freed. NULL is a no-op. */
void streams_free(struct streams *ss);

/* ---- one stream ---- */

/* Copies the next bytes of the stream into buf (cap bytes, any size >= 1): whole frames
 * where they fit, else the first part of one (the next call continues it). With a
 * heartbeat interval, the keep-alive comes as STREAM_DATA where STREAM_AGAIN would
 * (never inside a frame). May read a page from the store (on this thread). */
stream_pull stream_next(struct stream *st, char *buf, size_t cap, size_t *len);

/* Why the stream was closed (the message of its stream_error frame); "" while it was
 * not. Borrowed, valid until stream_free. */
const char *stream_why(const struct stream *st);

/* Ends the stream's hub subscription and its place among its streams' (no wake runs
 * after this returns) and frees it. Must not be called from its wake callback. NULL is
 * a no-op. */
void stream_free(struct stream *st);

#endif
