/* client_tokenize.c — `ddpd tokenize`: a text file to a tokens file (nanoGPT's train.bin,
 * what `data.type: "tokens"` reads) with GPT-2's byte-level BPE (tokenizer/bpe.h), as
 * nanoGPT's prepare.py does with tiktoken. Streams: the text is read and encoded a chunk
 * at a time, each cut where the two sides encode as the whole would (bpe_safe_cut), and
 * the ids go straight to the file; the eval file's tail is moved out of it at the end.
 * Talks to no server. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/clock.h"
#include "../base/file.h"
#include "../tokenizer/bpe.h"
#include "client_impl.h"
#include "progress.h"

#define TOK_CHUNK        (1u << 20)  /* bytes read (and encoded) at a time */
#define TOK_PROGRESS_MIN (16u << 20) /* inputs from this size show a progress line on a terminal */
#define TOK_COPY         (1u << 20)  /* bytes of the eval tail moved at a time */

enum { OPT_VOCAB = OPT_LOCAL, OPT_MERGES, OPT_EVAL_FRACTION, OPT_EVAL_OUT };

struct tok_out {
    const char *path;
    char tmp[PATH_MAX];
    int fd;
    size_t width; /* bytes an id takes: 2 (uint16) or 4 (int32) */
    int64_t ids;
    unsigned char *buf; /* the ids as written, little-endian */
    size_t cap;
};

/* Appends ids[0..n) to the file in its width. false with errno on a write error. */
static bool write_ids(struct tok_out *o, const int32_t *ids, size_t n)
{
    if (n * o->width > o->cap) {
        unsigned char *b = realloc(o->buf, n * o->width);
        if (!b)
            return false;
        o->buf = b;
        o->cap = n * o->width;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        unsigned char *p = o->buf + i * o->width;
        p[0] = (unsigned char)v;
        p[1] = (unsigned char)(v >> 8);
        if (o->width == 4) {
            p[2] = (unsigned char)(v >> 16);
            p[3] = (unsigned char)(v >> 24);
        }
    }
    if (base_write_all(o->fd, o->buf, n * o->width))
        return false;
    o->ids += (int64_t)n;
    return true;
}

/* A temporary file beside `path`, renamed over it once whole. */
static bool open_out(struct tok_out *o, const char *path, size_t width)
{
    o->path = path;
    o->width = width;
    o->fd = -1;
    int n = snprintf(o->tmp, sizeof o->tmp, "%s.tmp-%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof o->tmp) {
        errno = ENAMETOOLONG;
        return false;
    }
    o->fd = open(o->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); /* read back: the eval tail */
    return o->fd >= 0;
}

static void drop_out(struct tok_out *o)
{
    if (o->fd >= 0) {
        close(o->fd);
        unlink(o->tmp);
    }
    o->fd = -1;
    free(o->buf);
    o->buf = NULL;
}

static bool finish_out(struct tok_out *o)
{
    if (fsync(o->fd) != 0 || close(o->fd) != 0) {
        o->fd = -1;
        unlink(o->tmp);
        return false;
    }
    o->fd = -1;
    if (rename(o->tmp, o->path) != 0) {
        unlink(o->tmp);
        return false;
    }
    return true;
}

/* Moves the last `n` ids of train into ev (written whole, then train cut short). */
static bool split_tail(struct tok_out *train, struct tok_out *ev, int64_t n)
{
    unsigned char *b = malloc(TOK_COPY);
    if (!b)
        return false;
    const int64_t from = (train->ids - n) * (int64_t)train->width, end = train->ids * (int64_t)train->width;
    bool ok = true;
    for (int64_t at = from; ok && at < end;) {
        int64_t k = end - at < TOK_COPY ? end - at : TOK_COPY;
        ok = base_read_at(train->fd, b, k, at) == k && base_write_all(ev->fd, b, (size_t)k) == 0;
        at += k;
    }
    free(b);
    if (ok && ftruncate(train->fd, from) != 0)
        ok = false;
    if (ok) {
        ev->ids = n;
        train->ids -= n;
    }
    return ok;
}

/* `DIR/eval.bin` for an output `DIR/train.bin` (the eval file's default name). */
static void eval_beside(char *out, size_t cap, const char *train)
{
    const char *slash = strrchr(train, '/');
    snprintf(out, cap, "%.*seval.bin", slash ? (int)(slash - train + 1) : 0, train);
}

static void draw_progress(int *width, int64_t done, int64_t total, int64_t ids, double t0, bool final)
{
    char line[160];
    double s = base_mono_s() - t0, mbs = s > 0 ? (double)done / 1e6 / s : 0;
    snprintf(line, sizeof line, "tokenize  %.1f/%.1f MB (%.0f%%)  %" PRId64 " tokens  %.1f MB/s",
             (double)done / 1e6, (double)total / 1e6, total ? 100.0 * (double)done / (double)total : 100.0,
             ids, mbs);
    progress_line(stderr, line, width, final);
}

int cmd_tokenize(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {{"vocab", required_argument, NULL, OPT_VOCAB},
                                          {"merges", required_argument, NULL, OPT_MERGES},
                                          {"output", required_argument, NULL, 'o'},
                                          {"eval-fraction", required_argument, NULL, OPT_EVAL_FRACTION},
                                          {"eval-out", required_argument, NULL, OPT_EVAL_OUT},
                                          COMMON_OPTIONS};
    struct opts o = {.cmd = find_command(c->cmd)};
    const char *vocab = NULL, *merges = NULL, *out = NULL, *eval_out = NULL;
    double fraction = 0;
    int opt;
    while ((opt = next_option(&o, argc, argv, "ho:", longs)) != -1) {
        switch (opt) {
        case -2: return o.rc;
        case OPT_VOCAB: vocab = optarg; break;
        case OPT_MERGES: merges = optarg; break;
        case 'o': out = optarg; break;
        case OPT_EVAL_OUT: eval_out = optarg; break;
        case OPT_EVAL_FRACTION: {
            char *end = NULL;
            errno = 0;
            fraction = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(fraction > 0 && fraction < 1)) {
                fprintf(stderr,
                        "ddpd tokenize: --eval-fraction: expected a number between 0 and 1, got '%s'\n",
                        optarg);
                return EXIT_USAGE;
            }
            break;
        }
        }
    }
    if (!operands(&o, argc, 1, "the input text (IN.txt, or - for stdin)"))
        return o.rc;
    if (!vocab || !merges || !out) {
        fprintf(stderr, "ddpd tokenize: missing %s (ddpd tokenize --help)\n",
                !vocab    ? "--vocab V (vocab.json)"
                : !merges ? "--merges M (merges.txt)"
                          : "-o OUT (the tokens file)");
        return EXIT_USAGE;
    }
    if (eval_out && fraction <= 0) {
        fprintf(stderr, "ddpd tokenize: --eval-out goes with --eval-fraction\n");
        return EXIT_USAGE;
    }
    char eval_path[PATH_MAX];
    if (fraction > 0) {
        if (eval_out)
            snprintf(eval_path, sizeof eval_path, "%s", eval_out);
        else
            eval_beside(eval_path, sizeof eval_path, out);
        if (!strcmp(eval_path, out)) {
            fprintf(stderr,
                    "ddpd tokenize: the eval file would be the output %s: name another with --eval-out\n",
                    out);
            return EXIT_USAGE;
        }
    }
    const char *in_path = argv[optind];
    struct ddpd_error err;
    ddpd_error_clear(&err);
    struct bpe *b = bpe_open(vocab, merges, &err);
    if (!b) {
        fprintf(stderr, "ddpd tokenize: %s\n", err.message);
        return EXIT_USAGE;
    }
    const size_t width = bpe_vocab_size(b) <= 65536 ? 2 : 4;
    const char *dtype = width == 2 ? "uint16" : "int32";
    int rc = EXIT_FAIL;
    int in = -1;
    char *buf = NULL;
    struct bpe_ids ids = {0};
    struct tok_out train = {.fd = -1}, ev = {.fd = -1};
    const bool from_stdin = !strcmp(in_path, "-");
    in = from_stdin ? STDIN_FILENO : open(in_path, O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        fprintf(stderr, "ddpd tokenize: %s: %s\n", in_path, strerror(errno));
        goto out;
    }
    struct stat st;
    const int64_t total = fstat(in, &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : 0;
    const bool show = total >= TOK_PROGRESS_MIN && isatty(STDERR_FILENO);
    if (!open_out(&train, out, width) || (fraction > 0 && !open_out(&ev, eval_path, width))) {
        fprintf(stderr, "ddpd tokenize: %s: %s\n", train.fd < 0 ? out : eval_path, strerror(errno));
        goto out;
    }
    const double t0 = base_mono_s();
    double drawn = 0;
    int bar = 0;
    size_t len = 0, cap = 2 * TOK_CHUNK;
    int64_t done = 0;
    bool eof = false;
    if (!(buf = malloc(cap))) {
        fprintf(stderr, "ddpd tokenize: out of memory\n");
        goto out;
    }
    while (!eof || len) {
        /* Read a chunk; with no place to cut in what is held, hold more (a file without
         * spaces or newlines is held whole). */
        if (!eof) {
            if (cap - len < TOK_CHUNK) {
                char *nb = realloc(buf, cap * 2);
                if (!nb) {
                    fprintf(stderr,
                            "ddpd tokenize: %s: out of memory holding %zu bytes without a place to cut\n",
                            in_path, len);
                    goto out;
                }
                buf = nb;
                cap *= 2;
            }
            ssize_t r = read(in, buf + len, TOK_CHUNK);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0) {
                fprintf(stderr, "ddpd tokenize: %s: %s\n", in_path, strerror(errno));
                goto out;
            }
            eof = r == 0;
            len += (size_t)r;
            if (!eof && len < TOK_CHUNK)
                continue;
        }
        size_t cut = eof ? len : bpe_safe_cut(buf, len);
        if (!cut)
            continue;
        ids.n = 0;
        if (bpe_encode(b, buf, cut, &ids, &err)) {
            fprintf(stderr, "ddpd tokenize: %s: %s\n", in_path, err.message);
            goto out;
        }
        if (!write_ids(&train, ids.v, ids.n)) {
            fprintf(stderr, "ddpd tokenize: %s: %s\n", out, strerror(errno));
            goto out;
        }
        memmove(buf, buf + cut, len - cut);
        len -= cut;
        done += (int64_t)cut;
        if (show && base_mono_s() - drawn >= 0.1) {
            draw_progress(&bar, done, total, train.ids, t0, false);
            drawn = base_mono_s();
        }
    }
    if (show)
        draw_progress(&bar, done, total, train.ids, t0, true);
    const int64_t all = train.ids;
    const int64_t n_eval = fraction > 0 ? (int64_t)((double)all * fraction) : 0;
    if (fraction > 0 && !split_tail(&train, &ev, n_eval)) {
        fprintf(stderr, "ddpd tokenize: moving the eval tokens to %s: %s\n", eval_path, strerror(errno));
        goto out;
    }
    if (!finish_out(&train) || (fraction > 0 && !finish_out(&ev))) {
        fprintf(stderr, "ddpd tokenize: %s: %s\n", train.fd < 0 && ev.fd >= 0 ? eval_path : out,
                strerror(errno));
        goto out;
    }
    const double secs = base_mono_s() - t0;
    printf("%s: %" PRId64 " bytes -> %" PRId64 " tokens (%s, data.dtype \"%s\"; vocabulary %" PRId64
           "), %.2f s, %.1f MB/s\n",
           in_path, done, all, dtype, dtype, bpe_vocab_size(b), secs,
           secs > 0 ? (double)done / 1e6 / secs : 0.0);
    printf("%s: %" PRId64 " tokens\n", out, train.ids);
    if (fraction > 0)
        printf("%s: %" PRId64 " tokens (the last %g)\n", eval_path, ev.ids, fraction);
    rc = 0;
out:
    drop_out(&train);
    drop_out(&ev);
    if (in >= 0 && !from_stdin)
        close(in);
    free(ids.v);
    free(buf);
    bpe_free(b);
    return rc;
}
