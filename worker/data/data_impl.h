/* data/data_impl.h — what the files of the data module share and nobody else sees: the
 * dataset's struct, a data file, and the helpers each format reader uses (data.c: errors,
 * the model's shape, rows; path.c: files opened beneath the data directory). One file per
 * format (npy.c, csv.c, tokens.c, synthetic.c) fills a dataset through its `data__<format>_open`. */
#ifndef DDPD_DATA_IMPL_H
#define DDPD_DATA_IMPL_H

#include "../data.h"
#include "../fingerprint.h"

#include <stdbool.h>
#include <stdint.h>

/* Where one column (inputs or targets) of the samples is read from: rows held in memory
 * (converted at load) or a memory-mapped file (tokens, large .npy) converted row by row as
 * batches are read. Sample i's values start at p + i * stride; each is `size` bytes of
 * `kind` ('f' float, 'i' signed, 'u' unsigned integer), little-endian. */
struct dsrc {
    const unsigned char *p;
    int64_t stride;
    char kind;
    int size;
    bool mapped;
    int64_t file_off; /* file offset of p (mapped), for messages */
    char name[SPEC_PATH_MAX + 32];
};

struct dataset {
    int64_t xn, yn; /* values per sample: input (spec_sample_numel), target (spec_target_numel) */
    bool ids;       /* inputs are int32 token ids in [0, vocab) (the model starts with embedding) */
    int64_t vocab, classes;
    bool ce;
    int64_t n;       /* rows held below */
    float *x;        /* [n, xn] float32, or int32 ids; NULL when mapped */
    float *y;        /* [n, yn], mse */
    int32_t *labels; /* [n, yn], cross_entropy */
    struct dsrc sx, sy;
    void *map[2]; /* mappings to unmap */
    size_t map_len[2];
    int64_t touched;       /* mapped bytes read since their pages were last dropped */
    struct ddpd_error err; /* what dataset_batch failed on */

    int rank, world;
    int64_t batch;
    bool shuffle, drop_last;
    uint64_t seed;
    /* How shard positions map to held rows:
     * PER_RANK: the held rows are the shard ({rank} files); shuffling permutes them.
     * WHOLE: the held rows are the whole data set; rank r takes positions r, r+W, ...
     *        of the epoch's order.
     * SHARD_ONLY: synthetic without shuffling: only this rank's rows r, r+W, ... were
     *        generated, in that order. */
    enum { HOLD_PER_RANK, HOLD_WHOLE, HOLD_SHARD_ONLY } hold;
    int64_t n_total; /* length of the epoch's order */
    int64_t shard;
    int64_t *perm; /* [n_total] when shuffling */
    int64_t *idx;  /* [shard] held row of each shard position in this epoch */
    /* The files read, as they were when opened (dataset_fingerprints). */
    struct fingerprint fp[2];
    int nfp;
};

/* A data file: the name as the spec gives it ({rank} replaced) and its open descriptor. */
struct dfile {
    char name[SPEC_PATH_MAX + 32];
    int fd;
    int64_t size;
};

/* data.c */
/* Sets `err` to "<path>: <message>" with `path` also as the error's path. */
ddpd_err data__fail(struct ddpd_error *err, ddpd_err code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int data__first_linear(const struct spec *s);
int data__last_linear(const struct spec *s);
float data__to_f32(double d);
ddpd_err data__alloc_rows(struct dataset *ds, int64_t n, ddpd_err code, const char *what,
                          struct ddpd_error *err);
/* The same for the inputs (`x`) or the targets alone; the other column is mapped. */
ddpd_err data__alloc_cols(struct dataset *ds, int64_t n, bool x, bool y, ddpd_err code, const char *what,
                          struct ddpd_error *err);
/* Maps f->size bytes of an open file read-only into ds->map[slot]; *p is its start. */
ddpd_err data__map(struct dataset *ds, int slot, const struct dfile *f, const unsigned char **p,
                   struct ddpd_error *err);
/* The output shape of one sample (the top-level last layer's), rank 0 when unknown. */
int data__out_shape(const struct spec *s, int64_t *shape);

/* path.c */
bool data__has_rank(const char *p);
ddpd_err data__file_open(struct dfile *f, const char *data_dir, const char *field, const char *given,
                         int rank, struct ddpd_error *err);
/* data__file_open for the dataset's rank, then the file's fingerprint into ds->fp (data.c):
 * what a rank reads is what its checkpoints record. */
ddpd_err data__file_open_fp(struct dataset *ds, struct dfile *f, const char *data_dir, const char *field,
                            const char *given, struct ddpd_error *err);
void data__file_close(struct dfile *f);
ddpd_err data__read_whole(const struct dfile *f, char **out, struct ddpd_error *err);

/* npy.c, csv.c, synthetic.c: fill ds (its shape and rank set) with the rows of this rank
 * and set ds->hold and ds->n_total. The file readers also answer the planner's question
 * before any rank starts: the rows of a whole (not {rank}) data set, and with `check`
 * whatever a rank would die of while reading the values. */
ddpd_err data__npy_open(struct dataset *ds, const struct spec *s, const char *data_dir,
                        struct ddpd_error *err);
ddpd_err data__csv_open(struct dataset *ds, const struct spec *s, const char *data_dir,
                        struct ddpd_error *err);
ddpd_err data__synthetic_open(struct dataset *ds, const struct spec *s, struct ddpd_error *err);
ddpd_err data__npy_rows(const struct spec *s, const char *data_dir, bool check, int64_t *rows,
                        struct ddpd_error *err);
ddpd_err data__tokens_open(struct dataset *ds, const struct spec *s, const char *data_dir,
                           struct ddpd_error *err);
ddpd_err data__tokens_rows(const struct spec *s, const char *data_dir, bool check, int64_t *rows,
                           struct ddpd_error *err);
ddpd_err data__csv_rows(const struct spec *s, const char *data_dir, bool check, int64_t *rows,
                        int64_t *file_bytes, struct ddpd_error *err);

#endif
