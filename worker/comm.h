/* comm.h — the collective backend table (DESIGN.md "The worker's DDP"). Backends: `cpu`
 * (comm/cpu/: a ring with its own rendezvous; links between ranks on one host carry
 * their bytes through a shared-memory FIFO, others through TCP; DDPD_COMM_SHM=0 forces
 * TCP) and `nccl` (cuda/nccl.c: CUDA tensors, a comm stream and a watchdog).
 * Memory: allreduce_start and broadcast take tensors of the compute backend bound with
 * comm_bind_dev (host memory until then); allgather, allreduce_max_i64 and barrier take
 * host memory. Binding CUDA tensors to the cpu backend stages them through pinned host
 * memory (comm/staged.c), so compute and collectives are independent choices.
 * Ordering of collectives is the caller's contract, as with NCCL: every rank issues the
 * same collectives in the same order. A communicator is driven from one thread. Every
 * wait has a deadline; a dead or silent peer is an error (DDPD_ECOMM), never a hang. */
#ifndef DDPD_COMM_H
#define DDPD_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../schema/err.h"
#include "dev.h"
#include "half.h"

#define COMM_ID_BYTES 128 /* like ncclUniqueId */

struct comm_id {
    unsigned char bytes[COMM_ID_BYTES];
};

/* Hex text of an id (2*COMM_ID_BYTES chars + NUL) and back. */
void comm_id_to_hex(const struct comm_id *id, char *hex /* [2*COMM_ID_BYTES+1] */);
int comm_id_from_hex(const char *hex, struct comm_id *id); /* 0, or -1 if malformed */

struct comm;     /* a communicator: {ops, ctx} behind an opaque handle */
struct comm_req; /* an outstanding asynchronous collective */

struct comm_ops {
    const char *name;
    /* Joins the group of `world` ranks named by `id` as `rank`, within timeout_s (also
     * the deadline of every later collective). */
    ddpd_err (*init_rank)(const struct comm_id *id, int rank, int world, double timeout_s, void **ctx,
                          char *errbuf, size_t errcap);
    /* Starts an in-place SUM all-reduce of n floats; the buffer must stay untouched until
     * wait returns. Results are bitwise identical on every rank. */
    ddpd_err (*allreduce_start)(void *ctx, float *buf, int64_t n, struct comm_req **req);
    /* Optional (NULL: the backend has none): the same for n 16-bit floats of kind k
     * (half.h), DDP's compressed gradients; every add rounds to that kind, as gloo's fp16
     * sum does. Host memory (the CPU device's tensors). */
    ddpd_err (*allreduce_half_start)(void *ctx, uint16_t *buf, int64_t n, half_kind k, struct comm_req **req);
    ddpd_err (*wait)(void *ctx, struct comm_req *req); /* frees req */
    /* Blocking collectives, ordered after every started all-reduce. */
    ddpd_err (*broadcast)(void *ctx, void *buf, size_t bytes, int root);
    ddpd_err (*allgather)(void *ctx, const void *in, size_t bytes, void *out /* world*bytes */);
    ddpd_err (*allreduce_max_i64)(void *ctx, int64_t *v, int n); /* small vectors, MAX */
    ddpd_err (*barrier)(void *ctx);
    /* Makes every pending and later call fail fast; safe from another thread. */
    void (*abort)(void *ctx);
    /* Optional: abort, and the peers learn why: this rank was cancelled. Their pending and
     * later calls then fail with DDPD_ECANCELED (exit code 5), not DDPD_ECOMM, so a cancel
     * ends every rank as cancelled whichever rank it reached first. Async-signal-safe.
     * Returns 1 when the peers were told, 0 when they could not be. */
    int (*cancel)(void *ctx);
    const char *(*last_error)(void *ctx); /* text of the last failure, "" if none */
    /* Optional (NULL: never): 1 when the communicator's failure began at another rank (its
     * failure notice reached this one, or it hung up: it died), 0 when it is this rank's
     * own (a deadline it saw pass, a socket error, its own abort) or there is none. */
    int (*failed_by_peer)(void *ctx);
    /* Optional (NULL: not counted): bytes this rank has sent so far, headers included. */
    uint64_t (*bytes_sent)(void *ctx);
    void (*free)(void *ctx);
    /* Optional: the backend takes the compute backend's tensors itself (NCCL: orders its
     * stream after the compute stream). Without it, a device whose tensors are not host
     * memory is staged through the host. */
    ddpd_err (*bind_dev)(void *ctx, struct dev dev, char *errbuf, size_t errcap);
};

extern const struct comm_ops comm_cpu_ops;
/* NCCL (cuda/nccl.c, inside libddpd-cuda.so; cuda/nccl_forward.c forwards to it and loads the
 * module on init_rank). Where the module cannot be loaded, or in a build without CUDA,
 * init_rank fails with the loader's message (the module's path and dlerror(), or "built
 * without CUDA or NCCL"). Call comm_new on the thread that opened the rank's GPU. */
extern const struct comm_ops comm_nccl_ops;

/* Prints {"id":"<hex>"} as one line on `out`, then serves the rendezvous root until
 * `stdin_fd` reaches EOF (or one group has formed and stdin closed). This is
 * `ddpd-worker --issue-id cpu`. Returns 0, or 1 with a message on stderr. */
int comm_cpu_issue_id(FILE *out, int stdin_fd);
/* `ddpd-worker --issue-id nccl`: ncclGetUniqueId, printed the same way; NCCL's bootstrap
 * root lives in this process, which stays until `stdin_fd` reaches EOF. A fresh id on
 * every call. Returns 0, or 1 with a message on stderr (also when the CUDA module cannot
 * be loaded: its path and dlerror()). */
int comm_nccl_issue_id(FILE *out, int stdin_fd);

/* Thin wrappers over a backend: {ops, ctx} in one handle. */
struct comm *comm_new(const struct comm_ops *ops, const struct comm_id *id, int rank, int world,
                      double timeout_s, struct ddpd_error *err);
void comm_free(struct comm *c);
/* Tells the communicator which compute backend's tensors it will be handed (borrowed,
 * must outlive it). Call once, before the first collective on tensors. */
ddpd_err comm_bind_dev(struct comm *c, struct dev dev, struct ddpd_error *err);
int comm_rank(const struct comm *c);
int comm_world(const struct comm *c);
ddpd_err comm_allreduce_start(struct comm *c, float *buf, int64_t n, struct comm_req **req,
                              struct ddpd_error *err);
/* The all-reduce of 16-bit floats (comm_ops.allreduce_half_start); DDPD_ESPEC naming
 * ddp.comm_hook where the backend has none (comm_has_half says so beforehand). */
ddpd_err comm_allreduce_half_start(struct comm *c, uint16_t *buf, int64_t n, half_kind k,
                                   struct comm_req **req, struct ddpd_error *err);
int comm_has_half(const struct comm *c);
/* Bytes this rank has sent over the communicator's links so far (headers included); 0
 * where the backend does not count them (NCCL). */
uint64_t comm_bytes_sent(const struct comm *c);
ddpd_err comm_wait(struct comm *c, struct comm_req *req, struct ddpd_error *err);
ddpd_err comm_broadcast(struct comm *c, void *buf, size_t bytes, int root, struct ddpd_error *err);
ddpd_err comm_allgather(struct comm *c, const void *in, size_t bytes, void *out, struct ddpd_error *err);
ddpd_err comm_allreduce_max_i64(struct comm *c, int64_t *v, int n, struct ddpd_error *err);
ddpd_err comm_barrier(struct comm *c, struct ddpd_error *err);
void comm_abort(struct comm *c);
/* This rank is being cancelled (SIGTERM): ends the communicator as comm_abort does and tells
 * the peers so, where the backend can (the cpu backend; see comm_ops.cancel), and then a
 * failed call of this rank returns DDPD_ECANCELED. Async-signal-safe: a SIGTERM handler
 * may call it. Returns 1 when the backend took it, 0 when it has no such call (NCCL: the
 * caller aborts with comm_abort, outside a signal handler). NULL does nothing. */
int comm_cancel(struct comm *c);
/* Whether a peer's cancel reaches this rank as DDPD_ECANCELED (the backend has a cancel
 * slot): then a DDPD_ECOMM is a real failure of a peer, never a cancel in disguise. */
int comm_carries_cancel(const struct comm *c);
/* Whether the communicator's failure began at another rank (comm_ops.failed_by_peer): the
 * rank's error is then a consequence, which its `error` event marks `secondary` so that
 * the launcher blames the rank where it began. 0 for NULL, no failure, or a backend that
 * cannot tell (NCCL). */
int comm_failed_by_peer(const struct comm *c);

#endif
