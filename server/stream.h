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
 * JSON line in NDJSON (resume with after= the last line's seq). It never ends a stream as if the job had finished when it does not know so.
 *
 * Threads. stream_next is called by one thread at a time (the pull of the stream's
 * connection); `wake` runs on the hub's publisher thread, never under a hub lock;
 * stream_free may run on any thread once no stream_next runs. Reads of the store run on
 * the pulling thread (a reader connection: they never wait for the writer), apart from
 * one store_flush when the stream joins the hub's live tail. */
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
     * else; runs on the hub's publisher thread; must be quick and must not call stream_*
     * functions of this stream. May be NULL (then poll). */
    void (*wake)(void *ctx);
    void *ctx; /* borrowed, passed to wake */
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

/* Copies the next bytes of the stream into buf (cap bytes, any size >= 1): whole frames
 * where they fit, else the first part of one (the next call continues it). A heartbeat
 * may be sent by the caller only after STREAM_AGAIN, never inside a frame. May read a
 * page from the store (on this thread). */
stream_pull stream_next(struct stream *st, char *buf, size_t cap, size_t *len);

/* Why the stream was closed (the message of its stream_error frame); "" while it was
 * not. Borrowed, valid until stream_free. */
const char *stream_why(const struct stream *st);

/* Ends the stream's hub subscription (no wake runs after this returns) and frees it.
 * Must not be called from its wake callback. NULL is a no-op. */
void stream_free(struct stream *st);

#endif
