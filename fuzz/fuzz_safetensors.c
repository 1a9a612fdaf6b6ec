/* fuzz_safetensors.c — the safetensors reader (schema/safetensors.c) on any file, as
 * `init.from` and checkpoint restores call it. A file either fails with DDPD_EDATA naming
 * it, or every tensor it lists can be read in full (ASan checks the bounds) and found by
 * its name. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_files.h"
#include "schema/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[1024];
    struct ddpd_error err;
    fuzz_write("f.safetensors", data, size);
    snprintf(path, sizeof path, "%s/f.safetensors", fuzz_dir());
    struct safetensors_file *f = safetensors_read(path, &err);
    if (!f) {
        if (err.code != DDPD_EDATA || !strstr(err.message, "f.safetensors")) {
            fprintf(stderr, "fuzz_safetensors: unexpected %s: %s\n", ddpd_err_name(err.code), err.message);
            abort();
        }
        return 0;
    }
    float sum = 0; /* read every value: ASan checks each one is inside the tensor's block */
    for (int i = 0; i < safetensors_count(f); i++) {
        const struct safetensors_tensor *t = safetensors_at(f, i);
        int64_t numel = 1;
        if (t->ndim < 0 || t->ndim > SAFETENSORS_MAX_DIMS)
            abort();
        for (int d = 0; d < t->ndim; d++)
            numel *= t->shape[d];
        for (int64_t k = 0; k < numel; k++)
            sum += t->data[k];
        if (safetensors_get(f, t->name) == NULL) {
            fprintf(stderr, "fuzz_safetensors: tensor \"%s\" is listed but not found\n", t->name);
            abort();
        }
    }
    if (sum != sum && safetensors_count(f) < 0) /* keeps the reads; never true */
        abort();
    (void)safetensors_meta_get(f, "step");
    safetensors_free(f);
    return 0;
}
