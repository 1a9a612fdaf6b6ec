/* data.h — datasets of CONTRACT.md §2/§2a/§3: .npy, CSV, tokens and synthetic; rank sharding,
 * per-epoch shuffling, batching. Host memory only; knows nothing of devices, the
 * model or the optimizer. Every error names the file and what was wrong. */
#ifndef DDPD_DATA_H
#define DDPD_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "../schema/err.h"
#include "../schema/spec.h"

struct dataset;
struct fingerprint;

/* Loads this rank's view of the data set described by `spec->data`.
 * Paths are relative to `data_dir` and may not leave it (`..`, absolute paths and
 * symlinks pointing outside are DDPD_ESPEC naming the field). A path holding `{rank}` is
 * this rank's whole file; otherwise the whole file is loaded and sharded.
 * A sample's input is spec_sample_numel values: float32 (float64 files are converted), or
 * int32 token ids in [0, spec_vocab) when spec_input_ids (uint8/uint16/int64 files are
 * converted). Its target is spec_target_numel values: float32 for mse, int32 class ids in
 * [0, spec_classes) for cross_entropy ([N] classes or [N, T] sequences).
 * Tokens files, and .npy files over 64 MiB of values, are memory-mapped and read batch by
 * batch (their ids checked as they are read, see dataset_batch; a {rank} tokens file up to
 * 1 GiB, which the planner never sees, has its ids checked here too); the rest is loaded
 * and checked here. A {rank} file may hold no sample (the rank joins at once). Returns NULL with `err` set
 * (DDPD_EDATA names the file, and the row, sample or byte offset where known). Caller frees with
 * dataset_free. */
struct dataset *dataset_open(const struct spec *spec, const char *data_dir, int rank, int world_size,
                             struct ddpd_error *err);
void dataset_free(struct dataset *ds);

/* The same check for any other file a spec names under the data directory (init.from):
 * `given` (no {rank} replacement) opened beneath data_dir in one step (openat2
 * RESOLVE_BENEATH, or an O_NOFOLLOW walk where the kernel lacks it), so nothing swapped in
 * meanwhile leads out. Returns a read-only descriptor of a regular file (caller closes), or
 * -1 with DDPD_ESPEC naming `field` for an absolute path, "..", or a symbolic link that
 * leads out of the data directory (an absolute link target counts as leaving), and
 * DDPD_EDATA naming the file when it cannot be opened or is not a regular file (a FIFO or
 * a device is never waited on). */
int data_path_open(const char *data_dir, const char *field, const char *given, struct ddpd_error *err);

/* data_path_open, then the real path of what it opened into out[cap]. For naming only: a
 * reader must use data_path_open's descriptor, since the path may lead elsewhere by the
 * time it is opened again. */
ddpd_err data_path_resolve(const char *data_dir, const char *field, const char *given, char *out, size_t cap,
                           struct ddpd_error *err);

/* Model inputs from the .npy file at `path` (a predict request's upload: a path the caller
 * chose, not one beneath a data directory): [N] + the model's input_shape, converted as
 * dataset_open converts x (float32; int32 ids checked to be in [0, vocab) for a model that
 * starts with embedding). *x: a new array of N samples of spec_sample_numel 4-byte values
 * that the caller frees; *rows = N. Errors name `field` (DDPD_EDATA for what the file
 * holds, DDPD_ETOOBIG past max_rows samples). */
ddpd_err data_npy_inputs(const struct spec *s, const char *path, const char *field, int64_t max_rows,
                         void **x, int64_t *rows, struct ddpd_error *err);

/* Samples of the data set as spec_memory_estimate counts them: the whole set, or with
 * dataset_rank_file this rank's own {rank} file. */
int64_t dataset_rows(const struct dataset *ds);
bool dataset_rank_file(const struct dataset *ds);

/* The fingerprints of the files this rank's view was read from (fingerprint.h), taken
 * from the descriptors it read as it opened them: *n of them (none for synthetic data),
 * fields as spec->data names them ("data.x"), samples dataset_rows, rank -1 except for a
 * {rank} file. Borrowed, valid until dataset_free. */
const struct fingerprint *dataset_fingerprints(const struct dataset *ds, int *n);

/* For the planner's resume check: the fingerprints of the files of spec->data that every
 * rank reads whole (a {rank} file is its rank's to check), each with `rows` samples (the
 * data set's, as dataset_check counted them), into out[0..*n), *n <= 2. The errors of a
 * file that cannot be opened are dataset_check's. */
ddpd_err dataset_fingerprint_files(const struct spec *spec, const char *data_dir, int64_t rows,
                                   struct fingerprint *out, int *n, struct ddpd_error *err);

/* Samples in this rank's shard, and batches per epoch (ceil, or floor with drop_last). */
int64_t dataset_shard_size(const struct dataset *ds);
int64_t dataset_batches(const struct dataset *ds);

/* Batches per epoch for every rank, computable before any rank starts when the sizes
 * are known from the spec alone (synthetic), from the .npy/CSV headers or the size of a
 * tokens file (whole files
 * sharded by rank). Writes world_size counts into `out` and returns DDPD_OK; returns
 * DDPD_ENOTFOUND when they can only be known by the ranks ({rank} files). */
ddpd_err dataset_batch_counts(const struct spec *spec, const char *data_dir, int world_size, int64_t *out,
                              struct ddpd_error *err);

/* What the planner checks before a job is accepted: the rows of the whole data set
 * (synthetic: the spec's; files: their headers; tokens: their size) and, reading every
 * value, that class ids and token ids are in range (.npy and tokens files up to 1 GiB;
 * the ranks check larger ones as they read them) and CSV cells are finite numbers
 * under distinct header names. *file_bytes is the size of a file
 * a rank reads whole while loading (CSV), else 0. DDPD_ENOTFOUND for {rank} files (only the ranks see them);
 * else the error a rank would die of, naming the file and the row. */
ddpd_err dataset_check(const struct spec *spec, const char *data_dir, int world_size, int64_t *rows,
                       int64_t *file_bytes, struct ddpd_error *err);

/* Fixes the sample order of `epoch`: when shuffling, a permutation of the whole data set
 * drawn from (data.seed, epoch) — the same on every rank, like DistributedSampler with
 * set_epoch — then rank r takes positions r, r+W, r+2W, ... . Without shuffling the
 * order is 0..N-1. For {rank} files the shard is the file and shuffling permutes it. */
void dataset_set_epoch(struct dataset *ds, int64_t epoch);

/* Copies batch `b` (0-based, b < dataset_batches) of the current epoch into
 * x[rows, spec_sample_numel] (4-byte values: float32, or int32 ids when spec_input_ids)
 * and, for mse, y[rows, spec_target_numel] float32, or labels[rows, spec_target_numel]
 * int32 for cross_entropy (the other pointer is ignored). Returns rows (batch_size, or
 * fewer for the last batch when not drop_last), or -1 when a value read from a mapped
 * file is bad (an id out of range): dataset_error then says which (DDPD_EDATA naming the
 * file, the sample and the position). */
int64_t dataset_batch(struct dataset *ds, int64_t b, void *x, float *y, int32_t *labels);
const struct ddpd_error *dataset_error(const struct dataset *ds);

/* A shape as messages print it: "[3, 4]" (rank 0: "[]"). */
void data_shape_text(char *out, size_t cap, int rank, const int64_t *shape);

#endif
