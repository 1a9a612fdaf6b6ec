/* fingerprint.c — data files' fingerprints (size, mtime, samples, a sampled SHA-256 by
 * OpenSSL's libcrypto) and the resume check against a checkpoint's record of them. Reads
 * a bounded number of bytes of any file; knows no data format and no tensor. */
#include "fingerprint.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/file.h"

#define FP_WHOLE  (1LL << 20) /* files up to this many bytes are hashed whole */
#define FP_EDGE   (64 << 10)  /* else the first and the last 64 KiB ... */
#define FP_BLOCK  4096        /* ... and this many 4 KiB blocks between them */
#define FP_BLOCKS 64

/* Feeds bytes [off, off + n) of fd to the hash through buf (FP_EDGE bytes). */
static bool hash_range(EVP_MD_CTX *h, int fd, unsigned char *buf, int64_t off, int64_t n)
{
    while (n > 0) {
        int64_t k = n < FP_EDGE ? n : FP_EDGE;
        if (base_read_at(fd, buf, k, off) != k || EVP_DigestUpdate(h, buf, (size_t)k) != 1)
            return false;
        off += k;
        n -= k;
    }
    return true;
}

ddpd_err fingerprint_fd(int fd, const char *name, struct fingerprint *fp, struct ddpd_error *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return ddpd_error_set(err, DDPD_EDATA, name, "%s: cannot read its size: %s", name, strerror(errno));
    fp->bytes = st.st_size;
    fp->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    unsigned char *buf = malloc(FP_EDGE), size[8];
    EVP_MD_CTX *h = EVP_MD_CTX_new();
    ddpd_err rc = DDPD_OK;
    if (!buf || !h) {
        rc = ddpd_error_set(err, DDPD_ENOMEM, name, "%s: out of memory taking its fingerprint", name);
        goto out;
    }
    for (int i = 0; i < 8; i++)
        size[i] = (unsigned char)((uint64_t)fp->bytes >> (8 * i));
    errno = 0;
    bool ok = EVP_DigestInit_ex(h, EVP_sha256(), NULL) == 1 && EVP_DigestUpdate(h, size, sizeof size) == 1;
    if (fp->bytes <= FP_WHOLE) {
        ok = ok && hash_range(h, fd, buf, 0, fp->bytes);
    } else {
        /* Blocks i = 0..63 start evenly from the end of the head to the start of the tail's
         * last block: the middle of a file that differs anywhere much is likely seen. */
        const int64_t span = fp->bytes - 2 * FP_EDGE - FP_BLOCK;
        ok = ok && hash_range(h, fd, buf, 0, FP_EDGE);
        for (int i = 0; ok && i < FP_BLOCKS; i++)
            ok = hash_range(h, fd, buf, FP_EDGE + span / (FP_BLOCKS - 1) * i, FP_BLOCK);
        ok = ok && hash_range(h, fd, buf, fp->bytes - FP_EDGE, FP_EDGE);
    }
    unsigned int len = 0;
    if (!ok || EVP_DigestFinal_ex(h, fp->sha256, &len) != 1 || len != sizeof fp->sha256)
        rc = ddpd_error_set(err, DDPD_EDATA, name, "%s: cannot read it to take its fingerprint: %s", name,
                            errno ? strerror(errno) : "the file shrank while it was read");
out:
    EVP_MD_CTX_free(h);
    free(buf);
    return rc;
}

static void hex(const unsigned char *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

char *fingerprint_record(const struct fingerprint *fp, int n)
{
    json_t *files = json_array(),
           *rec = json_pack("{s:i, s:o}", "version", FINGERPRINT_VERSION, "files", files);
    bool ok = rec != NULL;
    for (int i = 0; ok && i < n; i++) {
        char sha[65];
        hex(fp[i].sha256, sizeof fp[i].sha256, sha);
        json_t *f = json_pack("{s:s, s:s, s:I, s:I, s:I, s:s, s:s}", "field", fp[i].field, "file", fp[i].file,
                              "bytes", (json_int_t)fp[i].bytes, "mtime_ns", (json_int_t)fp[i].mtime_ns,
                              "samples", (json_int_t)fp[i].samples, "unit", fp[i].unit, "sha256", sha);
        ok = f && (fp[i].rank < 0 || json_object_set_new(f, "rank", json_integer(fp[i].rank)) == 0) &&
             json_array_append_new(files, f) == 0;
    }
    char *text = ok ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    return text;
}

static void say(fingerprint_note_fn note, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(fingerprint_note_fn note, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    if (!note)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    note(line);
}

/* The record's entry for `now` (its field, and its rank for a {rank} file), or NULL. */
static json_t *entry_of(json_t *files, const struct fingerprint *now)
{
    size_t i;
    json_t *f;
    json_array_foreach (files, i, f) {
        json_t *r = json_object_get(f, "rank");
        const char *field = json_string_value(json_object_get(f, "field"));
        int rank = json_is_integer(r) ? (int)json_integer_value(r) : -1;
        if (field && !strcmp(field, now->field) && rank == now->rank)
            return f;
    }
    return NULL;
}

/* `"x.npy"`, or `"x_1.npy" (rank 1's file)` */
static void file_text(const struct fingerprint *fp, char *out, size_t cap)
{
    if (fp->rank >= 0)
        snprintf(out, cap, "\"%s\" (rank %d's file)", fp->file, fp->rank);
    else
        snprintf(out, cap, "\"%s\"", fp->file);
}

/* What differs between the recorded entry (bytes b0, samples s0) and `now`, into out:
 * "size 1200000 → 48 bytes, windows 300000 → 12", or the contents alone. */
static void change_text(const struct fingerprint *now, int64_t b0, int64_t s0, char *out, size_t cap)
{
    size_t n = 0;
    if (b0 != now->bytes)
        n += (size_t)snprintf(out, cap, "size %" PRId64 " → %" PRId64 " bytes", b0, now->bytes);
    if (s0 != now->samples && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "%s%s %" PRId64 " → %" PRId64, n ? ", " : "", now->unit, s0,
                              now->samples);
    if (!n)
        snprintf(out, cap,
                 "same size (%" PRId64 " bytes) and %s (%" PRId64
                 ") but different contents (the SHA-256 of its sampled blocks)",
                 now->bytes, now->unit, now->samples);
}

ddpd_err fingerprint_check(const char *record, const struct fingerprint *now, int n, int64_t step, bool force,
                           fingerprint_note_fn note, struct ddpd_error *err)
{
    if (!record) {
        say(note,
            "the checkpoint at step %" PRId64 " records no data fingerprints (written before ddpd recorded "
            "them): its data files could not be checked against it",
            step);
        return DDPD_OK;
    }
    json_t *rec = json_loads(record, 0, NULL), *files = json_object_get(rec, "files");
    json_t *ver = json_object_get(rec, "version");
    if (!json_is_array(files) || !json_is_integer(ver) || json_integer_value(ver) != FINGERPRINT_VERSION) {
        say(note,
            "the checkpoint at step %" PRId64 " records its data fingerprints in a form this ddpd does not "
            "read (version %s): its data files could not be checked against it",
            step, json_is_integer(ver) ? "other than 1" : "unknown");
        json_decref(rec);
        return DDPD_OK;
    }
    int changed = 0;
    const char *field = "";
    char first[768] = "", name[SPEC_PATH_MAX + 64];
    for (int i = 0; i < n; i++) {
        json_t *f = entry_of(files, &now[i]);
        file_text(&now[i], name, sizeof name);
        if (!f) {
            say(note, "%s %s: the checkpoint at step %" PRId64 " records no fingerprint of it: not checked",
                now[i].field, name, step);
            continue;
        }
        char sha[65];
        hex(now[i].sha256, sizeof now[i].sha256, sha);
        const char *sha0 = json_string_value(json_object_get(f, "sha256"));
        const char *file0 = json_string_value(json_object_get(f, "file"));
        const int64_t b0 = json_integer_value(json_object_get(f, "bytes"));
        const int64_t s0 = json_integer_value(json_object_get(f, "samples"));
        const int64_t m0 = json_integer_value(json_object_get(f, "mtime_ns"));
        if (b0 == now[i].bytes && s0 == now[i].samples && sha0 && !strcmp(sha0, sha)) {
            if (m0 != now[i].mtime_ns || !file0 || strcmp(file0, now[i].file))
                say(note,
                    "%s %s was modified or renamed since the checkpoint at step %" PRId64
                    " (modification time or name), but its size, %s and sampled contents are the same: "
                    "taken as the same data",
                    now[i].field, name, step, now[i].unit);
            continue;
        }
        if (changed++)
            continue;
        char what[400];
        change_text(&now[i], b0, s0, what, sizeof what);
        /* A name too long for the sentence is cut: its start says which file, and what
         * changed still follows. */
        snprintf(first, sizeof first, "%s %.400s changed since the checkpoint at step %" PRId64 ": %.250s",
                 now[i].field, name, step, what);
        field = now[i].field;
    }
    json_decref(rec);
    if (!changed)
        return DDPD_OK;
    char more[64] = "";
    if (changed > 1)
        snprintf(more, sizeof more, " (and %d more data file%s changed)", changed - 1,
                 changed > 2 ? "s" : "");
    if (force) {
        say(note, "warning: %s%s; resuming on the data as it is now (force)", first, more);
        return DDPD_OK;
    }
    return ddpd_error_set(err, DDPD_EDATACHANGED, field,
                          "%s%s; to train on the data as it is now, resume with force", first, more);
}
