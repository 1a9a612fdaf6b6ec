/* safetensors.h — read and write safetensors files (CONTRACT.md §4): 8-byte
 * little-endian header length, a JSON header, raw little-endian data. F32 tensors. Writes
 * go to a temporary name, are fsynced and renamed into place: never a torn file. In
 * schema/ because both programs use it: the worker reads and writes checkpoints, the
 * server reads a checkpoint's header to serve it in another layout (gpt2.h). */
#ifndef DDPD_SAFETENSORS_H
#define DDPD_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define SAFETENSORS_MAX_DIMS   4
#define SAFETENSORS_MAX_HEADER (16 * 1024 * 1024)

struct safetensors_tensor {
    char name[128];
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    float *data; /* write: borrowed; read: owned by the safetensors_file */
    /* write: when not NULL, the tensor is written from these as dtype I64 (BatchNorm's
     * num_batches_tracked) and `data` is unused; read: NULL (an I64 tensor is read
     * into `data` as floats, exact below 2^24, with `was_i64` set). */
    const int64_t *i64;
    bool was_i64;
    /* read: the dtype in the file ("F32", "BF16", ...; static) and where its bytes begin
     * in the file (8 + header length + data_offsets[0]). */
    const char *dtype;
    int64_t file_offset;
};

/* `meta` holds n_meta key/value string pairs for "__metadata__" (may be 0). */
struct safetensors_meta {
    const char *key, *value;
};

/* Writes the tensors (in the given order; the header lists them sorted by name as the
 * reference implementation does, data laid out in the same order) to `path`
 * atomically. Returns DDPD_OK or DDPD_EIO naming the file. */
ddpd_err safetensors_write(const char *path, const struct safetensors_tensor *t, int n,
                           const struct safetensors_meta *meta, int n_meta, struct ddpd_error *err);

/* The bytes that open the file safetensors_write writes for these tensors: the 8-byte
 * length, the JSON header and its padding, into *out (a new buffer the caller frees) and
 * *len; order[i] (n of them, caller's) is the index in `t` of the i-th tensor in the data
 * that follows, each as F32 (or I64) little-endian. For a writer of its own (the server's
 * GPT-2 export streams its data instead of writing a file). DDPD_EINTERNAL for a bad
 * tensor, DDPD_ENOMEM, each naming `path`. */
ddpd_err safetensors_header(const char *path, const struct safetensors_tensor *t, int n,
                            const struct safetensors_meta *meta, int n_meta, char **out, size_t *len,
                            int *order, struct ddpd_error *err);

/* "[2, 3]" for a shape, into out[cap] (as the errors of the reader and schema/gpt2.c write it). */
void safetensors_shape_text(char *out, size_t cap, int ndim, const int64_t *shape);

struct safetensors_file;

/* Reads and checks a whole file: header length within the file, valid JSON, every
 * tensor F32 (F64/F16/BF16, I64, BOOL and U8 are converted to float32), offsets inside the data and
 * not overlapping, shapes matching byte sizes. NULL with DDPD_EDATA naming the file and
 * what was wrong. Caller frees with safetensors_free. */
struct safetensors_file *safetensors_read(const char *path, struct ddpd_error *err);
/* The same from an open descriptor (steals `fd`, closed in every case; -1 = the open
 * failed with errno); `path` names it in errors. */
struct safetensors_file *safetensors_read_fd(int fd, const char *path, struct ddpd_error *err);

/* The same checks without reading the values: names, shapes and layout only (every
 * tensor's data is NULL). For a check before a job starts (ddpd-worker --plan). */
struct safetensors_file *safetensors_read_header(const char *path, struct ddpd_error *err);
void safetensors_free(struct safetensors_file *f);
int safetensors_count(const struct safetensors_file *f);
const struct safetensors_tensor *safetensors_at(const struct safetensors_file *f, int i);
const struct safetensors_tensor *safetensors_get(const struct safetensors_file *f,
                                                 const char *name);                  /* NULL if absent */
const char *safetensors_meta_get(const struct safetensors_file *f, const char *key); /* NULL if absent */

#endif
