/* main.c — ddpd-worker: one rank. Reads the stdin document (CONTRACT.md §5), builds
 * everything, runs, and maps failures to the documented exit codes. Thin on purpose:
 * the logic lives in train.c and the modules it calls. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../schema/event.h"
#include "../schema/jobdoc.h"
#include "../schema/spec.h"
#include "dev.h"
#include "comm.h"
#include "data.h"
#include "emit.h"
#include "fingerprint.h"
#include "mapguard.h"
#include "checkpoint.h"
#include "infer/infer.h"
#include "model.h"
#include "../schema/safetensors.h"
#include "gpt2_init.h"
#include "spec_tokenizer.h"
#include "train.h"

#define STDIN_MAX (4 * 1024 * 1024)

static volatile sig_atomic_t cancelled, in_loop, dying, preempt;
/* The rank's communicator once it is whole (bound to its device), for the handler. */
static struct comm *volatile group;

/* SIGTERM is a cancel (exit 5), and the whole group ends as one: a rank that stops for it
 * tells its peers through the communicator (comm_cancel), so a peer whose collective ends
 * because of it ends as cancelled too, not as a failed collective (issue 15, item 14).
 * In the training loop the rank stops at the next micro-batch; main then cancels the
 * communicator. The handler does not: the launcher also sends SIGTERM to stop a group
 * after a rank died, and a rank in a collective with the dead rank must report that
 * death (comm, exit 3), not a cancel it would make up by cutting the collective short.
 * Before the loop, the rank may be blocked in the rendezvous, the parameter broadcast or
 * a data read, waiting for a peer that is gone; it has nothing to save, so it tells its
 * peers (comm_cancel is async-signal-safe) and ends at once with the same code instead of
 * holding the job's slots until the launcher's SIGKILL. A rank that is dying of its own
 * cause (`dying`) ignores it: that cause is the job's, and its exit code must say so. */
static void on_sigterm(int sig)
{
    (void)sig;
    if (dying)
        return;
    cancelled = 1;
    if (!in_loop) {
        struct comm *c = group;
        if (c)
            comm_cancel(c);
        static const char msg[] = "ddpd-worker: SIGTERM before training began: exiting\n";
        ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)n;
        _exit(5);
    }
}

/* SIGUSR1 asks the rank to checkpoint and exit (a preemption; Slurm's --signal before its
 * time limit): the training loop reads the flag after each optimizer step, the ranks agree
 * on the step with the collective they run after every step, and each ends with
 * RANK_EXIT_PREEMPTED after that step's checkpoint (train.h). Before the loop the flag
 * waits: a rank has nothing to save yet, and acts on it at its first step. */
static void on_sigusr1(int sig)
{
    (void)sig;
    preempt = 1;
}

/* Test hook: with DDPD_TEST_DIE_LATE=1 in its environment, a rank failing of its own cause
 * (not a cancel) ends as late as the launcher lets it and by the launcher's hand: after its error and
 * its abort it waits (at most 10 s) for the SIGTERM with which the launcher stops the
 * group once a peer's echo (exit 3) has ended, and dies of it. That is the order of ends
 * a loaded machine can bring (issue 28, item 8), made certain: the launcher must still
 * name this rank's failure (tests/e2e/test_root_cause.py). */
static bool test_die_late(void)
{
    const char *v = getenv("DDPD_TEST_DIE_LATE");
    if (!v || strcmp(v, "1") != 0)
        return false;
    struct sigaction sa; /* before the abort: the SIGTERM it brings must find it */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(SIGTERM, &sa, NULL);
    return true;
}

static void usage(FILE *f)
{
    fputs("usage: ddpd-worker               read one job document on stdin and run one rank\n"
          "       ddpd-worker --devices     print the visible CUDA devices as one JSON array line ([] for\n"
          "                                 none): index, name, memory, uuid, emulated\n"
          "       ddpd-worker --issue-id cpu|nccl  print a rendezvous id and serve its root until\n"
          "                                 stdin closes\n"
          "       ddpd-worker --plan        read {spec, data_dir, world_size[, max_rank_memory, resume]}\n"
          "                                 lines on stdin; check the data, init.from (or the data\n"
          "                                 against a resume's checkpoint) and the memory a rank\n"
          "                                 needs; print every rank's batches per epoch\n"
          "                                 ({\"batches\": [...]} or null) or an error event\n"
          "       ddpd-worker --infer       serve one loaded model: load, generate, predict and unload\n"
          "                                 requests on stdin, one JSON line each, answered on stdout\n"
          "                                 (docs/generation.md)\n"
          "       ddpd-worker --version\n"
          "ddpd-worker is started by ddpd (`ddpd serve` or `ddpd run`), not by hand.\n",
          f);
}

/* Reads all of stdin (capped) up to its end: the launcher writes the document and closes
 * (CONTRACT.md §5). A read error ends the rank with an error naming it; a non-blocking
 * stdin is waited for in poll, not in a loop of reads. Returns a malloc'd NUL-terminated
 * buffer or NULL. */
static char *read_stdin(size_t *len, struct ddpd_error *err)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        if (n == cap) {
            if (cap >= STDIN_MAX) {
                free(buf);
                ddpd_error_set(err, DDPD_ETOOBIG, "stdin", "the job document is larger than %d bytes",
                               STDIN_MAX);
                return NULL;
            }
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        ssize_t r = read(0, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* Sleeps until there is input, its end, or an error the next read reports. */
            struct pollfd p = {0, POLLIN, 0};
            if (poll(&p, 1, -1) >= 0 || errno == EINTR)
                continue;
        }
        if (r < 0) {
            /* It used to retry this read forever, at 100% CPU (issue 15, item 10). */
            ddpd_error_set(err, DDPD_EIO, "stdin", "stdin: cannot read the job document: %s",
                           strerror(errno));
            free(buf);
            return NULL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (!buf) {
        ddpd_error_set(err, DDPD_ENOMEM, "stdin", "out of memory reading the job document");
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Whether `name` is a buffer of one of the spec's batchnorm layers ("3.running_var"). */
static bool is_buffer_name(const struct spec *spec, const char *name)
{
    static const char *const suffixes[] = {"running_mean", "running_var", "num_batches_tracked"};
    for (int i = 0; i < spec->n_layers; i++) {
        const struct spec_layer *l = &spec->layers[i];
        const size_t k = strlen(l->key);
        if (l->kind != LAYER_BATCHNORM || strncmp(name, l->key, k) != 0 || name[k] != '.')
            continue;
        for (size_t j = 0; j < sizeof suffixes / sizeof suffixes[0]; j++)
            if (strcmp(name + k + 1, suffixes[j]) == 0)
                return true;
    }
    return false;
}

/* init.from against the model, from the file's header alone: every parameter there with
 * its shape, a tied weight under both its names (whose values the ranks compare as they
 * load), nothing else (what checkpoint_load_weights would refuse in every rank). */
static ddpd_err plan_init_from(const struct spec *spec, const char *data_dir, const char *init_path,
                               struct ddpd_error *err)
{
    char path[4096], shown[SPEC_PATH_MAX];
    struct param params[SPEC_MAX_PARAMS + SPEC_MAX_LAYERS];
    struct model_alias aliases[SPEC_MAX_LAYERS];
    struct safetensors_file *f = NULL;
    const char *key = spec->init_from_job > 0 ? "init.from_job" : "init.from";
    ddpd_err rc = DDPD_OK;
    if (spec->init_from_job > 0) {
        /* The server resolved it in its jobs folder: named as the job, not the path. */
        if (!init_path[0])
            return ddpd_error_set(err, DDPD_ESPEC, key,
                                  "init.from_job: only ddpd serve can find another job's weights (ddpd run "
                                  "takes init.from with a file)");
        snprintf(path, sizeof path, "%s", init_path);
        snprintf(shown, sizeof shown, "job %" PRId64 "'s weights", spec->init_from_job);
    } else {
        rc = data_path_resolve(data_dir, "init.from", spec->init_from, path, sizeof path, err);
        snprintf(shown, sizeof shown, "%s", spec->init_from);
    }
    if (rc)
        return rc;
    int np = model_spec_params(spec, params);
    if (np < 0)
        return ddpd_error_set(err, DDPD_ENOMEM, key, "out of memory checking init.from");
    /* A tied weight's second name is checked as one more parameter of the tied layer. */
    const int na = model_spec_aliases(spec, aliases);
    for (int j = 0; j < na; j++) {
        params[np + j] = params[aliases[j].param];
        _Static_assert(sizeof params[0].name == sizeof aliases[0].name, "alias names are parameter names");
        memcpy(params[np + j].name, aliases[j].name, sizeof params[np + j].name);
        params[np + j].layer = aliases[j].layer;
    }
    np += na;
    if (!(f = safetensors_read_header(path, err))) {
        /* Name the field and the file as the spec gives it, not the server's path. */
        char msg[sizeof err->message];
        const char *rest = strstr(err->message, ": ");
        snprintf(msg, sizeof msg, "%s", rest ? rest + 2 : err->message);
        return ddpd_error_set(err, DDPD_ESPEC, key, "%s: %s: %s", key, shown, msg);
    }
    rc = DDPD_OK;
    for (int i = 0; i < np && !rc; i++) {
        const struct param *p = &params[i];
        const struct safetensors_tensor *t = safetensors_get(f, p->name);
        char want[64], got[96];
        size_t w = (size_t)snprintf(want, sizeof want, "[");
        for (int d = 0; d < p->ndim && w < sizeof want; d++)
            w += (size_t)snprintf(want + w, sizeof want - w, d ? ", %" PRId64 : "%" PRId64, p->shape[d]);
        if (w < sizeof want)
            snprintf(want + w, sizeof want - w, "]");
        if (!t) {
            rc = ddpd_error_set(err, DDPD_ESPEC, key,
                                "%s: %s has no tensor \"%s\" (the model's %s %s of layer %s)", key, shown,
                                p->name, p->name + strlen(spec->layers[p->layer].key) + 1, want,
                                spec->layers[p->layer].key);
            break;
        }
        bool same = t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = t->shape[d] == p->shape[d];
        if (same)
            continue;
        size_t o = (size_t)snprintf(got, sizeof got, "[");
        for (int d = 0; d < t->ndim && o < sizeof got; d++)
            o += (size_t)snprintf(got + o, sizeof got - o, d ? ", %" PRId64 : "%" PRId64, t->shape[d]);
        if (o < sizeof got)
            snprintf(got + o, sizeof got - o, "]");
        rc = ddpd_error_set(err, DDPD_ESPEC, key, "%s: %s: tensor \"%s\" has shape %s but model[%d]'s is %s",
                            key, shown, p->name, got, p->layer, want);
    }
    /* BatchNorm's buffers, which the ranks load too (load_state_dict(strict=True)). */
    static const char *const buffers[] = {"running_mean", "running_var", "num_batches_tracked"};
    for (int i = 0; i < spec->n_layers && !rc; i++)
        for (size_t j = 0; spec->layers[i].kind == LAYER_BATCHNORM && j < 3 && !rc; j++) {
            char name[128];
            snprintf(name, sizeof name, "%s.%s", spec->layers[i].key, buffers[j]);
            if (!safetensors_get(f, name))
                rc = ddpd_error_set(err, DDPD_ESPEC, key,
                                    "%s: %s has no tensor \"%s\" (the buffer %s of batchnorm layer %s)", key,
                                    shown, name, buffers[j], spec->layers[i].key);
        }
    for (int i = 0; i < safetensors_count(f) && !rc; i++) {
        const char *name = safetensors_at(f, i)->name;
        bool known = false;
        for (int j = 0; j < np && !known; j++)
            known = strcmp(params[j].name, name) == 0;
        known = known || is_buffer_name(spec, name);
        if (!known)
            rc = ddpd_error_set(err, DDPD_ESPEC, key,
                                "%s: %s: tensor \"%.100s\" is not a parameter of this model", key, shown,
                                name);
    }
    safetensors_free(f);
    return rc;
}

/* A resume's check before any rank starts: the files every rank reads (of the data, and
 * of eval.data: rows and eval_rows as dataset_check counted them) against the data
 * fingerprints of the checkpoint `resume`, so that a changed file is refused (409 from
 * the API) instead of failing the ranks of an accepted job. {rank} files are checked by
 * their ranks (train.c). A checkpoint that cannot be read is the ranks' to report, as
 * they always did. */
static ddpd_err plan_resume_data(const struct spec *spec, const char *data_dir, const char *resume,
                                 int64_t rows, int64_t eval_rows, struct ddpd_error *err)
{
    struct fingerprint fp[FINGERPRINT_MAX];
    int n = 0, k = 0;
    char *record = NULL;
    struct ddpd_error ignored;
    ddpd_err rc = dataset_fingerprint_files(spec, data_dir, rows, fp, &n, err);
    if (rc == DDPD_OK && spec->eval.every_steps > 0 && eval_rows > 0) {
        struct spec *es = malloc(sizeof *es);
        if (!es)
            return ddpd_error_set(err, DDPD_ENOMEM, "eval", "out of memory checking eval.data");
        *es = *spec;
        es->data = spec->eval.data;
        rc = dataset_fingerprint_files(es, data_dir, eval_rows, fp + n, &k, err);
        free(es);
        for (int i = n; i < n + k; i++) {
            char field[sizeof fp[i].field];
            memcpy(field, fp[i].field, sizeof field);
            snprintf(fp[i].field, sizeof fp[i].field, "eval.%.18s", field);
        }
        n += k;
    }
    int64_t step = 0;
    if (rc || n == 0 || checkpoint_data_record(resume, &record, &step, &ignored) != DDPD_OK)
        return rc;
    rc = fingerprint_check(record, fp, n, step, false, NULL, err);
    free(record);
    return rc;
}

/* One plan request line (a job document, read by jobdoc_plan_from_json) -> every rank's
 * batches per epoch (unknown when only the ranks can tell), or the error a rank would die
 * of. Checks what a rank would otherwise find after the job was accepted: the data's
 * values, init.from's shapes, the tokenizer's files, the memory a rank needs against max_rank_memory, and
 * batches that batchnorm refuses. */
static void plan_one(const char *line, size_t len)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    json_error_t jerr;
    json_t *doc = json_loadb(line, len, 0, &jerr);
    struct jobdoc req;
    struct jobdoc_plan_answer ans;
    memset(&req, 0, sizeof req);
    const struct spec *spec = &req.spec;
    const char *data_dir = req.data_dir;
    int64_t rows = 0, file_bytes = 0;
    ddpd_err rc = DDPD_ESPEC;
    if (!json_is_object(doc)) {
        ddpd_error_set(&err, DDPD_ESPEC, "stdin", "the plan document is not a JSON object: %s", jerr.text);
    } else if (jobdoc_plan_from_json(doc, &req, &err) == DDPD_OK) {
        if (!req.data_dir[0])
            snprintf(req.data_dir, sizeof req.data_dir, ".");
        rc = dataset_check(spec, data_dir, req.world_size, &rows, &file_bytes, &err);
    }
    json_decref(doc);
    bool known = rc == DDPD_OK;
    if (rc == DDPD_ENOTFOUND) /* {rank} files: the model and one-row batches at least */
        rc = DDPD_OK;
    /* The eval data's rows count in the memory too. */
    struct spec_memory_in mi = {.rows = rows, .rank_file = !known, .file_bytes = file_bytes};
    if (rc == DDPD_OK)
        rc = train_check_eval_data(spec, data_dir, req.world_size, &mi, &err);
    if (rc == DDPD_OK) {
        struct spec_memory mem;
        spec_memory_estimate(spec, &mi, &mem);
        rc = spec_memory_check(spec, &mem, req.max_rank_memory, "the server's --max-rank-memory", DDPD_ESPEC,
                               &err);
    }
    if (rc == DDPD_OK && known)
        rc = train_check_batches(spec, rows, req.world_size, &err);
    /* A resume starts from its checkpoint, not from init.from: it checks that the data is
     * still the checkpoint's instead. */
    if (req.resume[0]) {
        if (rc == DDPD_OK && !req.resume_force)
            rc = plan_resume_data(spec, data_dir, req.resume, rows, mi.eval_rows, &err);
    } else if (rc == DDPD_OK && spec->init_from[0] && spec->init_format == INIT_FORMAT_GPT2) {
        rc = gpt2_init_plan(spec, data_dir, &err);
    } else if (rc == DDPD_OK && (spec->init_from[0] || spec->init_from_job > 0)) {
        rc = plan_init_from(spec, data_dir, req.init_path, &err);
    }
    /* The tokenizer's files parse and its vocabulary fits the embedding (generate's text). */
    if (rc == DDPD_OK && spec->tokenizer_vocab[0]) {
        struct bpe *tok = spec_tokenizer_open(spec, data_dir, &err);
        rc = tok ? DDPD_OK : err.code;
        bpe_free(tok);
    }
    memset(&ans, 0, sizeof ans);
    ans.code = rc;
    ans.known = known;
    ans.world_size = req.world_size;
    for (int r = 0; rc == DDPD_OK && known && r < req.world_size; r++)
        ans.batches[r] =
            spec_batches(spec_shard_rows(rows, r, req.world_size), spec->batch_size, spec->data.drop_last);
    if (rc != DDPD_OK) {
        snprintf(ans.path, sizeof ans.path, "%s", err.path);
        snprintf(ans.message, sizeof ans.message, "%s", err.message);
    }
    char *text = jobdoc_plan_answer_encode(&ans, base_wall_s());
    if (text)
        puts(text);
    else if (rc != DDPD_OK)
        emit_error(&err);
    else
        puts("{\"batches\":null}");
    free(text);
    fflush(stdout);
}

/* --devices: the visible CUDA devices as one JSON array line, `[]` when there are none
 * (the server reads the array's entries, serve.c):
 * [{"index": 0, "name": "...", "memory": BYTES, "uuid": "GPU-...", "emulated": false,
 *   "compute_capability": "8.6", "has_code": true, "code": "sm_80",
 *   "module_code": "sm_75 sm_80 ... compute_120"}, ...]: `code` is what of the module's
 * `module_code` the device runs (cuda_code_pick; null with has_code false: a job there
 * would fail at its first kernel).
 * The server runs this at every start: without an NVIDIA driver (and without DDPD_CUDA_EMU),
 * dev_cuda_device_count answers 0 before loading the CUDA module, so it costs nothing on a
 * CPU host; without a loadable module it prints `[]` too. The line is flushed before
 * returning: stdout is a pipe when the server reads it, and what stdio holds is written
 * only after the module's exit handlers ran, which is too late when one of them crashes
 * or ends the process (then nothing at all came out). */
static int devices_main(void)
{
    int n = dev_cuda_device_count();
    struct ddpd_error err;
    /* A driver but no loadable module: say why on stderr (the server's log), not stdout. */
    if (n == 0 && dev_cuda_driver_present() && !dev_cuda_load(&err))
        fprintf(stderr, "ddpd-worker --devices: %s\n", err.message);
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        struct dev_cuda_info info;
        memset(&info, 0, sizeof info);
        if (!dev_cuda_device_info(i, &info))
            continue;
        info.name[sizeof info.name - 1] = info.uuid[sizeof info.uuid - 1] = '\0';
        json_t *d = json_pack("{s:i, s:s, s:I, s:s, s:b}", "index", i, "name", info.name, "memory",
                              (json_int_t)info.memory, "uuid", info.uuid, "emulated", info.emulated);
        if (!d) /* a name or uuid that is not UTF-8: the device is listed all the same */
            d = json_pack("{s:i, s:s, s:I, s:s, s:b}", "index", i, "name", "?", "memory",
                          (json_int_t)info.memory, "uuid", "", "emulated", info.emulated);
        char cc[24];
        snprintf(cc, sizeof cc, "%d.%d", info.cc_major, info.cc_minor);
        json_object_set_new(d, "compute_capability", json_string(cc));
        json_object_set_new(d, "has_code", json_boolean(info.has_code));
        json_object_set_new(d, "code", info.has_code ? json_string(info.code) : json_null());
        json_object_set_new(d, "module_code", json_string(dev_cuda_module_code()));
        json_array_append_new(arr, d);
    }
    char *line = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    int rc = line && puts(line) >= 0 && fflush(stdout) == 0 ? 0 : 1;
    if (rc)
        fprintf(stderr, "ddpd-worker --devices: cannot write the list: %s\n",
                line ? strerror(errno) : "out of memory");
    free(line);
    return rc;
}

/* The rank's GPU: device rank % visible devices, so that ranks spread over the GPUs they
 * see (the server gives each rank one through CUDA_VISIBLE_DEVICES: device 0). */
static struct dev open_device(const struct spec *spec, int rank, struct ddpd_error *err)
{
    int n = dev_cuda_device_count();
    if (n == 0) {
        /* Why: the module cannot be loaded (its path and dlerror(), or a CPU-only build),
         * or it can and there is no driver or no device. */
        if (dev_cuda_load(err))
            ddpd_error_set(err, DDPD_EDEVICE, "device",
                           "device: cuda was asked for but no CUDA device is visible to rank %d", rank);
        return (struct dev){NULL, NULL};
    }
    struct dev d = dev_cuda_new(rank % n, spec->precision == PRECISION_TF32, err);
    if (d.ops)
        emit_log("on GPU %d of %d visible (%s), %s matrix products", rank % n, n, dev_cuda_name(d),
                 spec->precision == PRECISION_TF32 ? "TF32" : "float32");
    return d;
}

/* Under `srun --input=all` every task reads the same document, so it carries no rank: the
 * rank is SLURM_PROCID, and SLURM_NTASKS must be the document's world_size (CONTRACT.md
 * §5). Called for a document without a rank. */
static int slurm_rank(struct jobdoc *d, struct ddpd_error *err)
{
    const char *procid = getenv("SLURM_PROCID"), *ntasks = getenv("SLURM_NTASKS");
    if (!procid) {
        ddpd_error_set(err, DDPD_ESPEC, "rank",
                       "rank: the job document has no rank and SLURM_PROCID is not set");
        return -1;
    }
    char *end;
    long long world = d->world_size;
    long long r = strtoll(procid, &end, 10), n = ntasks ? strtoll(ntasks, NULL, 10) : world;
    if (end == procid || *end || r < 0 || r >= world) {
        ddpd_error_set(err, DDPD_ESPEC, "rank", "rank: SLURM_PROCID '%s' is not a rank in [0, %lld)", procid,
                       world);
        return -1;
    }
    if (n != world) {
        ddpd_error_set(err, DDPD_ESPEC, "world_size",
                       "world_size: the job document says %lld but Slurm started %s tasks (SLURM_NTASKS) for "
                       "rank %lld",
                       world, ntasks, r);
        return -1;
    }
    d->rank = (int)r;
    return 0;
}

/* --plan: what the launcher checks before any rank starts (uneven batch counts with
 * join false, data sets too small, unreadable files). Reads one compact JSON document
 * per line and answers each with one line, until stdin ends, so that the server can
 * keep a planner running instead of starting a process per submission. */
static int plan_main(void)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        if (n > STDIN_MAX) {
            struct ddpd_error err;
            ddpd_error_set(&err, DDPD_ETOOBIG, "stdin", "the plan document is larger than %d bytes",
                           STDIN_MAX);
            emit_error(&err);
            continue;
        }
        if (n == 1 && line[0] == '\n')
            continue;
        plan_one(line, (size_t)n);
    }
    free(line);
    return 0;
}

/* The modes other than a rank (argv[1]): --devices, --issue-id, --plan, --infer, --version, --help. */
static int mode_main(int argc, char **argv)
{
    if (!strcmp(argv[1], "--devices"))
        return devices_main();
    if (!strcmp(argv[1], "--issue-id")) {
        bool nccl = argc >= 3 && !strcmp(argv[2], "nccl");
        if (argc < 3 || (!nccl && strcmp(argv[2], "cpu") != 0)) {
            fprintf(stderr, "ddpd-worker: --issue-id takes a backend: cpu or nccl\n");
            return 2;
        }
        signal(SIGPIPE, SIG_IGN);
        signal(SIGUSR1, SIG_IGN); /* a preemption is the ranks' business, not the rendezvous' */
        return nccl ? comm_nccl_issue_id(stdout, 0) : comm_cpu_issue_id(stdout, 0);
    }
    if (!strcmp(argv[1], "--plan"))
        return plan_main();
    if (!strcmp(argv[1], "--infer"))
        return infer_main();
    if (!strcmp(argv[1], "--version")) {
        puts("ddpd-worker 0.1.0");
        return 0;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "ddpd-worker: unknown argument '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}

/* A rank's signals: SIGTERM is a cancel (on_sigterm), SIGUSR1 a preemption (on_sigusr1),
 * SIGPIPE an error return, SIGBUS in a data file's mapping a data error naming the file
 * (mapguard.h). */
static void signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigterm;
    sigaction(SIGTERM, &sa, NULL);
    /* SA_RESTART: the rank goes on working after it; the reads and waits that the
     * restart does not cover retry EINTR. */
    sa.sa_handler = on_sigusr1;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    mapguard_install();
    /* The launcher starts a rank with SIGTERM and SIGUSR1 blocked (proc.h, hold_term): a
     * cancel or a preemption sent between its fork and these handlers has waited,
     * pending, and arrives now, as a cancel (exit 5) or a preemption rather than a death
     * by the signal. */
    sigset_t held;
    sigemptyset(&held);
    sigaddset(&held, SIGTERM);
    sigaddset(&held, SIGUSR1);
    sigprocmask(SIG_UNBLOCK, &held, NULL);
}

/* No file this rank writes may outgrow the quota, its log (our stderr) included: a rank
 * that logs without end is stopped by the server's measurement within a second, and
 * meanwhile its writes past the quota fail (EFBIG) instead of filling the disk. */
static void disk_quota_limit(int64_t quota)
{
    struct rlimit fsz;
    if (quota > 0 && getrlimit(RLIMIT_FSIZE, &fsz) == 0 &&
        (fsz.rlim_cur == RLIM_INFINITY || fsz.rlim_cur > (rlim_t)quota)) {
        signal(SIGXFSZ, SIG_IGN);
        fsz.rlim_cur = (rlim_t)quota;
        setrlimit(RLIMIT_FSIZE, &fsz);
    }
}

int main(int argc, char **argv)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);

    if (argc > 1)
        return mode_main(argc, argv);
    signals_install();

    size_t len = 0;
    char *text = read_stdin(&len, &err);
    if (!text)
        emit_die(&err);
    json_error_t jerr;
    json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!json_is_object(doc)) {
        ddpd_error_set(&err, DDPD_EJSON, "stdin",
                       "the job document on stdin is not a JSON object (line %d, column %d: %s)", jerr.line,
                       jerr.column, doc ? "not an object" : jerr.text);
        emit_die(&err);
    }

    /* The document (jobdoc.h); under Slurm the rank comes from the environment, and its
     * errors come first, as the rank is the document's second key. */
    struct jobdoc jd;
    ddpd_err drc = jobdoc_from_json(doc, &jd, &err);
    const bool has_rank = json_object_get(doc, "rank") != NULL;
    json_decref(doc);
    if (jd.world_size > 0 && !has_rank && slurm_rank(&jd, &err) != 0)
        drc = DDPD_ESPEC;
    if (jd.rank >= 0)
        emit_set_rank(jd.rank);
    if (drc != DDPD_OK)
        emit_die(&err);
    const struct spec *spec = &jd.spec;
    const int rank = jd.rank, world = jd.world_size;
    disk_quota_limit(jd.disk_quota);

    /* The compute backend, before the group: NCCL joins on the calling thread's current
     * device. On the CPU one BLAS thread per rank: the ranks of a host share its cores. */
    const bool cuda = spec->device == DEVICE_CUDA;
    struct dev dev = cuda ? open_device(spec, rank, &err) : dev_cpu_new(1);
    if (!dev.ops)
        emit_die(&err);

    /* The group: {"backend": "cpu" or "nccl", "id": "<hex>"} for more than one rank. */
    struct comm *comm = NULL;
    if (world > 1) {
        const struct comm_ops *ops = !strcmp(jd.comm_backend, "nccl") ? &comm_nccl_ops : &comm_cpu_ops;
        struct comm_id id;
        if (comm_id_from_hex(jd.comm_id, &id) != 0) {
            ddpd_error_set(&err, DDPD_ESPEC, "comm",
                           "comm: %d ranks need {\"backend\": \"cpu\" or \"nccl\", \"id\": \"<hex>\"} in the "
                           "job document",
                           world);
            emit_die(&err);
        }
        comm = comm_new(ops, &id, rank, world, spec->ddp.timeout_s, &err);
        if (!comm || (cuda && comm_bind_dev(comm, dev, &err) != DDPD_OK))
            emit_die(&err);
        group = comm;
    }

    struct train_config cfg = {
        .max_rank_memory = jd.max_rank_memory, /* the server's --max-rank-memory; 0: none */
        .spec = spec,
        .rank = rank,
        .world_size = world,
        .data_dir = jd.data_dir[0] ? jd.data_dir : ".",
        .out_dir = jd.out_dir[0] ? jd.out_dir : "var/run",
        .resume = jd.resume[0] ? jd.resume : NULL,
        .resume_force = jd.resume_force,
        .stop_at = jd.stop_at,
        .init_path = jd.init_path[0] ? jd.init_path : NULL,
        .disk_quota = jd.disk_quota,
        .cancel = &cancelled,
        .preempt = &preempt,
        .in_loop = &in_loop,
        .comm = comm,
        .dev = dev,
    };
    int64_t preempted_at = 0;
    cfg.preempted_at = &preempted_at;
    ddpd_err rc = train_run(&cfg, &err);
    if (rc == DDPD_ECOMM && cancelled && !comm_carries_cancel(comm)) {
        /* A rank told to cancel whose collective failed first, because a peer stopped for
         * the same cancel, reports cancelled. Only where the backend cannot say why a
         * peer stopped (NCCL): the cpu backend returns DDPD_ECANCELED for a peer's cancel,
         * so its DDPD_ECOMM is a peer's real failure, which a SIGTERM from the launcher
         * stopping the group must not hide. */
        char was[sizeof err.message];
        snprintf(was, sizeof was, "%s", err.message);
        ddpd_error_set(&err, DDPD_ECANCELED, "", "cancelled by SIGTERM (%s)", was);
        rc = DDPD_ECANCELED;
    }
    if (rc != DDPD_OK) {
        /* The error goes out first, marked `secondary` when the communicator's failure
         * began at another rank, so the launcher has it (and names the rank where the
         * failure began, server/cause.h) before any peer can learn of this one: peers
         * blocked on us learn of it from the closed sockets at once, and of a cancel from
         * its notice. They then fail (exit 3) and the launcher stops the group with
         * SIGTERM, which can arrive before this rank has exited: `dying` keeps the handler
         * from turning this rank's cause into a cancel (exit 5). A flag, not a blocked
         * signal: SIGTERM may land on any thread (NCCL's watchdog, CUDA's). */
        dying = 1;
        const bool secondary = (rc == DDPD_ECOMM || rc == DDPD_ECANCELED) && comm_failed_by_peer(comm);
        emit_failure(&err, secondary);
        const bool late = !secondary && rc != DDPD_ECANCELED && test_die_late();
        if (comm && !(rc == DDPD_ECANCELED && comm_cancel(comm)))
            comm_abort(comm);
        for (int i = 0; late && i < 1000; i++) /* 10 s at most */
            usleep(10000);
        /* _exit, as emit_die: the event is out (flushed), and exit()'s CUDA and NCCL
         * teardown could wait for a collective the abort did not end. */
        _exit(ddpd_err_exit(err.code));
    }
    group = NULL;
    comm_free(comm);
    if (cuda)
        dev_cuda_free(dev);
    else
        dev_cpu_free(dev);
    emit_flush();
    /* Stopped at a preemption's checkpoint: not done, and not a failure (CONTRACT.md §6). */
    return preempted_at > 0 ? RANK_EXIT_PREEMPTED : 0;
}
