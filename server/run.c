/* run.c — `ddpd run [--world-size N] [--device cpu|cuda] [--out DIR] [--data-dir DIR]
 * [--resume CKPT] SPEC.json`: the launcher driven from the command line. Events go to
 * stdout as NDJSON in arrival order; what went wrong goes to stderr naming the rank. */
#include "run.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../base/parse.h"
#include "../schema/event.h"
#include "../schema/jobdir.h"
#include "../schema/jobdoc.h"
#include "../schema/spec.h"
#include "launch.h"
#include "opt.h"
#include "planner.h"
#include "progress.h"

static volatile sig_atomic_t interrupted, preempt;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* SIGUSR1 goes on to the ranks (launch_preempt): they checkpoint at their next optimizer
 * step and end; `ddpd run` then exits RANK_EXIT_PREEMPTED. */
static void on_sigusr1(int sig)
{
    (void)sig;
    preempt = 1;
}

static void usage(FILE *f)
{
    fputs(
        "usage: ddpd run [--world-size N] [--device cpu|cuda] [--out DIR] [--data-dir DIR]\n"
        "                [--resume CKPT_DIR [--force]] [--stop-at STEP] [--max-rank-memory SIZE] SPEC.json\n"
        "Runs one job on this host and prints its events as NDJSON.\n"
        "  --world-size N  ranks (default: the spec's world_size)\n"
        "  --device D      cpu or cuda (default: the spec's device, else cpu)\n"
        "  --out DIR       checkpoints, final model, rank logs (default var/runs/NAME-TIME)\n"
        "  --data-dir DIR  where data paths and init.from are resolved (default .)\n"
        "  --resume DIR    continue from a checkpoint directory (OUT/ckpt-STEP or OUT), on the data\n"
        "                  files it was written on (a changed one is refused, naming it)\n"
        "  --force         with --resume: go on even where a data file changed since the checkpoint\n"
        "  --stop-at STEP  pause after step STEP: its checkpoint OUT/ckpt-STEP written, no final\n"
        "                  model, the schedules still the spec's steps (a sweep's ASHA rung)\n"
        "  --max-rank-memory SIZE  refuse a job whose rank needs more (bytes, or 512M, 4G, ...;\n"
        "                  default: this host's memory divided by the ranks; 0 = no limit)\n"
        "Exit status: 0 when every rank succeeded; a rank's exit code when one failed (2 spec or data,\n"
        "3 communication, 4 device, 5 cancelled, 1 other); 6 when SIGUSR1 preempted the run: every\n"
        "rank stopped at the checkpoint OUT/ckpt-STEP of the next optimizer step, which --resume\n"
        "continues bit-exactly.\n",
        f);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(SPEC_MAX_BODY + 2);
    size_t n = buf ? fread(buf, 1, SPEC_MAX_BODY + 1, f) : 0;
    fclose(f);
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

/* Each event to stdout; on a terminal, stderr also shows the progress line (ctx). */
static void print_line(void *ctx, int rank, const char *line, size_t len)
{
    (void)rank;
    fwrite(line, 1, len, stdout);
    fputc('\n', stdout);
    if (ctx) {
        json_t *ev = json_loadb(line, len, 0, NULL);
        if (ev)
            progress_event(ctx, ev);
        json_decref(ev);
    }
}

/* The spec's name as one file name under var/runs/: letters, digits, '-', '_' and '.' are
 * kept, every other byte ('/', spaces, control bytes, UTF-8) and a leading '.' become '_',
 * so that no name ("../../x", "/etc", ".hidden") puts the run anywhere else; at most 64
 * bytes; "job" when the name is empty. */
static void name_component(const char *name, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = name; *p && n + 1 < cap && n < 64; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                  c == '_' || (c == '.' && n > 0);
        out[n++] = ok ? c : '_';
    }
    out[n] = '\0';
    if (!n)
        snprintf(out, cap, "job");
}

/* Asks `ddpd-worker --plan` whether the data and the batch counts can work, before any
 * rank starts. Returns -1 to go on, else the exit status, with the failure on stderr
 * (and as an `error` event on stdout); on failure, releases doc. */
static int check_plan(const char *worker, json_t *doc, const struct spec *spec, const char *spec_path)
{
    struct ddpd_error err;
    int64_t counts[SPEC_MAX_WORLD];
    bool known;
    if (planner_plan_once(worker, doc, spec->world_size, 60, counts, &known, &err) != DDPD_OK) {
        /* Scripts read stdout: the failure is an `error` event there too. */
        struct event ev = {.kind = EVENT_ERROR, .rank = 0};
        char line[EVENT_LINE_MAX];
        snprintf(ev.error_kind, sizeof ev.error_kind, "%s", ddpd_err_kind(err.code));
        snprintf(ev.message, sizeof ev.message, "%s", err.message);
        ev.ts = (double)time(NULL);
        if (event_encode(&ev, line, sizeof line) > 0)
            puts(line);
        fprintf(stderr, "ddpd run: %s\n", err.message);
        json_decref(doc);
        return ddpd_err_exit(err.code) == 2 ? 2 : 1; /* a spec or data error, as a rank's */
    }
    if (known && spec_check_batch_counts(spec, counts, &err) != DDPD_OK) {
        fprintf(stderr, "ddpd run: %s: %s\n", spec_path, err.message);
        json_decref(doc);
        return 2;
    }
    return -1;
}

/* Runs the ranks through the local launcher, their events to stdout, until they end or
 * SIGINT/SIGTERM stops them. Steals doc. The exit status: 0, a rank's exit code, or 1. */
static int run_ranks(const char *worker, json_t *doc, const struct jobdoc *jd, const struct spec *spec,
                     const char *out)
{
    struct ddpd_error err;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = on_sigusr1;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct launch_opts lo = {
        .worker = worker,
        .world_size = spec->world_size,
        .out_dir = out,
        .doc = jd,
        .grace_s = 5,
        .die_with_parent = true,
        .on_line = print_line,
    };
    fprintf(stderr, "ddpd run: %d rank%s, output in %s\n", spec->world_size, spec->world_size > 1 ? "s" : "",
            out);
    /* A long run shows where it is on a terminal; stdout stays the events. When stdout is
     * a terminal too, the events show it there, and a line redrawn between them would
     * only garble them. */
    struct progress *prog = NULL;
    if (isatty(STDERR_FILENO) && !isatty(STDOUT_FILENO)) {
        json_t *spec_json = json_object_get(doc, "spec");
        prog = progress_new(stderr, 0, spec_json, "starting");
        lo.ctx = prog;
    }
    struct launch *l = launch_start(&lo, &err);
    json_decref(doc);
    if (!l) {
        progress_free(prog);
        fprintf(stderr, "ddpd run: %s\n", err.message);
        return 1;
    }
    bool stopping = false, preempting = false;
    while (!launch_poll(l, 100)) {
        fflush(stdout);
        if (prog)
            progress_flush(prog);
        if (preempt && !preempting && !stopping) {
            fprintf(stderr, "%sddpd run: SIGUSR1: the ranks checkpoint at their next step and stop\n",
                    prog ? "\n" : "");
            launch_preempt(l);
            preempting = true;
        }
        if (interrupted && !stopping) {
            fprintf(stderr, "%sddpd run: interrupted, stopping the ranks\n", prog ? "\n" : "");
            launch_cancel(l);
            stopping = true;
        }
    }
    fflush(stdout);
    struct launch_result res;
    launch_result(l, &res);
    launch_free(l);
    if (prog) {
        progress_set_state(prog, res.ok          ? "succeeded"
                                 : res.preempted ? "preempted"
                                 : stopping      ? "cancelled"
                                                 : "failed");
        progress_finish(prog);
        progress_free(prog);
    }
    if (res.ok) {
        char model[PATH_MAX];
        jobdir_model_path(model, sizeof model, out);
        fprintf(stderr, "ddpd run: all %d rank%s succeeded; final model in %s\n", spec->world_size,
                spec->world_size > 1 ? "s" : "", model);
        return 0;
    }
    if (res.preempted) {
        char ckpt[PATH_MAX];
        const bool found = jobdir_latest_ckpt(out, ckpt, sizeof ckpt);
        fprintf(stderr,
                "ddpd run: preempted: every rank stopped at its checkpoint; go on with --resume %s%s\n",
                found ? ckpt : out, found ? "" : "/ckpt-STEP");
        return RANK_EXIT_PREEMPTED;
    }
    if (stopping)
        fprintf(stderr, "ddpd run: cancelled; rank %d stopped with exit code %d: %s\n", res.rank,
                res.exit_code, res.message);
    else
        fprintf(stderr, "ddpd run: rank %d failed (exit code %d): %s\n", res.rank, res.exit_code,
                res.message);
    return res.exit_code > 0 && res.exit_code < 126 ? res.exit_code : 1;
}

/* What the command line says. */
struct run_opts {
    long world; /* 0: the spec's */
    const char *device, *out, *data_dir, *resume, *spec_path;
    bool force;              /* --force: resume on changed data */
    int64_t stop_at;         /* --stop-at: 0 for none */
    int64_t max_rank_memory; /* -1: this host's memory divided by the ranks */
};

/* Fills o from argv. Returns -1 to go on, else the exit status (0 after --help, 2 with
 * the message on stderr naming the option). */
static int parse_options(int argc, char **argv, struct run_opts *o)
{
    enum {
        OPT_WORLD = 1000,
        OPT_DEVICE,
        OPT_OUT,
        OPT_DATA_DIR,
        OPT_RESUME,
        OPT_FORCE,
        OPT_MAX_RANK_MEMORY,
        OPT_STOP_AT
    };
    static const struct option longs[] = {{"world-size", required_argument, NULL, OPT_WORLD},
                                          {"device", required_argument, NULL, OPT_DEVICE},
                                          {"out", required_argument, NULL, OPT_OUT},
                                          {"data-dir", required_argument, NULL, OPT_DATA_DIR},
                                          {"resume", required_argument, NULL, OPT_RESUME},
                                          {"force", no_argument, NULL, OPT_FORCE},
                                          {"stop-at", required_argument, NULL, OPT_STOP_AT},
                                          {"max-rank-memory", required_argument, NULL, OPT_MAX_RANK_MEMORY},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    long world = 0;
    const char *device = NULL, *out = NULL, *data_dir = ".", *resume = NULL, *spec_path = NULL;
    bool force = false;
    int64_t stop_at = 0;
    int64_t max_rank_memory = -1; /* -1: this host's memory divided by the ranks */
    optind = 1;
    opterr = 0;
    for (;;) {
        int c = getopt_long(argc, argv, ":h", longs, NULL);
        if (c == -1)
            break;
        const char *v = optarg;
        switch (c) {
        case 'h': usage(stdout); return 0;
        case '?':
        case ':':
            opt_complain("run", c, argv, longs);
            if (c == '?')
                usage(stderr);
            return 2;
        case OPT_WORLD:
            if (base_parse_long(v, 1, SPEC_MAX_WORLD, &world)) {
                fprintf(stderr, "ddpd run: --world-size: expected an integer in [1, %d], got '%s'\n",
                        SPEC_MAX_WORLD, v);
                return 2;
            }
            break;
        case OPT_DEVICE:
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "ddpd run: --device: expected cpu or cuda, got '%s'\n", v);
                return 2;
            }
            device = v;
            break;
        case OPT_OUT: out = v; break;
        case OPT_DATA_DIR: data_dir = v; break;
        case OPT_RESUME: resume = v; break;
        case OPT_FORCE: force = true; break;
        case OPT_STOP_AT:
            if (base_parse_i64(v, 1, INT64_MAX, &stop_at)) {
                fprintf(stderr, "ddpd run: --stop-at: expected a step (an integer >= 1), got '%s'\n", v);
                return 2;
            }
            break;
        case OPT_MAX_RANK_MEMORY:
            if (!jobdir_size_parse(v, &max_rank_memory)) {
                fprintf(stderr,
                        "ddpd run: --max-rank-memory: expected a size (bytes, or 512M, 4G, ...; 0 or none: "
                        "no limit), got '%s'\n",
                        v);
                return 2;
            }
            break;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "ddpd run: one spec file only ('%s' and '%s')\n", argv[optind], argv[optind + 1]);
        return 2;
    }
    if (optind < argc)
        spec_path = argv[optind];
    if (force && !resume) {
        fprintf(stderr, "ddpd run: --force goes with --resume (it lets a resume go on changed data)\n");
        return 2;
    }
    if (!spec_path) {
        usage(stderr);
        return 2;
    }

    *o = (struct run_opts){.world = world,
                           .device = device,
                           .out = out,
                           .data_dir = data_dir,
                           .resume = resume,
                           .force = force,
                           .stop_at = stop_at,
                           .spec_path = spec_path,
                           .max_rank_memory = max_rank_memory};
    return -1;
}

/* Reads and checks the spec file into *out, with --world-size and --device over it.
 * Returns -1 to go on, else the exit status, with the message on stderr. */
static int load_spec(const struct run_opts *o, struct spec *out)
{
    const char *spec_path = o->spec_path, *device = o->device;
    long world = o->world;
    size_t len;
    char *text = read_file(spec_path, &len);
    if (!text) {
        fprintf(stderr, "ddpd run: %s: %s\n", spec_path, strerror(errno));
        return 2;
    }
    struct spec spec;
    struct ddpd_error err;
    struct spec_parse_opts popts = {.default_device = DEVICE_CPU, .job_file = true};
    if (device)
        popts.default_device = !strcmp(device, "cuda") ? DEVICE_CUDA : DEVICE_CPU;
    ddpd_err rc = spec_parse(text, len, &popts, &spec, &err);
    free(text);
    if (rc != DDPD_OK) {
        if (err.path[0])
            fprintf(stderr, "ddpd run: %s: %s: %s\n", spec_path, err.path, err.message);
        else
            fprintf(stderr, "ddpd run: %s: %s\n", spec_path, err.message);
        return 2;
    }
    if (world)
        spec.world_size = (int)world;
    if (device) {
        spec.device = !strcmp(device, "cuda") ? DEVICE_CUDA : DEVICE_CPU;
        /* The spec's default backend follows the device it now trains on (nccl for cuda),
         * as it would have had the spec said that device itself. */
        if (!spec.ddp.backend_set)
            spec.ddp.backend = spec.device == DEVICE_CUDA ? BACKEND_NCCL : BACKEND_CPU;
        else if (spec.ddp.backend == BACKEND_NCCL && spec.device == DEVICE_CPU) {
            fprintf(stderr, "ddpd run: %s: ddp.backend: nccl needs device \"cuda\" (--device cpu)\n",
                    spec_path);
            return 2;
        }
    }
    *out = spec;
    return -1;
}

int run_main(int argc, char **argv, const char *self_dir)
{
    struct run_opts o;
    int st = parse_options(argc, argv, &o);
    if (st >= 0)
        return st;
    struct spec spec;
    if ((st = load_spec(&o, &spec)) >= 0)
        return st;
    const char *out = o.out, *resume = o.resume;
    int64_t max_rank_memory = o.max_rank_memory;

    char out_buf[PATH_MAX], data_abs[PATH_MAX], worker[PATH_MAX];
    if (!out) {
        char stamp[32], name[72];
        time_t t = time(NULL);
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&t));
        name_component(spec.name, name, sizeof name);
        snprintf(out_buf, sizeof out_buf, "var/runs/%s-%s-%d", name, stamp, (int)getpid());
        out = out_buf;
    }
    if (!realpath(o.data_dir, data_abs)) {
        fprintf(stderr, "ddpd run: --data-dir %s: %s\n", o.data_dir, strerror(errno));
        return 2;
    }
    const char *env_worker = getenv("DDPD_WORKER");
    snprintf(worker, sizeof worker, "%s", env_worker ? env_worker : "");
    if (!env_worker)
        snprintf(worker, sizeof worker, "%s/ddpd-worker", self_dir);
    if (access(worker, X_OK) != 0) {
        fprintf(stderr, "ddpd run: cannot execute the worker %s: %s (set DDPD_WORKER)\n", worker,
                strerror(errno));
        return 1;
    }

    /* The ranks all run here: each gets its share of the memory, as on the server. */
    if (max_rank_memory < 0) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        max_rank_memory = pages > 0 && page > 0 ? (int64_t)pages * page / spec.world_size : 0;
    }
    struct jobdoc jd = {.job = 0,
                        .attempt = 1,
                        .world_size = spec.world_size,
                        .rank = -1,
                        .spec = spec,
                        .max_rank_memory = max_rank_memory};
    snprintf(jd.data_dir, sizeof jd.data_dir, "%s", data_abs);
    snprintf(jd.out_dir, sizeof jd.out_dir, "%s", out);
    snprintf(jd.resume, sizeof jd.resume, "%s", resume ? resume : "");
    jd.resume_force = o.force;
    jd.stop_at = o.stop_at;
    json_t *doc = jobdoc_to_json(&jd);
    if (!doc) {
        fprintf(stderr, "ddpd run: out of memory building the job document\n");
        return 1;
    }

    /* Fail before any rank starts when the data or the batch counts say it cannot work. */
    if ((st = check_plan(worker, doc, &spec, o.spec_path)) >= 0)
        return st;
    return run_ranks(worker, doc, &jd, &spec, out);
}
