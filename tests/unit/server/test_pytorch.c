/* test_pytorch.c — server/pytorch.c, the model.py generator, on its own (what the file
 * computes is tests/parity/test_model_py.py's): the largest spec the validator takes (256
 * layers, residuals 8 deep, 1048576-wide layers) comes out whole, one line per layer in
 * preorder with its key, in ASCII with short lines; floats read back as Python writes
 * them and defaults are left out; a name with quotes, backslashes, characters past ASCII
 * and bytes that are not UTF-8 becomes one escaped string literal; generate() is there for
 * a GPT only; every example spec of the repository generates. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "schema/spec.h"
#include "server/pytorch.h"

static const char *TAIL =
    "\"loss\": \"mse\", \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, "
    "\"data\": {\"type\": \"npy\", \"x\": \"x.npy\", \"y\": \"y.npy\"}, \"batch_size\": 2, \"steps\": 1}";

/* model.py of spec text `json` (which must be valid), or aborts. */
static char *model_py(const char *json, struct spec *s)
{
    struct ddpd_error err = {0};
    if (spec_parse(json, strlen(json), NULL, s, &err) != DDPD_OK) {
        fprintf(stderr, "spec does not parse: %s: %s\n%s\n", err.path, err.message, json);
        abort();
    }
    char *py = pytorch_model_py(s, 12);
    CHECK(py != NULL);
    return py;
}

/* ASCII, printable but newlines, every line at most 110 characters but JOB_NAME's (a
 * name's escapes may take 10 characters a byte). */
static void check_text(const char *py)
{
    size_t longest = 0;
    for (const char *line = py; *line;) {
        size_t n = strcspn(line, "\n");
        for (size_t i = 0; i < n; i++)
            CHECK(line[i] >= 0x20 && line[i] < 0x7F);
        if (n > longest && strncmp(line, "JOB_NAME = ", 11) != 0)
            longest = n;
        line += n + (line[n] == '\n');
    }
    CHECK(longest <= 110);
}

/* The lines of build()'s body carry the keys of every layer, in preorder. */
static void check_keys(const char *py, const struct spec *s)
{
    const char *p = strstr(py, "    return nn.Sequential(\n");
    CHECK(p != NULL);
    for (int i = 0; i < s->n_layers; i++) {
        char want[64];
        snprintf(want, sizeof want, "# %s", s->layers[i].key);
        const char *at = strstr(p, want);
        CHECK(at != NULL);
        /* the key whole: "# 3" is not "# 3.1" */
        CHECK(at[strlen(want)] == '\n' || at[strlen(want)] == ':');
        p = at + strlen(want);
    }
}

#define LIN ", {\"type\": \"linear\", \"in\": 4, \"out\": 4}"

/* 256 layers, the most the validator takes: 4 residuals of 63 layers each (a list holds
 * at most 64); in the first, residuals nested 8 deep; in the last, a layer 1048576 wide. */
static void test_largest(void)
{
    static char json[1 << 16];
    static struct spec s;
    size_t o = (size_t)snprintf(json, sizeof json, "{\"model\": [{\"type\": \"residual\", \"layers\": [");
    for (int d = 0; d < 7; d++) /* 7 residuals and 7 linears */
        o += (size_t)snprintf(
            json + o, sizeof json - o,
            "{\"type\": \"residual\", \"layers\": [{\"type\": \"linear\", \"in\": 4, \"out\": 4}, ");
    o += (size_t)snprintf(json + o, sizeof json - o, "{\"type\": \"relu\"}");
    for (int d = 0; d < 7; d++)
        o += (size_t)snprintf(json + o, sizeof json - o, "]}");
    for (int i = 0; i < 48; i++) /* 15 + 48 = 63 */
        o += (size_t)snprintf(json + o, sizeof json - o, LIN);
    for (int r = 0; r < 2; r++) {
        o += (size_t)snprintf(json + o, sizeof json - o, "]}, {\"type\": \"residual\", \"layers\": [%s",
                              LIN + 2);
        for (int i = 1; i < 63; i++)
            o += (size_t)snprintf(json + o, sizeof json - o, LIN);
    }
    o += (size_t)snprintf(json + o, sizeof json - o, "]}, {\"type\": \"residual\", \"layers\": [%s", LIN + 2);
    for (int i = 1; i < 61; i++)
        o += (size_t)snprintf(json + o, sizeof json - o, LIN);
    o += (size_t)snprintf(
        json + o, sizeof json - o,
        ", {\"type\": \"linear\", \"in\": 4, \"out\": 1048576}, {\"type\": \"linear\", \"in\": "
        "1048576, \"out\": 4, \"bias\": false}]}], \"input_shape\": [4], %s",
        TAIL);
    CHECK(o < sizeof json);
    char *py = model_py(json, &s);
    CHECK_EQ_INT(s.n_layers, 256);
    check_text(py);
    check_keys(py, &s);
    /* the innermost layer: build()'s 2 levels and 8 residuals of 4 spaces each */
    CHECK(strstr(py, "\n                                        nn.ReLU(),") != NULL);
    CHECK(strstr(py, "nn.Linear(1048576, 4, bias=False),") != NULL);
    CHECK(strstr(py, "def generate(") == NULL);
    free(py);
}

static void test_floats_and_defaults(void)
{
    static char json[4096];
    static struct spec s;
    snprintf(
        json, sizeof json,
        "{\"model\": [{\"type\": \"linear\", \"in\": 3, \"out\": 6}, {\"type\": \"layernorm\", \"dim\": 6, "
        "\"eps\": "
        "1e-3}, {\"type\": \"layernorm\", \"dim\": 6, \"eps\": 1.5e-7, \"bias\": false}, {\"type\": "
        "\"layernorm\", \"dim\": 6}, {\"type\": \"dropout\", \"p\": 0.1}, {\"type\": \"dropout\", \"p\": 0}, "
        "{\"type\": \"batchnorm\", \"features\": 6, \"momentum\": 0.3}, {\"type\": \"batchnorm\", "
        "\"features\": 6}, {\"type\": \"gelu\"}, {\"type\": \"gelu\", \"approximate\": \"tanh\"}], "
        "\"input_shape\": [3], %s",
        TAIL);
    char *py = model_py(json, &s);
    check_text(py);
    const char *want[] = {"nn.LayerNorm(6, eps=0.001),",
                          "LayerNormNoBias(6, eps=1.5e-07),",
                          "nn.LayerNorm(6),",
                          "nn.Dropout(0.1),",
                          "nn.Dropout(0.0),",
                          "nn.BatchNorm1d(6, momentum=0.3),",
                          "nn.BatchNorm1d(6),",
                          "nn.GELU(),",
                          "nn.GELU(approximate=\"tanh\"),",
                          "class LayerNormNoBias(nn.Module):",
                          "INPUT_SHAPE = (3,)  # one sample"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (!strstr(py, want[i]))
            fprintf(stderr, "missing: %s\n", want[i]);
        CHECK(strstr(py, want[i]) != NULL);
    }
    CHECK(strstr(py, "class Attention") == NULL && strstr(py, "class Residual") == NULL);
    free(py);
}

static void test_name(void)
{
    static struct spec s;
    char json[1024];
    snprintf(json, sizeof json,
             "{\"name\": \"n\", \"model\": [{\"type\": \"linear\", \"in\": 2, \"out\": 1}], %s", TAIL);
    free(model_py(json, &s));
    /* Past what the validator lets through: the generator escapes whatever it is given. */
    snprintf(
        s.name, sizeof s.name,
        "a\"\"\"b\\c\n\t\x1b\x7f\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\xff\xc0\xaf\xed\xa0\x80\xf8\x80\x80z");
    char *py = pytorch_model_py(&s, 7);
    CHECK(py != NULL);
    check_text(py);
    const char *want =
        "\nJOB_NAME = \"a\\\"\\\"\\\"b\\\\c\\n\\t\\x1b\\x7f\\xe9\\u4e2d\\U0001f600\\ufffd\\ufffd\\ufffd"
        "\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffdz\"\n";
    if (!strstr(py, want))
        fprintf(stderr, "%.*s\n", 900, strstr(py, "JOB ="));
    CHECK(strstr(py, want) != NULL);
    CHECK(strstr(py, "\nJOB = 7\n") != NULL);
    free(py);
}

static void test_generative(void)
{
    static struct spec s;
    char json[2048];
    snprintf(
        json, sizeof json,
        "{\"model\": [{\"type\": \"embedding\", \"num\": 300, \"dim\": 8}, {\"type\": \"attention\", "
        "\"dim\": "
        "8, \"heads\": 2}, {\"type\": \"linear\", \"in\": 8, \"out\": 300}], \"input_shape\": [5], \"loss\": "
        "\"cross_entropy\", \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}, \"data\": {\"type\": "
        "\"tokens\", "
        "\"path\": \"t.bin\", \"block_size\": 5}, \"batch_size\": 2, \"steps\": 1}");
    char *py = model_py(json, &s);
    CHECK(pytorch_is_generative(&s));
    CHECK(strstr(py, "def generate(") != NULL && strstr(py, "BLOCK_SIZE = 5") != NULL);
    CHECK(strstr(py, "VOCAB = 300") != NULL);
    CHECK(strstr(py, "prompt.encode") == NULL); /* not a byte vocabulary: ids only */
    free(py);
    /* logits over another width: no generate() */
    snprintf(
        json, sizeof json,
        "{\"model\": [{\"type\": \"embedding\", \"num\": 300, \"dim\": 8}, {\"type\": \"linear\", \"in\": 8, "
        "\"out\": 7}], \"input_shape\": [5], \"loss\": \"cross_entropy\", \"optimizer\": {\"type\": \"sgd\", "
        "\"lr\": 0.1}, \"data\": {\"type\": \"tokens\", \"path\": \"t.bin\", \"block_size\": 5}, "
        "\"batch_size\": 2, \"steps\": 1}");
    py = model_py(json, &s);
    CHECK(!pytorch_is_generative(&s) && strstr(py, "def generate(") == NULL);
    free(py);
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open it\n", path);
        abort();
    }
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* The example specs (examples/), found from this test's data folder: DDPD_TEST_DATA is
 * <repo>/tests/data, which need not exist, so its path is cut rather than resolved. */
static void test_examples(void)
{
    const char *data = getenv("DDPD_TEST_DATA");
    const char *names[] = {"seed.json", "digits-cnn.json", "gpt-char.json"};
    char root[1024];
    snprintf(root, sizeof root, "%s", data ? data : "");
    char *cut = strstr(root, "/tests/data");
    CHECK(cut != NULL);
    if (!cut)
        return;
    *cut = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        static struct spec s;
        char path[1200];
        snprintf(path, sizeof path, "%s/examples/%s", root, names[i]);
        char *py = model_py(read_all(path), &s);
        check_text(py);
        check_keys(py, &s);
        CHECK((strstr(py, "def generate(") != NULL) == !strcmp(names[i], "gpt-char.json"));
        free(py);
    }
}

int main(void)
{
    test_largest();
    test_floats_and_defaults();
    test_name();
    test_generative();
    test_examples();
    CHECK_DONE();
}
