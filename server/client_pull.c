/* client_pull.c — `ddpd pull`: a model or optimizer file downloaded into a temporary file
 * beside its name, kept only when whole and a valid safetensors file (stcheck.h), then
 * renamed; with --pytorch, a folder with the model's weights and its model.py (GET
 * /v1/jobs/{id}/pytorch); with --format gpt2, a folder with Hugging Face's GPT-2
 * model.safetensors and config.json (GET .../checkpoint?format=gpt2). Never leaves a torn
 * file under a name, Ctrl-C included. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/parse.h"
#include "../schema/jobdir.h"
#include "client_impl.h"
#include "stcheck.h"
#include "termsafe.h"

/* `pull --max-bytes`'s default: the largest safetensors file ddpd-worker reads (its
 * SAFETENSORS_MAX_FILE), so that whatever ddpd can load again can be pulled. */
#define PULL_MAX_DEFAULT (64LL << 30)
#define MODEL_PY_MAX     (16u << 20) /* the most a model.py answer may be */

enum { OPT_STEP = OPT_LOCAL, OPT_OPTIM, OPT_MAX_BYTES, OPT_PYTORCH, OPT_FORMAT, OPT_BEST };

/* The most a pulled file may be, and where that figure came from (for the messages). */
struct pull_limit {
    int64_t max;
    int64_t step; /* --best: the best checkpoint's step, found in the list */
    char what[192];
};

/* With --step, the checkpoints list gives the bytes of that step's files together, which
 * one of them cannot exceed: the limit is tightened to it when it is listed. With step 0
 * (--best) the step is the list's best one, into lim->step first. Returns 0, or the exit
 * status when the server could not be reached or (--best) lists no best (the message
 * printed). */
static int pull_listed_limit(struct client *c, int64_t id, int64_t step, struct pull_limit *lim)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "/checkpoints", id);
    struct sink s = {.c = c, .body = {.max = ANSWER_MAX}};
    long status = request(c, "GET", path, NULL, 0, REQ_PLAIN, &s);
    json_t *j = status == 200 && s.body.p ? json_loadb(s.body.p, s.body.n, 0, NULL) : NULL;
    int rc = status == 0              ? EXIT_FAIL
             : !step && status != 200 ? http_failed(c, "GET", path, status, &s.body, false)
                                      : 0;
    buf_free(&s.body);
    if (rc)
        return rc;
    if (!step) { /* --best: the step of the entry marked best */
        size_t i;
        json_t *ck;
        json_array_foreach (json_object_get(j, "checkpoints"), i, ck)
            if (json_is_true(json_object_get(ck, "best")) &&
                json_integer_value(json_object_get(ck, "step")) > 0)
                step = json_integer_value(json_object_get(ck, "step"));
        if (!step) {
            json_decref(j);
            fprintf(stderr,
                    "ddpd pull: job %" PRId64 " has no best checkpoint (GET %s marks none best: "
                    "it needs checkpoint.keep_best and an eval)\n",
                    id, path);
            return EXIT_FAIL;
        }
        lim->step = step;
    }
    /* Any other answer: the download's own answer will say what is wrong. */
    size_t i;
    json_t *ck;
    json_array_foreach (json_object_get(j, "checkpoints"), i, ck) {
        json_t *b = json_object_get(ck, "bytes");
        if (json_integer_value(json_object_get(ck, "step")) == step && json_is_integer(b) &&
            json_integer_value(b) > 0 && json_integer_value(b) < lim->max) {
            lim->max = json_integer_value(b);
            snprintf(lim->what, sizeof lim->what,
                     "the %" PRId64 " bytes that GET %s gives for step %" PRId64 "'s files", lim->max, path,
                     step);
        }
    }
    json_decref(j);
    return 0;
}

/* Whether the answer to a download that began with 200 is to be kept: it came whole (as
 * many bytes as its Content-Length said, within the limit, the transfer ended cleanly) and
 * is a valid safetensors file. Else says why, with the numbers, and returns false. */
static bool pull_check(struct client *c, const struct sink *s, const struct pull_limit *lim, FILE *f,
                       const char *out)
{
    long long cl = (long long)s->announced, got = (long long)s->file_bytes;
    char announced[64] = "it gave no Content-Length", why[SAFE_MAX], o[512];
    if (cl >= 0)
        snprintf(announced, sizeof announced, "its Content-Length said %lld", cl);
    termsafe_line(o, sizeof o, out);
    if (s->file_failed)
        fprintf(stderr, "ddpd pull: writing the download for %s: %s (after %lld bytes)\n", o,
                strerror(s->file_errno), got);
    else if (s->rc == CURLE_FILESIZE_EXCEEDED)
        fprintf(stderr,
                "ddpd pull: refused: the server announced %lld bytes (Content-Length), more than %s\n", cl,
                lim->what);
    else if (s->file_over)
        fprintf(stderr, "ddpd pull: refused after %lld bytes: more than %s came (%s)\n",
                (long long)s->file_came, lim->what, announced);
    else if (s->rc == CURLE_OPERATION_TIMEDOUT)
        fprintf(stderr,
                "ddpd pull: the download stalled: fewer than %ld bytes/s for %ld s, after %lld bytes (%s)\n",
                PULL_MIN_SPEED, STREAM_IDLE_S, got, announced);
    else if (s->rc != CURLE_OK)
        fprintf(stderr, "ddpd pull: the download broke off after %lld bytes (%s): %s\n", got, announced,
                c->why);
    else if (cl >= 0 && got != cl)
        fprintf(stderr, "ddpd pull: received %lld bytes, but the answer's Content-Length said %lld\n", got,
                cl);
    else if (fflush(f) != 0)
        fprintf(stderr, "ddpd pull: writing the download for %s: %s\n", o, strerror(errno));
    else if (!stcheck_fd(fileno(f), s->file_bytes, why, sizeof why))
        fprintf(stderr, "ddpd pull: the %lld bytes received are not a whole safetensors file: %s\n", got,
                why);
    else
        return true;
    fprintf(stderr, "ddpd pull: %s was not written\n", o);
    return false;
}

/* fsyncs the folder holding `path`, so that the rename survives a crash. Best effort: the
 * file is whole either way. */
static void fsync_folder_of(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* The checked download `tmp` (open as f, which this closes) made `out`: its mode as a new
 * file's (mkstemp's 0600 would make a model file only its owner can read), its bytes on
 * disk, then its name. Returns true, or false after a message. */
static bool pull_finish(FILE *f, const char *tmp, const char *out)
{
    mode_t mask = umask(0);
    umask(mask);
    bool ok = fchmod(fileno(f), 0666 & ~mask) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0 || !ok) {
        fprintf(stderr, "ddpd pull: writing %s: %s\n", tmp, strerror(errno));
        return false;
    }
    if (rename(tmp, out) != 0) {
        fprintf(stderr, "ddpd pull: cannot rename %s to %s: %s\n", tmp, out, strerror(errno));
        return false;
    }
    fsync_folder_of(out);
    return true;
}

/* A pull stopped by Ctrl-C, `kill` or a closed terminal leaves no half-written FILE.XXXXXX
 * behind: while the download runs, those signals remove the temporary file, then end the
 * process as the signal would have (unlink and raise are async-signal-safe). */
static char pull_tmp[PATH_MAX];
static volatile sig_atomic_t pull_tmp_set;

static void pull_on_signal(int sig)
{
    if (pull_tmp_set)
        unlink(pull_tmp);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Guards `tmp` (a name of at most PATH_MAX bytes) until called again with NULL, which puts
 * back the handlers there were. */
static void pull_guard_tmp(const char *tmp)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    static struct sigaction old[sizeof sigs / sizeof sigs[0]];
    struct sigaction sa = {.sa_handler = pull_on_signal};
    sigemptyset(&sa.sa_mask);
    if (tmp) {
        snprintf(pull_tmp, sizeof pull_tmp, "%s", tmp);
        pull_tmp_set = 1;
    } else {
        pull_tmp_set = 0;
    }
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], tmp ? &sa : &old[i], tmp ? &old[i] : NULL);
}

/* Downloads `path` into `out` through a temporary file beside it (mkstemp: O_EXCL, 0600),
 * renamed over it once whole and checked: never a torn or bogus file under the name.
 * Returns 0 with *bytes set, or the exit status after a message. */
static int pull_download(struct client *c, const char *path, const char *out, const struct pull_limit *lim,
                         int64_t *bytes)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", out) >= (int)sizeof tmp) {
        fprintf(stderr, "ddpd pull: %s: the name is too long\n", out);
        return EXIT_USAGE;
    }
    int fd = mkstemp(tmp);
    if (fd >= 0)
        pull_guard_tmp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        fprintf(stderr, "ddpd pull: cannot create a file beside %s: %s\n", out, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
            pull_guard_tmp(NULL);
        }
        return EXIT_FAIL;
    }
    struct sink s = {.c = c, .body = {.max = ANSWER_MAX}, .file = f, .file_max = lim->max};
    long status = request(c, "GET", path, NULL, 0, REQ_DOWNLOAD, &s);
    bool ok = false;
    int rc = 0;
    if (status == 200 || status == -1)
        ok = pull_check(c, &s, lim, f, out);
    else if (status > 0)
        rc = http_failed(c, "GET", path, status, &s.body, false);
    if (ok)
        ok = pull_finish(f, tmp, out);
    else
        fclose(f);
    if (!ok)
        unlink(tmp);
    pull_guard_tmp(NULL);
    buf_free(&s.body);
    *bytes = s.file_bytes;
    return ok ? 0 : rc ? rc : EXIT_FAIL;
}

/* `text` (n bytes) as the file `out`, through a temporary file renamed over it. Returns
 * true, or false after a message. */
static bool write_text_file(const char *out, const char *text, size_t n)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", out) >= (int)sizeof tmp) {
        fprintf(stderr, "ddpd pull: %s: the name is too long\n", out);
        return false;
    }
    int fd = mkstemp(tmp);
    if (fd >= 0)
        pull_guard_tmp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    bool ok = f && fwrite(text, 1, n, f) == n && fflush(f) == 0;
    if (!ok)
        fprintf(stderr, "ddpd pull: writing %s: %s\n", f ? tmp : out, strerror(errno));
    if (ok)
        ok = pull_finish(f, tmp, out);
    else if (f)
        fclose(f);
    else if (fd >= 0)
        close(fd);
    if (!ok && fd >= 0)
        unlink(tmp);
    if (fd >= 0)
        pull_guard_tmp(NULL);
    return ok;
}

/* A small file that goes beside the weights (model.py, config.json): GET `path`'s text, a
 * new string, or NULL after a message with *rc set. `json`: it must be a JSON object (a
 * config); else text without a NUL byte (code that will be imported). */
static char *get_side_file(struct client *c, const char *path, bool json, size_t *len, int *rc)
{
    struct sink s = {.c = c, .body = {.max = MODEL_PY_MAX}};
    long status = request(c, "GET", path, NULL, 0, REQ_PLAIN, &s);
    *rc = EXIT_FAIL;
    if (status != 200) {
        if (status > 0)
            *rc = http_failed(c, "GET", path, status, &s.body, false);
        buf_free(&s.body);
        return NULL;
    }
    json_t *j = json && s.body.p ? json_loadb(s.body.p, s.body.n, 0, NULL) : NULL;
    bool ok = json ? json_is_object(j) : s.body.p && !memchr(s.body.p, '\0', s.body.n);
    json_decref(j);
    if (!ok) {
        fprintf(stderr, "ddpd pull: GET %s: the answer is %s, not %s\n", path,
                !s.body.p ? "empty"
                : json    ? "not a JSON object"
                          : "binary",
                json ? "a config.json" : "Python source");
        buf_free(&s.body);
        return NULL;
    }
    *len = s.body.n;
    return s.body.p; /* buf_add keeps it NUL-terminated */
}

/* A folder of the weights and one small file beside them (pull --pytorch: model.py, pull
 * --format gpt2: config.json): the small file first (and an old server without the route,
 * or a model without that form, fails before gigabytes are downloaded), then the weights,
 * then the small file is written. `hint` follows the folder's name in the last line. */
struct folder_pull {
    const char *weights; /* GET path of the weights */
    const char *side;    /* GET path of the small file */
    const char *side_name;
    bool side_json;
    const char *hint; /* printf format taking the folder's name */
};

static int pull_folder(struct client *c, const char *dir, const struct folder_pull *fp,
                       const struct pull_limit *lim)
{
    char st_out[PATH_MAX], side_out[PATH_MAX], d[512];
    termsafe_line(d, sizeof d, dir);
    if (snprintf(st_out, sizeof st_out, "%s/model.safetensors", dir) >= (int)sizeof st_out - 8 ||
        snprintf(side_out, sizeof side_out, "%s/%s", dir, fp->side_name) >= (int)sizeof side_out - 8) {
        fprintf(stderr, "ddpd pull: %s: the folder's name is too long\n", d);
        return EXIT_USAGE;
    }
    int rc;
    size_t len = 0;
    char *side = get_side_file(c, fp->side, fp->side_json, &len, &rc);
    if (!side)
        return rc;
    struct stat st;
    if (mkdir(dir, 0777) != 0 && (errno != EEXIST || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
        fprintf(stderr, "ddpd pull: cannot make the folder %s: %s\n", d,
                errno == EEXIST ? "a file has that name" : strerror(errno));
        free(side);
        return EXIT_FAIL;
    }
    int64_t bytes = 0;
    rc = pull_download(c, fp->weights, st_out, lim, &bytes);
    if (rc == 0 && !write_text_file(side_out, side, len))
        rc = EXIT_FAIL;
    free(side);
    if (rc == 0) {
        fprintf(stderr, "ddpd pull: wrote %s/model.safetensors (%lld bytes) and %s/%s; ", d, (long long)bytes,
                d, fp->side_name);
        fprintf(stderr, fp->hint, d);
        fputc('\n', stderr);
    }
    return rc;
}

int cmd_pull(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {
        {"step", required_argument, NULL, OPT_STEP}, {"output", required_argument, NULL, 'o'},
        {"optim", no_argument, NULL, OPT_OPTIM},     {"max-bytes", required_argument, NULL, OPT_MAX_BYTES},
        {"pytorch", no_argument, NULL, OPT_PYTORCH}, {"format", required_argument, NULL, OPT_FORMAT},
        {"best", no_argument, NULL, OPT_BEST},       COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("pull")};
    int64_t step = 0, max_bytes = PULL_MAX_DEFAULT;
    const char *out = NULL;
    bool optim = false, pytorch = false, gpt2 = false, best = false;
    int opt;
    while ((opt = next_option(&o, argc, argv, ":o:h", longs)) != -1) {
        if (opt == -2)
            return o.rc;
        if (opt == 'o')
            out = optarg;
        else if (opt == OPT_OPTIM)
            optim = true;
        else if (opt == OPT_PYTORCH)
            pytorch = true;
        else if (opt == OPT_BEST)
            best = true;
        else if (opt == OPT_FORMAT && strcmp(optarg, "gpt2") != 0) {
            fprintf(stderr, "ddpd pull: --format: expected gpt2 (Hugging Face's GPT-2), got '%s'\n", optarg);
            return EXIT_USAGE;
        } else if (opt == OPT_FORMAT)
            gpt2 = true;
        else if (opt == OPT_MAX_BYTES && (!jobdir_size_parse(optarg, &max_bytes) || max_bytes <= 0)) {
            fprintf(stderr,
                    "ddpd pull: --max-bytes: expected a size above 0 (bytes, or 512M, 16G, ...), got '%s'\n",
                    optarg);
            return EXIT_USAGE;
        } else if (opt == OPT_STEP && base_parse_i64(optarg, 1, INT64_MAX, &step)) {
            fprintf(stderr, "ddpd pull: --step: expected a step (a positive integer), got '%s'\n", optarg);
            return EXIT_USAGE;
        }
    }
    if (best && step) {
        fprintf(stderr, "ddpd pull: --best and --step both name a checkpoint; give one\n");
        return EXIT_USAGE;
    }
    if (pytorch && (out || optim || gpt2)) {
        fprintf(stderr,
                "ddpd pull: --pytorch writes DIR/model.safetensors and DIR/model.py; it takes no %s\n",
                out     ? "-o"
                : optim ? "--optim"
                        : "--format");
        return EXIT_USAGE;
    }
    if (gpt2 && (out || optim)) {
        fprintf(stderr,
                "ddpd pull: --format gpt2 writes DIR/model.safetensors and DIR/config.json; it takes no %s\n",
                out ? "-o" : "--optim");
        return EXIT_USAGE;
    }
    int64_t id;
    int rc;
    if (pytorch || gpt2) {
        if (!operands(&o, argc, 2, "ID and DIR"))
            return o.rc;
        if (!parse_id("pull", argv[optind], &id))
            return EXIT_USAGE;
        if ((rc = client_setup(c, &o)))
            return rc;
    } else if ((rc = id_operand(c, &o, argc, argv, "pull", &id))) {
        return rc;
    }
    struct pull_limit lim = {.max = max_bytes};
    snprintf(lim.what, sizeof lim.what, "--max-bytes %" PRId64, max_bytes);
    /* --best is the step the checkpoints list marks best (its bytes then bound the file). */
    if (best && (rc = pull_listed_limit(c, id, 0, &lim)))
        return rc;
    if (best)
        step = lim.step;
    char path[128], out_buf[128];
    int n = snprintf(path, sizeof path, "/v1/jobs/%" PRId64 "/checkpoint", id);
    if (step)
        n += snprintf(path + n, sizeof path - (size_t)n, "?step=%" PRId64, step);
    if (optim)
        snprintf(path + n, sizeof path - (size_t)n, "%sfile=optim", step ? "&" : "?");
    if (gpt2)
        snprintf(path + n, sizeof path - (size_t)n, "%sformat=gpt2", step ? "&" : "?");
    if (!out) {
        char st[32] = "";
        if (step)
            snprintf(st, sizeof st, "-step-%" PRId64, step);
        snprintf(out_buf, sizeof out_buf, "job-%" PRId64 "%s%s.safetensors", id, st, optim ? "-optim" : "");
        out = out_buf;
    }
    /* The listed bytes are ddpd's files; the GPT-2 form's header is its own. */
    if (step && !best && !gpt2 && (rc = pull_listed_limit(c, id, step, &lim)))
        return rc;
    char side[128];
    if (pytorch) {
        snprintf(side, sizeof side, "/v1/jobs/%" PRId64 "/pytorch", id);
        const struct folder_pull fp = {.weights = path,
                                       .side = side,
                                       .side_name = "model.py",
                                       .hint = "in Python, from that folder: import model; m = model.load()"};
        return pull_folder(c, argv[optind + 1], &fp, &lim);
    }
    if (gpt2) {
        snprintf(side, sizeof side, "/v1/jobs/%" PRId64 "/checkpoint?format=gpt2&file=config", id);
        const struct folder_pull fp = {.weights = path,
                                       .side = side,
                                       .side_name = "config.json",
                                       .side_json = true,
                                       .hint =
                                           "in Python: transformers.GPT2LMHeadModel.from_pretrained(\"%s\")"};
        return pull_folder(c, argv[optind + 1], &fp, &lim);
    }
    int64_t bytes = 0;
    if ((rc = pull_download(c, path, out, &lim, &bytes)))
        return rc;
    fprintf(stderr, "ddpd pull: wrote %s (%lld bytes)\n", out, (long long)bytes);
    return 0;
}
