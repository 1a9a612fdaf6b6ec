/* test_data.c — data sets: .npy (v1/v2, f4/f8 inputs, float and integer targets, token
 * ids, samples of any shape), tokens files and CSV readers against files written here, the
 * memory-mapped reading of large files, rank sharding and per-epoch shuffling, {rank}
 * files, batch counts before the ranks start, the synthetic teacher's determinism, and
 * a clean error naming the file for every kind of bad file or path. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "base/file.h"
#include "worker/data.h"

static char root[2048];    /* the test's temporary folder */
static char datadir[4096]; /* root/dd: the data directory; files live in dd/data/ */

static void setup(void)
{
    const char *base = getenv("DDPD_TEST_TMP");
    if (!base || !base[0])
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(root, sizeof root, "%s/data.XXXXXX", base);
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(datadir, sizeof datadir, "%s/dd", root);
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/data", datadir);
    if (mkdir(datadir, 0755) != 0 || mkdir(sub, 0755) != 0) {
        perror("mkdir");
        exit(1);
    }
}

/* "NAME: cannot open: No such file or directory (data paths are resolved against the
 * data directory DATADIR)", DATADIR with its links resolved: what a missing file says. */
static const char *missing_msg(const char *name)
{
    static char msg[PATH_MAX + 256];
    char abs[PATH_MAX];
    snprintf(
        msg, sizeof msg,
        "%s: cannot open: No such file or directory (data paths are resolved against the data directory %s)",
        name, realpath(datadir, abs) ? abs : datadir);
    return msg;
}

/* Writes `n` bytes to datadir/rel. */
static void put(const char *rel, const void *p, size_t n)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", datadir, rel);
    FILE *fp = fopen(path, "wb");
    if (!fp || (n && fwrite(p, 1, n, fp) != n)) {
        perror(path);
        exit(1);
    }
    fclose(fp);
}

static void put_str(const char *rel, const char *s)
{
    put(rel, s, strlen(s));
}

/* An .npy file as np.save writes it: magic, version, header length, the dict padded
 * with spaces to a 64-byte boundary and ended by '\n', then `nbytes` of data. Writes
 * only the first `keep` bytes when keep >= 0 (to make truncated files). */
static size_t npy_bytes(unsigned char *out, int version, const char *descr, bool fortran, const char *shape,
                        const void *data, size_t nbytes)
{
    char dict[512];
    int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr,
                      fortran ? "True" : "False", shape);
    size_t pre = version == 1 ? 10 : 12;
    size_t total = pre + (size_t)dl + 1;
    size_t padded = (total + 63) / 64 * 64;
    size_t hl = padded - pre;
    memcpy(out, "\x93NUMPY", 6);
    out[6] = (unsigned char)version;
    out[7] = 0;
    out[8] = (unsigned char)(hl & 0xff);
    out[9] = (unsigned char)(hl >> 8);
    if (version != 1) {
        out[10] = (unsigned char)(hl >> 16);
        out[11] = (unsigned char)(hl >> 24);
    }
    memcpy(out + pre, dict, (size_t)dl);
    memset(out + pre + dl, ' ', padded - pre - (size_t)dl - 1);
    out[padded - 1] = '\n';
    if (nbytes)
        memcpy(out + padded, data, nbytes);
    return padded + nbytes;
}

static void put_npy_keep(const char *rel, int version, const char *descr, bool fortran, const char *shape,
                         const void *data, size_t nbytes, long keep)
{
    unsigned char *b = malloc(256 + nbytes);
    size_t n = npy_bytes(b, version, descr, fortran, shape, data, nbytes);
    put(rel, b, keep >= 0 && (size_t)keep < n ? (size_t)keep : n);
    free(b);
}

static void put_npy(const char *rel, int version, const char *descr, const char *shape, const void *data,
                    size_t nbytes)
{
    put_npy_keep(rel, version, descr, false, shape, data, nbytes, -1);
}

/* A one-linear-layer model in -> out, no shuffling, batch 2. */
static void spec_base(struct spec *s, int64_t in, int64_t out, loss_kind loss)
{
    memset(s, 0, sizeof *s);
    s->world_size = 1;
    s->n_layers = 1;
    s->layers[0] = (struct spec_layer){.kind = LAYER_LINEAR, .in = in, .out = out, .bias = true};
    spec_flat_layers(s);
    s->loss = loss;
    s->batch_size = 2;
    s->epochs = 1;
    s->grad_accum = 1;
    s->data.shuffle = false;
}

static void spec_npy(struct spec *s, const char *x, const char *y)
{
    s->data.kind = DATA_NPY;
    snprintf(s->data.x, sizeof s->data.x, "%s", x);
    snprintf(s->data.y, sizeof s->data.y, "%s", y);
}

static void spec_csv(struct spec *s, const char *path, const char *target)
{
    s->data.kind = DATA_CSV;
    snprintf(s->data.path, sizeof s->data.path, "%s", path);
    s->data.n_targets = 1;
    snprintf(s->data.targets[0], sizeof s->data.targets[0], "%s", target);
}

static struct dataset *open_ok(const struct spec *s, int rank, int world)
{
    struct ddpd_error err = {0};
    struct dataset *ds = dataset_open(s, datadir, rank, world, &err);
    if (!ds)
        fprintf(stderr, "    dataset_open failed: %s %s\n", ddpd_err_name(err.code), err.message);
    CHECK(ds != NULL);
    return ds;
}

/* dataset_open must fail with `code`; the message starts with `path` (the file or field)
 * and err.path is it. Returns the message. */
static const char *open_fails(const struct spec *s, ddpd_err code, const char *path)
{
    static struct ddpd_error err;
    memset(&err, 0, sizeof err);
    struct dataset *ds = dataset_open(s, datadir, 0, 1, &err);
    CHECK(ds == NULL);
    dataset_free(ds);
    CHECK_EQ_STR(ddpd_err_name(err.code), ddpd_err_name(code));
    CHECK_EQ_STR(err.path, path);
    CHECK(strstr(err.message, path) == err.message);
    return err.message;
}

/* Sample ids of a whole epoch of a rank, in order: x's first column holds the id. */
static int64_t epoch_ids(struct dataset *ds, int64_t in, int64_t *ids)
{
    int64_t n = 0;
    float *x = malloc((size_t)(64 * in) * sizeof(float));
    float *y = malloc(64 * 8 * sizeof(float));
    for (int64_t b = 0; b < dataset_batches(ds); b++) {
        int64_t rows = dataset_batch(ds, b, x, y, NULL);
        for (int64_t k = 0; k < rows; k++)
            ids[n++] = (int64_t)x[k * in];
    }
    free(x);
    free(y);
    return n;
}

/* ---- .npy ---- */

static void test_npy_values(void)
{
    struct spec s;
    float x[7 * 3], y[7 * 2];
    for (int i = 0; i < 7; i++) {
        for (int j = 0; j < 3; j++)
            x[i * 3 + j] = (float)(i * 10 + j);
        for (int j = 0; j < 2; j++)
            y[i * 2 + j] = -(float)(i * 10 + j);
    }
    put_npy("data/x.npy", 1, "<f4", "(7, 3)", x, sizeof x);
    put_npy("data/y.npy", 2, "<f4", "(7, 2)", y, sizeof y);
    spec_base(&s, 3, 2, LOSS_MSE);
    spec_npy(&s, "data/x.npy", "data/y.npy");
    s.batch_size = 3;
    struct dataset *ds = open_ok(&s, 0, 1);
    if (ds) {
        CHECK_EQ_INT(dataset_shard_size(ds), 7);
        CHECK_EQ_INT(dataset_batches(ds), 3);
        float bx[9], by[6];
        CHECK_EQ_INT(dataset_batch(ds, 0, bx, by, NULL), 3);
        CHECK(memcmp(bx, x, sizeof bx) == 0);
        CHECK(memcmp(by, y, sizeof by) == 0);
        CHECK_EQ_INT(dataset_batch(ds, 2, bx, by, NULL), 1);
        CHECK(memcmp(bx, x + 18, 3 * sizeof(float)) == 0);
        CHECK(memcmp(by, y + 12, 2 * sizeof(float)) == 0);
        CHECK_EQ_INT(dataset_batch(ds, 3, bx, by, NULL), 0);
        dataset_free(ds);
    }
    s.data.drop_last = true;
    ds = open_ok(&s, 0, 1);
    if (ds)
        CHECK_EQ_INT(dataset_batches(ds), 2);
    dataset_free(ds);
    dataset_free(NULL);

    /* float64 inputs (v2 header) and int64 class ids. */
    double x8[5 * 2];
    int64_t y8[5] = {0, 3, 1, 2, 3};
    for (int i = 0; i < 10; i++)
        x8[i] = 0.1 * i - 0.35;
    put_npy("data/x8.npy", 2, "<f8", "(5, 2)", x8, sizeof x8);
    put_npy("data/y8.npy", 1, "<i8", "(5,)", y8, sizeof y8);
    spec_base(&s, 2, 4, LOSS_CROSS_ENTROPY);
    spec_npy(&s, "data/x8.npy", "data/y8.npy");
    s.batch_size = 5;
    ds = open_ok(&s, 0, 1);
    if (ds) {
        float bx[10];
        int32_t bl[5];
        CHECK_EQ_INT(dataset_batch(ds, 0, bx, NULL, bl), 5);
        for (int i = 0; i < 10; i++)
            CHECK(bx[i] == (float)x8[i]);
        for (int i = 0; i < 5; i++)
            CHECK_EQ_INT(bl[i], y8[i]);
        dataset_free(ds);
    }

    /* int32, int16 and int8 class ids; a version 3.0 header reads as 2.0. */
    int32_t y4[5] = {3, 2, 1, 0, 3};
    int16_t y2[5] = {1, 1, 2, 2, 0};
    int8_t y1[5] = {0, 0, 0, 3, 3};
    put_npy("data/y4.npy", 3, "<i4", "(5,)", y4, sizeof y4);
    put_npy("data/y2.npy", 1, "<i2", "(5,)", y2, sizeof y2);
    put_npy("data/y1.npy", 1, "|i1", "(5,)", y1, sizeof y1);
    const char *ys[] = {"data/y4.npy", "data/y2.npy", "data/y1.npy"};
    for (int f = 0; f < 3; f++) {
        spec_npy(&s, "data/x8.npy", ys[f]);
        ds = open_ok(&s, 0, 1);
        if (!ds)
            continue;
        float bx[10];
        int32_t bl[5];
        dataset_batch(ds, 0, bx, NULL, bl);
        for (int i = 0; i < 5; i++)
            CHECK_EQ_INT(bl[i], f == 0 ? y4[i] : f == 1 ? y2[i] : y1[i]);
        dataset_free(ds);
    }

    /* mse with one output accepts y of shape [N], and f8 targets. */
    double y1d[5] = {1, 2, 3, 4, 5};
    put_npy("data/y1d.npy", 1, "<f8", "(5,)", y1d, sizeof y1d);
    spec_base(&s, 2, 1, LOSS_MSE);
    spec_npy(&s, "data/x8.npy", "data/y1d.npy");
    s.batch_size = 8;
    ds = open_ok(&s, 0, 1);
    if (ds) {
        float bx[16], by[8];
        CHECK_EQ_INT(dataset_batch(ds, 0, bx, by, NULL), 5);
        CHECK(by[0] == 1 && by[4] == 5);
        dataset_free(ds);
    }
}

/* ids.npy: x[i] = {i, i + 0.5}, y[i] = {2i}: N rows. */
static void put_ids(const char *xname, const char *yname, int n, int first_id)
{
    float *x = malloc((size_t)n * 2 * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    char shape[64];
    for (int i = 0; i < n; i++) {
        x[2 * i] = (float)(first_id + i);
        x[2 * i + 1] = (float)(first_id + i) + 0.5f;
        y[i] = 2.0f * (float)(first_id + i);
    }
    snprintf(shape, sizeof shape, "(%d, 2)", n);
    put_npy(xname, 1, "<f4", shape, x, (size_t)n * 2 * sizeof(float));
    snprintf(shape, sizeof shape, "(%d, 1)", n);
    put_npy(yname, 1, "<f4", shape, y, (size_t)n * sizeof(float));
    free(x);
    free(y);
}

static void test_sharding(void)
{
    struct spec s;
    const int N = 10;
    put_ids("data/ids_x.npy", "data/ids_y.npy", N, 0);
    spec_base(&s, 2, 1, LOSS_MSE);
    spec_npy(&s, "data/ids_x.npy", "data/ids_y.npy");
    for (int W = 1; W <= 3; W++) {
        int seen[10] = {0};
        int64_t min = N, max = 0;
        for (int r = 0; r < W; r++) {
            s.batch_size = 3;
            struct dataset *ds = open_ok(&s, r, W);
            if (!ds)
                continue;
            int64_t ids[16], n = epoch_ids(ds, 2, ids);
            CHECK_EQ_INT(n, dataset_shard_size(ds));
            for (int64_t k = 0; k < n; k++) {
                CHECK_EQ_INT(ids[k], r + k * W); /* positions r, r+W, ... */
                seen[ids[k]]++;
            }
            min = n < min ? n : min;
            max = n > max ? n : max;
            dataset_free(ds);
        }
        CHECK(max - min <= 1);
        for (int i = 0; i < N; i++)
            CHECK_EQ_INT(seen[i], 1);
    }

    /* batch counts: shards of 4, 3, 3 for W = 3 with batch 3. */
    int64_t counts[3];
    struct ddpd_error err = {0};
    s.batch_size = 3;
    for (int drop = 0; drop < 2; drop++) {
        s.data.drop_last = drop;
        CHECK_EQ_INT(dataset_batch_counts(&s, datadir, 3, counts, &err), DDPD_OK);
        CHECK_EQ_INT(counts[0], drop ? 1 : 2);
        CHECK_EQ_INT(counts[1], 1);
        CHECK_EQ_INT(counts[2], 1);
        for (int r = 0; r < 3; r++) {
            struct dataset *ds = open_ok(&s, r, 3);
            if (ds)
                CHECK_EQ_INT(dataset_batches(ds), counts[r]);
            dataset_free(ds);
        }
    }
    /* More ranks than samples: some shards are empty. */
    s.data.drop_last = false;
    struct dataset *ds = open_ok(&s, 11, 12);
    if (ds) {
        CHECK_EQ_INT(dataset_shard_size(ds), 0);
        CHECK_EQ_INT(dataset_batches(ds), 0);
    }
    dataset_free(ds);
}

static void test_shuffle(void)
{
    struct spec s;
    const int N = 23;
    put_ids("data/sh_x.npy", "data/sh_y.npy", N, 0);
    spec_base(&s, 2, 1, LOSS_MSE);
    spec_npy(&s, "data/sh_x.npy", "data/sh_y.npy");
    s.data.shuffle = true;
    s.data.seed = 5;
    s.batch_size = 4;
    struct dataset *one = open_ok(&s, 0, 1);
    if (!one)
        return;
    int64_t e0[32], e1[32], again[32];
    CHECK_EQ_INT(epoch_ids(one, 2, e0), N); /* epoch 0 without set_epoch */
    dataset_set_epoch(one, 1);
    CHECK_EQ_INT(epoch_ids(one, 2, e1), N);
    dataset_set_epoch(one, 0);
    epoch_ids(one, 2, again);
    CHECK(memcmp(e0, again, sizeof(int64_t) * N) == 0);
    CHECK(memcmp(e0, e1, sizeof(int64_t) * N) != 0);
    int seen[32] = {0}, identity = 1;
    for (int i = 0; i < N; i++) {
        seen[e0[i]]++;
        identity &= e0[i] == i;
    }
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(seen[i], 1);
    CHECK(!identity);

    /* Three ranks draw the same permutation and take positions r, r+3, ... of it. */
    for (int64_t epoch = 0; epoch < 3; epoch++) {
        int64_t whole[32];
        dataset_set_epoch(one, epoch);
        epoch_ids(one, 2, whole);
        for (int r = 0; r < 3; r++) {
            struct dataset *ds = open_ok(&s, r, 3);
            if (!ds)
                continue;
            dataset_set_epoch(ds, epoch);
            int64_t ids[16], n = epoch_ids(ds, 2, ids);
            CHECK_EQ_INT(n, (N - r + 2) / 3);
            for (int64_t k = 0; k < n; k++)
                CHECK_EQ_INT(ids[k], whole[r + 3 * k]);
            /* y follows its x. */
            float bx[8], by[4];
            int64_t rows = dataset_batch(ds, 0, bx, by, NULL);
            for (int64_t k = 0; k < rows; k++) {
                CHECK(by[k] == 2 * bx[2 * k]);
                CHECK(bx[2 * k + 1] == bx[2 * k] + 0.5f);
            }
            dataset_free(ds);
        }
    }
    dataset_free(one);

    /* Another seed, another order. */
    s.data.seed = 6;
    one = open_ok(&s, 0, 1);
    if (one) {
        int64_t other[32];
        epoch_ids(one, 2, other);
        CHECK(memcmp(e0, other, sizeof(int64_t) * N) != 0);
    }
    dataset_free(one);
}

static void test_rank_files(void)
{
    struct spec s;
    put_ids("data/part_x_0.npy", "data/part_y_0.npy", 3, 100);
    put_ids("data/part_x_1.npy", "data/part_y_1.npy", 5, 200);
    spec_base(&s, 2, 1, LOSS_MSE);
    spec_npy(&s, "data/part_x_{rank}.npy", "data/part_y_{rank}.npy");
    s.batch_size = 2;
    for (int r = 0; r < 2; r++) {
        struct dataset *ds = open_ok(&s, r, 2);
        if (!ds)
            continue;
        int64_t ids[8], n = epoch_ids(ds, 2, ids);
        CHECK_EQ_INT(dataset_shard_size(ds), r ? 5 : 3);
        CHECK_EQ_INT(dataset_batches(ds), r ? 3 : 2);
        CHECK_EQ_INT(n, r ? 5 : 3);
        for (int64_t k = 0; k < n; k++)
            CHECK_EQ_INT(ids[k], (r ? 200 : 100) + k);
        dataset_free(ds);
    }
    /* Shuffling permutes the rank's own file. */
    s.data.shuffle = true;
    struct dataset *ds = open_ok(&s, 1, 2);
    if (ds) {
        int64_t ids[8], seen[5] = {0};
        dataset_set_epoch(ds, 3);
        CHECK_EQ_INT(epoch_ids(ds, 2, ids), 5);
        for (int k = 0; k < 5; k++) {
            CHECK(ids[k] >= 200 && ids[k] < 205);
            if (ids[k] >= 200 && ids[k] < 205)
                seen[ids[k] - 200]++;
        }
        for (int k = 0; k < 5; k++)
            CHECK_EQ_INT(seen[k], 1);
    }
    dataset_free(ds);

    struct ddpd_error err = {0};
    int64_t counts[2];
    CHECK_EQ_INT(dataset_batch_counts(&s, datadir, 2, counts, &err), DDPD_ENOTFOUND);
    /* A rank whose file is missing. */
    ds = dataset_open(&s, datadir, 2, 3, &err);
    CHECK(ds == NULL);
    CHECK_EQ_STR(err.path, "data/part_x_2.npy");
    CHECK_EQ_STR(err.message, missing_msg("data/part_x_2.npy"));
    /* {rank} in one of the two paths only. */
    spec_npy(&s, "data/part_x_{rank}.npy", "data/part_y_0.npy");
    open_fails(&s, DDPD_ESPEC, "data.y");
}

/* A rank whose own {rank} file has no rows opens with zero batches (it joins at once and
 * shadows the others, as PyTorch's DDP runs it), as .npy and as CSV, shuffled or not; a
 * whole file with no rows is still refused (every rank would be empty). */
static void test_empty_rank_file(void)
{
    struct spec s;
    float none[1] = {0};
    put_ids("data/e_x_0.npy", "data/e_y_0.npy", 3, 100);
    put_npy("data/e_x_1.npy", 1, "<f4", "(0, 2)", none, 0);
    put_npy("data/e_y_1.npy", 1, "<f4", "(0, 1)", none, 0);
    put_str("data/e_0.csv", "a,b,y\n1,2,3\n4,5,6\n");
    put_str("data/e_1.csv", "a,b,y\n");
    for (int shuffle = 0; shuffle < 2; shuffle++)
        for (int csv = 0; csv < 2; csv++) {
            spec_base(&s, 2, 1, LOSS_MSE);
            if (csv)
                spec_csv(&s, "data/e_{rank}.csv", "y");
            else
                spec_npy(&s, "data/e_x_{rank}.npy", "data/e_y_{rank}.npy");
            s.batch_size = 2;
            s.data.shuffle = shuffle;
            struct dataset *ds = open_ok(&s, 1, 2);
            if (ds) {
                dataset_set_epoch(ds, 1);
                CHECK_EQ_INT(dataset_shard_size(ds), 0);
                CHECK_EQ_INT(dataset_batches(ds), 0);
            }
            dataset_free(ds);
            ds = open_ok(&s, 0, 2);
            if (ds)
                CHECK_EQ_INT(dataset_batches(ds), csv ? 1 : 2);
            dataset_free(ds);
        }
    spec_base(&s, 2, 1, LOSS_MSE);
    spec_npy(&s, "data/e_x_1.npy", "data/e_y_1.npy");
    CHECK(strstr(open_fails(&s, DDPD_EDATA, "data/e_x_1.npy"), "no samples") != NULL);
    spec_csv(&s, "data/e_1.csv", "y");
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/e_1.csv"), "data/e_1.csv: no data rows after the header");
}

static void test_npy_errors(void)
{
    struct spec s;
    float x[30] = {0};
    int32_t y[10] = {0};
    const char *m;
    put_npy("data/y10.npy", 1, "<i4", "(10,)", y, sizeof y);
    spec_base(&s, 3, 5, LOSS_CROSS_ENTROPY);
    spec_npy(&s, "data/x.npy", "data/y10.npy");

    /* Truncated data: the message the contract promises. */
    put_npy_keep("data/x.npy", 1, "<f4", false, "(10, 3)", x, sizeof x, 128 + 100);
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/x.npy"),
                 "data/x.npy: truncated: header says 30 float32 values (120 bytes) but only 100 "
                 "bytes follow the header at offset 128");
    /* Truncated header. */
    put_npy_keep("data/x.npy", 1, "<f4", false, "(10, 3)", x, sizeof x, 50);
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/x.npy"),
                 "data/x.npy: truncated header: the header says it is 118 bytes but the file "
                 "ends at byte 50");
    put_npy_keep("data/x.npy", 2, "<f4", false, "(10, 3)", x, sizeof x, 9);
    m = open_fails(&s, DDPD_EDATA, "data/x.npy");
    CHECK(strstr(m, "truncated header") != NULL);
    put_str("data/x.npy", "");
    m = open_fails(&s, DDPD_EDATA, "data/x.npy");
    CHECK(strstr(m, "not a .npy file") != NULL);
    put_str("data/x.npy", "x,y\n1,2\n");
    m = open_fails(&s, DDPD_EDATA, "data/x.npy");
    CHECK(strstr(m, "not a .npy file") != NULL);

    /* Wrong dtypes, byte order, layout. */
    put_npy("data/x.npy", 1, "<U3", "(10, 3)", x, sizeof x);
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/x.npy"), "data/x.npy: unsupported dtype '<U3'");
    put_npy("data/x.npy", 1, ">f4", "(10, 3)", x, sizeof x);
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/x.npy"),
                 "data/x.npy: dtype '>f4' is big-endian; save it little-endian "
                 "(arr.astype('<f4'))");
    put_npy("data/x.npy", 1, "<i4", "(10, 3)", x, sizeof x);
    m = open_fails(&s, DDPD_EDATA, "data/x.npy");
    CHECK(strstr(m, "x must be float32") != NULL);
    put_npy_keep("data/x.npy", 1, "<f4", true, "(10, 3)", x, sizeof x, -1);
    m = open_fails(&s, DDPD_EDATA, "data/x.npy");
    CHECK(strstr(m, "fortran_order is True") != NULL);
    put_npy("data/x.npy", 4, "<f4", "(10, 3)", x, sizeof x);
    m = open_fails(&s, DDPD_EDATA, "data/x.npy");
    CHECK(strstr(m, "unsupported .npy version 4.0") != NULL);

    /* Shapes. */
    float x7[70] = {0};
    put_npy("data/x.npy", 1, "<f4", "(10, 7)", x7, sizeof x7);
    spec_base(&s, 10, 5, LOSS_CROSS_ENTROPY);
    spec_npy(&s, "data/x.npy", "data/y10.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/x.npy"),
                 "data/x.npy: x has 7 columns but model[0].in is 10");
    spec_base(&s, 7, 5, LOSS_CROSS_ENTROPY);
    spec_npy(&s, "data/x.npy", "data/y10.npy");
    put_npy("data/x.npy", 1, "<f4", "(2, 5, 7)", x7, sizeof x7);
    m = open_fails(&s, DDPD_EDATA, "data/x.npy");
    CHECK(strstr(m, "x must be 2-dimensional [N, 7], got shape (2, 5, 7)") != NULL);
    put_npy("data/x.npy", 1, "<f4", "(0, 7)", x7, 0);
    m = open_fails(&s, DDPD_EDATA, "data/x.npy");
    CHECK(strstr(m, "no samples") != NULL);
    put_npy("data/x.npy", 1, "<f4", "(9, 7)", x7, 9 * 7 * 4);
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/y10.npy"),
                 "data/y10.npy: y has 10 rows but data/x.npy has 9");
    put_npy("data/x.npy", 1, "<f4", "(10, 7)", x7, sizeof x7);
    put_npy("data/y.npy", 1, "<i4", "(10, 1)", y, sizeof y);
    spec_npy(&s, "data/x.npy", "data/y.npy");
    m = open_fails(&s, DDPD_EDATA, "data/y.npy");
    CHECK(strstr(m, "1-dimensional [N]") != NULL);
    put_npy("data/y.npy", 1, "<f4", "(10,)", y, sizeof y);
    m = open_fails(&s, DDPD_EDATA, "data/y.npy");
    CHECK(strstr(m, "integer class ids") != NULL);

    /* Class ids in [0, out). */
    int32_t bad[10] = {0, 1, 2, 7, 4, 0, 0, 0, 0, 0};
    put_npy("data/y.npy", 1, "<i4", "(10,)", bad, sizeof bad);
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/y.npy"),
                 "data/y.npy: class id 7 at row 3 is out of range [0, 5)");
    int64_t neg[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, -1};
    put_npy("data/y.npy", 1, "<i8", "(10,)", neg, sizeof neg);
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/y.npy"),
                 "data/y.npy: class id -1 at row 9 is out of range [0, 5)");

    /* mse targets: float, [N, out]. */
    spec_base(&s, 7, 2, LOSS_MSE);
    spec_npy(&s, "data/x.npy", "data/y.npy");
    put_npy("data/y.npy", 1, "<f4", "(10, 3)", x, sizeof x);
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/y.npy"),
                 "data/y.npy: y has 3 columns but model[0].out is 2");
    put_npy("data/y.npy", 1, "<i8", "(5, 2)", neg, sizeof neg);
    m = open_fails(&s, DDPD_EDATA, "data/y.npy");
    CHECK(strstr(m, "mse targets must be float32") != NULL);

    /* Broken header dicts. */
    const char *dicts[] = {
        "{'descr': '<f4', 'fortran_order': False}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 7), 'extra': 1}",
        "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (10, 7)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (10, -7)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 7) junk",
        "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (10,)}",
        "['descr']",
    };
    for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++) {
        unsigned char b[512];
        size_t dl = strlen(dicts[i]);
        memcpy(b, "\x93NUMPY\x01\x00", 8);
        b[8] = (unsigned char)(dl + 1);
        b[9] = 0;
        memcpy(b + 10, dicts[i], dl);
        b[10 + dl] = '\n';
        memset(b + 11 + dl, 0, 300);
        put("data/x.npy", b, 11 + dl + 280);
        m = open_fails(&s, DDPD_EDATA, "data/x.npy");
        CHECK(strstr(m, "header") != NULL || strstr(m, "structured") != NULL);
    }
    /* A header over the cap. */
    unsigned char big[16];
    memcpy(big, "\x93NUMPY\x02\x00\x00\x00\x01\x00", 12); /* 65536 + 0 ... */
    big[8] = 0x70;
    big[9] = 0x11;
    big[10] = 0x01;
    put("data/x.npy", big, 12);
    m = open_fails(&s, DDPD_EDATA, "data/x.npy");
    CHECK(strstr(m, "header too large") != NULL);

    /* A Python 2 style header with long integers still reads. */
    float xs[4] = {1, 2, 3, 4}, ys[4] = {5, 6, 7, 8};
    spec_base(&s, 2, 2, LOSS_MSE);
    spec_npy(&s, "data/x.npy", "data/y.npy");
    put_npy("data/x.npy", 1, "<f4", "(2L, 2L)", xs, sizeof xs);
    put_npy("data/y.npy", 1, "<f4", "(2, 2)", ys, sizeof ys);
    struct dataset *ds = open_ok(&s, 0, 1);
    dataset_free(ds);
}

/* ---- paths ---- */

/* data_path_resolve as the worker calls it for init.from, into real[PATH_MAX]. */
static ddpd_err resolve_from(const char *given, char *real, struct ddpd_error *err)
{
    return data_path_resolve(datadir, "init.from", given, real, PATH_MAX, err);
}

static void test_paths(void)
{
    struct spec s;
    float x[4] = {1, 2, 3, 4};
    spec_base(&s, 2, 2, LOSS_MSE);
    put_npy("data/px.npy", 1, "<f4", "(2, 2)", x, sizeof x);
    put_npy("data/py.npy", 1, "<f4", "(2, 2)", x, sizeof x);

    spec_npy(&s, "data/missing.npy", "data/py.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/missing.npy"), missing_msg("data/missing.npy"));

    spec_npy(&s, "../etc/passwd", "data/py.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_ESPEC, "data.x"), "data.x: \"../etc/passwd\" leaves the data directory");
    spec_npy(&s, "data/px.npy", "data/../../dd/data/py.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_ESPEC, "data.y"),
                 "data.y: \"data/../../dd/data/py.npy\" leaves the data directory");
    spec_npy(&s, "data/..", "data/py.npy");
    open_fails(&s, DDPD_ESPEC, "data.x");
    spec_npy(&s, "/etc/passwd", "data/py.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_ESPEC, "data.x"),
                 "data.x: \"/etc/passwd\" is an absolute path; data paths are relative to the "
                 "data directory");
    spec_npy(&s, "", "data/py.npy");
    open_fails(&s, DDPD_ESPEC, "data.x");
    spec_npy(&s, "data", "data/py.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data"), "data: not a regular file");

    /* A symbolic link out of the data directory, and one that stays inside. */
    char outside[8192], link[8192];
    snprintf(outside, sizeof outside, "%s/outside.npy", root);
    FILE *fp = fopen(outside, "wb");
    fclose(fp);
    snprintf(link, sizeof link, "%s/data/link.npy", datadir);
    CHECK(symlink(outside, link) == 0);
    snprintf(link, sizeof link, "%s/data/rel_link.npy", datadir);
    CHECK(symlink("../../outside.npy", link) == 0);
    snprintf(link, sizeof link, "%s/data/in_link.npy", datadir);
    CHECK(symlink("px.npy", link) == 0);
    spec_npy(&s, "data/link.npy", "data/py.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_ESPEC, "data.x"),
                 "data.x: \"data/link.npy\" leaves the data directory (through a symbolic link)");
    spec_npy(&s, "data/px.npy", "data/rel_link.npy");
    open_fails(&s, DDPD_ESPEC, "data.y");
    spec_csv(&s, "data/link.npy", "y");
    open_fails(&s, DDPD_ESPEC, "data.path");
    spec_npy(&s, "data/in_link.npy", "./data//py.npy");
    struct dataset *ds = open_ok(&s, 0, 1);
    dataset_free(ds);

    /* The data directory itself given through a symbolic link. */
    char ddlink[8192];
    snprintf(ddlink, sizeof ddlink, "%s/ddlink", root);
    CHECK(symlink(datadir, ddlink) == 0);
    struct ddpd_error err = {0};
    ds = dataset_open(&s, ddlink, 0, 1, &err);
    CHECK(ds != NULL);
    dataset_free(ds);
    ds = dataset_open(&s, "/nonexistent-ddpd-dir", 0, 1, &err);
    CHECK(ds == NULL);
    CHECK(strstr(err.message, "/nonexistent-ddpd-dir: data directory: No such file") != NULL);

    /* {rank} tricks: the path is checked after {rank} is replaced, per rank. Rank 0's own
     * files are fine; rank 1's x is a symbolic link out of the data directory; {rank} in
     * front of ".." or an absolute path does not hide them. */
    put_npy("data/rx_0.npy", 1, "<f4", "(2, 2)", x, sizeof x);
    put_npy("data/ry_0.npy", 1, "<f4", "(2, 2)", x, sizeof x);
    put_npy("data/ry_1.npy", 1, "<f4", "(2, 2)", x, sizeof x);
    snprintf(link, sizeof link, "%s/data/rx_1.npy", datadir);
    CHECK(symlink(outside, link) == 0);
    spec_npy(&s, "data/rx_{rank}.npy", "data/ry_{rank}.npy");
    ds = open_ok(&s, 0, 2);
    dataset_free(ds);
    memset(&err, 0, sizeof err);
    ds = dataset_open(&s, datadir, 1, 2, &err);
    CHECK(ds == NULL);
    CHECK_EQ_STR(err.message,
                 "data.x: \"data/rx_{rank}.npy\" leaves the data directory (through a symbolic link)");
    spec_npy(&s, "{rank}/../../outside.npy", "data/ry_{rank}.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_ESPEC, "data.x"),
                 "data.x: \"{rank}/../../outside.npy\" leaves the data directory");
    spec_npy(&s, "data/rx_{rank}.npy", "{rank}/../../etc/passwd");
    open_fails(&s, DDPD_ESPEC, "data.y");
    spec_npy(&s, "/{rank}/x.npy", "data/ry_{rank}.npy");
    CHECK(strstr(open_fails(&s, DDPD_ESPEC, "data.x"), "is an absolute path") != NULL);
    /* {rank} never makes a path longer (6 bytes become at most 4 digits: world <= 1024), so
     * 170 of them still fit; the file name is then the operating system's to refuse. */
    char longp[SPEC_PATH_MAX];
    size_t lp = 0;
    while (lp + 6 < sizeof longp - 1) {
        memcpy(longp + lp, "{rank}", 6);
        lp += 6;
    }
    longp[lp] = '\0';
    spec_npy(&s, longp, "data/ry_{rank}.npy");
    memset(&err, 0, sizeof err);
    ds = dataset_open(&s, datadir, 123, 1000, &err);
    CHECK(ds == NULL);
    CHECK_EQ_STR(ddpd_err_name(err.code), "EDATA");
    CHECK(strstr(err.message, "123123123: cannot open: File name too long") != NULL);

    /* init.from goes through the same check (it used to be joined to the data directory and
     * opened, symbolic links and all). */
    char real[PATH_MAX], given[PATH_MAX + 32], want[PATH_MAX];
    snprintf(given, sizeof given, "%s/data/px.npy", datadir);
    CHECK(realpath(given, want));
    CHECK_EQ_INT(resolve_from("data/in_link.npy", real, &err), DDPD_OK);
    CHECK_EQ_STR(real, want);
    CHECK_EQ_INT(resolve_from("data/link.npy", real, &err), DDPD_ESPEC);
    CHECK_EQ_STR(err.message,
                 "init.from: \"data/link.npy\" leaves the data directory (through a symbolic link)");
    CHECK_EQ_STR(err.path, "init.from");
    CHECK_EQ_INT(resolve_from("data/rel_link.npy", real, &err), DDPD_ESPEC);
    CHECK_EQ_INT(resolve_from("data/../../w.st", real, &err), DDPD_ESPEC);
    CHECK_EQ_INT(resolve_from("/etc/passwd", real, &err), DDPD_ESPEC);
    CHECK_EQ_INT(resolve_from("", real, &err), DDPD_ESPEC);
    CHECK_EQ_INT(resolve_from("data/none.st", real, &err), DDPD_EDATA);
    CHECK_EQ_STR(err.message, missing_msg("data/none.st"));
}

/* Issue 15 item 4: a directory swapped for a symbolic link while the reader opens must
 * never lead outside. A child process exchanges race/sub (a directory holding x.npy, all
 * 1s) and race/alt (a relative link to root/outside_race, whose x.npy is all 999s) as fast
 * as it can, while this process opens race/sub/x.npy `tries` times and reads the rows it
 * got. Resolving first and opening afterwards read the outside file 89 times in 300. */
static void race_run(const char *how, int tries)
{
    struct spec s;
    spec_base(&s, 2, 2, LOSS_MSE);
    spec_npy(&s, "race/sub/x.npy", "data/py.npy");
    int ready[2];
    CHECK(pipe(ready) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        char a[8192], b[8192];
        snprintf(a, sizeof a, "%s/race/sub", datadir);
        snprintf(b, sizeof b, "%s/race/alt", datadir);
        alarm(120); /* a bound of its own, should the parent not end it */
        close(ready[0]);
        for (long i = 0; i < 100000000L; i++) {
            if (renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0)
                _exit(3);
            if (i == 1000 && write(ready[1], "1", 1) != 1)
                _exit(4);
        }
        _exit(0);
    }
    CHECK(pid > 0);
    close(ready[1]);
    char one;
    CHECK(pid > 0 && read(ready[0], &one, 1) == 1); /* it is swapping */
    close(ready[0]);
    /* At least `tries` opens, and on until both outcomes were seen often (at most 200 times
     * the tries, or a minute): a busy machine may run the swapper rarely. */
    int inside = 0, outside = 0, refused = 0, n = 0;
    float x[4], y[4];
    unsigned seed = 15;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (; pid > 0 && n < 200 * tries && (n < tries || inside < tries / 10 || refused < tries / 10); n++) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (n >= tries && t1.tv_sec - t0.tv_sec > 60)
            break;
        /* Back to back first (what found the old window: 64 of 300 read outside); then,
         * should the opens have fallen into step with the swaps (one outcome only), with
         * random pauses until both outcomes were met. */
        if (n >= tries) {
            struct timespec pause = {0, (long)(rand_r(&seed) % 50000)};
            nanosleep(&pause, NULL);
        }
        struct ddpd_error err = {0};
        struct dataset *ds = dataset_open(&s, datadir, 0, 1, &err);
        if (!ds) {
            refused++;
            /* the link is refused as leaving, or the name is briefly a link's */
            CHECK(err.code == DDPD_ESPEC || err.code == DDPD_EDATA);
            continue;
        }
        dataset_set_epoch(ds, 0);
        CHECK_EQ_INT(dataset_batch(ds, 0, x, y, NULL), 2);
        if (x[0] == 999.0f)
            outside++;
        else
            inside++;
        dataset_free(ds);
    }
    int status = 0;
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        CHECK(WIFSIGNALED(status)); /* it was still swapping: every exchange worked */
    }
    /* Leave race/sub the directory and race/alt the link, whichever they were at the end. */
    char a[8192], b[8192];
    struct stat st;
    snprintf(a, sizeof a, "%s/race/sub", datadir);
    snprintf(b, sizeof b, "%s/race/alt", datadir);
    if (lstat(a, &st) == 0 && S_ISLNK(st.st_mode))
        CHECK(renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0);
    fprintf(stderr, "  %s: %d opens while swapping: %d inside, %d refused, %d outside\n", how, n, inside,
            refused, outside);
    CHECK_EQ_INT(outside, 0);
    CHECK(inside > 0 && refused > 0); /* the race was run: both states were met */
}

static void test_confinement_race(void)
{
    float ones[4] = {1, 1, 1, 1}, far[4] = {999, 999, 999, 999};
    char p[8192];
    snprintf(p, sizeof p, "%s/race", datadir);
    CHECK(mkdir(p, 0755) == 0);
    snprintf(p, sizeof p, "%s/race/sub", datadir);
    CHECK(mkdir(p, 0755) == 0);
    snprintf(p, sizeof p, "%s/outside_race", root);
    CHECK(mkdir(p, 0755) == 0);
    put_npy("race/sub/x.npy", 1, "<f4", "(2, 2)", ones, sizeof ones);
    put_npy("../outside_race/x.npy", 1, "<f4", "(2, 2)", far, sizeof far);
    put_npy("data/py.npy", 1, "<f4", "(2, 2)", ones, sizeof ones);
    snprintf(p, sizeof p, "%s/race/alt", datadir);
    CHECK(symlink("../../outside_race", p) == 0);
    /* Outside the race: the link is refused, the directory read. */
    struct spec s;
    spec_base(&s, 2, 2, LOSS_MSE);
    spec_npy(&s, "race/alt/x.npy", "data/py.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_ESPEC, "data.x"),
                 "data.x: \"race/alt/x.npy\" leaves the data directory (through a symbolic link)");

    race_run("openat2", 1000);
    setenv("DDPD_NO_OPENAT2", "1", 1); /* the walk used where the kernel has no openat2 */
    race_run("O_NOFOLLOW walk", 1000);
    spec_npy(&s, "race/alt/x.npy", "data/py.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_ESPEC, "data.x"),
                 "data.x: \"race/alt/x.npy\" leaves the data directory (through a symbolic link)");
    unsetenv("DDPD_NO_OPENAT2");
}

/* Issue 15 item 4: a FIFO (or a device) named as a data file used to block the open until
 * a writer came (the planner of a POST, or a rank, hung); it is refused at once, by the
 * ranks and by the batch counts the server asks for at submit. */
static void test_special_files(void)
{
    char p[8192];
    float ones[4] = {1, 1, 1, 1};
    put_npy("data/py.npy", 1, "<f4", "(2, 2)", ones, sizeof ones);
    snprintf(p, sizeof p, "%s/data/fifo.npy", datadir);
    CHECK(mkfifo(p, 0600) == 0);
    snprintf(p, sizeof p, "%s/data/fifo.csv", datadir);
    CHECK(mkfifo(p, 0600) == 0);
    alarm(60); /* the old open blocked for ever: fail by the alarm rather than hang */
    for (int walk = 0; walk < 2; walk++) {
        if (walk)
            setenv("DDPD_NO_OPENAT2", "1", 1);
        struct spec s;
        spec_base(&s, 2, 2, LOSS_MSE);
        spec_npy(&s, "data/fifo.npy", "data/py.npy");
        CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/fifo.npy"),
                     "data/fifo.npy: not a regular file (a FIFO)");
        spec_csv(&s, "data/fifo.csv", "y");
        CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/fifo.csv"),
                     "data/fifo.csv: not a regular file (a FIFO)");
        int64_t counts[2];
        struct ddpd_error err = {0};
        CHECK_EQ_INT(dataset_batch_counts(&s, datadir, 2, counts, &err), DDPD_EDATA);
        CHECK(strstr(err.message, "a FIFO") != NULL);
        CHECK_EQ_INT(data_path_open(datadir, "init.from", "data/fifo.npy", &err), -1);
        CHECK(strstr(err.message, "not a regular file (a FIFO)") != NULL);
        /* a character device, where this user may make one (root) */
        snprintf(p, sizeof p, "%s/data/null.npy", datadir);
        if (walk == 0 && mknod(p, S_IFCHR | 0600, makedev(1, 3)) == 0) {
            spec_npy(&s, "data/null.npy", "data/py.npy");
            CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/null.npy"),
                         "data/null.npy: not a regular file (a device)");
        }
        unsetenv("DDPD_NO_OPENAT2");
    }
    alarm(0);
    /* a descriptor for a regular file, which the reader of init.from reads */
    struct ddpd_error err = {0};
    int fd = data_path_open(datadir, "init.from", "data/py.npy", &err);
    CHECK(fd >= 0);
    char magic[6] = {0};
    CHECK(fd >= 0 && pread(fd, magic, 6, 0) == 6 && !memcmp(magic, "\x93NUMPY", 6));
    if (fd >= 0)
        close(fd);
}

/* ---- CSV ---- */

static void test_csv(void)
{
    struct spec s;
    /* The target sits between inputs; quotes, "" escapes, CRLF, blank lines, spaces around
     * numbers and a missing final newline are all fine. */
    put_str("data/train.csv", "\"a\",y,\"b \"\"q\"\"\"\r\n"
                              "1,2,3\r\n"
                              "\"4.5\", -5e-1 ,6\n"
                              "\n"
                              "7,8,\"9\"");
    spec_base(&s, 2, 1, LOSS_MSE);
    spec_csv(&s, "data/train.csv", "y");
    s.batch_size = 4;
    struct dataset *ds = open_ok(&s, 0, 1);
    if (ds) {
        float bx[8], by[4];
        CHECK_EQ_INT(dataset_shard_size(ds), 3);
        CHECK_EQ_INT(dataset_batch(ds, 0, bx, by, NULL), 3);
        const float wx[6] = {1, 3, 4.5f, 6, 7, 9}, wy[3] = {2, -0.5f, 8};
        CHECK(memcmp(bx, wx, sizeof wx) == 0);
        CHECK(memcmp(by, wy, sizeof wy) == 0);
    }
    dataset_free(ds);
    /* A target named with quotes in the header. */
    spec_csv(&s, "data/train.csv", "b \"q\"");
    ds = open_ok(&s, 0, 1);
    if (ds) {
        float bx[8], by[4];
        dataset_batch(ds, 0, bx, by, NULL);
        CHECK(bx[0] == 1 && bx[1] == 2 && by[0] == 3 && by[2] == 9);
    }
    dataset_free(ds);

    /* A UTF-8 byte order mark before the header is skipped. */
    put_str("data/bom.csv", "\xef\xbb\xbfy,a,b\n1,2,3\n");
    spec_csv(&s, "data/bom.csv", "y");
    ds = open_ok(&s, 0, 1);
    if (ds) {
        float bx[2], by[1];
        CHECK_EQ_INT(dataset_batch(ds, 0, bx, by, NULL), 1);
        CHECK(by[0] == 1 && bx[0] == 2 && bx[1] == 3);
    }
    dataset_free(ds);

    /* Several targets for mse, in the spec's order. */
    put_str("data/multi.csv", "t2,x,t1\n1,2,3\n4,5,6\n");
    spec_base(&s, 1, 2, LOSS_MSE);
    spec_csv(&s, "data/multi.csv", "t1");
    s.data.n_targets = 2;
    snprintf(s.data.targets[1], sizeof s.data.targets[1], "t2");
    ds = open_ok(&s, 0, 1);
    if (ds) {
        float bx[2], by[4];
        CHECK_EQ_INT(dataset_batch(ds, 0, bx, by, NULL), 2);
        CHECK(bx[0] == 2 && bx[1] == 5);
        CHECK(by[0] == 3 && by[1] == 1 && by[2] == 6 && by[3] == 4);
    }
    dataset_free(ds);

    /* Class ids, and batch counts from a CSV. */
    put_str("data/cls.csv", "f1,f2,label\n0.5,1,2\n1.5,2,0\n2.5,3,1.0\n3.5,4,2\n4.5,5,1\n");
    spec_base(&s, 2, 3, LOSS_CROSS_ENTROPY);
    spec_csv(&s, "data/cls.csv", "label");
    s.batch_size = 2;
    int64_t counts[2];
    struct ddpd_error err = {0};
    CHECK_EQ_INT(dataset_batch_counts(&s, datadir, 2, counts, &err), DDPD_OK);
    CHECK_EQ_INT(counts[0], 2); /* rows 0, 2, 4 */
    CHECK_EQ_INT(counts[1], 1); /* rows 1, 3 */
    ds = open_ok(&s, 1, 2);
    if (ds) {
        float bx[4];
        int32_t bl[2];
        CHECK_EQ_INT(dataset_batches(ds), counts[1]);
        CHECK_EQ_INT(dataset_batch(ds, 0, bx, NULL, bl), 2);
        CHECK(bx[0] == 1.5f && bx[2] == 3.5f);
        CHECK_EQ_INT(bl[0], 0);
        CHECK_EQ_INT(bl[1], 2);
    }
    dataset_free(ds);
}

static const char *csv_fails(const char *text, const char *target, loss_kind loss, int64_t in, int64_t out,
                             ddpd_err code, const char *path)
{
    struct spec s;
    put_str("data/bad.csv", text);
    spec_base(&s, in, out, loss);
    spec_csv(&s, "data/bad.csv", target);
    return open_fails(&s, code, path);
}

static void test_csv_errors(void)
{
    const char *m;
    const char *P = "data/bad.csv";
    struct ddpd_error err = {0};
    struct spec s;

    m = csv_fails("x1,x2,x3,y\n1,2,3,4\n1,2,3,4\n1,2,3,4\n1,2,abc,4\n", "y", LOSS_MSE, 3, 1, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: line 5, column \"x3\": \"abc\" is not a number");
    /* The line and column are also in the error's fields. */
    spec_base(&s, 3, 1, LOSS_MSE);
    spec_csv(&s, P, "y");
    CHECK(dataset_open(&s, datadir, 0, 1, &err) == NULL);
    CHECK_EQ_INT(err.line, 5);
    CHECK_EQ_INT(err.column, 3);
    put_str(P, "x1,y\n1,2\n3\n");
    spec_base(&s, 1, 1, LOSS_MSE);
    spec_csv(&s, P, "y");
    CHECK(dataset_open(&s, datadir, 0, 1, &err) == NULL);
    CHECK_EQ_INT(err.line, 3);
    CHECK_EQ_INT(err.column, 0);

    m = csv_fails("a,b,y\n1,,3\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: line 2, column \"b\": empty cell");
    m = csv_fails("a,b,y\n1,\"  \",3\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK(strstr(m, "empty cell") != NULL);
    m = csv_fails("a,b,y\n1,0x10,3\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK(strstr(m, "\"0x10\" is not a number") != NULL);
    m = csv_fails("a,b,y\n1,2 3,3\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK(strstr(m, "\"2 3\" is not a number") != NULL);
    m = csv_fails("a,b,y\n1,1e999,3\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK(strstr(m, "out of range") != NULL);
    m = csv_fails("a,b,y\n1,2,3\n", "label", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: no column named \"label\" (the target) in the header");
    m = csv_fails("a,b,y\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: no data rows after the header");
    m = csv_fails("", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: empty file (a header row is needed)");
    m = csv_fails("a,b,y\n1,2,3\n4,5\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: line 3 has 2 fields but the header has 3");
    m = csv_fails("a,b,y\n1,2,3,4\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK(strstr(m, "line 2 has more fields") != NULL);
    m = csv_fails("a,b,y\n1,\"2,3\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK(strstr(m, "line 2: quoted field is never closed") != NULL);
    m = csv_fails("a,b,y\n1,\"2\"x,3\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK(strstr(m, "after a closing quote") != NULL);
    m = csv_fails("a,b,y\n1,2\",3\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK(strstr(m, "quote inside an unquoted field") != NULL);
    m = csv_fails("a,b,c,y\n1,2,3,4\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: 3 input columns (all but the target) but model[0].in is 2");
    /* Header names are distinct, the target's and the inputs' alike (issue 28): the first
     * repeat is named with the column it repeats, quoted or not, however long. */
    m = csv_fails("a,y,y\n1,2,3\n", "y", LOSS_MSE, 1, 1, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: line 1 (the header): columns 2 and 3 are both named \"y\"; the header's "
                    "names must be distinct");
    m = csv_fails("\n\nb,a,\"b\",c,a,y\n1,2,3,4,5,6\n", "y", LOSS_MSE, 5, 1, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: line 3 (the header): columns 1 and 3 are both named \"b\"; the header's "
                    "names must be distinct");
    m = csv_fails("x,\"q\"\"\",y,\"q\"\"\"\n1,2,3,4\n", "y", LOSS_MSE, 3, 1, DDPD_EDATA, P);
    CHECK(strstr(m, "columns 2 and 4 are both named \"q\"\"") != NULL);
    {
        /* Two 300-byte names that differ only in their last byte are distinct. */
        char text[1024];
        int o = snprintf(text, sizeof text, "%0300d,%0299d1,y\n1,2,3\n", 0, 0);
        CHECK(o > 0 && (size_t)o < sizeof text);
        put_str(P, text);
        spec_base(&s, 2, 1, LOSS_MSE);
        spec_csv(&s, P, "y");
        struct dataset *ok = open_ok(&s, 0, 1);
        dataset_free(ok);
        text[299] = '1'; /* now the same */
        m = csv_fails(text, "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
        CHECK(strstr(m, "columns 1 and 2 are both named \"0000") != NULL && strstr(m, "...\"") != NULL);
    }
    /* Cells strtod reads as NaN, infinity or past float32's range (issue 28): the job would
     * die at the first step that reads one. The line, the column's number and name. */
    static const char *const nonfinite[] = {"nan",  "NaN",       "-nan",     "+NAN",    "nan(12)", "inf",
                                            "-Inf", "+INFINITY", "infinity", " -inf  ", "\"inf\""};
    for (size_t i = 0; i < sizeof nonfinite / sizeof nonfinite[0]; i++) {
        char text[128];
        snprintf(text, sizeof text, "a,b,y\n1,2,3\n1,%s,3\n", nonfinite[i]);
        m = csv_fails(text, "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
        CHECK(strstr(m, "data/bad.csv: line 3, column 2 (\"b\"): \"") != NULL);
        CHECK(strstr(m, "is not a finite number") != NULL);
    }
    m = csv_fails("a,b,y\n1,2,3\n1,2,-inf\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: line 3, column 3 (\"y\"): \"-inf\" is not a finite number (NaN and "
                    "infinity make the loss NaN at the first step that reads them)");
    m = csv_fails("a,c\n1,0\n2,nan\n", "c", LOSS_CROSS_ENTROPY, 1, 3, DDPD_EDATA, P);
    CHECK(strstr(m, "line 3, column 2 (\"c\"): \"nan\" is not a finite number") != NULL);
    m = csv_fails("a,b,y\n1,-1e39,3\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: line 2, column 2 (\"b\"): \"-1e39\" is beyond float32's range (about "
                    "3.4e38), so it would be infinity");
    /* The largest float32 and what rounds to it stay numbers, as do tiny ones. */
    put_str(P, "a,b,y\n3.4028234e38,-3.40282356e38,1e-999\n");
    spec_base(&s, 2, 1, LOSS_MSE);
    spec_csv(&s, P, "y");
    dataset_free(open_ok(&s, 0, 1));
    /* The planner's check sees them too, reading every cell of the file. */
    put_str(P, "a,b,y\n1,2,3\n1,2,3\n1,2,3\n1,2,3\n1,2,3\n1,2,3\n1,Infinity,3\n");
    {
        int64_t rows = 0, bytes = 0;
        CHECK_EQ_INT(dataset_check(&s, datadir, 1, &rows, &bytes, &err), DDPD_EDATA);
        CHECK(strstr(err.message, "line 8, column 2 (\"b\"): \"Infinity\" is not a finite number") != NULL);
        CHECK_EQ_INT(err.line, 8);
        CHECK_EQ_INT(err.column, 2);
    }
    /* A quoted newline counts for the line numbers after it. */
    m = csv_fails("\"a\nz\",b,y\n1,2,3\n1,x,3\n", "y", LOSS_MSE, 2, 1, DDPD_EDATA, P);
    CHECK(strstr(m, "line 4, column \"b\": \"x\" is not a number") != NULL);

    /* Class ids. */
    m = csv_fails("a,c\n1,0\n2,1.5\n", "c", LOSS_CROSS_ENTROPY, 1, 3, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: line 3, column \"c\": class id 1.5 is not an integer");
    m = csv_fails("a,c\n1,0\n2,3\n", "c", LOSS_CROSS_ENTROPY, 1, 3, DDPD_EDATA, P);
    CHECK_EQ_STR(m, "data/bad.csv: line 3, column \"c\": class id 3 is out of range [0, 3)");
    m = csv_fails("a,c\n1,-1\n", "c", LOSS_CROSS_ENTROPY, 1, 3, DDPD_EDATA, P);
    CHECK(strstr(m, "class id -1 is out of range") != NULL);

    /* Target lists that cannot fit the model. */
    put_str("data/bad.csv", "a,b,c\n1,2,3\n");
    spec_base(&s, 1, 3, LOSS_CROSS_ENTROPY);
    spec_csv(&s, P, "b");
    s.data.n_targets = 2;
    snprintf(s.data.targets[1], sizeof s.data.targets[1], "c");
    m = open_fails(&s, DDPD_ESPEC, "data.target");
    CHECK(strstr(m, "exactly one target column") != NULL);
    s.loss = LOSS_MSE;
    m = open_fails(&s, DDPD_ESPEC, "data.target");
    CHECK(strstr(m, "2 target column(s) but model[0].out is 3") != NULL);
    s.layers[0].out = 2;
    snprintf(s.data.targets[1], sizeof s.data.targets[1], "b");
    m = open_fails(&s, DDPD_ESPEC, "data.target");
    CHECK(strstr(m, "\"b\" is named twice") != NULL);

    /* The batch counts see the same errors as the ranks would. */
    put_str("data/bad.csv", "a,y\n1,2\n3\n");
    spec_base(&s, 1, 1, LOSS_MSE);
    spec_csv(&s, P, "y");
    int64_t counts[1];
    CHECK_EQ_INT(dataset_batch_counts(&s, datadir, 1, counts, &err), DDPD_EDATA);
    CHECK(strstr(err.message, "line 3 has 1 fields") != NULL);
}

/* ---- synthetic ---- */

static void spec_synth(struct spec *s, loss_kind loss, int64_t samples, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->world_size = 1;
    s->n_layers = 5;
    s->layers[0] = (struct spec_layer){.kind = LAYER_LINEAR, .in = 4, .out = 8, .bias = true};
    s->layers[1] = (struct spec_layer){.kind = LAYER_GELU, .in = 8, .out = 8, .bias = false};
    s->layers[2] = (struct spec_layer){.kind = LAYER_LINEAR, .in = 8, .out = 6, .bias = false};
    s->layers[3] = (struct spec_layer){.kind = LAYER_TANH, .in = 6, .out = 6, .bias = false};
    s->layers[4] = (struct spec_layer){.kind = LAYER_LINEAR, .in = 6, .out = 3, .bias = true};
    spec_flat_layers(s);
    s->loss = loss;
    s->batch_size = 7;
    s->data.kind = DATA_SYNTHETIC;
    s->data.samples = samples;
    s->data.seed = seed;
}

/* All rows of an epoch of a rank: x [n,4], y [n,3] or labels [n]. */
static int64_t synth_rows(struct dataset *ds, float *x, float *y, int32_t *l)
{
    int64_t n = 0;
    for (int64_t b = 0; b < dataset_batches(ds); b++)
        n += dataset_batch(ds, b, x + n * 4, y ? y + n * 3 : NULL, l ? l + n : NULL);
    return n;
}

static void test_synthetic(void)
{
    struct spec s;
    enum { N = 300 };
    static float x1[N * 4], y1[N * 3], x2[N * 4], y2[N * 3], xr[N * 4], yr[N * 3];
    spec_synth(&s, LOSS_MSE, N, 7);
    struct dataset *a = open_ok(&s, 0, 1), *b = open_ok(&s, 0, 1);
    if (!a || !b)
        return;
    CHECK_EQ_INT(synth_rows(a, x1, y1, NULL), N);
    CHECK_EQ_INT(synth_rows(b, x2, y2, NULL), N);
    CHECK(memcmp(x1, x2, sizeof x1) == 0);
    CHECK(memcmp(y1, y2, sizeof y1) == 0);
    dataset_free(b);
    /* Inputs look like N(0,1); targets are finite and not constant. */
    double mean = 0, var = 0;
    for (int i = 0; i < N * 4; i++)
        mean += x1[i];
    mean /= N * 4;
    for (int i = 0; i < N * 4; i++)
        var += (x1[i] - mean) * (x1[i] - mean);
    var /= N * 4;
    CHECK_NEAR(mean, 0, 0.15, 0);
    CHECK_NEAR(var, 1, 0.2, 0);
    bool finite = true, varied = false;
    for (int i = 0; i < N * 3; i++) {
        finite &= isfinite(y1[i]);
        varied |= y1[i] != y1[0];
    }
    CHECK(finite && varied);

    /* Without shuffling, rank r of W holds rows r, r+W, ... of the whole set. */
    for (int W = 2; W <= 3; W++)
        for (int r = 0; r < W; r++) {
            struct dataset *ds = open_ok(&s, r, W);
            if (!ds)
                continue;
            int64_t n = synth_rows(ds, xr, yr, NULL);
            CHECK_EQ_INT(n, (N - r + W - 1) / W);
            bool same = true;
            for (int64_t k = 0; k < n; k++) {
                same &= memcmp(xr + k * 4, x1 + (r + k * W) * 4, 4 * sizeof(float)) == 0;
                same &= memcmp(yr + k * 3, y1 + (r + k * W) * 3, 3 * sizeof(float)) == 0;
            }
            CHECK(same);
            dataset_free(ds);
        }

    /* With shuffling, ranks agree on which row is which: every row a rank sees is
     * row i of the unshuffled set for some i, and together they see each once. */
    s.data.shuffle = true;
    int seen[N] = {0};
    for (int r = 0; r < 2; r++) {
        struct dataset *ds = open_ok(&s, r, 2);
        if (!ds)
            continue;
        dataset_set_epoch(ds, 4);
        int64_t n = synth_rows(ds, xr, yr, NULL);
        CHECK_EQ_INT(n, N / 2);
        for (int64_t k = 0; k < n; k++) {
            int found = -1;
            for (int i = 0; i < N && found < 0; i++)
                if (memcmp(xr + k * 4, x1 + i * 4, 4 * sizeof(float)) == 0 &&
                    memcmp(yr + k * 3, y1 + i * 3, 3 * sizeof(float)) == 0)
                    found = i;
            CHECK(found >= 0);
            if (found >= 0)
                seen[found]++;
        }
        dataset_free(ds);
    }
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(seen[i], 1);

    /* Another seed, other data; a prefix of a larger set is the smaller set. */
    s.data.shuffle = false;
    s.data.seed = 8;
    b = open_ok(&s, 0, 1);
    if (b) {
        synth_rows(b, x2, y2, NULL);
        CHECK(memcmp(x1, x2, sizeof x1) != 0);
    }
    dataset_free(b);
    s.data.seed = 7;
    s.data.samples = 100;
    b = open_ok(&s, 0, 1);
    if (b) {
        CHECK_EQ_INT(synth_rows(b, x2, y2, NULL), 100);
        CHECK(memcmp(x1, x2, 100 * 4 * sizeof(float)) == 0);
    }
    dataset_free(b);
    dataset_free(a);

    /* Class labels: argmax of the teacher, in range, more than one class used. */
    static int32_t l1[N];
    spec_synth(&s, LOSS_CROSS_ENTROPY, N, 7);
    s.layers[1].kind = LAYER_RELU;
    s.layers[3].kind = LAYER_SIGMOID;
    a = open_ok(&s, 0, 1);
    if (a) {
        CHECK_EQ_INT(synth_rows(a, x1, NULL, l1), N);
        int counts[3] = {0};
        bool in_range = true;
        for (int i = 0; i < N; i++) {
            in_range &= l1[i] >= 0 && l1[i] < 3;
            if (l1[i] >= 0 && l1[i] < 3)
                counts[l1[i]]++;
        }
        CHECK(in_range);
        /* Centred logits: no class is starved, even after a sigmoid. */
        for (int c = 0; c < 3; c++)
            CHECK(counts[c] >= N / 10);
    }
    dataset_free(a);

    /* Batch counts from the spec alone. */
    int64_t counts[4];
    struct ddpd_error err = {0};
    spec_synth(&s, LOSS_MSE, 3000, 1);
    s.batch_size = 3;
    CHECK_EQ_INT(dataset_batch_counts(&s, NULL, 4, counts, &err), DDPD_OK);
    for (int r = 0; r < 4; r++)
        CHECK_EQ_INT(counts[r], 250);
    s.data.samples = 3001;
    s.data.drop_last = true;
    CHECK_EQ_INT(dataset_batch_counts(&s, NULL, 4, counts, &err), DDPD_OK);
    CHECK_EQ_INT(counts[0], 250); /* 751 rows */
    s.data.drop_last = false;
    CHECK_EQ_INT(dataset_batch_counts(&s, NULL, 4, counts, &err), DDPD_OK);
    CHECK_EQ_INT(counts[0], 251);
    CHECK_EQ_INT(counts[1], 250);
    for (int r = 0; r < 2; r++) {
        struct dataset *ds = open_ok(&s, r, 4);
        if (ds)
            CHECK_EQ_INT(dataset_batches(ds), counts[r]);
        dataset_free(ds);
    }
    s.data.samples = 0;
    CHECK_EQ_INT(dataset_batch_counts(&s, NULL, 4, counts, &err), DDPD_ESPEC);
    CHECK_EQ_STR(err.path, "data.samples");
    open_fails(&s, DDPD_ESPEC, "data.samples");
    s.data.samples = INT64_MAX / 4;
    const char *m = open_fails(&s, DDPD_ESPEC, "data.samples");
    CHECK(strstr(m, "too large") != NULL);
}

static void test_batch_counts_npy(void)
{
    struct spec s;
    put_ids("data/bc_x.npy", "data/bc_y.npy", 17, 0);
    spec_base(&s, 2, 1, LOSS_MSE);
    spec_npy(&s, "data/bc_x.npy", "data/bc_y.npy");
    s.batch_size = 4;
    int64_t counts[3];
    struct ddpd_error err = {0};
    for (int drop = 0; drop < 2; drop++) {
        s.data.drop_last = drop;
        CHECK_EQ_INT(dataset_batch_counts(&s, datadir, 3, counts, &err), DDPD_OK);
        for (int r = 0; r < 3; r++) {
            struct dataset *ds = open_ok(&s, r, 3);
            if (ds)
                CHECK_EQ_INT(dataset_batches(ds), counts[r]);
            dataset_free(ds);
        }
    }
    CHECK_EQ_INT(counts[0], 1); /* 6 rows, drop_last */
    /* Errors in the headers show up before the ranks start. */
    spec_npy(&s, "data/bc_x.npy", "data/nope.npy");
    CHECK_EQ_INT(dataset_batch_counts(&s, datadir, 3, counts, &err), DDPD_EDATA);
    CHECK_EQ_STR(err.path, "data/nope.npy");
    spec_npy(&s, "../bc_x.npy", "data/bc_y.npy");
    CHECK_EQ_INT(dataset_batch_counts(&s, datadir, 3, counts, &err), DDPD_ESPEC);
    CHECK_EQ_STR(err.path, "data.x");
}

/* A batch_size near INT64_MAX: a batch is the whole shard, the buffers a caller sizes by
 * spec_batch_rows hold it, and batch indices past the end are empty, with no overflow of
 * b * batch_size (signed overflow, UB, before). Synthetic, npy and drop_last. */
static void test_huge_batch(void)
{
    struct spec s;
    const int64_t huge[] = {4611686018427387904LL, INT64_MAX - 1, INT64_MAX};
    put_ids("data/hb_x.npy", "data/hb_y.npy", 7, 0);
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        for (int kind = 0; kind < 2; kind++) {
            spec_base(&s, 2, 1, LOSS_MSE);
            if (kind == 0) {
                s.data.kind = DATA_SYNTHETIC;
                s.data.samples = 7;
            } else {
                spec_npy(&s, "data/hb_x.npy", "data/hb_y.npy");
            }
            s.batch_size = huge[i];
            struct dataset *ds = open_ok(&s, 0, 1);
            if (!ds)
                continue;
            const int64_t rows = spec_batch_rows(&s, dataset_shard_size(ds));
            CHECK_EQ_INT(rows, 7);
            CHECK_EQ_INT(dataset_batches(ds), 1);
            float *x = malloc((size_t)rows * 2 * sizeof(float)), *y = malloc((size_t)rows * sizeof(float));
            CHECK_EQ_INT(dataset_batch(ds, 0, x, y, NULL), 7);
            CHECK_EQ_INT(dataset_batch(ds, 1, x, y, NULL), 0);
            CHECK_EQ_INT(dataset_batch(ds, 2, x, y, NULL), 0);
            CHECK_EQ_INT(dataset_batch(ds, INT64_MAX, x, y, NULL), 0);
            free(x);
            free(y);
            dataset_free(ds);
            s.data.drop_last = true;
            ds = open_ok(&s, 0, 1);
            if (ds)
                CHECK_EQ_INT(dataset_batches(ds), 0);
            dataset_free(ds);
        }
    }
}

/* dataset_check, the planner's look at the data before a job is accepted: rows from the
 * headers, and the values a rank would otherwise die of (class ids, CSV cells). */
static void test_check(void)
{
    struct spec s;
    struct ddpd_error err = {0};
    int64_t rows = -1, bytes = -1;
    float x[5 * 2] = {0};
    int64_t ids[5] = {0, 2, 1, 2, 0}, bad[5] = {0, 2, 1, 3, 0};
    int32_t neg[5] = {0, 1, -1, 1, 0};
    put_npy("data/ck_x.npy", 1, "<f4", "(5, 2)", x, sizeof x);
    put_npy("data/ck_y.npy", 1, "<i8", "(5,)", ids, sizeof ids);
    put_npy("data/ck_bad.npy", 1, "<i8", "(5,)", bad, sizeof bad);
    put_npy("data/ck_neg.npy", 1, "<i4", "(5,)", neg, sizeof neg);
    spec_base(&s, 2, 3, LOSS_CROSS_ENTROPY);
    spec_npy(&s, "data/ck_x.npy", "data/ck_y.npy");
    CHECK_EQ_INT(dataset_check(&s, datadir, 2, &rows, &bytes, &err), DDPD_OK);
    CHECK_EQ_INT(rows, 5);
    CHECK_EQ_INT(bytes, 0);
    spec_npy(&s, "data/ck_x.npy", "data/ck_bad.npy");
    CHECK_EQ_INT(dataset_check(&s, datadir, 2, &rows, &bytes, &err), DDPD_EDATA);
    CHECK_EQ_STR(err.path, "data/ck_bad.npy");
    CHECK(strstr(err.message, "class id 3 at row 3 is out of range [0, 3)") != NULL);
    /* The headers alone (the batch counts) do not read the values. */
    int64_t counts[2];
    CHECK_EQ_INT(dataset_batch_counts(&s, datadir, 2, counts, &err), DDPD_OK);
    spec_npy(&s, "data/ck_x.npy", "data/ck_neg.npy");
    CHECK_EQ_INT(dataset_check(&s, datadir, 1, &rows, &bytes, &err), DDPD_EDATA);
    CHECK(strstr(err.message, "class id -1 at row 2") != NULL);
    /* {rank} files are the ranks' business. */
    spec_npy(&s, "data/ck_x{rank}.npy", "data/ck_y{rank}.npy");
    CHECK_EQ_INT(dataset_check(&s, datadir, 2, &rows, &bytes, &err), DDPD_ENOTFOUND);

    /* CSV: every cell is read; the file's size is reported (a rank reads it whole). */
    const char *good = "a,b,label\n1,2,0\n3,4,2\n";
    put_str("data/ck.csv", good);
    put_str("data/ck_bad.csv", "a,b,label\n1,2,0\n3,4,7\n");
    put_str("data/ck_text.csv", "a,b,label\n1,2,0\n3,x,1\n");
    spec_csv(&s, "data/ck.csv", "label");
    CHECK_EQ_INT(dataset_check(&s, datadir, 1, &rows, &bytes, &err), DDPD_OK);
    CHECK_EQ_INT(rows, 2);
    CHECK_EQ_INT(bytes, (int64_t)strlen(good));
    spec_csv(&s, "data/ck_bad.csv", "label");
    CHECK_EQ_INT(dataset_check(&s, datadir, 1, &rows, &bytes, &err), DDPD_EDATA);
    CHECK(strstr(err.message, "line 3, column \"label\": class id 7 is out of range [0, 3)") != NULL);
    spec_csv(&s, "data/ck_text.csv", "label");
    CHECK_EQ_INT(dataset_check(&s, datadir, 1, &rows, &bytes, &err), DDPD_EDATA);
    CHECK(strstr(err.message, "line 3, column \"b\": \"x\" is not a number") != NULL);

    /* Synthetic: the spec's samples, nothing read. */
    spec_base(&s, 2, 3, LOSS_CROSS_ENTROPY);
    s.data.kind = DATA_SYNTHETIC;
    s.data.samples = INT64_MAX;
    CHECK_EQ_INT(dataset_check(&s, datadir, 1024, &rows, &bytes, &err), DDPD_OK);
    CHECK_EQ_INT(rows, INT64_MAX);
}

/* ---- v2 (CONTRACT.md §2a): token ids, samples of any shape, tokens files ---- */

/* embedding(vocab, 4) on [T] ids, then linear 4 -> classes on the last dimension: samples
 * are [T] ids, targets [T] class ids (cross_entropy) or [T, classes] floats (mse). The
 * shapes are filled in as the validator would. */
static void spec_ids(struct spec *s, int64_t T, int64_t vocab, int64_t classes, loss_kind loss)
{
    memset(s, 0, sizeof *s);
    s->world_size = 1;
    s->n_layers = 2;
    s->layers[0] = (struct spec_layer){.kind = LAYER_EMBEDDING,
                                       .parent = -1,
                                       .end = 1,
                                       .key = "0",
                                       .num = vocab,
                                       .dim = 4,
                                       .in_rank = 1,
                                       .in_shape = {T},
                                       .out_rank = 2,
                                       .out_shape = {T, 4},
                                       .tie = -1};
    s->layers[1] = (struct spec_layer){.kind = LAYER_LINEAR,
                                       .parent = -1,
                                       .end = 2,
                                       .key = "1",
                                       .in = 4,
                                       .out = classes,
                                       .bias = true,
                                       .in_rank = 2,
                                       .in_shape = {T, 4},
                                       .out_rank = 2,
                                       .out_shape = {T, classes},
                                       .tie = -1};
    s->input_rank = 1;
    s->input_shape[0] = T;
    s->input_shape_set = true;
    s->loss = loss;
    s->batch_size = 2;
    s->epochs = 1;
    s->grad_accum = 1;
    s->data.shuffle = false;
}

static void spec_tokens(struct spec *s, const char *path, int64_t T, tokens_dtype dtype)
{
    s->data.kind = DATA_TOKENS;
    snprintf(s->data.path, sizeof s->data.path, "%s", path);
    s->data.block_size = T;
    s->data.dtype = dtype;
}

/* A tokens file of n ids, ids[k] = k % mod (+ `bad` at token `at` when at >= 0). */
static void put_tokens(const char *rel, tokens_dtype dtype, int64_t n, int64_t mod, int64_t at, int64_t bad)
{
    int w = dtype == TOKENS_INT32 ? 4 : 2;
    unsigned char *b = malloc((size_t)(n * w) + 1);
    for (int64_t k = 0; k < n; k++) {
        int64_t v = k == at ? bad : k % mod;
        for (int i = 0; i < w; i++)
            b[k * w + i] = (unsigned char)((uint64_t)v >> (8 * i));
    }
    put(rel, b, (size_t)(n * w));
    free(b);
}

/* dataset_check must fail with EDATA naming `file`, with `msg` as the message. */
static void check_fails(const struct spec *s, const char *file, const char *msg)
{
    struct ddpd_error err = {0};
    int64_t rows = -1, bytes = -1;
    CHECK_EQ_INT(dataset_check(s, datadir, 1, &rows, &bytes, &err), DDPD_EDATA);
    CHECK_EQ_STR(err.path, file);
    CHECK_EQ_STR(err.message, msg);
}

/* Windows and shards exactly as §2a: sample i is x = ids[iT : iT+T], y = ids[iT+1 :
 * iT+T+1], for i < (n-1)/T; rank r of W takes samples r, r+W, ... . */
static void test_tokens_windows(void)
{
    struct spec s;
    struct ddpd_error err = {0};
    const int64_t T = 4;
    for (int d = 0; d < 2; d++) {
        tokens_dtype dt = d ? TOKENS_INT32 : TOKENS_UINT16;
        const int64_t ns[] = {23, 21, 20};
        for (int f = 0; f < 3; f++) {
            const int64_t n = ns[f], rows = (n - 1) / T;
            put_tokens("data/tok.bin", dt, n, 1000, -1, 0);
            spec_ids(&s, T, 1000, 1000, LOSS_CROSS_ENTROPY);
            spec_tokens(&s, "data/tok.bin", T, dt);
            int64_t counts[3], crows = -1, bytes = -1;
            CHECK_EQ_INT(dataset_check(&s, datadir, 3, &crows, &bytes, &err), DDPD_OK);
            CHECK_EQ_INT(crows, rows);
            CHECK_EQ_INT(bytes, 0);
            for (int W = 1; W <= 3; W++) {
                CHECK_EQ_INT(dataset_batch_counts(&s, datadir, W, counts, &err), DDPD_OK);
                for (int r = 0; r < W; r++) {
                    struct dataset *ds = open_ok(&s, r, W);
                    if (!ds)
                        continue;
                    CHECK_EQ_INT(dataset_rows(ds), rows);
                    CHECK_EQ_INT(dataset_shard_size(ds), (rows - r + W - 1) / W);
                    CHECK_EQ_INT(dataset_batches(ds), counts[r]);
                    int64_t k = 0;
                    for (int64_t b = 0; b < dataset_batches(ds); b++) {
                        int32_t x[2 * 4], y[2 * 4];
                        int64_t got = dataset_batch(ds, b, x, NULL, y);
                        for (int64_t j = 0; j < got; j++, k++) {
                            int64_t i = r + k * W; /* the sample */
                            for (int64_t t = 0; t < T; t++) {
                                CHECK_EQ_INT(x[j * T + t], i * T + t);
                                CHECK_EQ_INT(y[j * T + t], i * T + t + 1);
                            }
                        }
                    }
                    CHECK_EQ_INT(k, dataset_shard_size(ds));
                    dataset_free(ds);
                }
            }
        }
    }
}

/* Shuffling draws the same permutation as for any data of N samples; drop_last drops the
 * partial batch. */
static void test_tokens_shuffle(void)
{
    struct spec s, t;
    const int64_t T = 3, N = 11;
    put_tokens("data/tsh.bin", TOKENS_UINT16, N * T + 1, 60000, -1, 0);
    put_ids("data/tsh_x.npy", "data/tsh_y.npy", (int)N, 0);
    spec_ids(&s, T, 60000, 60000, LOSS_CROSS_ENTROPY);
    spec_tokens(&s, "data/tsh.bin", T, TOKENS_UINT16);
    s.data.shuffle = true;
    s.data.seed = 9;
    s.batch_size = 4;
    spec_base(&t, 2, 1, LOSS_MSE);
    spec_npy(&t, "data/tsh_x.npy", "data/tsh_y.npy");
    t.data.shuffle = true;
    t.data.seed = 9;
    t.batch_size = 4;
    for (int W = 1; W <= 2; W++) {
        for (int r = 0; r < W; r++) {
            struct dataset *a = open_ok(&s, r, W), *b = open_ok(&t, r, W);
            if (!a || !b) {
                dataset_free(a);
                dataset_free(b);
                continue;
            }
            for (int64_t epoch = 0; epoch < 2; epoch++) {
                dataset_set_epoch(a, epoch);
                dataset_set_epoch(b, epoch);
                int64_t want[16], n = epoch_ids(b, 2, want), k = 0;
                bool identity = true;
                for (int64_t bi = 0; bi < dataset_batches(a); bi++) {
                    int32_t x[4 * 3], y[4 * 3];
                    int64_t got = dataset_batch(a, bi, x, NULL, y);
                    for (int64_t j = 0; j < got; j++, k++) {
                        CHECK_EQ_INT(x[j * T], want[k] * T);
                        CHECK_EQ_INT(y[j * T + T - 1], want[k] * T + T);
                        identity &= want[k] == r + k * W;
                    }
                }
                CHECK_EQ_INT(k, n);
                CHECK(!identity);
            }
            dataset_free(a);
            dataset_free(b);
        }
    }
    s.data.drop_last = true;
    struct dataset *ds = open_ok(&s, 0, 1);
    if (ds)
        CHECK_EQ_INT(dataset_batches(ds), 2); /* 11 samples, batches of 4 */
    dataset_free(ds);
    s.data.drop_last = false;
    ds = open_ok(&s, 0, 1);
    if (ds)
        CHECK_EQ_INT(dataset_batches(ds), 3);
    dataset_free(ds);
}

static void test_tokens_errors(void)
{
    struct spec s;
    const char *m;
    spec_ids(&s, 4, 50, 50, LOSS_CROSS_ENTROPY);

    /* Shorter than one window: T + 1 ids are needed. */
    put_tokens("data/short.bin", TOKENS_UINT16, 4, 50, -1, 0);
    spec_tokens(&s, "data/short.bin", 4, TOKENS_UINT16);
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/short.bin"),
                 "data/short.bin: too short: 4 tokens, fewer than one window of block_size + 1 = 5");
    check_fails(&s, "data/short.bin",
                "data/short.bin: too short: 4 tokens, fewer than one window of block_size + 1 = 5");
    put_str("data/short.bin", "");
    m = open_fails(&s, DDPD_EDATA, "data/short.bin");
    CHECK(strstr(m, "too short: 0 tokens") != NULL);

    /* A size that is not a whole number of ids. */
    put_str("data/odd.bin", "abcdefghijk");
    spec_tokens(&s, "data/odd.bin", 4, TOKENS_UINT16);
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/odd.bin"),
                 "data/odd.bin: its size, 11 bytes, is not a multiple of 2 (dtype uint16)");
    put_str("data/odd.bin", "abcdefghijklmn");
    spec_tokens(&s, "data/odd.bin", 3, TOKENS_INT32);
    s.input_shape[0] = 3;
    s.layers[1].out_shape[0] = 3;
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/odd.bin"),
                 "data/odd.bin: its size, 14 bytes, is not a multiple of 4 (dtype int32)");
    check_fails(&s, "data/odd.bin", "data/odd.bin: its size, 14 bytes, is not a multiple of 4 (dtype int32)");

    /* The spec's side: block_size against input_shape, ids, cross_entropy. */
    spec_ids(&s, 4, 50, 50, LOSS_CROSS_ENTROPY);
    put_tokens("data/ok.bin", TOKENS_UINT16, 40, 50, -1, 0);
    spec_tokens(&s, "data/ok.bin", 5, TOKENS_UINT16);
    CHECK_EQ_STR(open_fails(&s, DDPD_ESPEC, "data.block_size"),
                 "data.block_size: is 5 but input_shape is [4] (it must be [5])");
    spec_base(&s, 4, 3, LOSS_CROSS_ENTROPY);
    spec_tokens(&s, "data/ok.bin", 4, TOKENS_UINT16);
    m = open_fails(&s, DDPD_ESPEC, "data.type");
    CHECK(strstr(m, "must start with an embedding layer") != NULL);
    spec_ids(&s, 4, 50, 50, LOSS_CROSS_ENTROPY);
    spec_csv(&s, "data/ck.csv", "label");
    CHECK_EQ_STR(open_fails(&s, DDPD_ESPEC, "data.type"),
                 "data.type: csv data is rows of float inputs for a list of linear layers; a model on "
                 "token ids needs npy or tokens data");

    /* An id outside the vocabulary: found at submit (dataset_check) and by the rank that
     * reads it, naming the file, the sample and the position. Token 9 is sample 2,
     * position 1 as an input. */
    spec_ids(&s, 4, 50, 50, LOSS_CROSS_ENTROPY);
    put_tokens("data/bad.bin", TOKENS_UINT16, 21, 50, 9, 77);
    spec_tokens(&s, "data/bad.bin", 4, TOKENS_UINT16);
    const char *want = "data/bad.bin: id 77 at sample 2, position 1 is out of range [0, 50)";
    check_fails(&s, "data/bad.bin", want);
    struct dataset *ds = open_ok(&s, 0, 1);
    if (ds) {
        int32_t x[8], y[8];
        CHECK_EQ_INT(dataset_batch(ds, 0, x, NULL, y), 2); /* samples 0 and 1 */
        CHECK_EQ_INT(dataset_batch(ds, 1, x, NULL, y), -1);
        CHECK_EQ_STR(ddpd_err_name(dataset_error(ds)->code), "EDATA");
        CHECK_EQ_STR(dataset_error(ds)->path, "data/bad.bin");
        CHECK_EQ_STR(dataset_error(ds)->message, want);
        dataset_free(ds);
    }
    /* As a target: fewer classes than ids; token 9 is sample 2's target at position 0. */
    spec_ids(&s, 4, 100, 50, LOSS_CROSS_ENTROPY);
    spec_tokens(&s, "data/bad.bin", 4, TOKENS_UINT16);
    want = "data/bad.bin: class id 77 at sample 2, position 0 is out of range [0, 50)";
    check_fails(&s, "data/bad.bin", want);
    ds = open_ok(&s, 0, 1);
    if (ds) {
        int32_t x[8], y[8];
        CHECK_EQ_INT(dataset_batch(ds, 1, x, NULL, y), -1);
        CHECK_EQ_STR(dataset_error(ds)->message, want);
        dataset_free(ds);
    }
    /* int32: a negative id. */
    spec_ids(&s, 4, 50, 50, LOSS_CROSS_ENTROPY);
    put_tokens("data/neg.bin", TOKENS_INT32, 21, 50, 17, -3);
    spec_tokens(&s, "data/neg.bin", 4, TOKENS_INT32);
    check_fails(&s, "data/neg.bin", "data/neg.bin: id -3 at sample 4, position 1 is out of range [0, 50)");
    /* Ids past the last whole window are never read. */
    put_tokens("data/tail.bin", TOKENS_UINT16, 23, 50, 22, 999);
    spec_tokens(&s, "data/tail.bin", 4, TOKENS_UINT16);
    struct ddpd_error err = {0};
    int64_t rows, bytes;
    CHECK_EQ_INT(dataset_check(&s, datadir, 1, &rows, &bytes, &err), DDPD_OK);
    CHECK_EQ_INT(rows, 5);
}

/* .npy token ids: uint8, uint16, int32 and int64 x [N, T] with [N, T] class ids. */
static void test_npy_ids(void)
{
    struct spec s;
    const int64_t N = 3, T = 5;
    uint8_t x1[15];
    uint16_t x2[15];
    int32_t x4[15], y4[15];
    int64_t x8[15], y8[15];
    for (int i = 0; i < 15; i++) {
        x1[i] = (uint8_t)(i * 7 % 16);
        x2[i] = x1[i];
        x4[i] = x1[i];
        x8[i] = x1[i];
        y4[i] = (i * 3) % 6;
        y8[i] = y4[i];
    }
    put_npy("data/id1.npy", 1, "|u1", "(3, 5)", x1, sizeof x1);
    put_npy("data/id2.npy", 1, "<u2", "(3, 5)", x2, sizeof x2);
    put_npy("data/id4.npy", 1, "<i4", "(3, 5)", x4, sizeof x4);
    put_npy("data/id8.npy", 1, "<i8", "(3, 5)", x8, sizeof x8);
    put_npy("data/lab4.npy", 1, "<i4", "(3, 5)", y4, sizeof y4);
    put_npy("data/lab8.npy", 1, "<i8", "(3, 5)", y8, sizeof y8);
    const char *xs[] = {"data/id1.npy", "data/id2.npy", "data/id4.npy", "data/id8.npy"};
    spec_ids(&s, T, 16, 6, LOSS_CROSS_ENTROPY);
    s.batch_size = 4;
    for (int f = 0; f < 4; f++) {
        spec_npy(&s, xs[f], f % 2 ? "data/lab8.npy" : "data/lab4.npy");
        struct ddpd_error err = {0};
        int64_t rows = -1, bytes;
        CHECK_EQ_INT(dataset_check(&s, datadir, 1, &rows, &bytes, &err), DDPD_OK);
        CHECK_EQ_INT(rows, N);
        struct dataset *ds = open_ok(&s, 0, 1);
        if (!ds)
            continue;
        int32_t x[20], y[20];
        CHECK_EQ_INT(dataset_batch(ds, 0, x, NULL, y), 3);
        for (int i = 0; i < 15; i++) {
            CHECK_EQ_INT(x[i], x1[i]);
            CHECK_EQ_INT(y[i], y4[i]);
        }
        dataset_free(ds);
    }

    /* Out of range: at open (a small file is loaded and checked) and at submit. */
    x2[7] = 16;
    put_npy("data/idbad.npy", 1, "<u2", "(3, 5)", x2, sizeof x2);
    spec_npy(&s, "data/idbad.npy", "data/lab4.npy");
    const char *want = "data/idbad.npy: id 16 at sample 1, position 2 is out of range [0, 16)";
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/idbad.npy"), want);
    check_fails(&s, "data/idbad.npy", want);
    y4[14] = 6;
    put_npy("data/labbad.npy", 1, "<i4", "(3, 5)", y4, sizeof y4);
    spec_npy(&s, "data/id4.npy", "data/labbad.npy");
    want = "data/labbad.npy: class id 6 at sample 2, position 4 is out of range [0, 6)";
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/labbad.npy"), want);
    check_fails(&s, "data/labbad.npy", want);

    /* Dtypes and shapes. */
    float xf[15] = {0};
    put_npy("data/idf.npy", 1, "<f4", "(3, 5)", xf, sizeof xf);
    spec_npy(&s, "data/idf.npy", "data/lab4.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/idf.npy"),
                 "data/idf.npy: dtype '<f4' is not supported; x holds token ids for model[0] (embedding): "
                 "uint8 ('|u1'), uint16 ('<u2'), int32 ('<i4') or int64 ('<i8')");
    put_npy("data/idi1.npy", 1, "|i1", "(3, 5)", x1, sizeof x1);
    spec_npy(&s, "data/idi1.npy", "data/lab4.npy");
    CHECK(strstr(open_fails(&s, DDPD_EDATA, "data/idi1.npy"), "dtype '|i1' is not supported") != NULL);
    put_npy("data/id35.npy", 1, "<i4", "(5, 3)", x4, sizeof x4);
    spec_npy(&s, "data/id35.npy", "data/lab4.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/id35.npy"),
                 "data/id35.npy: x's samples have shape [3] (x is (5, 3)) but input_shape is [5]");
    put_npy("data/lab53.npy", 1, "<i4", "(3, 4)", y4, 12 * sizeof(int32_t));
    spec_npy(&s, "data/id4.npy", "data/lab53.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/lab53.npy"),
                 "data/lab53.npy: cross_entropy targets must be class ids of shape [N] + the model's "
                 "output shape [5, 6] without its last dimension, got shape (3, 4)");
    put_npy("data/lab1.npy", 1, "<i4", "(3,)", y4, 3 * sizeof(int32_t));
    spec_npy(&s, "data/id4.npy", "data/lab1.npy");
    CHECK(strstr(open_fails(&s, DDPD_EDATA, "data/lab1.npy"), "got shape (3,)") != NULL);
}

/* Float samples of any rank: x [N, 2, 3] for input_shape [2, 3] and a linear on the last
 * dimension; mse targets of the output's shape [N, 2, 2]. */
static void test_npy_any_rank(void)
{
    struct spec s;
    memset(&s, 0, sizeof s);
    s.world_size = 1;
    s.n_layers = 1;
    s.layers[0] = (struct spec_layer){.kind = LAYER_LINEAR,
                                      .parent = -1,
                                      .end = 1,
                                      .key = "0",
                                      .in = 3,
                                      .out = 2,
                                      .bias = true,
                                      .in_rank = 2,
                                      .in_shape = {2, 3},
                                      .out_rank = 2,
                                      .out_shape = {2, 2}};
    s.input_rank = 2;
    s.input_shape[0] = 2;
    s.input_shape[1] = 3;
    s.input_shape_set = true;
    s.loss = LOSS_MSE;
    s.batch_size = 2;
    s.epochs = 1;
    s.grad_accum = 1;
    float x[4 * 6], y[4 * 4];
    double x8[4 * 6];
    for (int i = 0; i < 24; i++)
        x8[i] = x[i] = (float)i * 0.5f;
    for (int i = 0; i < 16; i++)
        y[i] = -(float)i;
    put_npy("data/ar_x.npy", 1, "<f4", "(4, 2, 3)", x, sizeof x);
    put_npy("data/ar_x8.npy", 1, "<f8", "(4, 2, 3)", x8, sizeof x8);
    put_npy("data/ar_y.npy", 1, "<f4", "(4, 2, 2)", y, sizeof y);
    const char *xs[] = {"data/ar_x.npy", "data/ar_x8.npy"};
    for (int f = 0; f < 2; f++) {
        spec_npy(&s, xs[f], "data/ar_y.npy");
        struct dataset *ds = open_ok(&s, 0, 1);
        if (!ds)
            continue;
        float bx[12], by[8];
        CHECK_EQ_INT(dataset_batch(ds, 1, bx, by, NULL), 2);
        CHECK(memcmp(bx, x + 12, sizeof bx) == 0);
        CHECK(memcmp(by, y + 8, sizeof by) == 0);
        dataset_free(ds);
    }
    put_npy("data/ar_xt.npy", 1, "<f4", "(4, 3, 2)", x, sizeof x);
    spec_npy(&s, "data/ar_xt.npy", "data/ar_y.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/ar_xt.npy"),
                 "data/ar_xt.npy: x's samples have shape [3, 2] (x is (4, 3, 2)) but input_shape is [2, 3]");
    put_npy("data/ar_xf.npy", 1, "<f4", "(4, 6)", x, sizeof x);
    spec_npy(&s, "data/ar_xf.npy", "data/ar_y.npy");
    CHECK_EQ_STR(open_fails(&s, DDPD_EDATA, "data/ar_xf.npy"),
                 "data/ar_xf.npy: x's samples have shape [6] (x is (4, 6)) but input_shape is [2, 3]");
    put_npy("data/ar_y4.npy", 1, "<f4", "(4, 4)", y, sizeof y);
    spec_npy(&s, "data/ar_x.npy", "data/ar_y4.npy");
    CHECK_EQ_STR(
        open_fails(&s, DDPD_EDATA, "data/ar_y4.npy"),
        "data/ar_y4.npy: mse targets must be [N] + the model's output shape [2, 2], got shape (4, 4)");
}

/* Resident memory of this process in bytes. */
static int64_t rss_bytes(void)
{
    long pages = 0, resident = 0;
    FILE *fp = fopen("/proc/self/statm", "r");
    if (!fp || fscanf(fp, "%ld %ld", &pages, &resident) != 2)
        resident = 0;
    if (fp)
        fclose(fp);
    return (int64_t)resident * sysconf(_SC_PAGESIZE);
}

/* A sparse file of `size` bytes: `head` first, then zeros, with `n` values written at
 * their offsets. */
static void put_sparse(const char *rel, const void *head, size_t hn, int64_t size, const int64_t *offs,
                       const void *vals, int vsize, int n)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", datadir, rel);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0);
    CHECK(hn == 0 || write(fd, head, hn) == (ssize_t)hn);
    CHECK(ftruncate(fd, size) == 0);
    for (int i = 0; i < n; i++)
        CHECK(pwrite(fd, (const char *)vals + i * vsize, (size_t)vsize, offs[i]) == vsize);
    close(fd);
}

/* Large files are memory-mapped and read window by window: reading a whole epoch of a
 * 160 MiB tokens file, or of a 96 MiB .npy, does not grow this process by the file. */
static void test_mapped(void)
{
    struct spec s;
    struct ddpd_error err = {0};
    const int64_t T = 1024, size = 160LL << 20, n = size / 2, rows = (n - 1) / T;
    /* Two known ids: token 5000 (sample 4, position 904) and the last window's last target. */
    int64_t offs[2] = {5000 * 2, rows * T * 2};
    uint16_t vals[2] = {123, 45};
    put_sparse("data/big.bin", NULL, 0, size, offs, vals, 2, 2);
    spec_ids(&s, T, 256, 256, LOSS_CROSS_ENTROPY);
    spec_tokens(&s, "data/big.bin", T, TOKENS_UINT16);
    s.batch_size = 256;
    int64_t before = rss_bytes(), peak = before;
    struct dataset *ds = open_ok(&s, 0, 1);
    if (ds) {
        int32_t *x = malloc(sizeof(int32_t) * 256 * 1024), *y = malloc(sizeof(int32_t) * 256 * 1024);
        memset(x, 1, sizeof(int32_t) * 256 * 1024);
        memset(y, 1, sizeof(int32_t) * 256 * 1024);
        before = rss_bytes(); /* the batch buffers are resident now */
        int64_t seen = 0, sum = 0;
        for (int64_t b = 0; b < dataset_batches(ds); b++) {
            int64_t got = dataset_batch(ds, b, x, NULL, y);
            CHECK(got > 0);
            for (int64_t k = 0; k < got * T; k++)
                sum += x[k] + y[k];
            if (b == 0)
                CHECK_EQ_INT(x[4 * T + 904], 123);
            seen += got;
            int64_t now = rss_bytes();
            peak = now > peak ? now : peak;
        }
        CHECK_EQ_INT(seen, rows);
        CHECK_EQ_INT(sum, 2 * 123 + 45); /* token 5000 is an input and a target; the last one a target */
        CHECK_EQ_INT(y[(rows - 1) % 256 * T + T - 1], 45);
        fprintf(stderr, "    tokens: %" PRId64 " MiB file, resident grew by %.1f MiB\n", size >> 20,
                (double)(peak - before) / (1 << 20));
        CHECK(peak - before < (32LL << 20));
        free(x);
        free(y);
        dataset_free(ds);
    }

    /* .npy over 64 MiB: uint16 ids [N, 64] mapped, class ids [N, 64] (int8) loaded. An id
     * out of range in the mapped file is found by the rank that reads it, and at submit. */
    const int64_t N = 800000, W = 64;
    unsigned char hx[256], hy[256];
    char shape[64];
    snprintf(shape, sizeof shape, "(%" PRId64 ", %" PRId64 ")", N, W);
    size_t nhx = npy_bytes(hx, 1, "<u2", false, shape, NULL, 0),
           nhy = npy_bytes(hy, 1, "|i1", false, shape, NULL, 0);
    int64_t xo[1] = {(int64_t)nhx + (700000 * W + 3) * 2};
    uint16_t xv[1] = {300};
    put_sparse("data/bigx.npy", hx, nhx, (int64_t)nhx + N * W * 2, xo, xv, 2, 1);
    put_sparse("data/bigy.npy", hy, nhy, (int64_t)nhy + N * W, NULL, NULL, 1, 0);
    spec_ids(&s, W, 256, 256, LOSS_CROSS_ENTROPY);
    spec_npy(&s, "data/bigx.npy", "data/bigy.npy");
    s.batch_size = 50000;
    const char *want = "data/bigx.npy: id 300 at sample 700000, position 3 is out of range [0, 256)";
    check_fails(&s, "data/bigx.npy", want);
    int64_t counts[1];
    CHECK_EQ_INT(dataset_batch_counts(&s, datadir, 1, counts, &err), DDPD_OK);
    CHECK_EQ_INT(counts[0], 16);
    before = rss_bytes();
    ds = open_ok(&s, 0, 1);
    if (ds) {
        int64_t opened = rss_bytes();
        /* Loaded: the int8 labels as int32 (N * 64 * 4 bytes); the ids stay in the file. */
        CHECK(opened - before < N * W * 4 + (32LL << 20));
        int32_t *x = malloc(sizeof(int32_t) * 50000 * 64), *y = malloc(sizeof(int32_t) * 50000 * 64);
        int64_t b = 0, got = 0;
        for (; b < dataset_batches(ds); b++)
            if ((got = dataset_batch(ds, b, x, NULL, y)) < 0)
                break;
        CHECK_EQ_INT(b, 14); /* rows 700000.. */
        CHECK_EQ_INT(got, -1);
        CHECK_EQ_STR(dataset_error(ds)->message, want);
        free(x);
        free(y);
        dataset_free(ds);
    }
}

int main(void)
{
    setup();
    test_huge_batch();
    test_check();
    test_npy_values();
    test_sharding();
    test_shuffle();
    test_rank_files();
    test_empty_rank_file();
    test_npy_errors();
    test_paths();
    test_confinement_race();
    test_special_files();
    test_csv();
    test_csv_errors();
    test_synthetic();
    test_batch_counts_npy();
    test_tokens_windows();
    test_tokens_shuffle();
    test_tokens_errors();
    test_npy_ids();
    test_npy_any_rank();
    test_mapped();
    base_remove_tree(root);
    CHECK_DONE();
}
