/* test_safetensors.c — safetensors write/read round trip, the writer's exact bytes
 * against the format as the reference implementation lays it out, conversions from
 * F64/F16/BF16, and clean errors for every kind of damaged file. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "base/file.h"
#include "schema/safetensors.h"

static char tmpdir[4096];

static void make_tmpdir(void)
{
    const char *base = getenv("DDPD_TEST_TMP");
    if (!base || !base[0])
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(tmpdir, sizeof tmpdir, "%s/st.XXXXXX", base);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        exit(1);
    }
    /* Relative paths keep the error messages short and exact. */
    if (chdir(tmpdir) != 0) {
        perror("chdir");
        exit(1);
    }
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(p, 1, n, fp) != n) {
        perror(path);
        exit(1);
    }
    fclose(fp);
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, fp);
    fclose(fp);
    return b;
}

/* A file of: 8-byte little-endian `hlen`, the JSON text, then `data`. */
static void write_st(const char *path, uint64_t hlen, const char *json, const void *data, size_t dlen)
{
    size_t jl = strlen(json);
    unsigned char *b = malloc(8 + jl + dlen + 1);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, json, jl);
    if (dlen)
        memcpy(b + 8 + jl, data, dlen);
    write_bytes(path, b, 8 + jl + dlen);
    free(b);
}

static void write_st_json(const char *path, const char *json, const void *data, size_t dlen)
{
    write_st(path, strlen(json), json, data, dlen);
}

static int count_dir_entries(void)
{
    DIR *d = opendir(".");
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

static void test_round_trip(void)
{
    float w0[50], b0[5], w2[15], b2[3], scalar[1] = {42.5f};
    for (int i = 0; i < 50; i++)
        w0[i] = (float)i * 0.1f - 2.f;
    for (int i = 0; i < 5; i++)
        b0[i] = -(float)i;
    for (int i = 0; i < 15; i++)
        w2[i] = 1.0f / (float)(i + 1);
    /* Values whose bits must survive exactly. */
    uint32_t odd[3] = {0x7fc00001u, 0x80000000u, 0x00000001u}; /* NaN payload, -0, denormal */
    memcpy(b2, odd, sizeof odd);
    struct safetensors_tensor t[6] = {
        {.name = "2.weight", .ndim = 2, .shape = {3, 5}, .data = w2},
        {.name = "0.weight", .ndim = 2, .shape = {5, 10}, .data = w0},
        {.name = "2.bias", .ndim = 1, .shape = {3}, .data = b2},
        {.name = "0.bias", .ndim = 1, .shape = {5}, .data = b0},
        {.name = "scalar", .ndim = 0, .data = scalar},
        {.name = "empty", .ndim = 2, .shape = {0, 4}, .data = NULL},
    };
    struct safetensors_meta meta[] = {{"format", "ddpd-checkpoint-1"}, {"step", "17"}};
    struct ddpd_error err = {0};
    int before = count_dir_entries();
    CHECK_EQ_INT(safetensors_write("model.safetensors", t, 6, meta, 2, &err), DDPD_OK);
    /* Only the file itself: the temporary file was renamed away. */
    CHECK_EQ_INT(count_dir_entries(), before + 1);
    char tmp[64];
    snprintf(tmp, sizeof tmp, "model.safetensors.tmp.%ld", (long)getpid());
    CHECK(access(tmp, F_OK) != 0);

    struct safetensors_file *f = safetensors_read("model.safetensors", &err);
    CHECK(f != NULL);
    if (!f) {
        fprintf(stderr, "safetensors_read: %s\n", err.message);
        return;
    }
    CHECK_EQ_INT(safetensors_count(f), 6);
    /* The header lists tensors sorted by name. */
    const char *order[] = {"0.bias", "0.weight", "2.bias", "2.weight", "empty", "scalar"};
    for (int i = 0; i < 6; i++)
        CHECK_EQ_STR(safetensors_at(f, i)->name, order[i]);
    CHECK(safetensors_at(f, 6) == NULL);
    for (int i = 0; i < 6; i++) {
        const struct safetensors_tensor *r = safetensors_get(f, t[i].name);
        CHECK(r != NULL);
        if (!r)
            continue;
        CHECK_EQ_INT(r->ndim, t[i].ndim);
        int64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            CHECK_EQ_INT(r->shape[d], t[i].shape[d]);
            numel *= t[i].shape[d];
        }
        if (numel)
            CHECK(memcmp(r->data, t[i].data, (size_t)numel * sizeof(float)) == 0);
    }
    CHECK(safetensors_get(f, "1.weight") == NULL);
    CHECK_EQ_STR(safetensors_meta_get(f, "format"), "ddpd-checkpoint-1");
    CHECK_EQ_STR(safetensors_meta_get(f, "step"), "17");
    CHECK(safetensors_meta_get(f, "epoch") == NULL);
    safetensors_free(f);
    safetensors_free(NULL);

    /* Overwriting an existing file replaces it. */
    float one = 1;
    struct safetensors_tensor t1 = {.name = "x", .ndim = 1, .shape = {1}, .data = &one};
    CHECK_EQ_INT(safetensors_write("model.safetensors", &t1, 1, NULL, 0, &err), DDPD_OK);
    f = safetensors_read("model.safetensors", &err);
    CHECK(f && safetensors_count(f) == 1 && safetensors_get(f, "x") &&
          safetensors_get(f, "x")->data[0] == 1.0f);
    CHECK(f && safetensors_meta_get(f, "format") == NULL);
    safetensors_free(f);
    remove("model.safetensors");
}

/* The bytes the format spec (and the reference writer) gives for tiny files. */
static void test_exact_bytes(void)
{
    struct ddpd_error err = {0};
    float ab[2] = {1.0f, -2.0f}, c[1] = {0.5f};
    struct safetensors_tensor t[2] = {
        {.name = "b", .ndim = 1, .shape = {1}, .data = c},
        {.name = "a", .ndim = 1, .shape = {2}, .data = ab},
    };
    struct safetensors_meta meta[] = {{"k", "v"}};
    CHECK_EQ_INT(safetensors_write("exact.safetensors", t, 2, meta, 1, &err), DDPD_OK);

    const char *json = "{\"__metadata__\":{\"k\":\"v\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}";
    size_t jl = strlen(json), pad = (8 - jl % 8) % 8, hl = jl + pad;
    unsigned char want[512];
    size_t n = 0;
    for (int i = 0; i < 8; i++)
        want[n++] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(want + n, json, jl);
    n += jl;
    memset(want + n, ' ', pad);
    n += pad;
    const unsigned char data[] = {0x00, 0x00, 0x80, 0x3f,  /* 1.0 */
                                  0x00, 0x00, 0x00, 0xc0,  /* -2.0 */
                                  0x00, 0x00, 0x00, 0x3f}; /* 0.5 */
    memcpy(want + n, data, sizeof data);
    n += sizeof data;

    size_t got_n = 0;
    unsigned char *got = read_bytes("exact.safetensors", &got_n);
    CHECK(got != NULL);
    CHECK_EQ_INT(got_n, n);
    CHECK(got && got_n == n && memcmp(got, want, n) == 0);
    CHECK_EQ_INT(hl % 8, 0);
    free(got);

    /* Without metadata there is no "__metadata__" key; a scalar has shape []. */
    float s = 3.0f;
    struct safetensors_tensor one = {.name = "s", .ndim = 0, .data = &s};
    CHECK_EQ_INT(safetensors_write("exact.safetensors", &one, 1, NULL, 0, &err), DDPD_OK);
    const char *json2 = "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}";
    got = read_bytes("exact.safetensors", &got_n);
    jl = strlen(json2);
    pad = (8 - jl % 8) % 8;
    CHECK_EQ_INT(got_n, 8 + jl + pad + 4);
    CHECK(got && got[0] == jl + pad && got[1] == 0 && memcmp(got + 8, json2, jl) == 0);
    CHECK(got && memcmp(got + 8 + jl, "        ", pad) == 0);
    CHECK(got && memcmp(got + 8 + jl + pad, "\x00\x00\x40\x40", 4) == 0);
    free(got);
    remove("exact.safetensors");
}

static void test_conversions(void)
{
    unsigned char d[26];
    double f64[2] = {1.5, -3.25};
    memcpy(d, f64, 16); /* the host is little-endian, as the test machines are */
    const unsigned char f16[6] = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00}; /* 1, -2, 2^-24 */
    const unsigned char bf16[4] = {0x80, 0x3f, 0x40, 0xc0};            /* 1, -3 */
    memcpy(d + 16, f16, 6);
    memcpy(d + 22, bf16, 4);
    write_st_json("conv.safetensors",
                  "{\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                  "\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[16,22]},"
                  "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[22,26]},"
                  "\"__metadata__\":{}}",
                  d, sizeof d);
    struct ddpd_error err = {0};
    struct safetensors_file *f = safetensors_read("conv.safetensors", &err);
    CHECK(f != NULL);
    if (!f) {
        fprintf(stderr, "safetensors_read: %s\n", err.message);
        return;
    }
    /* Header order is file order. */
    CHECK_EQ_STR(safetensors_at(f, 0)->name, "d");
    CHECK_EQ_STR(safetensors_at(f, 2)->name, "b");
    const struct safetensors_tensor *t = safetensors_get(f, "d");
    CHECK(t->data[0] == 1.5f && t->data[1] == -3.25f);
    t = safetensors_get(f, "h");
    CHECK(t->data[0] == 1.0f && t->data[1] == -2.0f && t->data[2] == 0x1p-24f);
    t = safetensors_get(f, "b");
    CHECK_EQ_INT(t->ndim, 2);
    CHECK(t->data[0] == 1.0f && t->data[1] == -3.0f);
    safetensors_free(f);
    remove("conv.safetensors");
}

/* safetensors_read of `path` fails with EDATA; returns the message (static). */
static const char *read_fails(const char *path)
{
    static struct ddpd_error err;
    memset(&err, 0, sizeof err);
    struct safetensors_file *f = safetensors_read(path, &err);
    CHECK(f == NULL);
    safetensors_free(f);
    CHECK_EQ_INT(err.code, DDPD_EDATA);
    CHECK_EQ_STR(err.path, path);
    CHECK(strstr(err.message, path) == err.message);
    return err.message;
}

static void test_bad_files(void)
{
    const char *p = "bad.safetensors";
    unsigned char zeros[256] = {0};
    const char *msg;

    write_bytes(p, "\x10\x00\x00", 3);
    CHECK_EQ_STR(read_fails(p), "bad.safetensors: truncated: the file is 3 bytes, shorter than the 8-byte "
                                "header length");

    write_st(p, 1000, "{}", NULL, 0);
    CHECK_EQ_STR(read_fails(p),
                 "bad.safetensors: truncated: the header length is 1000 bytes but only 2 bytes "
                 "follow it");

    write_st(p, (uint64_t)1 << 40, "{}", NULL, 0);
    msg = read_fails(p);
    CHECK(strstr(msg, "header length 1099511627776 is too large") != NULL);

    write_st_json(p, "{\"a\":", NULL, 0);
    msg = read_fails(p);
    CHECK(strstr(msg, "not valid JSON") != NULL);

    write_st_json(p, "[1, 2]", NULL, 0);
    CHECK_EQ_STR(read_fails(p), "bad.safetensors: the header is not a JSON object");

    write_st(p, 0, "", NULL, 0);
    msg = read_fails(p);
    CHECK(strstr(msg, "not valid JSON") != NULL);

    write_st_json(p, "{\"0.weight\":{\"dtype\":\"F32\",\"shape\":[5,10],\"data_offsets\":[0,100]}}", zeros,
                  100);
    CHECK_EQ_STR(read_fails(p),
                 "bad.safetensors: tensor \"0.weight\": data_offsets [0, 100] do not match shape "
                 "[5, 10] of F32 (200 bytes expected)");

    write_st_json(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", zeros, 8);
    CHECK_EQ_STR(read_fails(p), "bad.safetensors: tensor \"x\": data_offsets [0, 16] run past the end of the "
                                "data (8 bytes)");

    write_st_json(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", zeros, 8);
    msg = read_fails(p);
    CHECK(strstr(msg, "do not match shape") != NULL);

    write_st_json(p, "{\"x\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", zeros, 4);
    CHECK_EQ_STR(read_fails(p),
                 "bad.safetensors: tensor \"x\": dtype \"I32\" is not supported (F32, F64, F16, "
                 "BF16, I64, BOOL and U8 are)");

    write_st_json(p, "{\"x\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", zeros, 4);
    msg = read_fails(p);
    CHECK(strstr(msg, "dtype \"f32\" is not supported") != NULL);

    write_st_json(p, "{\"x\":{\"shape\":[1],\"data_offsets\":[0,4]}}", zeros, 4);
    msg = read_fails(p);
    CHECK(strstr(msg, "\"dtype\" is missing") != NULL);

    write_st_json(p, "{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", zeros, 4);
    msg = read_fails(p);
    CHECK(strstr(msg, "\"shape\" is missing") != NULL);

    write_st_json(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", zeros, 4);
    msg = read_fails(p);
    CHECK(strstr(msg, "\"data_offsets\" must be") != NULL);

    write_st_json(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", zeros, 4);
    msg = read_fails(p);
    CHECK(strstr(msg, "non-negative") != NULL);

    write_st_json(p, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", zeros, 4);
    msg = read_fails(p);
    CHECK(strstr(msg, "5 dimensions") != NULL);

    write_st_json(p,
                  "{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
                  "\"data_offsets\":[0,4]}}",
                  zeros, 4);
    msg = read_fails(p);
    CHECK(strstr(msg, "too large") != NULL);

    write_st_json(p, "{\"x\":[1]}", zeros, 0);
    msg = read_fails(p);
    CHECK(strstr(msg, "tensor \"x\": expected an object") != NULL);

    write_st_json(p,
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                  zeros, 12);
    CHECK_EQ_STR(read_fails(p), "bad.safetensors: tensor \"b\": data_offsets [4, 12] overlap tensor \"a\"");

    write_st_json(p,
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                  zeros, 12);
    msg = read_fails(p);
    CHECK(strstr(msg, "leave a gap") != NULL);

    write_st_json(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", zeros, 12);
    CHECK_EQ_STR(read_fails(p), "bad.safetensors: the data section is 12 bytes but the tensors cover only 4");

    write_st_json(p, "{\"__metadata__\":{\"step\":17}}", NULL, 0);
    CHECK_EQ_STR(read_fails(p), "bad.safetensors: \"__metadata__\" value of \"step\" is not a string");

    write_st_json(p, "{\"__metadata__\":[]}", NULL, 0);
    msg = read_fails(p);
    CHECK(strstr(msg, "not an object") != NULL);

    write_st_json(p,
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                  zeros, 4);
    msg = read_fails(p);
    CHECK(strstr(msg, "not valid JSON") != NULL);

    char longname[300];
    memset(longname, 'n', 200);
    longname[200] = '\0';
    char json[600];
    snprintf(json, sizeof json, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
             longname);
    write_st_json(p, json, zeros, 4);
    msg = read_fails(p);
    CHECK(strstr(msg, "longer than 127 bytes") != NULL);

    msg = read_fails("missing.safetensors");
    CHECK(strstr(msg, "No such file") != NULL);

    /* An empty header is a valid file with no tensors. */
    write_st_json(p, "{}      ", NULL, 0);
    struct ddpd_error err = {0};
    struct safetensors_file *f = safetensors_read(p, &err);
    CHECK(f && safetensors_count(f) == 0);
    safetensors_free(f);
    remove(p);
}

static void test_write_errors(void)
{
    struct ddpd_error err = {0};
    float v[2] = {1, 2};
    struct safetensors_tensor t[2] = {
        {.name = "a", .ndim = 1, .shape = {2}, .data = v},
        {.name = "a", .ndim = 1, .shape = {2}, .data = v},
    };
    CHECK_EQ_INT(safetensors_write("nodir/x.safetensors", t, 1, NULL, 0, &err), DDPD_EIO);
    CHECK_EQ_STR(err.path, "nodir/x.safetensors");
    CHECK_EQ_STR(err.message, "nodir/x.safetensors: cannot write: No such file or directory");

    CHECK_EQ_INT(safetensors_write("dup.safetensors", t, 2, NULL, 0, &err), DDPD_EINTERNAL);
    CHECK(strstr(err.message, "\"a\" is given twice") != NULL);
    CHECK(access("dup.safetensors", F_OK) != 0);

    struct safetensors_tensor bad = {.name = "b", .ndim = 5, .shape = {1, 1, 1, 1}, .data = v};
    CHECK_EQ_INT(safetensors_write("bad.safetensors", &bad, 1, NULL, 0, &err), DDPD_EINTERNAL);

    /* A directory in the way of the final name: the temporary file is cleaned up. */
    mkdir("adir.safetensors", 0755);
    CHECK_EQ_INT(safetensors_write("adir.safetensors", t, 1, NULL, 0, &err), DDPD_EIO);
    CHECK(strstr(err.message, "adir.safetensors: cannot write: ") == err.message);
    char tmp[64];
    snprintf(tmp, sizeof tmp, "adir.safetensors.tmp.%ld", (long)getpid());
    CHECK(access(tmp, F_OK) != 0);
    rmdir("adir.safetensors");
}

/* I64 (BatchNorm's num_batches_tracked): written from `i64` as 8 little-endian bytes
 * under dtype "I64", read back as floats with was_i64 set; F32 beside it unchanged. */
static void test_i64(void)
{
    const int64_t count[1] = {123457};
    float mean[2] = {0.5f, -1.25f};
    struct safetensors_tensor t[2] = {
        {.name = "1.num_batches_tracked", .ndim = 0, .i64 = count},
        {.name = "1.running_mean", .ndim = 1, .shape = {2}, .data = mean},
    };
    struct ddpd_error err = {0};
    CHECK_EQ_INT(safetensors_write("i64.safetensors", t, 2, NULL, 0, &err), DDPD_OK);
    FILE *fp = fopen("i64.safetensors", "rb");
    char buf[512] = {0};
    size_t n = fp ? fread(buf, 1, sizeof buf - 1, fp) : 0;
    if (fp)
        fclose(fp);
    CHECK(n > 8 && strstr(buf + 8, "\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]") != NULL);
    struct safetensors_file *f = safetensors_read("i64.safetensors", &err);
    CHECK(f != NULL);
    if (!f)
        return;
    const struct safetensors_tensor *c = safetensors_get(f, "1.num_batches_tracked");
    const struct safetensors_tensor *m = safetensors_get(f, "1.running_mean");
    CHECK(c && c->was_i64 && c->ndim == 0 && c->data[0] == 123457.0f);
    CHECK(m && !m->was_i64 && m->data[0] == 0.5f && m->data[1] == -1.25f);
    safetensors_free(f);
}

int main(void)
{
    make_tmpdir();
    test_round_trip();
    test_exact_bytes();
    test_conversions();
    test_bad_files();
    test_write_errors();
    test_i64();
    if (chdir("/") == 0)
        base_remove_tree(tmpdir);
    CHECK_DONE();
}
