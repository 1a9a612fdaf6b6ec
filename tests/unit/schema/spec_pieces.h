/* spec_pieces.h — what the spec's unit tests share (test_spec.c, test_spec_v2.c,
 * test_spec_job.c): pieces of valid specs, to build specs that are wrong in exactly one
 * place; the parse call; the field-by-field comparison of two specs. */
#ifndef DDPD_TEST_SPEC_PIECES_H
#define DDPD_TEST_SPEC_PIECES_H

#include <string.h>

#include "check.h"
#include "schema/spec.h"

/* Pieces of a valid spec, to build specs that are wrong in exactly one place. */
#define MODEL                                       "\"model\":[{\"type\":\"linear\",\"in\":4,\"out\":2}]"
#define LOSS                                        "\"loss\":\"mse\""
#define OPTIM                                       "\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1}"
#define DATA                                        "\"data\":{\"type\":\"synthetic\",\"samples\":10}"
#define BATCH                                       "\"batch_size\":2,\"epochs\":1"
#define SPEC(model, loss, optim, data, batch, more) "{" model "," loss "," optim "," data "," batch more "}"
/* A valid spec plus `more` (which starts with a comma). */
#define OK_PLUS(more) SPEC(MODEL, LOSS, OPTIM, DATA, BATCH, more)
/* The widest model the caps allow (2^40 + 2^21 weights). */
#define WIDE_MODEL                                                                                           \
    "\"model\":[{\"type\":\"linear\",\"in\":1048576,\"out\":1048576},{\"type\":\"relu\"},"                   \
    "{\"type\":\"linear\",\"in\":1048576,\"out\":2}]"
#define WITH_MODEL(m) SPEC("\"model\":" m, LOSS, OPTIM, DATA, BATCH, "")
#define WITH_OPTIM(o) SPEC(MODEL, LOSS, "\"optimizer\":" o, DATA, BATCH, "")
#define WITH_DATA(d)  SPEC(MODEL, LOSS, OPTIM, "\"data\":" d, BATCH, "")
#define WITH_CSV(loss, target)                                                                               \
    SPEC(MODEL, "\"loss\":\"" loss "\"", OPTIM,                                                              \
         "\"data\":{\"type\":\"csv\",\"path\":\"t.csv\",\"target\":" target "}", BATCH, "")

/* v2 (§2a) pieces: a tiny GPT on tokens, and specs around any model and input_shape. */
#define ADAMW  "{\"type\":\"adamw\"}"
#define EMB    "{\"type\":\"embedding\",\"num\":8,\"dim\":4}"
#define TOKENS "{\"type\":\"tokens\",\"path\":\"t.bin\",\"block_size\":3}"
#define GPT_MODEL                                                                                            \
    "[" EMB ",{\"type\":\"position\",\"max\":3,\"dim\":4},{\"type\":\"residual\",\"layers\":["               \
    "{\"type\":\"layernorm\",\"dim\":4},{\"type\":\"attention\",\"dim\":4,\"heads\":2}]},"                   \
    "{\"type\":\"linear\",\"in\":4,\"out\":8}]"
#define GPT_WITH(optim, data, more)                                                                          \
    "{\"model\":" GPT_MODEL ",\"input_shape\":[3],\"loss\":\"cross_entropy\",\"optimizer\":" optim           \
    ",\"data\":" data ",\"batch_size\":2,\"steps\":10" more "}"
#define V2_TAIL                                                                                              \
    "\"loss\":\"cross_entropy\",\"optimizer\":" ADAMW ",\"data\":{\"type\":\"npy\",\"x\":\"x.npy\","         \
    "\"y\":\"y.npy\"},\"batch_size\":2,\"steps\":10"
#define V2(model, shape, loss)                                                                               \
    "{\"model\":" model ",\"input_shape\":" shape ",\"loss\":\"" loss "\",\"optimizer\":" ADAMW              \
    ",\"data\":{\"type\":\"npy\",\"x\":\"x.npy\",\"y\":\"y.npy\"},\"batch_size\":2,\"steps\":10}"
#define V2CE(model, shape)  V2(model, shape, "cross_entropy")
#define V2MSE(model, shape) V2(model, shape, "mse")
#define PRESET(fields)                                                                                       \
    "{\"model\":{" fields "},\"loss\":\"cross_entropy\",\"optimizer\":" ADAMW                                \
    ",\"data\":{\"type\":\"tokens\",\"path\":\"t.bin\",\"block_size\":3},\"batch_size\":2,\"steps\":10}"
#define V2_CONV_DATA(data)                                                                                   \
    "{\"model\":[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":3},{\"type\":\"flatten\"}],"             \
    "\"input_shape\":[1,4,4],\"loss\":\"mse\",\"optimizer\":" ADAMW ",\"data\":" data                        \
    ",\"batch_size\":2,\"steps\":10}"

static inline ddpd_err parse(const char *json, struct spec *s, struct ddpd_error *e)
{
    return spec_parse(json, strlen(json), NULL, s, e);
}

/* Every field, with device_set/backend_set left out: printing makes them explicit. */
static inline void check_same(const struct spec *a, const struct spec *b)
{
    struct spec x = *a, y = *b;
    x.device_set = y.device_set = false;
    x.ddp.backend_set = y.ddp.backend_set = false;
    CHECK(memcmp(&x, &y, sizeof x) == 0);
    CHECK_EQ_STR(x.name, y.name);
    CHECK_EQ_INT(x.n_layers, y.n_layers);
    CHECK(x.optim.lr == y.optim.lr && x.ddp.bucket_cap_mb == y.ddp.bucket_cap_mb);
}

#endif
