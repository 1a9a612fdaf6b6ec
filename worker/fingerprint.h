/* fingerprint.h — what a checkpoint records of each data file it was trained on (its size,
 * modification time, sample count and a SHA-256 of sampled blocks), and the check a resume
 * makes against that record (docs/spec.md "Checkpoints", schema/README.md). A resume on a
 * file that changed since its checkpoint would go on "from step 40000 of the epoch" of
 * data that no longer has it. Knows files, the hash and the record's JSON; nothing of
 * tensors, the model, the collectives or the data formats. */
#ifndef DDPD_FINGERPRINT_H
#define DDPD_FINGERPRINT_H

#include <stdbool.h>
#include <stdint.h>

#include "../schema/err.h"
#include "../schema/spec.h"

/* The record's version: a record of another version is not compared (its hash may be
 * another function of the file), only noted. */
#define FINGERPRINT_VERSION 1
/* The files one rank reads: the data's (x and y, or path) and eval.data's. */
#define FINGERPRINT_MAX 4
/* The metadata key of a checkpoint's safetensors files that holds the record. */
#define FINGERPRINT_META_KEY "data_fingerprints"

/* One data file as a rank opened it. A plain value without pointers: ranks exchange
 * them as bytes. */
struct fingerprint {
    char field[24];                /* the spec field naming the file: "data.path", "eval.data.x" */
    char file[SPEC_PATH_MAX + 32]; /* as the spec gives it, {rank} replaced */
    int rank;                      /* -1: every rank reads it; R: rank R's own {rank} file */
    char unit[8];                  /* what a sample is: "windows" (tokens) or "rows" */
    int64_t bytes, mtime_ns, samples;
    unsigned char sha256[32];
};

/* Sets fp's bytes, mtime_ns and sha256 from the open regular file `fd` (`name` names it
 * in errors). The hash is SHA-256 (OpenSSL) of the size as 8 little-endian bytes, then of
 * the whole file when it holds at most 1 MiB, else of its first 64 KiB, 64 blocks of 4 KiB
 * spread evenly between, and its last 64 KiB: at most 384 KiB read, whatever the size.
 * DDPD_EDATA naming the file when it cannot be read; DDPD_ENOMEM. */
ddpd_err fingerprint_fd(int fd, const char *name, struct fingerprint *fp, struct ddpd_error *err);

/* The record of `n` files, {"version":1,"files":[{"field","file","rank","bytes",
 * "mtime_ns","samples","unit","sha256"}, ...]} ("rank" only for {rank} files), as a new
 * string the caller frees; NULL when memory ran out. */
char *fingerprint_record(const struct fingerprint *fp, int n);

/* Told what the check found that is not an error: a file whose modification time or name
 * changed with the same contents, a checkpoint that records nothing to compare, what
 * `force` let through. One sentence, no newline. */
typedef void (*fingerprint_note_fn)(const char *sentence);

/* Checks a rank's files `now[0..n)` against `record` (a checkpoint's, NULL when the
 * checkpoint has none: one written before ddpd recorded them) of the checkpoint at step
 * `step`. A file counts as changed when its size, its sample count or its hash differs; a
 * new modification time or name with all three the same is the same data (a file copied
 * or touched) and only noted. DDPD_EDATACHANGED with the field as path and a sentence
 * naming the file and what changed ("data.path \"train.tokens\" changed since the
 * checkpoint at step 40000: size 1200000 → 48 bytes, windows 300000 → 12; ..."), unless
 * `force`, which notes it instead. A record that cannot be read, or of another version, or
 * without one of the files, is noted as not checked. `note` may be NULL. */
ddpd_err fingerprint_check(const char *record, const struct fingerprint *now, int n, int64_t step, bool force,
                           fingerprint_note_fn note, struct ddpd_error *err);

#endif
