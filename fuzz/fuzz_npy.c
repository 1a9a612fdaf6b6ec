/* fuzz_npy.c — the .npy reader (worker/data/npy.c) on any file, through dataset_open and
 * dataset_batch_counts (fuzz_data.h). The input is the file's bytes, read as inputs x and
 * targets y at once (mse, x and y the same file: [N,3] float), and as class ids y
 * (cross_entropy, beside a valid x of 4 rows). */
#include "fuzz_data.h"

static struct spec mse_spec, ce_spec, huge_spec; /* huge: mse, batch_size INT64_MAX */

/* A valid float32 [4,3] x4.npy (version 1.0, header padded to 64 bytes as numpy does). */
static void write_x4(void)
{
    static const char head[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }";
    unsigned char buf[64 + 4 * 3 * 4];
    memset(buf, ' ', 64);
    memcpy(buf, "\x93NUMPY\x01\x00\x36\x00", 10);
    memcpy(buf + 10, head, sizeof head - 1);
    buf[63] = '\n';
    for (int i = 0; i < 4 * 3; i++) {
        float v = (float)i * 0.25f;
        memcpy(buf + 64 + 4 * i, &v, 4);
    }
    fuzz_write("x4.npy", buf, sizeof buf);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_spec_of(&mse_spec,
                 "{\"model\":[{\"type\":\"linear\",\"in\":3,\"out\":3}],\"loss\":\"mse\","
                 "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},\"data\":{\"type\":\"npy\","
                 "\"x\":\"f.npy\",\"y\":\"f.npy\",\"shuffle\":true},\"batch_size\":2,\"epochs\":1}");
    fuzz_spec_of(&ce_spec, "{\"model\":[{\"type\":\"linear\",\"in\":3,\"out\":3}],"
                           "\"loss\":\"cross_entropy\",\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},"
                           "\"data\":{\"type\":\"npy\",\"x\":\"x4.npy\",\"y\":\"f.npy\",\"shuffle\":false},"
                           "\"batch_size\":3,\"epochs\":1}");
    huge_spec = mse_spec;
    huge_spec.batch_size = INT64_MAX; /* a batch is the whole shard; nothing sized by batch_size */
    write_x4();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write("f.npy", data, size);
    fuzz_dataset(&mse_spec, 2);
    fuzz_dataset(&ce_spec, 1);
    fuzz_dataset(&huge_spec, 3);
    return 0;
}
