/* client_impl.h — what the client's files share (client.c: the connection, the requests
 * and the job commands; client_pull.c: pull; client_infer.c: generate and predict;
 * client_tokenize.c: tokenize; client_compare.c: compare;
 * client_tags.c: patch and the tag options; client_sweep.c: sweep; client_queue.c: queue;
 * client_whoami.c: whoami). Only they include it. Short names map to client__ ones, as spec_impl.h does for
 * the spec. */
#ifndef DDPD_CLIENT_IMPL_H
#define DDPD_CLIENT_IMPL_H

#include <curl/curl.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "token.h"

#define DEFAULT_SERVER    "http://127.0.0.1:8080" /* `ddpd serve`'s default --listen */
#define URL_MAX           2048
#define URL_PATH_ROOM     256         /* of URL_MAX, what the longest path and query need after the address */
#define ANSWER_MAX        (64u << 20) /* the most a JSON answer or a log may be */
#define CONNECT_TIMEOUT_S 10L
#define REQUEST_TIMEOUT_S 120L  /* a submission waits for the planner (up to 60 s) */
#define STREAM_IDLE_S     45L   /* three of the server's 15 s SSE heartbeats */
#define SAFE_MAX          2048  /* a one-line field from the network as printed, escaped (termsafe.h) */
#define PULL_MIN_SPEED    1024L /* bytes/s over STREAM_IDLE_S, or a download is given up */

/* Exit codes (client.h). */
#define EXIT_FAIL        1
#define EXIT_USAGE       2
#define EXIT_CANCELLED   5
#define EXIT_INTERRUPTED 130 /* Ctrl-C ended a request, as a shell reports SIGINT */

struct client {
    const char *cmd; /* "submit" */
    char base[URL_MAX];
    char *token;
    char auth[TOKEN_MAX + 32];
    char why[CURL_ERROR_SIZE + 64]; /* why the last stream request got no (whole) answer */
    CURL *curl;
};

/* A growing buffer with a cap. */
struct buf {
    char *p;
    size_t n, cap, max;
    bool over;
};

#define buf_add  client__buf_add
#define buf_free client__buf_free
bool buf_add(struct buf *b, const char *s, size_t n);
void buf_free(struct buf *b);

/* ---- commands and their options ---- */

/* getopt_long codes of the common options; each file numbers its own from OPT_LOCAL. */
enum { OPT_SERVER = 1000, OPT_TOKEN_FILE, OPT_LOCAL };

#define COMMON_OPTIONS                                                                                       \
    {"server", required_argument, NULL, OPT_SERVER},                                                         \
        {"token-file", required_argument, NULL, OPT_TOKEN_FILE}, {"help", no_argument, NULL, 'h'},           \
    {                                                                                                        \
        NULL, 0, NULL, 0                                                                                     \
    }

#define COMMON_HELP                                                                                          \
    "  --server URL      the server (default: $DDPD_SERVER, else " DEFAULT_SERVER ")\n"                      \
    "  --token-file F    the bearer token's file (default: $DDPD_TOKEN)\n"

struct command {
    const char *name, *args, *what, *help;
    int (*run)(struct client *c, int argc, char **argv);
};

/* The options of a client command: a getopt_long loop that takes the common ones
 * (--server, --token-file, --help) and names the option in every error. */
struct opts {
    const struct command *cmd;
    const char *server, *token_file;
    int rc; /* after next_option returned -2: the exit status */
};

#define find_command   client__find_command
#define next_option    client__next_option
#define operands       client__operands
#define parse_id       client__parse_id
#define parse_opt_long client__parse_opt_long
#define id_operand     client__id_operand
#define client_setup   client__setup

/* The command named `name` in client.c's table (borrowed, static), or NULL. */
const struct command *find_command(const char *name);
/* The next command-specific option (its code, with optarg), -1 at the end of the options,
 * or -2 to stop with o->rc (0 after --help, 2 after an error on stderr). */
int next_option(struct opts *o, int argc, char **argv, const char *shorts, const struct option *longs);
/* Checks that exactly `want` operands remain (their names in `what`, for the message). */
bool operands(struct opts *o, int argc, int want, const char *what);
bool parse_id(const char *cmd, const char *s, int64_t *id);
bool parse_opt_long(const char *cmd, const char *opt, const char *v, long lo, long hi, long *out);
/* After a command's options: its one operand, a job id, then the connection. Returns 0
 * to go on, else the exit status (never 0). */
int id_operand(struct client *c, struct opts *o, int argc, char **argv, const char *name, int64_t *id);
/* Sets the server's address and the token from the options and the environment. Returns
 * 0, or the exit status after a message. */
int client_setup(struct client *c, const struct opts *o);

/* ---- requests ---- */

/* What a transfer writes into: the answer's body (up to its cap), or, for a 200 answer
 * with `file` set, that file; or the stream's parser. The request's options are here too. */
struct sink {
    struct client *c;
    struct buf body;
    FILE *file;                   /* pull: a 200 answer's bytes go here, ... */
    int64_t file_bytes, file_max; /* ... counted, and refused past file_max (0: no cap); */
    int64_t file_came;            /* what came, the refused bytes included */
    int64_t announced;            /* the answer's Content-Length, -1 without one */
    bool file_over;               /* more than file_max bytes came */
    bool file_failed;             /* writing the file failed (errno in file_errno) */
    int file_errno;
    CURLcode rc;                                          /* how the transfer ended */
    size_t (*stream)(void *ctx, const char *p, size_t n); /* a 200 answer's bytes go here */
    void *stream_ctx;
    /* Options: the body's type (NULL: application/json), what to accept (NULL: SSE for a
     * stream, anything else), a plain request's timeout and a stream's longest silence
     * (0: REQUEST_TIMEOUT_S, STREAM_IDLE_S), and a flag that ends the transfer when set
     * (NULL: none; a signal handler sets it). */
    const char *content_type, *accept;
    long timeout_s, idle_s;
    volatile sig_atomic_t *stop;
    char retry_after[32]; /* the answer's Retry-After, "" without one */
};

enum req_kind { REQ_PLAIN, REQ_DOWNLOAD, REQ_STREAM };

#define request     client__request
#define http_failed client__http_failed
#define get_json    client__get_json

/* One request: method, path (with its query) and an optional body. Returns the HTTP
 * status, or 0 when no answer came (the message, naming the server, already printed), or
 * for a stream -1 when it broke off or could not be opened, for a download -1 when a 200
 * answer's body did not arrive whole (the reason in c->why and s->rc, for the caller to
 * explain). A transfer that s->stop ended returns -1 with s->rc CURLE_ABORTED_BY_CALLBACK. */
long request(struct client *c, const char *method, const char *path, const char *body, size_t body_len,
             enum req_kind kind, struct sink *s);
/* Prints an error answer: the server's message and the JSON path it names. Returns the
 * exit status: 2 for a request the server refused as invalid (`user_input`: 400, 413,
 * 422), else 1. */
int http_failed(struct client *c, const char *method, const char *path, long status, const struct buf *b,
                bool user_input);
/* GET path as JSON: returns a new reference, or NULL after a message with *rc set. */
json_t *get_json(struct client *c, const char *path, int *rc);
/* Prints a JSON answer (taken) for a terminal: indented, the server's numbers as it
 * printed them, control characters escaped. 0, or EXIT_FAIL. */
int client_print_json(json_t *j);

/* ---- the commands of the other files ---- */

#define cmd_pull     client__cmd_pull
#define cmd_generate client__cmd_generate
#define cmd_predict  client__cmd_predict
int cmd_pull(struct client *c, int argc, char **argv);     /* client_pull.c */
int cmd_generate(struct client *c, int argc, char **argv); /* client_infer.c */
int cmd_predict(struct client *c, int argc, char **argv);  /* client_infer.c */
#define cmd_compare client__cmd_compare
int cmd_compare(struct client *c, int argc, char **argv); /* client_compare.c */

/* ---- a job's tags and notes (client_tags.c) ---- */

/* Their options' getopt_long codes, shared by submit, jobs and patch (above the codes any
 * file numbers from OPT_LOCAL). */
enum { OPT_TAG = OPT_LOCAL + 100, OPT_NO_TAGS, OPT_NOTES };
/* What the options said: --tag T (repeated; the list replaces the job's), --no-tags (none),
 * --notes TEXT. */
struct meta_opts {
    json_t *tags; /* owned; NULL: no --tag */
    bool no_tags;
    const char *notes; /* borrowed from argv; NULL: no --notes */
};
#define meta_option client__meta_option
#define meta_given  client__meta_given
#define meta_put    client__meta_put
#define meta_free   client__meta_free
#define cmd_patch   client__cmd_patch
/* Takes option `opt` (OPT_TAG, OPT_NO_TAGS, OPT_NOTES) into *m; false for another option. */
bool meta_option(struct meta_opts *m, int opt, const char *arg);
/* Whether any of them was given. */
bool meta_given(const struct meta_opts *m);
/* Sets "tags" and "notes" of `obj` as the options said (the others left alone). */
void meta_put(const struct meta_opts *m, json_t *obj);
void meta_free(struct meta_opts *m);
int cmd_patch(struct client *c, int argc, char **argv); /* client_tags.c */

#define cmd_sweep client__cmd_sweep
int cmd_sweep(struct client *c, int argc, char **argv); /* client_sweep.c */
#define cmd_queue client__cmd_queue
int cmd_queue(struct client *c, int argc, char **argv); /* client_queue.c */
#define cmd_whoami client__cmd_whoami
int cmd_whoami(struct client *c, int argc, char **argv); /* client_whoami.c */
#define post_created client__post_created
/* POSTs `body` to `path`, which answers 201 and a new object with an "id" (a job, a
 * sweep): that answer (the caller's), or NULL with *rc the exit code after a message. A
 * 503 "busy" (every planner is checking other submissions: the server says to retry) is
 * tried again a few times. */
json_t *post_created(struct client *c, const char *cmd, const char *path, const char *body, size_t len,
                     int *rc);
#define read_body client__read_body
/* The body of a request from the file `path` ("-": stdin) into b (b->max its cap).
 * Returns 0, or EXIT_USAGE after a message naming the command and the file. */
int read_body(const char *cmd, const char *path, struct buf *b);

#define cmd_tokenize client__cmd_tokenize
int cmd_tokenize(struct client *c, int argc, char **argv); /* client_tokenize.c (no server) */

#endif
