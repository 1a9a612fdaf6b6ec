/* fuzz_csv.c — the CSV reader (worker/data/csv.c) on any file, through dataset_open and
 * dataset_batch_counts (fuzz_data.h): once for mse (two input columns, target "y", two
 * ranks) and once for cross_entropy (class ids in "y", 3 classes). */
#include "fuzz_data.h"

static struct spec mse_spec, ce_spec, huge_spec; /* huge: mse, batch_size INT64_MAX */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_spec_of(&mse_spec, "{\"model\":[{\"type\":\"linear\",\"in\":2,\"out\":1}],\"loss\":\"mse\","
                            "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},\"data\":{\"type\":\"csv\","
                            "\"path\":\"f.csv\",\"target\":\"y\"},\"batch_size\":2,\"epochs\":1}");
    fuzz_spec_of(&ce_spec, "{\"model\":[{\"type\":\"linear\",\"in\":2,\"out\":3}],"
                           "\"loss\":\"cross_entropy\",\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},"
                           "\"data\":{\"type\":\"csv\",\"path\":\"f.csv\",\"target\":[\"y\"],"
                           "\"shuffle\":false},\"batch_size\":3,\"epochs\":1}");
    huge_spec = mse_spec;
    huge_spec.batch_size = INT64_MAX; /* a batch is the whole shard; nothing sized by batch_size */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write("f.csv", data, size);
    fuzz_dataset(&mse_spec, 2);
    fuzz_dataset(&ce_spec, 1);
    fuzz_dataset(&huge_spec, 3);
    return 0;
}
