/* test_fingerprint.c — data files' fingerprints and the resume check (worker/fingerprint.h,
 * issue 28 item 5), and their record in a checkpoint (worker/checkpoint.h). The hash is pinned to the
 * documented layout (computed independently with Python's hashlib: the size as 8 little-endian bytes, then
 * the whole file up to 1 MiB, else its first 64 KiB, 64 blocks of 4 KiB at 65536 + floor((size - 135168) /
 * 63)
 * * i and its last 64 KiB); what is sampled and what is not is as documented. The check:
 * a file of another size, sample count or hash is refused naming it and what changed
 * (unless force), one touched or renamed with the same contents is only noted, and a
 * record that is missing, of another version or without the file is noted as unchecked.
 * A checkpoint's files carry the record (read back as written), within the bound the disk
 * quota is checked against however many files and escapes it holds. */
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "worker/checkpoint.h"
#include "worker/fingerprint.h"

static char root[2048];

static void setup(void)
{
    const char *base = getenv("DDPD_TEST_TMP");
    if (!base || !base[0])
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(root, sizeof root, "%s/fingerprint.XXXXXX", base);
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        exit(1);
    }
}

/* Writes n bytes to root/name and returns its fingerprint. */
static struct fingerprint take(const char *name, const unsigned char *p, size_t n)
{
    char path[4096];
    struct fingerprint fp;
    struct ddpd_error e;
    memset(&fp, 0, sizeof fp);
    snprintf(path, sizeof path, "%s/%s", root, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    CHECK_EQ_INT(fingerprint_fd(fd, name, &fp, &e), DDPD_OK);
    close(fd);
    snprintf(fp.field, sizeof fp.field, "data.path");
    snprintf(fp.file, sizeof fp.file, "%s", name);
    snprintf(fp.unit, sizeof fp.unit, "windows");
    fp.rank = -1;
    return fp;
}

static void hex(const struct fingerprint *fp, char out[65])
{
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", fp->sha256[i]);
}

static void test_hash(void)
{
    char h[65];
    struct fingerprint fp = take("abc", (const unsigned char *)"abc", 3);
    hex(&fp, h);
    CHECK_EQ_STR(h, "ce91dc5eec0139adf091900d225971d6ad246a845bad791b5693a9d0d55dd391");
    CHECK_EQ_INT(fp.bytes, 3);
    CHECK(fp.mtime_ns > 0);
    fp = take("empty", NULL, 0);
    hex(&fp, h);
    CHECK_EQ_STR(h, "af5570f5a1810b7af78caf4bc70a660f0df51e42baf91d4de5b2328de0e83dfc");

    /* 5 MiB, byte i = (7 i + i / 4096) mod 256: sampled. */
    const size_t size = (size_t)5 << 20;
    unsigned char *big = malloc(size);
    for (size_t i = 0; i < size; i++)
        big[i] = (unsigned char)((i * 7 + (i >> 12)) & 255);
    fp = take("big", big, size);
    hex(&fp, h);
    CHECK_EQ_STR(h, "bc8466a09cfd5b201819a93436368e8de3e75d5c8a05e50ce494a8a0fa116728");
    /* A byte between two sampled blocks is not seen (the price of reading at most 384 KiB of any
     * file: docs/spec.md says so); one in the head, a block or the tail is. */
    const size_t gap = 65536 + ((size - 135168) / 63) + 4096 + 10, seen[] = {10, 65536 + 5, size - 1};
    big[gap] ^= 1;
    struct fingerprint other = take("big", big, size);
    CHECK(!memcmp(other.sha256, fp.sha256, 32));
    big[gap] ^= 1;
    for (size_t k = 0; k < sizeof seen / sizeof seen[0]; k++) {
        big[seen[k]] ^= 1;
        other = take("big", big, size);
        if (!memcmp(other.sha256, fp.sha256, 32))
            CHECK__FAIL("a change at byte %zu was not seen", seen[k]);
        big[seen[k]] ^= 1;
    }
    free(big);

    struct ddpd_error e;
    fp.bytes = 0;
    int fd = open(root, O_RDONLY | O_DIRECTORY);
    CHECK_EQ_INT(fingerprint_fd(fd, "a folder", &fp, &e), DDPD_EDATA);
    CHECK(strstr(e.message, "a folder: cannot read it") != NULL);
    close(fd);
}

static char notes[8][1100];
static int nnotes;

static void note(const char *s)
{
    if (nnotes < 8)
        snprintf(notes[nnotes++], sizeof notes[0], "%s", s);
}

/* fingerprint_check of `now` against `record`, the notes collected. */
static ddpd_err check(const char *record, const struct fingerprint *now, int n, bool force,
                      struct ddpd_error *e)
{
    nnotes = 0;
    ddpd_error_clear(e);
    return fingerprint_check(record, now, n, 40000, force, note, e);
}

static void test_check(void)
{
    struct ddpd_error e;
    struct fingerprint fp[2];
    fp[0] = take("train.tokens", (const unsigned char *)"0123456789abcdef0123", 20);
    fp[0].samples = 300000;
    fp[1] = take("x_1.npy", (const unsigned char *)"rows", 4);
    snprintf(fp[1].field, sizeof fp[1].field, "eval.data.x");
    snprintf(fp[1].unit, sizeof fp[1].unit, "rows");
    fp[1].rank = 1;
    fp[1].samples = 7;
    char *rec = fingerprint_record(fp, 2);
    CHECK(rec != NULL);
    json_t *j = json_loads(rec, 0, NULL);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "version")), 1);
    json_t *f0 = json_array_get(json_object_get(j, "files"), 0),
           *f1 = json_array_get(json_object_get(j, "files"), 1);
    CHECK_EQ_STR(json_string_value(json_object_get(f0, "file")), "train.tokens");
    CHECK(!json_object_get(f0, "rank"));
    CHECK_EQ_INT(json_integer_value(json_object_get(f1, "rank")), 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(f0, "samples")), 300000);
    CHECK_EQ_STR(json_string_value(json_object_get(f1, "unit")), "rows");
    json_decref(j);

    /* The same data: nothing to say. */
    CHECK_EQ_INT(check(rec, fp, 2, false, &e), DDPD_OK);
    CHECK_EQ_INT(nnotes, 0);

    /* Touched (a new mtime), or renamed: the same data, noted. */
    struct fingerprint now[2] = {fp[0], fp[1]};
    now[0].mtime_ns += 1000000000;
    snprintf(now[1].file, sizeof now[1].file, "x_1-copy.npy");
    CHECK_EQ_INT(check(rec, now, 2, false, &e), DDPD_OK);
    CHECK_EQ_INT(nnotes, 2);
    CHECK_EQ_STR(notes[0],
                 "data.path \"train.tokens\" was modified or renamed since the checkpoint at step 40000 "
                 "(modification time or name), but its size, windows and sampled contents are the "
                 "same: taken as the same data");
    CHECK(strstr(notes[1], "eval.data.x \"x_1-copy.npy\" (rank 1's file) was modified or renamed") ==
          notes[1]);

    /* Shorter: refused, naming the file, the sizes and the samples. */
    now[0] = fp[0];
    now[0].bytes = 48;
    now[0].samples = 12;
    CHECK_EQ_INT(check(rec, now, 2, false, &e), DDPD_EDATACHANGED);
    CHECK_EQ_STR(e.path, "data.path");
    CHECK_EQ_STR(e.message,
                 "data.path \"train.tokens\" changed since the checkpoint at step 40000: size 20 → 48 "
                 "bytes, windows 300000 → 12; to train on the data as it is now, resume with force");
    /* Same size and samples, other contents; and two files at once. */
    now[0] = fp[0];
    now[0].sha256[7] ^= 1;
    now[1] = fp[1];
    now[1].samples = 8;
    CHECK_EQ_INT(check(rec, now, 2, false, &e), DDPD_EDATACHANGED);
    CHECK_EQ_STR(e.message,
                 "data.path \"train.tokens\" changed since the checkpoint at step 40000: same size (20 "
                 "bytes) and windows (300000) but different contents (the SHA-256 of its sampled "
                 "blocks) (and 1 more data file changed); to train on the data as it is now, resume "
                 "with force");
    CHECK_EQ_INT(check(rec, now + 1, 1, false, &e), DDPD_EDATACHANGED);
    CHECK_EQ_STR(e.path, "eval.data.x");
    CHECK(strstr(e.message,
                 "eval.data.x \"x_1.npy\" (rank 1's file) changed since the checkpoint at step 40000: "
                 "rows 7 → 8;") == e.message);
    /* Another rank's file of the same field is another entry: not checked here. */
    now[1] = fp[1];
    now[1].rank = 2;
    CHECK_EQ_INT(check(rec, now + 1, 1, false, &e), DDPD_OK);
    CHECK_EQ_INT(nnotes, 1);
    CHECK_EQ_STR(notes[0], "eval.data.x \"x_1.npy\" (rank 2's file): the checkpoint at step 40000 records no "
                           "fingerprint of it: not checked");

    /* force: noted as a warning, not refused. */
    CHECK_EQ_INT(check(rec, now, 1, true, &e), DDPD_OK);
    CHECK_EQ_INT(nnotes, 1);
    CHECK(strstr(notes[0],
                 "warning: data.path \"train.tokens\" changed since the checkpoint at step 40000: same "
                 "size") == notes[0]);
    CHECK(strstr(notes[0], "; resuming on the data as it is now (force)") != NULL);

    /* Nothing to compare with: an old checkpoint, another version, not JSON. */
    CHECK_EQ_INT(check(NULL, now, 2, false, &e), DDPD_OK);
    CHECK_EQ_STR(notes[0], "the checkpoint at step 40000 records no data fingerprints (written before ddpd "
                           "recorded them): its data files could not be checked against it");
    CHECK_EQ_INT(check("{\"version\":2,\"files\":[]}", now, 2, false, &e), DDPD_OK);
    CHECK(strstr(notes[0], "in a form this ddpd does not read (version other than 1)") != NULL);
    CHECK_EQ_INT(check("garbage", now, 2, false, &e), DDPD_OK);
    CHECK(strstr(notes[0], "could not be checked") != NULL);
    CHECK_EQ_INT(check(rec, NULL, 0, false, &e), DDPD_OK);
    free(rec);
}

static int64_t file_size(const char *dir, const char *name)
{
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

static void remove_ckpt(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/optim.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

static void test_in_a_checkpoint(void)
{
    static const char spec_text[] = "{\"model\":[{\"type\":\"linear\",\"in\":3,\"out\":2}],\"loss\":\"mse\","
                                    "\"optimizer\":{\"type\":\"adamw\",\"lr\":0.1},\"data\":{\"type\":"
                                    "\"synthetic\",\"samples\":8},\"batch_size\":2,\"epochs\":1}";
    struct spec spec;
    struct ddpd_error e;
    CHECK_EQ_INT(spec_parse(spec_text, strlen(spec_text), NULL, &spec, &e), DDPD_OK);
    struct dev dev = dev_cpu_new(1);
    struct model *m = model_new(dev, &spec, 2);
    struct optim *o = optim_new(&spec.optim, m);
    CHECK(m && o);
    /* 1,000 ranks' {rank} files whose names are all quotes and control bytes: the record
     * is escaped inside the header, 6 bytes for each control byte. */
    const int n = 1000;
    struct fingerprint *fp = calloc((size_t)n, sizeof *fp);
    for (int i = 0; i < n; i++) {
        snprintf(fp[i].field, sizeof fp[i].field, "data.x");
        memset(fp[i].file, '\x01', 40);
        fp[i].file[0] = '"';
        fp[i].rank = i;
        snprintf(fp[i].unit, sizeof fp[i].unit, "rows");
        fp[i].samples = i;
    }
    char *rec = fingerprint_record(fp, n), dir[2100], tmp[2200];
    CHECK(rec != NULL);
    snprintf(dir, sizeof dir, "%s/ckpt-4", root);
    struct train_pos pos = {.step = 4, .epoch = 1, .epoch_step = 0};
    CHECK_EQ_INT(checkpoint_dir_begin(dir, tmp, sizeof tmp, &e), DDPD_OK);
    CHECK_EQ_INT(checkpoint_write_rank(tmp, m, o, &pos, 0, 1, true, false, false, rec, &e), DDPD_OK);
    CHECK_EQ_INT(checkpoint_dir_commit(tmp, dir, &e), DDPD_OK);
    const int64_t bound = checkpoint_bytes_bound(m, o, rec);
    const int64_t written = file_size(dir, "model.safetensors") + file_size(dir, "optim.safetensors");
    if (written > bound)
        CHECK__FAIL("the checkpoint's files hold %lld bytes, over the bound of %lld", (long long)written,
                    (long long)bound);
    char *back = NULL;
    int64_t step = 0;
    CHECK_EQ_INT(checkpoint_data_record(dir, &back, &step, &e), DDPD_OK);
    CHECK_EQ_STR(back, rec);
    CHECK_EQ_INT(step, 4);
    free(back);
    remove_ckpt(dir);

    /* Synthetic data: no record, none read back. */
    CHECK_EQ_INT(checkpoint_dir_begin(dir, tmp, sizeof tmp, &e), DDPD_OK);
    CHECK_EQ_INT(checkpoint_write_rank(tmp, m, o, &pos, 0, 1, true, false, false, NULL, &e), DDPD_OK);
    CHECK_EQ_INT(checkpoint_dir_commit(tmp, dir, &e), DDPD_OK);
    back = (char *)"unset";
    CHECK_EQ_INT(checkpoint_data_record(dir, &back, NULL, &e), DDPD_OK);
    CHECK(back == NULL);
    remove_ckpt(dir);
    free(rec);
    free(fp);
    optim_free(o);
    model_free(m);
    dev_cpu_free(dev);
}

int main(void)
{
    setup();
    test_hash();
    test_check();
    test_in_a_checkpoint();
    const char *names[] = {"abc", "empty", "big", "train.tokens", "x_1.npy"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[2100];
        snprintf(path, sizeof path, "%s/%s", root, names[i]);
        unlink(path);
    }
    rmdir(root);
    CHECK_DONE();
}
