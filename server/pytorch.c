/* pytorch.c — model.py from a job's spec (pytorch.h). The file reads like a hand-written
 * PyTorch module: the helper classes the spec needs (Residual, Position, Attention, a
 * LayerNorm without bias), build() as one nn.Sequential with a comment per layer naming its
 * state_dict key and shapes, a safetensors reader, load() and, for a GPT, generate().
 * The semantics are those of tests/pylib/torch_models.py, the tests' PyTorch reference. Only
 * numbers the validator checked and the escaped name reach the text. */
#include "pytorch.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../schema/spec.h"

#ifndef DDPD_VERSION
#define DDPD_VERSION "unknown"
#endif

#define DEFAULT_EPS      1e-5 /* nn.LayerNorm's and nn.BatchNorm's, as the spec's */
#define DEFAULT_MOMENTUM 0.1
#define COMMENT_COL_MAX  56 /* build()'s layer comments line up here, or after a longer line */

/* ---- a growing text ---------------------------------------------------------------- */

struct text {
    char *p;
    size_t n, cap;
    bool oom;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct text *t, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !t->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            t->oom = true;
            return;
        }
        if (t->p && (size_t)w < t->cap - t->n) {
            t->n += (size_t)w;
            return;
        }
        size_t cap = t->cap ? t->cap : 8192;
        while (cap < t->n + (size_t)w + 1)
            cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->oom = true;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
}

/* ---- Python literals --------------------------------------------------------------- */

/* x as Python's repr writes a float: the fewest digits that read back as x ("1e-05",
 * "0.1", "0.0"). The spec's floats are finite. */
static void py_float(char *dst, size_t cap, double x)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(dst, cap, "%.*g", prec, x);
        if (strtod(dst, NULL) == x)
            break;
    }
    size_t len = strlen(dst);
    if (!strpbrk(dst, ".e"))
        snprintf(dst + len, cap - len, ".0");
}

/* One UTF-8 character at s (n bytes left): its code point and length, or U+FFFD and 1 for
 * a byte that does not begin a valid, shortest-form character. */
static unsigned utf8_next(const unsigned char *s, size_t n, size_t *len)
{
    unsigned c = s[0];
    unsigned need = c >= 0xF5 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 ? 1 : 0;
    *len = 1;
    if (c < 0x80)
        return c;
    if (!need || need >= n)
        return 0xFFFD;
    unsigned cp = c & (0x3F >> need);
    for (unsigned i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0xFFFD;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const unsigned least[] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0xFFFD;
    *len = need + 1;
    return cp;
}

/* s as a Python string literal in ASCII: quotes and backslashes escaped, every control
 * character and everything past ASCII as an escape. A name cannot end the literal, so it
 * cannot become code. */
static void put_py_str(struct text *t, const char *s)
{
    size_t n = strlen(s);
    put(t, "\"");
    for (size_t i = 0; i < n;) {
        size_t len;
        unsigned c = utf8_next((const unsigned char *)s + i, n - i, &len);
        i += len;
        if (c == '"' || c == '\\')
            put(t, "\\%c", (char)c);
        else if (c == '\n')
            put(t, "\\n");
        else if (c == '\t')
            put(t, "\\t");
        else if (c >= 0x20 && c < 0x7F)
            put(t, "%c", (char)c);
        else if (c < 0x100)
            put(t, "\\x%02x", c);
        else if (c < 0x10000)
            put(t, "\\u%04x", c);
        else
            put(t, "\\U%08x", c);
    }
    put(t, "\"");
}

/* "[64, 256]" (with_batch: "[B, 64, 256]"). */
static void shape_py(char *dst, size_t cap, int rank, const int64_t *shape, bool with_batch)
{
    size_t o = (size_t)snprintf(dst, cap, "[%s", with_batch ? "B" : "");
    for (int i = 0; i < rank && o < cap; i++)
        o += (size_t)snprintf(dst + o, cap - o, "%s%" PRId64, i || with_batch ? ", " : "", shape[i]);
    if (o < cap)
        snprintf(dst + o, cap - o, "]");
}

/* "208,640" */
static void thousands(char *dst, size_t cap, int64_t v)
{
    char d[32];
    int n = snprintf(d, sizeof d, "%" PRId64, v), o = 0;
    for (int i = 0; i < n && (size_t)o + 2 < cap; i++) {
        if (i && (n - i) % 3 == 0)
            dst[o++] = ',';
        dst[o++] = d[i];
    }
    dst[o] = '\0';
}

/* ---- what the spec is ------------------------------------------------------------- */

static bool uses(const struct spec *s, layer_kind k, bool bias)
{
    for (int i = 0; i < s->n_layers; i++)
        if (s->layers[i].kind == k && s->layers[i].bias == bias)
            return true;
    return false;
}

static bool uses_any(const struct spec *s, layer_kind k)
{
    return uses(s, k, true) || uses(s, k, false);
}

bool pytorch_is_generative(const struct spec *s)
{
    const struct spec_layer *o = spec_output_layer(s);
    return spec_input_ids(s) && s->loss == LOSS_CROSS_ENTROPY && s->input_rank == 1 && o &&
           o->out_rank == 2 && o->out_shape[0] == s->input_shape[0] && o->out_shape[1] == spec_vocab(s);
}

/* ---- the helper classes ------------------------------------------------------------ */

static const char residual_py[] = "class Residual(nn.Sequential):\n"
                                  "    \"\"\"x + layers(x): a residual block of the spec.\"\"\"\n"
                                  "\n"
                                  "    def forward(self, x):\n"
                                  "        return x + super().forward(x)\n";

static const char position_py[] =
    "class Position(nn.Module):\n"
    "    \"\"\"A learned position table [max_len, dim]: row t is added at position t.\"\"\"\n"
    "\n"
    "    def __init__(self, max_len, dim):\n"
    "        super().__init__()\n"
    "        self.weight = nn.Parameter(torch.randn(max_len, dim))\n"
    "\n"
    "    def forward(self, x):  # [B, T, dim]\n"
    "        return x + self.weight[: x.shape[-2]]\n";

static const char attention_py[] =
    "class Attention(nn.Module):\n"
    "    \"\"\"Multi-head self-attention as nanoGPT's CausalSelfAttention, without dropout: one\n"
    "    linear makes q, k and v, each head scores q.k / sqrt(head size), a causal mask hides\n"
    "    the positions ahead, softmax weighs v, and proj mixes the heads.\"\"\"\n"
    "\n"
    "    def __init__(self, dim, heads, causal=True, bias=True):\n"
    "        super().__init__()\n"
    "        self.heads, self.causal = heads, causal\n"
    "        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)\n"
    "        self.proj = nn.Linear(dim, dim, bias=bias)\n"
    "\n"
    "    def forward(self, x):  # [B, T, dim]\n"
    "        B, T, C = x.shape\n"
    "        q, k, v = self.qkv(x).split(C, dim=2)\n"
    "        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)  # [B, heads, T, hd]\n"
    "        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)\n"
    "        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)\n"
    "        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))\n"
    "        if self.causal:\n"
    "            mask = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))\n"
    "            att = att.masked_fill(~mask, float(\"-inf\"))\n"
    "        y = torch.softmax(att, dim=-1) @ v\n"
    "        y = y.transpose(1, 2).contiguous().view(B, T, C)\n"
    "        return self.proj(y)\n";

static const char layernorm_py[] =
    "class LayerNormNoBias(nn.Module):\n"
    "    \"\"\"nn.LayerNorm with a weight and no bias (\"bias\": false in the spec; PyTorch 1.13's\n"
    "    LayerNorm has no such option).\"\"\"\n"
    "\n"
    "    def __init__(self, dim, eps=1e-05):\n"
    "        super().__init__()\n"
    "        self.eps = eps\n"
    "        self.weight = nn.Parameter(torch.ones(dim))\n"
    "\n"
    "    def forward(self, x):\n"
    "        return nn.functional.layer_norm(x, self.weight.shape, self.weight, None, self.eps)\n";

/* ---- build(): one line per layer --------------------------------------------------- */

struct line {
    int depth;      /* inside how many residuals */
    char code[160]; /* "nn.Linear(64, 256)," or "Residual(" or ")," */
    char note[256]; /* the comment: "3.1" or "0: [64] -> [64, 64]"; "" for none */
};

/* "3", "(3, 5)" */
static void pair_py(char *dst, size_t cap, const int64_t *v)
{
    if (v[0] == v[1])
        snprintf(dst, cap, "%" PRId64, v[0]);
    else
        snprintf(dst, cap, "(%" PRId64 ", %" PRId64 ")", v[0], v[1]);
}

/* The constructor call of layer l (not a residual). */
static void layer_code(char *dst, size_t cap, const struct spec_layer *l)
{
    char a[64], b[64], c[48], f[32];
    switch (l->kind) {
    case LAYER_LINEAR:
        snprintf(dst, cap, "nn.Linear(%" PRId64 ", %" PRId64 "%s)", l->in, l->out,
                 l->bias ? "" : ", bias=False");
        return;
    case LAYER_RELU: snprintf(dst, cap, "nn.ReLU()"); return;
    case LAYER_TANH: snprintf(dst, cap, "nn.Tanh()"); return;
    case LAYER_SIGMOID: snprintf(dst, cap, "nn.Sigmoid()"); return;
    case LAYER_GELU: snprintf(dst, cap, "nn.GELU()"); return;
    case LAYER_GELU_TANH: snprintf(dst, cap, "nn.GELU(approximate=\"tanh\")"); return;
    case LAYER_EMBEDDING:
        snprintf(dst, cap, "nn.Embedding(%" PRId64 ", %" PRId64 ")", l->num, l->dim);
        return;
    case LAYER_POSITION: snprintf(dst, cap, "Position(%" PRId64 ", %" PRId64 ")", l->num, l->dim); return;
    case LAYER_LAYERNORM:
        a[0] = '\0';
        if (l->eps != DEFAULT_EPS) {
            py_float(f, sizeof f, l->eps);
            snprintf(a, sizeof a, ", eps=%s", f);
        }
        snprintf(dst, cap, "%s(%" PRId64 "%s)", l->bias ? "nn.LayerNorm" : "LayerNormNoBias", l->dim, a);
        return;
    case LAYER_ATTENTION:
        snprintf(dst, cap, "Attention(%" PRId64 ", heads=%" PRId64 "%s%s)", l->dim, l->heads,
                 l->causal ? "" : ", causal=False", l->bias ? "" : ", bias=False");
        return;
    case LAYER_DROPOUT:
        py_float(f, sizeof f, l->p);
        snprintf(dst, cap, "nn.Dropout(%s)", f);
        return;
    case LAYER_CONV2D:
        pair_py(f, sizeof f, l->kernel);
        a[0] = b[0] = '\0';
        if (l->stride[0] != 1 || l->stride[1] != 1) {
            pair_py(c, sizeof c, l->stride);
            snprintf(a, sizeof a, ", stride=%s", c);
        }
        if (l->padding[0] || l->padding[1]) {
            pair_py(c, sizeof c, l->padding);
            snprintf(b, sizeof b, ", padding=%s", c);
        }
        snprintf(dst, cap, "nn.Conv2d(%" PRId64 ", %" PRId64 ", kernel_size=%s%s%s%s)", l->in, l->out, f, a,
                 b, l->bias ? "" : ", bias=False");
        return;
    case LAYER_MAXPOOL2D:
    case LAYER_AVGPOOL2D:
        pair_py(f, sizeof f, l->kernel);
        a[0] = b[0] = '\0';
        if (l->stride[0] != l->kernel[0] || l->stride[1] != l->kernel[1]) {
            pair_py(c, sizeof c, l->stride);
            snprintf(a, sizeof a, ", stride=%s", c);
        }
        if (l->padding[0] || l->padding[1]) {
            pair_py(c, sizeof c, l->padding);
            snprintf(b, sizeof b, ", padding=%s", c);
        }
        snprintf(dst, cap, "nn.%s(%s%s%s)", l->kind == LAYER_MAXPOOL2D ? "MaxPool2d" : "AvgPool2d", f, a, b);
        return;
    case LAYER_BATCHNORM:
        a[0] = b[0] = '\0';
        if (l->eps != DEFAULT_EPS) {
            py_float(f, sizeof f, l->eps);
            snprintf(a, sizeof a, ", eps=%s", f);
        }
        if (l->momentum != DEFAULT_MOMENTUM) {
            py_float(f, sizeof f, l->momentum);
            snprintf(b, sizeof b, ", momentum=%s", f);
        }
        /* [features] per sample is BatchNorm1d's [B, F]; [features, H, W] BatchNorm2d's. */
        snprintf(dst, cap, "nn.BatchNorm%dd(%" PRId64 "%s%s)", l->in_rank == 1 ? 1 : 2, l->dim, a, b);
        return;
    case LAYER_FLATTEN: snprintf(dst, cap, "nn.Flatten()"); return;
    case LAYER_RESIDUAL: snprintf(dst, cap, "Residual("); return;
    }
    snprintf(dst, cap, "None");
}

/* The comment of layer l: its key, and the shapes when it changes them. */
static void layer_note(char *dst, size_t cap, const struct spec_layer *l)
{
    if (l->in_rank == l->out_rank &&
        !memcmp(l->in_shape, l->out_shape, sizeof(int64_t) * (size_t)l->in_rank)) {
        snprintf(dst, cap, "%s", l->key);
        return;
    }
    char a[96], b[96];
    shape_py(a, sizeof a, l->in_rank, l->in_shape, false);
    shape_py(b, sizeof b, l->out_rank, l->out_shape, false);
    snprintf(dst, cap, "%s: %s -> %s", l->key, a, b);
}

/* The lines of layers [from, to) of the preorder tree, one level (residuals recurse). */
static int layer_lines(const struct spec *s, int from, int to, int depth, struct line *out, int n)
{
    for (int i = from; i < to; i = s->layers[i].end) {
        const struct spec_layer *l = &s->layers[i];
        struct line *ln = &out[n++];
        ln->depth = depth;
        layer_code(ln->code, sizeof ln->code, l);
        if (l->kind != LAYER_RESIDUAL) {
            size_t len = strlen(ln->code);
            snprintf(ln->code + len, sizeof ln->code - len, ",");
        }
        layer_note(ln->note, sizeof ln->note, l);
        if (l->kind == LAYER_RESIDUAL) {
            n = layer_lines(s, i + 1, l->end, depth + 1, out, n);
            out[n++] = (struct line){.depth = depth, .code = "),"};
        }
    }
    return n;
}

/* "m[2][1]": the module of the layer whose key is "2.1" inside nn.Sequential m. */
static void module_py(char *dst, size_t cap, const char *key)
{
    size_t o = (size_t)snprintf(dst, cap, "m");
    for (const char *k = key; *k && o < cap;) {
        size_t n = strcspn(k, ".");
        o += (size_t)snprintf(dst + o, cap - o, "[%.*s]", (int)n, k);
        k += n;
        k += (*k == '.');
    }
}

static void put_build(struct text *t, const struct spec *s)
{
    bool tied = false;
    for (int i = 0; i < s->n_layers; i++)
        tied |= spec_layer_tie(s, i) >= 0;
    /* A layer's line, and a closing line per residual. */
    struct line *lines = calloc((size_t)s->n_layers * 2 + 1, sizeof *lines);
    if (!lines) {
        t->oom = true;
        return;
    }
    int n = layer_lines(s, 0, s->n_layers, 2, lines, 0);
    size_t col = 0;
    for (int i = 0; i < n; i++) {
        size_t w = 4 * (size_t)lines[i].depth + strlen(lines[i].code);
        if (lines[i].note[0] && w > col && w <= COMMENT_COL_MAX)
            col = w;
    }
    put(t,
        "def build():\n"
        "    \"\"\"The job's model with fresh weights: load() puts the trained ones in. The\n"
        "    comments give each layer's state_dict prefix and one sample's shapes.\"\"\"\n"
        "    %s nn.Sequential(\n",
        tied ? "m =" : "return");
    for (int i = 0; i < n; i++) {
        int w = 4 * lines[i].depth + (int)strlen(lines[i].code);
        put(t, "%*s%s", 4 * lines[i].depth, "", lines[i].code);
        if (lines[i].note[0])
            put(t, "%*s# %s", (int)col - w + 2 > 2 ? (int)col - w + 2 : 2, "", lines[i].note);
        put(t, "\n");
    }
    put(t, "    )\n");
    /* A tied linear shares the embedding's Parameter, as nanoGPT's lm_head.weight = wte.weight:
     * the state_dict then names it under both keys, which ddpd's model file holds. */
    for (int i = 0; i < s->n_layers; i++) {
        const int e = spec_layer_tie(s, i);
        char a[96], b[96];
        if (e < 0)
            continue;
        module_py(a, sizeof a, s->layers[i].key);
        module_py(b, sizeof b, s->layers[e].key);
        put(t, "    %s.weight = %s.weight  # tied: one tensor, two state_dict names\n", a, b);
    }
    if (tied)
        put(t, "    return m\n");
    free(lines);
}

/* ---- the file ---------------------------------------------------------------------- */

static const char reader_py[] =
    "# The safetensors format: an 8-byte little-endian header length, a JSON header\n"
    "# {name: {\"dtype\", \"shape\", \"data_offsets\": [begin, end]}, \"__metadata__\": {...}},\n"
    "# then the tensors' bytes. Read here without the safetensors package (Debian has none).\n"
    "_DTYPES = {  # name: (dtype, bytes per element)\n"
    "    \"F64\": (torch.float64, 8), \"F32\": (torch.float32, 4), \"F16\": (torch.float16, 2),\n"
    "    \"BF16\": (torch.bfloat16, 2), \"I64\": (torch.int64, 8), \"I32\": (torch.int32, 4),\n"
    "    \"I16\": (torch.int16, 2), \"I8\": (torch.int8, 1), \"U8\": (torch.uint8, 1),\n"
    "    \"BOOL\": (torch.bool, 1),\n"
    "}\n"
    "_HEADER_MAX = 100_000_000  # the format's own limit on the header\n"
    "\n"
    "\n"
    "def read_safetensors(path):\n"
    "    \"\"\"{name: tensor} of the safetensors file `path`, on the CPU. The header and each\n"
    "    tensor's place and size are checked before it is read: a file that is cut short or\n"
    "    is not safetensors raises ValueError saying what is wrong.\"\"\"\n"
    "    if sys.byteorder != \"little\":\n"
    "        raise ValueError(\"safetensors data is little-endian, and this machine is not\")\n"
    "    with open(path, \"rb\") as f:\n"
    "        size = os.fstat(f.fileno()).st_size\n"
    "        if size < 8:\n"
    "            raise ValueError(f\"{path}: {size} bytes is too short for a safetensors file \"\n"
    "                             \"(the header's length alone takes 8)\")\n"
    "        (n,) = struct.unpack(\"<Q\", f.read(8))\n"
    "        if n > min(size - 8, _HEADER_MAX):\n"
    "            raise ValueError(f\"{path}: the header's length says {n} bytes, but the file has \"\n"
    "                             f\"{size - 8} after it (a truncated file, or not safetensors)\")\n"
    "        try:\n"
    "            header = json.loads(f.read(n))\n"
    "        except ValueError as e:\n"
    "            raise ValueError(f\"{path}: the header is not JSON ({e})\") from None\n"
    "        if not isinstance(header, dict):\n"
    "            raise ValueError(f\"{path}: the header is not a JSON object\")\n"
    "        header.pop(\"__metadata__\", None)\n"
    "        data = size - 8 - n\n"
    "        tensors = {}\n"
    "        for name, h in header.items():\n"
    "            where = f\"{path}: tensor {name!r}\"\n"
    "            if not isinstance(h, dict) or h.get(\"dtype\") not in _DTYPES:\n"
    "                raise ValueError(f\"{where}: expected a dtype of {', '.join(_DTYPES)}, \"\n"
    "                                 f\"got {h!r:.80}\")\n"
    "            (dtype, itemsize), shape = _DTYPES[h[\"dtype\"]], h.get(\"shape\")\n"
    "            offsets = h.get(\"data_offsets\")\n"
    "            if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):\n"
    "                raise ValueError(f\"{where}: expected a shape of sizes, got {shape!r:.80}\")\n"
    "            if not (isinstance(offsets, list) and len(offsets) == 2\n"
    "                    and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):\n"
    "                raise ValueError(f\"{where}: expected data_offsets [begin, end], \"\n"
    "                                 f\"got {offsets!r:.80}\")\n"
    "            begin, end = offsets\n"
    "            if end > data:\n"
    "                raise ValueError(f\"{where}: its bytes {begin}..{end} end past the file's \"\n"
    "                                 f\"{data} bytes of data (a truncated file?)\")\n"
    "            numel = math.prod(shape)\n"
    "            if end - begin != numel * itemsize:\n"
    "                raise ValueError(f\"{where}: shape {shape} of {h['dtype']} takes \"\n"
    "                                 f\"{numel * itemsize} bytes, but its data_offsets span \"\n"
    "                                 f\"{end - begin}\")\n"
    "            buf = bytearray(end - begin)\n"
    "            f.seek(8 + n + begin)\n"
    "            if f.readinto(buf) != len(buf):\n"
    "                raise ValueError(f\"{where}: the file ended while it was read\")\n"
    "            t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)\n"
    "            tensors[name] = t.reshape(shape)\n"
    "    return tensors\n";

static const char load_py[] =
    "def load(path=\"model.safetensors\", device=\"cpu\"):\n"
    "    \"\"\"The trained model: build() with the weights of `path` (the job's model.safetensors\n"
    "    or a checkpoint's; a relative path that is not in the current folder is looked up\n"
    "    beside this file), every tensor of the model and no other (strict), moved to\n"
    "    `device`, in eval mode: dropout off, BatchNorm on its running statistics.\"\"\"\n"
    "    if not os.path.isabs(path) and not os.path.exists(path):\n"
    "        beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), path)\n"
    "        if os.path.exists(beside):\n"
    "            path = beside\n"
    "    m = build()\n"
    "    try:\n"
    "        m.load_state_dict(read_safetensors(path), strict=True)\n"
    "    except RuntimeError as e:\n"
    "        raise ValueError(f\"{path} does not fit job {JOB}'s model: {e}\") from None\n"
    "    return m.to(device).eval()\n";

static void put_generate(struct text *t, bool bytes)
{
    put(t,
        "\n\n@torch.no_grad()\n"
        "def generate(m, prompt, max_new_tokens=256, temperature=1.0, top_k=0, generator=None):\n"
        "    \"\"\"Continues `prompt` by max_new_tokens tokens as nanoGPT's sample.py does and returns\n"
        "    the new ids. %s\n"
        "    The context is the last BLOCK_SIZE tokens. temperature 0 takes the most likely token\n"
        "    (the lowest id among equals): ddpd's greedy answer. Otherwise the logits are divided\n"
        "    by temperature, the top_k largest kept (0: all), and a token drawn from their softmax\n"
        "    with torch's random numbers (`generator`), not ddpd's: a seed gives other tokens here.\"\"\"\n"
        "    device = next(m.parameters()).device\n",
        bytes ? "`prompt` is a str (its UTF-8 bytes are the ids of this byte vocabulary)\n"
                "    or a list of ids; bytes(ids).decode(\"utf-8\", \"replace\") is the answer's text."
              : "`prompt` is a list of ids in [0, VOCAB).");
    if (bytes)
        put(t, "    if isinstance(prompt, str):\n"
               "        prompt = prompt.encode(\"utf-8\")\n");
    put(t, "    ids = [int(i) for i in prompt]\n");
    put(t, "    if not ids or not all(0 <= i < VOCAB for i in ids):\n"
           "        raise ValueError(f\"prompt: expected at least one id, each in [0, {VOCAB})\")\n"
           "    new = []\n"
           "    for _ in range(max_new_tokens):\n"
           "        x = torch.tensor([ids[-BLOCK_SIZE:]], dtype=torch.long, device=device)\n"
           "        logits = m(x)[0, -1].double()\n"
           "        if temperature == 0:\n"
           "            token = int(torch.argmax(logits))\n"
           "        else:\n"
           "            logits = logits / temperature\n"
           "            if 0 < top_k < VOCAB:\n"
           "                order = torch.sort(logits, descending=True, stable=True).indices\n"
           "                logits[order[top_k:]] = float(\"-inf\")\n"
           "            probs = torch.softmax(logits, dim=-1)\n"
           "            token = int(torch.multinomial(probs, 1, generator=generator))\n"
           "        ids.append(token)\n"
           "        new.append(token)\n"
           "    return new\n");
}

static void put_docstring(struct text *t, const struct spec *s, int64_t job, bool gen)
{
    const struct spec_layer *o = spec_output_layer(s);
    char in[128], out[128], params[32];
    shape_py(in, sizeof in, s->input_rank, s->input_shape, true);
    shape_py(out, sizeof out, o ? o->out_rank : 0, o ? o->out_shape : NULL, true);
    thousands(params, sizeof params, spec_param_count(s));
    put(t,
        "\"\"\"model.py: job %" PRId64 " of ddpd as a plain PyTorch module.\n"
        "\n"
        "The job's spec written as PyTorch: an nn.Sequential whose state_dict names are those of\n"
        "ddpd's checkpoints (each layer's key, as build() shows, then its tensor: \"0.weight\"), so\n"
        "the job's model.safetensors loads into it as it is. Made by ddpd " DDPD_VERSION
        " from the spec\nof job %" PRId64 " (JOB_NAME below).\n"
        "\n"
        "    import model\n"
        "    m = model.load()  # model.safetensors beside this file, in eval mode\n"
        "\n",
        job, job);
    if (spec_input_ids(s))
        put(t, "Input:  %s token ids in [0, %" PRId64 "), int64\n", in, spec_vocab(s));
    else
        put(t, "Input:  %s float32\n", in);
    if (s->loss == LOSS_CROSS_ENTROPY)
        put(t, "Output: %s logits over %" PRId64 " classes (cross_entropy: softmax gives probabilities)\n",
            out, spec_classes(s));
    else
        put(t, "Output: %s (mse)\n", out);
    put(t, "Parameters: %s\n", params);
    if (gen)
        put(t, "generate(m, prompt) continues a prompt as nanoGPT's sample.py does.\n");
    put(t, "Needs PyTorch 1.12 or later and nothing else.\n\"\"\"\n");
}

static void put_constants(struct text *t, const struct spec *s, int64_t job, bool gen)
{
    char shape[128] = "(";
    size_t n = 1;
    for (int i = 0; i < s->input_rank; i++)
        n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%" PRId64, i ? ", " : "", s->input_shape[i]);
    snprintf(shape + n, sizeof shape - n, "%s)", s->input_rank == 1 ? "," : "");
    put(t, "JOB = %" PRId64 "\nJOB_NAME = ", job);
    put_py_str(t, s->name);
    put(t, "\nINPUT_SHAPE = %s  # one sample, without the batch dimension\n", shape);
    if (spec_input_ids(s))
        put(t, "VOCAB = %" PRId64 "  # the input holds ids in [0, VOCAB)\n", spec_vocab(s));
    if (gen)
        put(t, "BLOCK_SIZE = %" PRId64 "  # the context generate() keeps\n", s->input_shape[0]);
    put(t, "LOSS = \"%s\"\n", loss_kind_name(s->loss));
}

char *pytorch_model_py(const struct spec *s, int64_t job)
{
    struct text t = {0};
    const bool gen = pytorch_is_generative(s);
    const char *helpers[4];
    int nh = 0;
    if (uses_any(s, LAYER_RESIDUAL))
        helpers[nh++] = residual_py;
    if (uses_any(s, LAYER_POSITION))
        helpers[nh++] = position_py;
    if (uses_any(s, LAYER_ATTENTION))
        helpers[nh++] = attention_py;
    if (uses(s, LAYER_LAYERNORM, false))
        helpers[nh++] = layernorm_py;

    put_docstring(&t, s, job, gen);
    put(&t, "import json\n"
            "import math\n"
            "import os\n"
            "import struct\n"
            "import sys\n"
            "\n"
            "import torch\n"
            "from torch import nn\n"
            "\n");
    put_constants(&t, s, job, gen);
    for (int i = 0; i < nh; i++)
        put(&t, "\n\n%s", helpers[i]);
    put(&t, "\n\n");
    put_build(&t, s);
    put(&t, "\n\n%s\n\n%s", reader_py, load_py);
    if (gen)
        put_generate(&t, spec_vocab(s) == 256);
    if (t.oom) {
        free(t.p);
        return NULL;
    }
    return t.p;
}
