/* serve.c — `ddpd serve [--listen ADDR:PORT] [--db PATH] [--data-dir DIR] [--jobs-dir DIR]
 * [--gpus auto|none|0,1,..] [--cpu-slots N] [--token-file F] [--insecure]
 * [--on-shutdown cancel|finish] [--web-dir DIR] [--cors-origin ORIGIN] [--launcher local|slurm]
 * [--slurm-partition P] [--slurm-account A] [--slurm-time T] [--slurm-cpus-per-task N]
 * [--slurm-arg ARG]... [--comm-addr HOST] [--infer-procs N] [--infer-queue N]
 * [--infer-memory SIZE] [--infer-idle-s S] [--infer-timeout-s S] [--infer-max-bytes SIZE]
 * [--infer-worker PATH]`. Parses options,
 * opens the store, starts the supervisor and the HTTP server, waits for SIGTERM/SIGINT,
 * then stops them in order: no new requests, jobs cancelled (or finished), streams
 * closed, the store flushed. */
#include "serve.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../base/file.h"
#include "../base/parse.h"
#include "../schema/jobdir.h"
#include "../schema/spec.h"
#include "api.h"
#include "env.h"
#include "http.h"
#include "hub.h"
#include "inference/pool.h"
#include "proc.h"
#include "sched.h"
#include "token.h"
#include "launch.h"
#include "sweep/sweep.h"
#include "launch_slurm.h"
#include "opt.h"
#include "store.h"
#include "super.h"

static void usage(FILE *f)
{
    fputs("usage: ddpd serve [--listen ADDR:PORT] [--db PATH] [--data-dir DIR] [--jobs-dir DIR]\n"
          "                  [--gpus auto|none|N,N,..] [--cpu-slots N] [--max-rank-memory SIZE]\n"
          "                  [--token-file F] [--insecure]\n"
          "                  [--on-shutdown cancel|finish] [--web-dir DIR] [--cors-origin ORIGIN]\n"
          "                  [--launcher local|slurm] [--slurm-partition P] [--slurm-account A]\n"
          "                  [--slurm-time T] [--slurm-cpus-per-task N] [--slurm-arg ARG]...\n"
          "                  [--comm-addr HOST] [--job-disk-quota SIZE] [--job-events-max N]\n"
          "                  [--infer-procs N] [--infer-queue N] [--infer-memory SIZE]\n"
          "                  [--infer-idle-s S] [--infer-timeout-s S] [--infer-max-bytes SIZE]\n"
          "                  [--infer-worker PATH] [--preempt-grace S] [--priority-age-s S]\n"
          "  --listen       address to serve on (default 127.0.0.1:8080; port 0 = any free port)\n"
          "  --db           SQLite database, created on first start in a folder that exists\n"
          "                 (default ./var/ddpd.db, var/ made when missing); one\n"
          "                 server per database (DB.lock beside it names the holder's pid)\n"
          "  --data-dir     where jobs' data paths are resolved; they may not leave it (default .)\n"
          "  --jobs-dir     each job's checkpoints and logs (default: jobs/ beside the database)\n"
          "  --job-disk-quota  bytes one job's folder may hold (checkpoints, final model, logs):\n"
          "                 a number with K, M, G or T (powers of 1024), or none (default 10G); a job\n"
          "                 that would go over it fails with an error naming the quota; the\n"
          "                 bytes of its stored events count too\n"
          "  --job-events-max  loss events kept per job in the database, all ranks together\n"
          "                 (default 20000; 100 or more, or none): past it the older ones are thinned,\n"
          "                 keeping the newest half whole, the curve's shape (each stretch's first,\n"
          "                 last, lowest and highest loss), the first and last step and every other\n"
          "                 event; live streams still get every event\n"
          "  --gpus         GPUs to use (default auto: what ddpd-worker --devices finds)\n"
          "  --cpu-slots    CPU ranks that may run at once (default: the number of cores)\n"
          "  --max-rank-memory  refuse at submit a job whose rank needs more memory (bytes, or\n"
          "                 512M, 4G, ...; default: this host's memory divided by the slots, no\n"
          "                 limit with slurm; 0 = no limit)\n"
          "  --token-file   require `Authorization: Bearer <token>` on /v1 (the file's bytes less\n"
          "                 trailing whitespace: printable ASCII, no spaces, at most 4095 bytes)\n"
          "  --insecure     allow a non-loopback address without a token\n"
          "  --on-shutdown  on SIGTERM: cancel running jobs (default) or let them finish\n"
          "  --launcher     local: ranks run on this host's slots (default); slurm: every job is one\n"
          "                 srun whose tasks are the ranks, queued and placed by Slurm\n"
          "  --slurm-partition, --slurm-account, --slurm-time   srun's --partition, --account, --time\n"
          "  --slurm-cpus-per-task  CPUs per rank of cpu jobs (default 1; cuda jobs get 1 GPU per rank)\n"
          "  --slurm-arg    one more srun argument, as is (repeatable; no shell splitting)\n"
          "  --comm-addr    address the rendezvous root listens on, reachable from the ranks\n"
          "                 (DDPD_COMM_ADDR; default 127.0.0.1, with slurm this host's name)\n"
          "  --web-dir      the dashboard's files, served at / (default: the source tree's web/,\n"
          "                 else web/ beside the folder of the ddpd binary)\n"
          "  --cors-origin  send Access-Control-Allow-Origin: ORIGIN and answer preflights, so a\n"
          "                 dashboard opened elsewhere (a file URL: use '*') can use this server;\n"
          "                 POST/DELETE from any other foreign Origin are refused (403)\n"
          "Scheduling (docs/scheduling.md):\n"
          "  --preempt-grace  seconds a preempted job has to reach its checkpoint before it is\n"
          "                 stopped and restarts from its last one (default 60; a spec's\n"
          "                 preempt_grace wins)\n"
          "  --priority-age-s  a waiting job gains one point of priority per this many seconds,\n"
          "                 up to 100 (default 60; 0: never), which bounds starvation\n"
          "Inference (POST /v1/jobs/{id}/generate and /predict; docs/api.md):\n"
          "  --infer-procs  inference processes at most (ddpd-worker --infer, each holding one\n"
          "                 model; default: the number of cores, at most 64): the concurrency bound\n"
          "  --infer-queue  requests that may wait beyond the running ones (default 4 x procs);\n"
          "                 past it 503 with Retry-After\n"
          "  --infer-memory the loaded models' resident bytes together (default 2G): the least\n"
          "                 recently used idle models are unloaded to make room; a model larger\n"
          "                 than this alone is refused (507)\n"
          "  --infer-idle-s a model unused this many seconds is unloaded (default 300)\n"
          "  --infer-timeout-s  an inference process silent this long with a request is killed\n"
          "                 (504), and a request waits in the queue at most this long (503)\n"
          "                 (default 60)\n"
          "  --infer-max-bytes  the largest predict body, JSON or .npy (default 64M; 413 beyond)\n"
          "  --infer-worker the program run as `PROGRAM --infer` (default: the ddpd-worker that\n"
          "                 runs the ranks; tests give a stand-in)\n",
          f);
}

/* Event streams are long-lived connections (a dashboard, a `curl -N`): allow as many as
 * the hub allows subscribers (10,000) within the files this process may open, raising
 * the soft RLIMIT_NOFILE (often 1,024) towards the hard one; 256 descriptors stay for
 * the workers' pipes, the database and the logs. */
#define STREAM_CONNECTIONS 10000
#define FD_RESERVE         256
static unsigned connection_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0; /* the HTTP layer's default */
    rlim_t want = STREAM_CONNECTIONS + FD_RESERVE;
    if (rl.rlim_cur < want) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur <= 2 * FD_RESERVE)
        return 0;
    return rl.rlim_cur - FD_RESERVE < STREAM_CONNECTIONS ? (unsigned)(rl.rlim_cur - FD_RESERVE)
                                                         : STREAM_CONNECTIONS;
}

/* The devices ddpd-worker --devices lists (one JSON array line, [] when none; an older
 * worker printed nothing, which reads as none too) into found[0..cap): their number. */
static int list_gpus(const char *worker, struct sched_gpu_info *found, int cap)
{
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "%s", worker);
    int fds[2];
    if (pipe(fds) != 0)
        return 0;
    /* The worker's environment is an allow-list of ours (env.h), built before fork:
     * DDPD_CUDA_PLUGIN and DDPD_CUDA_EMU reach it, so emulated devices are listed too. */
    static char *const no_env[] = {NULL};
    char **env = env_for_worker(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0); /* it reads nothing: a stand-in that would read a job waits for none */
        char *argv[] = {cmd, "--devices", NULL};
        execve(cmd, argv, env ? env : no_env);
        _exit(127);
    }
    free(env);
    close(fds[1]);
    size_t n = 0, bufcap = 1 << 20; /* ~200 bytes a device */
    char *buf = pid > 0 ? malloc(bufcap) : NULL;
    ssize_t r;
    while (buf && n < bufcap - 1 && (r = read(fds[0], buf + n, bufcap - 1 - n)) != 0)
        if (r > 0)
            n += (size_t)r;
        else if (errno != EINTR)
            break;
    close(fds[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    if (!buf)
        return 0;
    buf[n] = '\0';
    json_t *j = n ? json_loads(buf, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    free(buf);
    size_t i;
    json_t *d;
    int count = 0;
    json_array_foreach (j, i, d) {
        if (count == cap)
            break;
        struct sched_gpu_info *g = &found[count++];
        const char *name = json_string_value(json_object_get(d, "name"));
        const char *uuid = json_string_value(json_object_get(d, "uuid"));
        /* An older worker does not say "has_code": its GPUs read as having code. */
        const char *cc = json_string_value(json_object_get(d, "compute_capability"));
        const char *code = json_string_value(json_object_get(d, "code"));
        const char *module = json_string_value(json_object_get(d, "module_code"));
        *g = (struct sched_gpu_info){.known = true,
                                     .emulated = json_is_true(json_object_get(d, "emulated")),
                                     .memory = json_integer_value(json_object_get(d, "memory")),
                                     .no_code = json_is_false(json_object_get(d, "has_code"))};
        snprintf(g->name, sizeof g->name, "%s", name ? name : "");
        snprintf(g->uuid, sizeof g->uuid, "%s", uuid ? uuid : "");
        snprintf(g->cc, sizeof g->cc, "%s", cc ? cc : "");
        snprintf(g->code, sizeof g->code, "%s", code ? code : "");
        snprintf(g->module_code, sizeof g->module_code, "%s", module ? module : "");
    }
    json_decref(j);
    return count;
}

/* What the command line says, with the defaults of `usage`. */
struct serve_opts {
    const char *listen, *db, *data_dir, *jobs_dir, *gpus_arg, *token_file, *web_dir, *cors, *comm_addr;
    long cpu_slots;
    int64_t max_rank_memory; /* -1: the host's memory divided by the slots */
    int64_t job_disk_quota;
    long job_events_max;           /* 0: none */
    long infer_procs, infer_queue; /* infer_queue -1: 4 x infer_procs */
    int64_t infer_memory, infer_max_bytes;
    double infer_idle_s, infer_timeout_s;
    const char *infer_worker;             /* NULL: the worker */
    double preempt_grace, priority_age_s; /* priority_age_s < 0: never */
    bool insecure, finish, slurm;
    struct slurm_opts slurm_opts;
};

/* What the options resolve to before anything starts: the worker, absolute folders, the
 * token, the GPU slots. */
struct serve_setup {
    char worker[PATH_MAX], data_abs[PATH_MAX], jobs_abs[PATH_MAX], web_abs[PATH_MAX];
    char infer_worker[PATH_MAX], infer_dir[PATH_MAX]; /* `PROGRAM --infer`; its logs, uploads */
    char *token;                                      /* NULL: none */
    int gpus;
    /* Slot i of the scheduler is the device gpu_ids[i] (--gpus 2,3: slot 0 is GPU 2),
     * which ddpd-worker --devices described as gpu_info[i] (known false: not listed). */
    char gpu_ids[SCHED_MAX_SLOTS][SCHED_GPU_ID_MAX];
    struct sched_gpu_info gpu_info[SCHED_MAX_SLOTS];
    char slurm_prefix[64];
    /* What a start that fails must not leave behind: the database when it did not exist
     * yet, and the folders prepare() made (removed only when still empty). */
    bool db_existed;
    char made_db_dir[PATH_MAX], made_jobs_dir[PATH_MAX]; /* "" when none was made */
};

/* One of the --infer-* options into o; 0, or -1 with the message on stderr. */
static int infer_option(const char *a, const char *v, struct serve_opts *o)
{
    char *end = NULL;
    double secs = 0;
    if (!strcmp(a, "--infer-procs")) {
        if (!base_parse_long(v, 1, INFER_PROCS_MAX, &o->infer_procs))
            return 0;
        fprintf(stderr, "ddpd serve: --infer-procs: expected an integer in [1, %d], got '%s'\n",
                INFER_PROCS_MAX, v);
    } else if (!strcmp(a, "--infer-queue")) {
        if (!base_parse_long(v, 0, INFER_QUEUE_MAX, &o->infer_queue))
            return 0;
        fprintf(stderr, "ddpd serve: --infer-queue: expected an integer in [0, %d], got '%s'\n",
                INFER_QUEUE_MAX, v);
    } else if (!strcmp(a, "--infer-memory") || !strcmp(a, "--infer-max-bytes")) {
        int64_t *dst = !strcmp(a, "--infer-memory") ? &o->infer_memory : &o->infer_max_bytes;
        int64_t b;
        /* Body limits are size_t and the answers 4 x that: 1 GiB at most. */
        int64_t most = dst == &o->infer_memory ? INT64_MAX : (int64_t)1 << 30;
        if (jobdir_size_parse(v, &b) && b >= 1024 && b <= most) {
            *dst = b;
            return 0;
        }
        fprintf(stderr, "ddpd serve: %s: expected a size from 1K%s (bytes, or 512M, 2G, ...), got '%s'\n", a,
                dst == &o->infer_memory ? "" : " to 1G", v);
    } else if (!strcmp(a, "--infer-idle-s") || !strcmp(a, "--infer-timeout-s")) {
        secs = strtod(v, &end);
        if (end != v && !*end && secs >= 0.1 && secs <= 86400) {
            *(!strcmp(a, "--infer-idle-s") ? &o->infer_idle_s : &o->infer_timeout_s) = secs;
            return 0;
        }
        fprintf(stderr, "ddpd serve: %s: expected seconds from 0.1 to 86400, got '%s'\n", a, v);
    } else if (!strcmp(a, "--infer-worker")) {
        o->infer_worker = v;
        return 0;
    } else {
        fprintf(stderr, "ddpd serve: unknown option '%s'\n", a);
    }
    return -1;
}

/* Fills o from argv. Returns -1 to go on, else the exit status (0 after --help, 2 with
 * the message on stderr naming the option). */
static int parse_options(int argc, char **argv, struct serve_opts *o)
{
    *o = (struct serve_opts){.listen = "127.0.0.1:8080",
                             .db = "var/ddpd.db",
                             .data_dir = ".",
                             .gpus_arg = "auto",
                             .cpu_slots = sysconf(_SC_NPROCESSORS_ONLN),
                             .max_rank_memory = -1,
                             .job_disk_quota = JOBDIR_DEFAULT_QUOTA,
                             .job_events_max = STORE_JOB_EVENTS_DEFAULT,
                             .infer_procs = sysconf(_SC_NPROCESSORS_ONLN),
                             .infer_queue = -1,
                             .infer_memory = (int64_t)2 << 30,
                             .infer_max_bytes = (int64_t)64 << 20,
                             .infer_idle_s = 300,
                             .infer_timeout_s = 60,
                             .slurm_opts = {.cpus_per_task = 1}};
    struct slurm_opts *so_slurm = &o->slurm_opts;
    /* getopt_long finds the option and its value (--db X, --db=X, or an unambiguous prefix:
     * each has its own value, so that glibc tells a prefix of two apart); the chain below
     * reads it by name. */
    static const struct option longs[] = {{"listen", required_argument, NULL, 1001},
                                          {"db", required_argument, NULL, 1002},
                                          {"data-dir", required_argument, NULL, 1003},
                                          {"jobs-dir", required_argument, NULL, 1004},
                                          {"gpus", required_argument, NULL, 1005},
                                          {"token-file", required_argument, NULL, 1006},
                                          {"web-dir", required_argument, NULL, 1007},
                                          {"slurm-partition", required_argument, NULL, 1008},
                                          {"slurm-account", required_argument, NULL, 1009},
                                          {"slurm-time", required_argument, NULL, 1010},
                                          {"comm-addr", required_argument, NULL, 1011},
                                          {"slurm-arg", required_argument, NULL, 1012},
                                          {"slurm-cpus-per-task", required_argument, NULL, 1013},
                                          {"launcher", required_argument, NULL, 1014},
                                          {"cors-origin", required_argument, NULL, 1015},
                                          {"job-disk-quota", required_argument, NULL, 1016},
                                          {"max-rank-memory", required_argument, NULL, 1017},
                                          {"cpu-slots", required_argument, NULL, 1018},
                                          {"on-shutdown", required_argument, NULL, 1019},
                                          {"insecure", no_argument, NULL, 1020},
                                          {"job-events-max", required_argument, NULL, 1021},
                                          {"infer-procs", required_argument, NULL, 1022},
                                          {"infer-queue", required_argument, NULL, 1023},
                                          {"infer-memory", required_argument, NULL, 1024},
                                          {"infer-idle-s", required_argument, NULL, 1025},
                                          {"infer-timeout-s", required_argument, NULL, 1026},
                                          {"infer-max-bytes", required_argument, NULL, 1027},
                                          {"infer-worker", required_argument, NULL, 1028},
                                          {"preempt-grace", required_argument, NULL, 1029},
                                          {"priority-age-s", required_argument, NULL, 1030},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
    optind = 1;
    opterr = 0;
    for (;;) {
        int idx = -1;
        int c = getopt_long(argc, argv, ":h", longs, &idx);
        if (c == -1)
            break;
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == '?' || c == ':') {
            opt_complain("serve", c, argv, longs);
            if (c == '?')
                usage(stderr);
            return 2;
        }
        char a[64];
        snprintf(a, sizeof a, "--%s", longs[idx].name);
        const char *v = optarg;
        if (!strcmp(a, "--insecure")) {
            o->insecure = true;
            continue;
        }
        if (!strcmp(a, "--listen"))
            o->listen = v;
        else if (!strcmp(a, "--db"))
            o->db = v;
        else if (!strcmp(a, "--data-dir"))
            o->data_dir = v;
        else if (!strcmp(a, "--jobs-dir"))
            o->jobs_dir = v;
        else if (!strcmp(a, "--gpus"))
            o->gpus_arg = v;
        else if (!strcmp(a, "--token-file"))
            o->token_file = v;
        else if (!strcmp(a, "--web-dir"))
            o->web_dir = v;
        else if (!strcmp(a, "--slurm-partition"))
            so_slurm->partition = v;
        else if (!strcmp(a, "--slurm-account"))
            so_slurm->account = v;
        else if (!strcmp(a, "--slurm-time"))
            so_slurm->time_limit = v;
        else if (!strcmp(a, "--comm-addr"))
            o->comm_addr = v;
        else if (!strcmp(a, "--slurm-arg")) {
            if (so_slurm->n_extra == SLURM_MAX_EXTRA) {
                fprintf(stderr, "ddpd serve: --slurm-arg: at most %d of them\n", SLURM_MAX_EXTRA);
                return 2;
            }
            so_slurm->extra[so_slurm->n_extra++] = v;
        } else if (!strcmp(a, "--slurm-cpus-per-task")) {
            long c;
            if (base_parse_long(v, 1, 4096, &c)) {
                fprintf(stderr,
                        "ddpd serve: --slurm-cpus-per-task: expected an integer in [1, 4096], got '%s'\n", v);
                return 2;
            }
            so_slurm->cpus_per_task = (int)c;
        } else if (!strcmp(a, "--launcher")) {
            if (strcmp(v, "local") && strcmp(v, "slurm")) {
                fprintf(stderr, "ddpd serve: --launcher: expected local or slurm, got '%s'\n", v);
                return 2;
            }
            o->slurm = !strcmp(v, "slurm");
        } else if (!strcmp(a, "--cors-origin"))
            o->cors = v;
        else if (!strcmp(a, "--job-disk-quota")) {
            if (!jobdir_size_parse(v, &o->job_disk_quota)) {
                fprintf(stderr,
                        "ddpd serve: --job-disk-quota: expected a size such as 10G, 500M or 1048576 "
                        "(bytes; K, M, G, T are powers of 1024) or none, got '%s'\n",
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--job-events-max")) {
            if (!strcmp(v, "none"))
                o->job_events_max = 0;
            else if (base_parse_long(v, 100, INT32_MAX, &o->job_events_max)) {
                fprintf(
                    stderr,
                    "ddpd serve: --job-events-max: expected a number of events from 100 to %d, or none, got "
                    "'%s'\n",
                    INT32_MAX, v);
                return 2;
            }
        } else if (!strcmp(a, "--max-rank-memory")) {
            if (!jobdir_size_parse(v, &o->max_rank_memory)) {
                fprintf(stderr,
                        "ddpd serve: --max-rank-memory: expected a size (bytes, or 512M, 4G, ...; 0 or none: "
                        "no limit), "
                        "got '%s'\n",
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--cpu-slots")) {
            if (base_parse_long(v, 0, 1024, &o->cpu_slots)) {
                fprintf(stderr, "ddpd serve: --cpu-slots: expected an integer in [0, %d], got '%s'\n", 1024,
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--preempt-grace") || !strcmp(a, "--priority-age-s")) {
            char *end;
            double secs = strtod(v, &end);
            bool age = !strcmp(a, "--priority-age-s");
            if (end == v || *end || !(secs >= (age ? 0 : 0.1)) || secs > 86400) {
                fprintf(stderr, "ddpd serve: %s: expected seconds from %s to 86400, got '%s'\n", a,
                        age ? "0 (never)" : "0.1", v);
                return 2;
            }
            *(age ? &o->priority_age_s : &o->preempt_grace) = age && secs == 0 ? -1 : secs;
        } else if (!strncmp(a, "--infer-", 8)) {
            if (infer_option(a, v, o) != 0)
                return 2;
        } else if (!strcmp(a, "--on-shutdown")) {
            if (strcmp(v, "cancel") && strcmp(v, "finish")) {
                fprintf(stderr, "ddpd serve: --on-shutdown: expected cancel or finish, got '%s'\n", v);
                return 2;
            }
            o->finish = !strcmp(v, "finish");
        } else {
            fprintf(stderr, "ddpd serve: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ddpd serve: unexpected argument '%s' (ddpd serve takes options only)\n",
                argv[optind]);
        return 2;
    }
    return -1;
}

/* The dashboard into web_abs[PATH_MAX]: --web-dir, else the source tree's web/ (a build),
 * else web/ beside the binary's folder (an install that copied it there); none found
 * leaves it empty: the dashboard's routes answer 404 and the API works as ever. False
 * when --web-dir names a folder without a readable index.html. */
static bool find_web_dir(const char *web_dir, const char *self_dir, char *web_abs)
{
    char web_try[PATH_MAX + 16];
    web_abs[0] = '\0';
    if (web_dir) {
        snprintf(web_try, sizeof web_try, "%s/index.html", web_dir);
        return realpath(web_dir, web_abs) && access(web_try, R_OK) == 0;
    }
    const char *cands[2] = {NULL, NULL};
    char beside[PATH_MAX];
#ifdef DDPD_WEB_DIR
    cands[0] = DDPD_WEB_DIR;
#endif
    snprintf(beside, sizeof beside, "%s/../web", self_dir);
    cands[1] = beside;
    for (int i = 0; i < 2 && !web_abs[0]; i++) {
        if (!cands[i])
            continue;
        snprintf(web_try, sizeof web_try, "%s/index.html", cands[i]);
        if (access(web_try, R_OK) != 0 || !realpath(cands[i], web_abs))
            web_abs[0] = '\0';
    }
    return true;
}

/* Resolves what the options name into s (the token, the worker, folders made, the GPUs,
 * the Slurm programs and names, DDPD_COMM_ADDR) before any thread starts. Returns -1 to
 * go on, else the exit status, with the message on stderr. */
static int prepare(struct serve_opts *o, const char *self_dir, struct serve_setup *s)
{
    char token_why[256];
    if (o->token_file && !(s->token = token_read_file(o->token_file, token_why, sizeof token_why))) {
        fprintf(stderr, "ddpd serve: --token-file %s: %s\n", o->token_file, token_why);
        return 2;
    }
    char addr_why[160];
    if (!http_addr_check(o->listen, addr_why, sizeof addr_why)) {
        fprintf(stderr, "ddpd serve: --listen %s: %s\n", o->listen, addr_why);
        return 2;
    }
    /* A non-loopback address needs tokens: the token file's or users'. A database that
     * does not exist yet has no users (refused before anything is made); one that does is
     * asked once it is open (run_server). */
    struct stat dbst;
    if (!s->token && !o->insecure && !http_addr_is_loopback(o->listen) && stat(o->db, &dbst) != 0) {
        fprintf(stderr,
                "ddpd serve: refusing to listen on %s without --token-file or users (anyone could run "
                "jobs); use a loopback address, a token, `ddpd users add`, or --insecure\n",
                o->listen);
        return 2;
    }
    char jobs_buf[PATH_MAX], db_dir[PATH_MAX], db_real[PATH_MAX];
    const char *env_worker = getenv("DDPD_WORKER");
    snprintf(s->worker, sizeof s->worker, "%s%s", env_worker ? env_worker : self_dir,
             env_worker ? "" : "/ddpd-worker");
    if (access(s->worker, X_OK) != 0) {
        fprintf(stderr, "ddpd serve: cannot execute the worker %s: %s\n", s->worker, strerror(errno));
        return 1;
    }
    if (o->infer_worker &&
        (!realpath(o->infer_worker, s->infer_worker) || access(s->infer_worker, X_OK) != 0)) {
        fprintf(stderr, "ddpd serve: --infer-worker %s: %s\n", o->infer_worker, strerror(errno));
        return 2;
    }
    if (!o->infer_worker)
        snprintf(s->infer_worker, sizeof s->infer_worker, "%s", s->worker);
    if (o->infer_procs > INFER_PROCS_MAX) /* the default on a host of more cores */
        o->infer_procs = INFER_PROCS_MAX;
    if (o->infer_procs < 1)
        o->infer_procs = 1;
    if (o->infer_queue < 0)
        o->infer_queue = 4 * o->infer_procs > INFER_QUEUE_MAX ? INFER_QUEUE_MAX : 4 * o->infer_procs;
    if (!realpath(o->data_dir, s->data_abs)) {
        fprintf(stderr, "ddpd serve: --data-dir %s: %s\n", o->data_dir, strerror(errno));
        return 2;
    }
    snprintf(db_dir, sizeof db_dir, "%s", o->db);
    const char *dd = dirname(db_dir);
    struct stat st;
    s->db_existed = stat(o->db, &st) == 0;
    /* The database's folder must exist: a typo in --db must not grow a tree of folders
     * and a new empty database somewhere. Only the default's one folder (var/ in the
     * current directory) is made. */
    int missing = stat(dd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    if (missing) {
        if (strcmp(o->db, "var/ddpd.db") != 0 || missing != ENOENT) {
            fprintf(stderr, "ddpd serve: --db %s: the folder %s %s; create it first\n", o->db, dd,
                    missing == ENOENT    ? "does not exist"
                    : missing == ENOTDIR ? "is not a folder"
                                         : strerror(missing));
            return 2;
        }
        if (mkdir(dd, 0700) != 0) {
            fprintf(stderr, "ddpd serve: cannot create %s: %s\n", dd, strerror(errno));
            return 1;
        }
        snprintf(s->made_db_dir, sizeof s->made_db_dir, "%s", dd);
    }
    /* The inference processes' logs and uploads: beside the database (made at the first
     * request). */
    if (!realpath(dd, db_real) ||
        snprintf(s->infer_dir, sizeof s->infer_dir, "%s/inference", db_real) >= (int)sizeof s->infer_dir) {
        fprintf(stderr, "ddpd serve: --db %s: cannot resolve its folder: %s\n", o->db, strerror(errno));
        return 2;
    }
    const char *jobs_dir = o->jobs_dir;
    if (!jobs_dir) {
        snprintf(jobs_buf, sizeof jobs_buf, "%s/" JOBDIR_JOBS, dd);
        jobs_dir = jobs_buf;
    }
    if (stat(jobs_dir, &st) != 0)
        snprintf(s->made_jobs_dir, sizeof s->made_jobs_dir, "%s", jobs_dir);
    if ((errno = base_mkdirs(jobs_dir, true)) != 0 || !realpath(jobs_dir, s->jobs_abs)) {
        fprintf(stderr, "ddpd serve: cannot create %s: %s\n", jobs_dir, strerror(errno));
        return 1;
    }
    if (!find_web_dir(o->web_dir, self_dir, s->web_abs)) {
        fprintf(stderr, "ddpd serve: --web-dir %s: no readable index.html there\n", o->web_dir);
        return 2;
    }
    /* The devices the worker sees: all of them for "auto", and what a --gpus list names
     * is described from them too (GET /v1/devices: name, memory, emulated). */
    char gpus_why[256];
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    struct sched_gpu_info *found = calloc(SCHED_MAX_SLOTS, sizeof *found);
    int nfound = found && strcmp(o->gpus_arg, "none") ? list_gpus(s->worker, found, SCHED_MAX_SLOTS) : 0;
    s->gpus =
        sched_gpu_ids(o->gpus_arg, nfound, visible, s->gpu_ids, SCHED_MAX_SLOTS, gpus_why, sizeof gpus_why);
    if (s->gpus > 0 && found)
        sched_gpu_match((const char(*)[SCHED_GPU_ID_MAX])s->gpu_ids, s->gpus, visible, found, nfound,
                        s->gpu_info);
    free(found);
    if (s->gpus < 0) {
        fprintf(stderr, "ddpd serve: %s\n", gpus_why);
        return 2;
    }

    char why[PATH_MAX + 64];
    if (o->slurm && !slurm_programs_found(&o->slurm_opts, why, sizeof why)) {
        fprintf(stderr, "ddpd serve: --launcher slurm: %s\n", why);
        return 2;
    }
    /* The id issuer's root listens on DDPD_COMM_ADDR (worker/comm/cpu/root.c): loopback for
     * local ranks; ranks on other nodes need an address of this host that they reach.
     * Set before any thread starts; the launcher's environment allow-list passes it on. */
    char host[256];
    const char *comm_addr = o->comm_addr;
    if (!comm_addr && o->slurm && !getenv("DDPD_COMM_ADDR") && gethostname(host, sizeof host) == 0) {
        host[sizeof host - 1] = '\0';
        comm_addr = host;
    }
    if (comm_addr && setenv("DDPD_COMM_ADDR", comm_addr, 1) != 0) {
        fprintf(stderr, "ddpd serve: --comm-addr %s: %s\n", comm_addr, strerror(errno));
        return 2;
    }
    /* Slurm job names carry a tag of this server (its jobs folder), so that a restarted
     * server finds its own leftovers and two servers never touch each other's jobs. */
    if (o->slurm) {
        uint32_t h = 2166136261u; /* FNV-1a */
        for (const char *p = s->jobs_abs; *p; p++)
            h = (h ^ (unsigned char)*p) * 16777619u;
        snprintf(s->slurm_prefix, sizeof s->slurm_prefix, "ddpd.%08x.", (unsigned)h);
        o->slurm_opts.name_prefix = s->slurm_prefix;
    }
    if (o->max_rank_memory < 0) { /* every slot busy must still fit in this host's memory */
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE), slots = o->cpu_slots + s->gpus;
        o->max_rank_memory =
            o->slurm || pages <= 0 || page <= 0 ? 0 : (int64_t)pages * page / (slots > 0 ? slots : 1);
    }
    return -1;
}

/* Removes the database at `path` and the files SQLite and the lock keep beside it. */
static void remove_db_files(const char *path)
{
    static const char *const suffixes[] = {"", "-wal", "-shm", "-journal", ".lock"};
    char f[PATH_MAX + 16];
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++)
        if (snprintf(f, sizeof f, "%s%s", path, suffixes[i]) < (int)sizeof f)
            unlink(f);
}

/* Wires the store, the hub, the launcher, the supervisor, the API and the HTTP server,
 * waits for SIGINT/SIGTERM (blocked in every thread: the caller blocked them), and
 * stops them in order. The exit status. */
static int run_server(const struct serve_opts *o, const struct serve_setup *s, const sigset_t *set)
{
    struct ddpd_error err;
    int rc = 1;
    struct store *store = NULL;
    struct hub *hub = NULL;
    struct super *super = NULL;
    struct launcher *launcher = NULL;
    struct http_server *http = NULL;
    struct api *api = NULL;
    struct sweeper *sweeper = NULL;
    struct store_lock *lock = NULL;
    int listen_fd = -1;

    /* One server per database, and the port held, before recovery kills an earlier
     * server's orphans and requeues its jobs: a second server (a second Compose service
     * on the same volume, a typo in --listen) must leave a live one's jobs alone. */
    lock = store_lock_take(o->db, &err);
    if (!lock || (listen_fd = http_listen(o->listen, &err)) < 0) {
        fprintf(stderr, "ddpd serve: %s\n", err.message);
        goto out;
    }
    struct store_opts sto = {.job_events_max = (int)o->job_events_max};
    store = store_open_with(o->db, &sto, &err);
    if (!store) {
        fprintf(stderr, "ddpd serve: %s\n", err.message);
        goto out;
    }
    /* A non-loopback address needs tokens: the token file's, or users' (docs/security.md). */
    bool any_user = false;
    if (!s->token && !o->insecure && !http_addr_is_loopback(o->listen) &&
        (store_user_any(store, &any_user, &err) != DDPD_OK || !any_user)) {
        fprintf(stderr,
                "ddpd serve: refusing to listen on %s without --token-file or users (anyone could run "
                "jobs); use a loopback address, a token, `ddpd users add`, or --insecure\n",
                o->listen);
        rc = 2;
        goto out;
    }
    hub = hub_new(NULL);
    launcher = o->slurm ? launcher_slurm_new(&o->slurm_opts) : launcher_local_new();
    if (!launcher) {
        fprintf(stderr, "ddpd serve: out of memory\n");
        goto out;
    }
    struct super_opts so = {.worker = s->worker,
                            .data_dir = s->data_abs,
                            .jobs_dir = s->jobs_abs,
                            .gpus = s->gpus,
                            .gpu_ids = (const char(*)[SCHED_GPU_ID_MAX])s->gpu_ids,
                            .gpu_info = s->gpu_info,
                            .launcher = launcher,
                            .cpu_slots = (int)o->cpu_slots,
                            .store = store,
                            .hub = hub,
                            .grace_s = 5,
                            .finish_on_shutdown = o->finish,
                            .job_disk_quota = o->job_disk_quota,
                            .max_rank_memory = o->max_rank_memory,
                            .preempt_grace = o->preempt_grace,
                            .priority_age_s = o->priority_age_s};
    super = hub ? super_start(&so, &err) : NULL;
    if (!super) {
        fprintf(stderr, "ddpd serve: %s\n", err.message);
        goto out;
    }
    /* The sweeps' controller goes on with the sweeps the store says are running. */
    if (!(sweeper = sweeper_start(store, super, &err))) {
        fprintf(stderr, "ddpd serve: %s\n", err.message);
        goto out;
    }
    struct api_config ac = {.store = store,
                            .hub = hub,
                            .super = super,
                            .sweeper = sweeper,
                            .worker = s->worker,
                            .data_dir = s->data_abs,
                            .jobs_dir = s->jobs_abs,
                            .web_dir = s->web_abs[0] ? s->web_abs : NULL,
                            .max_rank_memory = o->max_rank_memory,
                            .infer = {.worker = s->infer_worker,
                                      .dir = s->infer_dir,
                                      .procs = (int)o->infer_procs,
                                      .queue = (int)o->infer_queue,
                                      .memory = o->infer_memory,
                                      .idle_s = o->infer_idle_s,
                                      .timeout_s = o->infer_timeout_s,
                                      .max_bytes = (size_t)o->infer_max_bytes,
                                      .line_max = 4 * (size_t)o->infer_max_bytes < ((size_t)16 << 20)
                                                      ? (size_t)16 << 20
                                                      : 4 * (size_t)o->infer_max_bytes}};
    size_t nroutes;
    struct http_config hc = {.listen = o->listen,
                             .listen_fd = listen_fd,
                             .routes = NULL,
                             .ctx = NULL,
                             .token = s->token,
                             .users_exist = api_users_exist,
                             .authenticate = api_authenticate,
                             .authorize = api_authorize,
                             .cors_origin = o->cors,
                             .threads = 4,
                             .connection_limit = connection_limit()};
    if (api_new(&ac, &api, &err) == DDPD_OK) {
        hc.routes = api_routes(api, &nroutes);
        hc.nroutes = nroutes;
        hc.ctx = api;
        http = http_server_new(&hc, &err);
        listen_fd = -1; /* taken, also on failure */
    }
    if (!http) {
        fprintf(stderr, "ddpd serve: %s\n", err.message);
        goto out;
    }
    api_set_http(api, http); /* read by /metrics handlers */
    fprintf(stderr, "ddpd serve: listening on http://%s%s (port %d), database %s, %d GPU%s, %ld CPU slot%s\n",
            o->listen, s->token ? " with a token" : "", http_server_port(http), o->db, s->gpus,
            s->gpus == 1 ? "" : "s", o->cpu_slots, o->cpu_slots == 1 ? "" : "s");
    /* A GPU the CUDA module has no code for: no job will get it (sched_describe_gpus). */
    for (int i = 0; i < s->gpus; i++)
        if (s->gpu_info[i].known && s->gpu_info[i].no_code)
            fprintf(stderr,
                    "ddpd serve: GPU %d (%s) has compute capability %s, for which the CUDA module holds no "
                    "code (it was built for %s): no job will be given it\n",
                    i, s->gpu_info[i].name, s->gpu_info[i].cc, s->gpu_info[i].module_code);
    if (o->slurm)
        fprintf(stderr,
                "ddpd serve: launcher slurm: every job is one srun named %s<job>.<attempt>; the "
                "rendezvous root listens on %s\n",
                s->slurm_prefix, getenv("DDPD_COMM_ADDR") ? getenv("DDPD_COMM_ADDR") : "127.0.0.1");
    fflush(stderr);

    int sig;
    sigwait(set, &sig);
    fprintf(stderr, "ddpd serve: %s: shutting down (%s running jobs)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            o->finish ? "finishing" : "cancelling");
    rc = 0;
out:
    /* Order: no new requests (inference cancelled first: the HTTP server waits for its
     * deferred answers), then the jobs, then the streams, then the store. */
    api_stop(api);
    http_server_free(http);
    api_free(api);
    sweeper_stop(sweeper);
    super_stop(super);
    launcher_free(launcher);
    if (hub)
        hub_close_all(hub, "server shutting down");
    hub_free(hub);
    store_close(store);
    if (listen_fd >= 0)
        close(listen_fd);
    /* A start that failed leaves no new database behind (nor its lock file, while the
     * lock is still ours). */
    bool forget = rc != 0 && !s->db_existed && lock;
    if (forget)
        remove_db_files(o->db);
    store_lock_release(lock); /* last: the jobs are left as the next server expects them */
    return rc;
}

int serve_main(int argc, char **argv, const char *self_dir)
{
    struct serve_opts o;
    int rc = parse_options(argc, argv, &o);
    if (rc >= 0)
        return rc;
    struct serve_setup *s = calloc(1, sizeof *s);
    if (!s) {
        fprintf(stderr, "ddpd serve: out of memory\n");
        return 1;
    }
    if ((rc = prepare(&o, self_dir, s)) < 0) {
        /* Signals are taken by sigwait in run_server; every thread started after this
         * inherits the mask. */
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
        signal(SIGPIPE, SIG_IGN);
        rc = run_server(&o, s, &set);
    }
    /* The folders this start made, when it failed (rmdir: only while empty). */
    if (rc != 0 && s->made_jobs_dir[0])
        rmdir(s->made_jobs_dir);
    if (rc != 0 && s->made_db_dir[0])
        rmdir(s->made_db_dir);
    free(s->token);
    free(s);
    return rc;
}
