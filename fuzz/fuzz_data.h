/* fuzz_data.h — for fuzz_npy and fuzz_csv: a built-in spec, and a data set loaded the way a
 * worker (dataset_open) and `ddpd-worker --plan` (dataset_batch_counts, dataset_check) load it, with
 * every batch copied out. A file either fails with an error naming a code and a sentence,
 * or loads, its plan agrees with its ranks, and every class id is in range. */
#ifndef DDPD_FUZZ_DATA_H
#define DDPD_FUZZ_DATA_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_files.h"
#include "schema/spec.h"
#include "worker/data.h"

#define FUZZ_MAX_BATCHES 8
#define FUZZ_MAX_WORLD   4

static void fuzz_spec_of(struct spec *s, const char *json)
{
    struct ddpd_error err;
    if (spec_parse(json, strlen(json), NULL, s, &err) != DDPD_OK) {
        fprintf(stderr, "fuzz: bad built-in spec: %s\n", err.message);
        abort();
    }
}

static void fuzz_data_error(ddpd_err rc, const struct ddpd_error *err)
{
    if ((rc != DDPD_EDATA && rc != DDPD_ESPEC) || err->code != rc || !err->message[0]) {
        fprintf(stderr, "fuzz: unexpected %s: %s\n", ddpd_err_name(rc), err->message);
        abort();
    }
}

/* Loads the data of `s` (in fuzz_dir()) as each of `world` ranks. */
static void fuzz_dataset(const struct spec *s, int world)
{
    struct ddpd_error err;
    int64_t counts[FUZZ_MAX_WORLD];
    int64_t in = spec_in_width(s), out = spec_out_width(s), bs = s->batch_size;
    if (world > FUZZ_MAX_WORLD)
        abort();
    ddpd_err rc = dataset_batch_counts(s, fuzz_dir(), world, counts, &err);
    if (rc != DDPD_OK)
        fuzz_data_error(rc, &err);
    /* The planner's full check (every value read): what it accepts, every rank loads. */
    int64_t rows, file_bytes;
    ddpd_err checked = dataset_check(s, fuzz_dir(), world, &rows, &file_bytes, &err);
    if (checked != DDPD_OK)
        fuzz_data_error(checked, &err);
    if (checked == DDPD_OK && rc != DDPD_OK)
        abort();
    for (int rank = 0; rank < world; rank++) {
        struct dataset *ds = dataset_open(s, fuzz_dir(), rank, world, &err);
        if (!ds) {
            fuzz_data_error(err.code, &err);
            if (checked == DDPD_OK) {
                fprintf(stderr, "fuzz: the plan's check passed but rank %d fails: %s\n", rank, err.message);
                abort();
            }
            continue;
        }
        int64_t nb = dataset_batches(ds);
        if (rc == DDPD_OK && counts[rank] != nb) {
            fprintf(stderr, "fuzz: --plan says %lld batches, rank %d has %lld\n", (long long)counts[rank],
                    rank, (long long)nb);
            abort();
        }
        /* Sized as train.c sizes them: a batch is at most the shard. */
        bs = spec_batch_rows(s, dataset_shard_size(ds));
        float *x = malloc((size_t)(bs * in) * sizeof *x), *y = malloc((size_t)(bs * out) * sizeof *y);
        int32_t *labels = malloc((size_t)bs * sizeof *labels);
        dataset_set_epoch(ds, 1);
        for (int64_t b = 0; b < nb && b < FUZZ_MAX_BATCHES; b++) {
            int64_t rows = dataset_batch(ds, b, x, y, labels);
            if (rows < 1 || rows > bs)
                abort();
            for (int64_t i = 0; s->loss == LOSS_CROSS_ENTROPY && i < rows; i++)
                if (labels[i] < 0 || labels[i] >= out) {
                    fprintf(stderr, "fuzz: class id %d out of range\n", labels[i]);
                    abort();
                }
        }
        free(labels);
        free(y);
        free(x);
        dataset_free(ds);
    }
}

#endif
