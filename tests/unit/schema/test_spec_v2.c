/* test_spec_v2.c — the model families of the spec's v2 (CONTRACT.md §2a): a GPT and a
 * conv net parse to the layers, shapes and memory the contract promises, their printed
 * form parses back, and the gpt preset and tied weights (issue 30) expand and check as
 * docs/spec.md says. */
#include "check.h"

#include <jansson.h>

#include "schema/spec.h"
#include "spec_pieces.h"

/* A GPT (§2a) on tokens with eval, a schedule and clipping: every layer's keys, defaults,
 * place in the tree and shapes, and what the data readers ask of it. */
static const char *gpt_spec =
    "{\"model\":[{\"type\":\"embedding\",\"num\":65,\"dim\":32},{\"type\":\"position\",\"max\":16,\"dim\":32}"
    ","
    "{\"type\":\"residual\",\"layers\":[{\"type\":\"layernorm\",\"dim\":32},"
    "{\"type\":\"attention\",\"dim\":32,\"heads\":4}]},"
    "{\"type\":\"residual\",\"layers\":[{\"type\":\"layernorm\",\"dim\":32,\"eps\":1e-6},"
    "{\"type\":\"linear\",\"in\":32,\"out\":128},{\"type\":\"gelu\",\"approximate\":\"tanh\"},"
    "{\"type\":\"linear\",\"in\":128,\"out\":32},{\"type\":\"dropout\",\"p\":0.1}]},"
    "{\"type\":\"residual\",\"layers\":[{\"type\":\"attention\",\"dim\":32,\"heads\":2,\"causal\":false,"
    "\"bias\":false},{\"type\":\"residual\",\"layers\":[{\"type\":\"gelu\"}]}]},"
    "{\"type\":\"layernorm\",\"dim\":32,\"bias\":false},{\"type\":\"linear\",\"in\":32,\"out\":65,\"bias\":"
    "false}],"
    "\"input_shape\":[16],\"loss\":\"cross_entropy\","
    "\"optimizer\":{\"type\":\"adamw\",\"lr\":0.001,\"schedule\":{\"type\":\"cosine\",\"warmup_steps\":2,"
    "\"min_lr\":1e-5}},"
    "\"data\":{\"type\":\"tokens\",\"path\":\"train.bin\",\"block_size\":16},"
    "\"eval\":{\"data\":{\"type\":\"tokens\",\"path\":\"val.bin\",\"block_size\":16,\"dtype\":\"int32\"},"
    "\"every_steps\":5,\"max_batches\":2},"
    "\"grad_clip\":1,\"batch_size\":4,\"steps\":10}";

/* A conv net: conv2d, both poolings, batchnorm 2d and 1d, flatten. */
static const char *conv_spec =
    "{\"model\":[{\"type\":\"conv2d\",\"in\":1,\"out\":8,\"kernel\":3,\"padding\":1},"
    "{\"type\":\"batchnorm\",\"features\":8},{\"type\":\"relu\"},{\"type\":\"maxpool2d\",\"kernel\":2},"
    "{\"type\":\"conv2d\",\"in\":8,\"out\":16,\"kernel\":[3,2],\"stride\":[1,2],\"bias\":false},"
    "{\"type\":\"avgpool2d\",\"kernel\":2,\"stride\":1,\"padding\":1},{\"type\":\"flatten\"},"
    "{\"type\":\"linear\",\"in\":144,\"out\":10},"
    "{\"type\":\"batchnorm\",\"features\":10,\"momentum\":0.2,\"eps\":0.001}],"
    "\"input_shape\":[1,8,8],\"loss\":\"cross_entropy\",\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},"
    "\"data\":{\"type\":\"npy\",\"x\":\"x.npy\",\"y\":\"y.npy\"},\"batch_size\":4,\"epochs\":1}";

static void check_shape(const struct spec_layer *l, int in_rank, const int64_t *in, int out_rank,
                        const int64_t *out)
{
    CHECK_EQ_INT(l->in_rank, in_rank);
    CHECK_EQ_INT(l->out_rank, out_rank);
    for (int i = 0; i < in_rank; i++)
        CHECK_EQ_INT(l->in_shape[i], in[i]);
    for (int i = 0; i < out_rank; i++)
        CHECK_EQ_INT(l->out_shape[i], out[i]);
}

static void test_v2_gpt(void)
{
    struct spec s;
    struct ddpd_error e;
    const int64_t T16[] = {16}, TD[] = {16, 32}, TH[] = {16, 128}, TV[] = {16, 65};
    CHECK_EQ_INT(parse(gpt_spec, &s, &e), DDPD_OK);
    CHECK_EQ_STR(e.message, "");
    CHECK_EQ_INT(s.n_layers, 17);
    CHECK(s.input_shape_set);
    CHECK_EQ_INT(s.input_rank, 1);
    CHECK_EQ_INT(s.input_shape[0], 16);
    /* The tree, flat in preorder. */
    static const struct {
        layer_kind kind;
        int parent, end;
        const char *key;
    } tree[] = {
        {LAYER_EMBEDDING, -1, 1, "0"},    {LAYER_POSITION, -1, 2, "1"},    {LAYER_RESIDUAL, -1, 5, "2"},
        {LAYER_LAYERNORM, 2, 4, "2.0"},   {LAYER_ATTENTION, 2, 5, "2.1"},  {LAYER_RESIDUAL, -1, 11, "3"},
        {LAYER_LAYERNORM, 5, 7, "3.0"},   {LAYER_LINEAR, 5, 8, "3.1"},     {LAYER_GELU_TANH, 5, 9, "3.2"},
        {LAYER_LINEAR, 5, 10, "3.3"},     {LAYER_DROPOUT, 5, 11, "3.4"},   {LAYER_RESIDUAL, -1, 15, "4"},
        {LAYER_ATTENTION, 11, 13, "4.0"}, {LAYER_RESIDUAL, 11, 15, "4.1"}, {LAYER_GELU, 13, 15, "4.1.0"},
        {LAYER_LAYERNORM, -1, 16, "5"},   {LAYER_LINEAR, -1, 17, "6"}};
    for (int i = 0; i < 17; i++) {
        CHECK_EQ_INT(s.layers[i].kind, tree[i].kind);
        CHECK_EQ_INT(s.layers[i].parent, tree[i].parent);
        CHECK_EQ_INT(s.layers[i].end, tree[i].end);
        CHECK_EQ_STR(s.layers[i].key, tree[i].key);
    }
    CHECK_EQ_INT(s.n_layers, 17);
    /* Keys and defaults. */
    const struct spec_layer *L = s.layers;
    CHECK_EQ_INT(L[0].num, 65);
    CHECK_EQ_INT(L[0].dim, 32);
    CHECK_EQ_INT(L[0].in, 65);
    CHECK_EQ_INT(L[0].out, 32);
    CHECK_EQ_INT(L[1].num, 16); /* position: max */
    CHECK_EQ_INT(L[1].dim, 32);
    CHECK(L[3].eps == 1e-5 && L[3].bias);
    CHECK(L[6].eps == 1e-6);
    CHECK_EQ_INT(L[4].heads, 4);
    CHECK(L[4].causal && L[4].bias);
    CHECK_EQ_INT(L[12].heads, 2);
    CHECK(!L[12].causal && !L[12].bias);
    CHECK(L[10].p == 0.1);
    CHECK_EQ_INT(L[8].in, 128); /* activations: the width */
    CHECK_EQ_INT(L[8].out, 128);
    CHECK(!L[15].bias && !L[16].bias);
    /* Shapes. */
    check_shape(&L[0], 1, T16, 2, TD);
    check_shape(&L[2], 2, TD, 2, TD);
    check_shape(&L[7], 2, TD, 2, TH);
    check_shape(&L[8], 2, TH, 2, TH);
    check_shape(&L[13], 2, TD, 2, TD);
    check_shape(&L[15], 2, TD, 2, TD);
    check_shape(&L[16], 2, TD, 2, TV);
    /* What the data readers ask. */
    CHECK(spec_input_ids(&s));
    CHECK_EQ_INT(spec_vocab(&s), 65);
    CHECK_EQ_INT(spec_sample_numel(&s), 16);
    CHECK_EQ_INT(spec_target_numel(&s), 16); /* [T] class ids */
    CHECK_EQ_INT(spec_classes(&s), 65);
    CHECK_EQ_INT(spec_in_width(&s), 65);
    CHECK_EQ_INT(spec_out_width(&s), 65);
    /* embedding 65·32, position 16·32, layernorm 2·32, attention 4·32²+4·32, layernorm, mlp
     * 32·128+128 + 128·32+32, attention without bias 4·32², layernorm without bias 32, head 32·65. */
    CHECK_EQ_INT(spec_param_count(&s), 65 * 32 + 16 * 32 + 64 + (4 * 1024 + 128) + 64 + (32 * 128 + 128) +
                                           (128 * 32 + 32) + 4 * 1024 + 32 + 32 * 65);
    /* Data, eval, schedule, clipping. */
    CHECK_EQ_INT(s.data.kind, DATA_TOKENS);
    CHECK_EQ_STR(s.data.path, "train.bin");
    CHECK_EQ_INT(s.data.block_size, 16);
    CHECK_EQ_INT(s.data.dtype, TOKENS_UINT16);
    CHECK(s.data.shuffle && !s.data.drop_last);
    CHECK_EQ_INT(s.eval.every_steps, 5);
    CHECK_EQ_INT(s.eval.max_batches, 2);
    CHECK_EQ_INT(s.eval.data.kind, DATA_TOKENS);
    CHECK_EQ_INT(s.eval.data.dtype, TOKENS_INT32);
    CHECK_EQ_STR(s.eval.data.path, "val.bin");
    CHECK(!s.eval.data.shuffle); /* eval data is never shuffled */
    CHECK_EQ_INT(s.optim.schedule, SCHED_COSINE);
    CHECK_EQ_INT(s.optim.warmup_steps, 2);
    CHECK(s.optim.min_lr == 1e-5);
    CHECK_EQ_INT(s.optim.total_steps, 0);
    CHECK(s.grad_clip == 1.0);

    /* Without them: off. */
    CHECK_EQ_INT(parse(OK_PLUS(""), &s, &e), DDPD_OK);
    CHECK_EQ_INT(s.eval.every_steps, 0);
    CHECK_EQ_INT(s.optim.schedule, SCHED_CONSTANT);
    CHECK_EQ_INT(s.optim.warmup_steps, 0);
    CHECK(s.optim.min_lr == 0 && s.grad_clip == 0);
    CHECK(!s.input_shape_set);
    CHECK_EQ_INT(s.input_rank, 1);
    CHECK_EQ_INT(s.input_shape[0], 4);
    CHECK(!spec_input_ids(&s));
    CHECK_EQ_INT(spec_vocab(&s), 0);
    CHECK_EQ_INT(spec_target_numel(&s), 2);
    /* A v1 MLP may give input_shape, as [model[0].in]. */
    CHECK_EQ_INT(parse(OK_PLUS(",\"input_shape\":[4]"), &s, &e), DDPD_OK);
    CHECK(s.input_shape_set);
    /* Sequence mse on [T,dim], linear acting on the last dimension. */
    CHECK_EQ_INT(parse(V2MSE("[" EMB ",{\"type\":\"linear\",\"in\":4,\"out\":2}]", "[3]"), &s, &e), DDPD_OK);
    CHECK_EQ_INT(spec_target_numel(&s), 6);
    CHECK_EQ_INT(spec_classes(&s), 2);
    /* warmup below total_steps given explicitly, though not below steps */
    CHECK_EQ_INT(parse(GPT_WITH("{\"type\":\"adamw\",\"schedule\":{\"type\":\"linear\",\"warmup_steps\":20,"
                                "\"total_steps\":30}}",
                                TOKENS, ""),
                       &s, &e),
                 DDPD_OK);
    CHECK_EQ_INT(s.optim.schedule, SCHED_LINEAR);
    CHECK_EQ_INT(s.optim.total_steps, 30);

    for (int k = LAYER_LINEAR; k <= LAYER_FLATTEN; k++)
        CHECK(strcmp(layer_kind_name((layer_kind)k), "unknown") != 0);
    CHECK_EQ_STR(layer_kind_name(LAYER_GELU_TANH), "gelu");
    CHECK_EQ_STR(layer_kind_name(LAYER_AVGPOOL2D), "avgpool2d");
    CHECK_EQ_STR(layer_kind_name(LAYER_FLATTEN), "flatten");
    CHECK_EQ_STR(layer_kind_name((layer_kind)(LAYER_FLATTEN + 1)), "unknown");
}

static void test_v2_conv(void)
{
    struct spec s;
    struct ddpd_error e;
    CHECK_EQ_INT(parse(conv_spec, &s, &e), DDPD_OK);
    CHECK_EQ_STR(e.message, "");
    CHECK_EQ_INT(s.n_layers, 9);
    const struct spec_layer *L = s.layers;
    for (int i = 0; i < 9; i++) {
        CHECK_EQ_INT(L[i].parent, -1);
        CHECK_EQ_INT(L[i].end, i + 1);
    }
    /* conv2d: an int kernel is [k,k]; stride 1 and padding 0 by default. */
    CHECK_EQ_INT(L[0].kernel[0], 3);
    CHECK_EQ_INT(L[0].kernel[1], 3);
    CHECK_EQ_INT(L[0].stride[0], 1);
    CHECK_EQ_INT(L[0].stride[1], 1);
    CHECK_EQ_INT(L[0].padding[0], 1);
    CHECK(L[0].bias);
    CHECK_EQ_INT(L[0].in, 1);
    CHECK_EQ_INT(L[0].out, 8);
    CHECK(L[1].eps == 1e-5 && L[1].momentum == 0.1);
    CHECK_EQ_INT(L[1].dim, 8);
    /* pooling: stride = kernel by default */
    CHECK_EQ_INT(L[3].stride[0], 2);
    CHECK_EQ_INT(L[3].stride[1], 2);
    CHECK_EQ_INT(L[3].padding[1], 0);
    CHECK_EQ_INT(L[3].in, 8);
    CHECK_EQ_INT(L[4].kernel[1], 2);
    CHECK_EQ_INT(L[4].stride[1], 2);
    CHECK(!L[4].bias);
    CHECK_EQ_INT(L[5].stride[0], 1);
    CHECK_EQ_INT(L[5].padding[0], 1);
    CHECK(L[8].eps == 0.001 && L[8].momentum == 0.2);
    const int64_t x[] = {1, 8, 8}, c1[] = {8, 8, 8}, p1[] = {8, 4, 4}, c2[] = {16, 2, 2}, p2[] = {16, 3, 3},
                  f[] = {144}, o[] = {10};
    check_shape(&L[0], 3, x, 3, c1);
    check_shape(&L[3], 3, c1, 3, p1);
    check_shape(&L[4], 3, p1, 3, c2);
    check_shape(&L[5], 3, c2, 3, p2);
    check_shape(&L[6], 3, p2, 1, f);
    check_shape(&L[8], 1, o, 1, o);
    CHECK_EQ_INT(L[6].in, 144);
    CHECK(!spec_input_ids(&s));
    CHECK_EQ_INT(spec_sample_numel(&s), 64);
    CHECK_EQ_INT(spec_target_numel(&s), 1);
    CHECK_EQ_INT(spec_classes(&s), 10);
    /* conv 8·1·9+8, batchnorm 2·8 (its running statistics are buffers), conv 16·8·6, linear
     * 144·10+10, batchnorm 2·10: PyTorch counts 2334. */
    CHECK_EQ_INT(spec_param_count(&s), 2334);
    /* mse on [C,H,W]: every element is a target. */
    CHECK_EQ_INT(parse(V2MSE("[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":3}]", "[1,8,8]"), &s, &e),
                 DDPD_OK);
    CHECK_EQ_INT(spec_target_numel(&s), 2 * 6 * 6);
}

/* A tokenizer is printed back as given, and parses back to the same paths. */
static void test_tokenizer_round_trip(void)
{
    const char *text =
        GPT_WITH(ADAMW, TOKENS, ",\"tokenizer\":{\"vocab\":\"gpt2/vocab.json\",\"merges\":\"gpt2/m.txt\"}");
    struct spec a, b;
    struct ddpd_error e;
    CHECK_EQ_INT(parse(text, &a, &e), DDPD_OK);
    CHECK_EQ_STR(a.tokenizer_vocab, "gpt2/vocab.json");
    CHECK_EQ_STR(a.tokenizer_merges, "gpt2/m.txt");
    char *back = spec_dumps(&a);
    CHECK(back && strstr(back, "\"tokenizer\":{\"vocab\":\"gpt2/vocab.json\",\"merges\":\"gpt2/m.txt\"}"));
    CHECK_EQ_INT(parse(back, &b, &e), DDPD_OK);
    CHECK_EQ_STR(b.tokenizer_vocab, a.tokenizer_vocab);
    CHECK_EQ_STR(b.tokenizer_merges, a.tokenizer_merges);
    free(back);
}

static void test_v2_round_trip(void)
{
    const char *specs[] = {gpt_spec, conv_spec};
    for (size_t i = 0; i < 2; i++) {
        struct spec a, b;
        struct ddpd_error e;
        CHECK_EQ_INT(parse(specs[i], &a, &e), DDPD_OK);
        char *text = spec_dumps(&a);
        CHECK(text != NULL);
        CHECK_EQ_INT(parse(text, &b, &e), DDPD_OK);
        CHECK_EQ_STR(e.message, "");
        check_same(&a, &b);
        json_t *j = spec_to_json(&a), *j2 = spec_to_json(&b);
        CHECK(json_equal(j, j2));
        /* Every default written out. */
        json_t *model = json_object_get(j, "model");
        if (i == 0) {
            json_t *ln = json_array_get(json_object_get(json_array_get(model, 2), "layers"), 0);
            CHECK(json_real_value(json_object_get(ln, "eps")) == 1e-5);
            CHECK(json_is_true(json_object_get(ln, "bias")));
            json_t *att = json_array_get(json_object_get(json_array_get(model, 2), "layers"), 1);
            CHECK(json_is_true(json_object_get(att, "causal")));
            CHECK_EQ_STR(
                json_string_value(json_object_get(
                    json_array_get(json_object_get(json_array_get(model, 3), "layers"), 2), "approximate")),
                "tanh");
            json_t *sched = json_object_get(json_object_get(j, "optimizer"), "schedule");
            CHECK_EQ_STR(json_string_value(json_object_get(sched, "type")), "cosine");
            CHECK(json_object_get(sched, "total_steps") == NULL);
            CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "data"), "dtype")), "uint16");
            CHECK(json_is_false(
                json_object_get(json_object_get(json_object_get(j, "eval"), "data"), "shuffle")));
            CHECK(json_real_value(json_object_get(j, "grad_clip")) == 1.0);
            CHECK_EQ_INT(json_array_size(json_object_get(j, "input_shape")), 1);
            CHECK(json_object_get(j, "tokenizer") == NULL); /* none unless given */
        } else {
            json_t *pool = json_array_get(model, 3);
            CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(pool, "stride"), 1)), 2);
            CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(pool, "padding"), 0)), 0);
            CHECK(json_real_value(json_object_get(json_array_get(model, 1), "momentum")) == 0.1);
            CHECK(json_object_get(j, "eval") == NULL && json_object_get(j, "grad_clip") == NULL);
        }
        free(text);
        json_decref(j);
        json_decref(j2);
    }
}

/* The memory estimate of v2 layers, by hand for a tiny GPT: embedding [3] -> [3,4], then
 * attention (heads 2) on [3,4]. */
static void test_v2_memory(void)
{
    struct spec s;
    struct spec_memory m;
    struct ddpd_error e;
    CHECK_EQ_INT(
        parse("{\"model\":[" EMB ",{\"type\":\"attention\",\"dim\":4,\"heads\":2}],\"input_shape\":[3],"
              "\"loss\":\"mse\",\"optimizer\":{\"type\":\"sgd\",\"lr\":0.1},\"data\":{\"type\":\"npy\","
              "\"x\":\"x.npy\",\"y\":\"y.npy\"},\"batch_size\":2,\"steps\":10}",
              &s, &e),
        DDPD_OK);
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 10, .rank_file = false, .file_bytes = 0}, &m);
    CHECK_EQ_INT(m.rows, 2);
    CHECK_EQ_INT(m.params, 4 * (8 * 4 + 4 * 16 + 4 * 4));
    /* What model_new_err allocates (worker/model.c, layers/attention.c): the outputs
     * 12 + 12 per row; attention saves q, k, v, the merged heads (4·T·dim) and the
     * probabilities (heads·T·T); its scratch, the largest, 8·T·dim + 2·heads·T·T; backward's
     * dy ping-pong 2 × the widest (12) at one depth. */
    CHECK_EQ_INT(m.activations,
                 4 * (2 * (12 + 12) + 2 * (4 * 12 + 2 * 9) + 2 * (8 * 12 + 2 * 2 * 9) + 2 * 2 * 12));
    /* Host: x [3] ids, y [3,4], the labels (train.c sizes them by the target too), two
     * copies of the step's loss (grad_accum 1). Device: the same once, the loss gradient
     * [3,4] and the loss. */
    CHECK_EQ_INT(m.batch, 4 * (2 * (3 + 2 * 12) + 2) + 4 * (2 * (3 + 2 * 12 + 12) + 1));
    /* A small npy file is loaded (x ids and y as 4-byte values), with the shard's order
     * and the permutation; a large one is memory-mapped: only the order and permutation. */
    CHECK_EQ_INT(m.data, 10 * 4 * (3 + 12) + 10 * 8 + 10 * 8);
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 10000000, .rank_file = false, .file_bytes = 0},
                         &m);
    CHECK_EQ_INT(m.data, 10000000LL * 8 + 10000000LL * 8);
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 2000000, .rank_file = false, .file_bytes = 0},
                         &m); /* x 24 MB loaded, y 96 MB mapped */
    CHECK_EQ_INT(m.data, 2000000LL * 4 * 3 + 2000000LL * 8 + 2000000LL * 8);
    /* tokens likewise */
    CHECK_EQ_INT(parse(GPT_WITH(ADAMW, TOKENS, ""), &s, &e), DDPD_OK);
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 1000000, .rank_file = false, .file_bytes = 0},
                         &m);
    CHECK_EQ_INT(m.data, 1000000 * 8 + 1000000 * 8);
    /* A tokens file per rank (issue 28), for the data and eval.data: the rank's own file is
     * its shard (its windows, the order and the permutation; the file itself is mapped). */
    CHECK_EQ_INT(parse(GPT_WITH(ADAMW, "{\"type\":\"tokens\",\"path\":\"t-{rank}.bin\",\"block_size\":3}",
                                ",\"world_size\":2,\"eval\":{\"data\":{\"type\":\"tokens\",\"path\":"
                                "\"v{rank}/v.bin\",\"block_size\":3,\"shuffle\":false},\"every_steps\":5}"),
                       &s, &e),
                 DDPD_OK);
    CHECK_EQ_STR(s.data.path, "t-{rank}.bin");
    CHECK_EQ_STR(s.eval.data.path, "v{rank}/v.bin");
    spec_memory_estimate(
        &s,
        &(struct spec_memory_in){.rows = 1000, .rank_file = true, .eval_rows = 30, .eval_rank_file = true},
        &m);
    CHECK_EQ_INT(m.data, 1000 * 8 + 1000 * 8);
    CHECK_EQ_INT(m.eval, 30 * 8);
    /* conv2d's im2col and batchnorm's statistics count. */
    CHECK_EQ_INT(parse(V2MSE("[{\"type\":\"conv2d\",\"in\":1,\"out\":2,\"kernel\":3},{\"type\":\"batchnorm\","
                             "\"features\":2}]",
                             "[1,4,4]"),
                       &s, &e),
                 DDPD_OK);
    spec_memory_estimate(&s, &(struct spec_memory_in){.rows = 2, .rank_file = false, .file_bytes = 0}, &m);
    /* outputs 8 + 8; batchnorm saves its mean and invstd (2 × 2); the largest scratch is
     * conv's im2col 1·9·2·2 = 36 per row and its row of ones (2·2), above batchnorm's dx
     * (8 per row); backward's dy 2 × 16 per row; the running mean, var (2 × 2 floats) and
     * num_batches_tracked (8 bytes). */
    CHECK_EQ_INT(m.activations, 4 * (2 * (8 + 8) + 2 * 2 + (2 * 36 + 4) + 2 * 2 * 16) + 4 * 2 * 2 + 8);
}

/* tie (issue 30): "0" or 0 names the embedding; a tied linear inside a residual too; the
 * tied weight counted once; the key printed back; spec_layer_tie ignores a zeroed tie. */
static void test_tie(void)
{
    static const char *const specs[] = {
        V2CE("[" EMB ",{\"type\":\"linear\",\"in\":4,\"out\":8,\"bias\":false,\"tie\":\"0\"}]", "[3]"),
        V2CE("[" EMB ",{\"type\":\"linear\",\"in\":4,\"out\":8,\"bias\":false,\"tie\":0}]", "[3]"),
        V2CE("[" EMB ",{\"type\":\"residual\",\"layers\":[{\"type\":\"linear\",\"in\":4,\"out\":4}]},"
             "{\"type\":\"linear\",\"in\":4,\"out\":8,\"tie\":\"0\"}]",
             "[3]"),
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        struct spec a, b;
        struct ddpd_error e;
        CHECK_EQ_INT(parse(specs[i], &a, &e), DDPD_OK);
        CHECK_EQ_STR(e.message, "");
        const int head = a.n_layers - 1;
        CHECK_EQ_INT(a.layers[head].tie, 0);
        CHECK_EQ_INT(spec_layer_tie(&a, head), 0);
        CHECK_EQ_INT(a.layers[0].tie, -1);
        CHECK_EQ_INT(spec_layer_tie(&a, 0), -1);
        /* the embedding's 8x4 once, the head's bias, the residual's linear */
        CHECK_EQ_INT(spec_param_count(&a), 32 + (a.layers[head].bias ? 8 : 0) + (i == 2 ? 20 : 0));
        char *text = spec_dumps(&a);
        CHECK(text != NULL);
        CHECK(strstr(text, "\"tie\":\"0\"") != NULL);
        CHECK_EQ_INT(parse(text, &b, &e), DDPD_OK);
        check_same(&a, &b);
        free(text);
        /* A list built in code and zeroed: tie 0 on a linear whose shape does not fit the
         * embedding is no tie. */
        b.layers[head].tie = 0;
        b.layers[head].out = 7;
        CHECK_EQ_INT(spec_layer_tie(&b, head), -1);
    }
}

/* The gpt preset (issue 30): its expansion, input_shape [block_size], the preset printed
 * back with `expanded` beside it, parsed to the same spec. */
static void test_preset(void)
{
    struct spec a, b;
    struct ddpd_error e;
    CHECK_EQ_INT(parse(PRESET("\"preset\":\"gpt\",\"layers\":3,\"dim\":8,\"heads\":2,\"vocab\":11,"
                              "\"block_size\":3,\"bias\":false"),
                       &a, &e),
                 DDPD_OK);
    CHECK_EQ_STR(e.message, "");
    CHECK_EQ_STR(a.preset.name, "gpt");
    CHECK_EQ_INT(a.n_layers, 8 * 3 + 5);
    CHECK_EQ_INT(a.input_rank, 1);
    CHECK_EQ_INT(a.input_shape[0], 3);
    CHECK_EQ_INT(a.layers[0].kind, LAYER_EMBEDDING);
    CHECK_EQ_INT(a.layers[2].kind, LAYER_DROPOUT);
    CHECK_EQ_INT(a.layers[4].kind, LAYER_LAYERNORM); /* 3.0: the first block's ln_1 */
    CHECK(!a.layers[4].bias);
    CHECK_EQ_INT(a.layers[5].heads, 2);
    CHECK_EQ_INT(a.layers[9].kind, LAYER_GELU_TANH); /* 4.2 */
    CHECK_EQ_STR(a.layers[a.n_layers - 1].key, "10");
    CHECK_EQ_INT(a.layers[a.n_layers - 1].tie, 0);
    CHECK(!a.layers[a.n_layers - 1].bias);
    /* embedding 11·8 once; per block: attention 4·64, MLP 8·32 + 32·8, no biases, no
     * layernorm biases; the layernorms' weights 2·8 per block and ln_f 8; position 3·8 */
    CHECK_EQ_INT(spec_param_count(&a), 88 + 24 + 3 * (256 + 512 + 16) + 8);
    char *text = spec_dumps(&a);
    CHECK(text != NULL);
    CHECK(strstr(text, "\"model\":{\"preset\":\"gpt\"") != NULL && strstr(text, "\"expanded\":[") != NULL);
    CHECK_EQ_INT(parse(text, &b, &e), DDPD_OK);
    CHECK_EQ_STR(e.message, "");
    check_same(&a, &b);
    free(text);
    /* tie false: the head has its own weight */
    CHECK_EQ_INT(parse(PRESET("\"preset\":\"gpt\",\"layers\":1,\"dim\":8,\"heads\":2,\"vocab\":11,"
                              "\"block_size\":3,\"tie\":false"),
                       &a, &e),
                 DDPD_OK);
    CHECK_EQ_INT(a.layers[a.n_layers - 1].tie, -1);
}

int main(void)
{
    test_v2_gpt();
    test_v2_conv();
    test_v2_round_trip();
    test_tokenizer_round_trip();
    test_v2_memory();
    test_tie();
    test_preset();
    CHECK_DONE();
}
