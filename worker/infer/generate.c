/* infer/generate.c — the generate request: its fields checked (each error names one), the
 * prompt cropped to the window as nanoGPT's sample.py does, then token after token: the
 * logits from the KV cache (cache.c), the draw (sample.c), a stream line when asked, a
 * look at stdin for a cancel; one final line with the new ids and their text (a byte
 * vocabulary's, or the job's tokenizer's, which also encodes a text prompt). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/clock.h"
#include "infer_impl.h"

struct gen_req {
    int32_t *seq; /* the prompt, then the new tokens: [prompt + max_new_tokens] */
    int64_t prompt;
    int64_t max_new;
    double temperature;
    int64_t top_k;
    uint64_t seed;
    bool stream;
};

/* Text as the tokenizer's ids into r->seq (room for max_new after them). */
static ddpd_err encode_prompt(struct bpe *tok, json_t *text, struct gen_req *r, struct ddpd_error *err)
{
    struct bpe_ids ids = {0};
    ddpd_err rc = bpe_encode(tok, json_string_value(text), json_string_length(text), &ids, err);
    if (!rc && ids.n > INFER_MAX_PROMPT)
        rc =
            ddpd_error_set(err, DDPD_ETOOBIG, "prompt",
                           "prompt: %zu tokens, more than the %d a prompt may hold", ids.n, INFER_MAX_PROMPT);
    if (!rc && !(r->seq = malloc((ids.n + (size_t)r->max_new) * sizeof(int32_t))))
        rc = ddpd_error_set(err, DDPD_ENOMEM, "prompt", "out of memory reading the prompt");
    if (!rc) {
        memcpy(r->seq, ids.v, ids.n * sizeof(int32_t));
        r->prompt = (int64_t)ids.n;
    }
    if (rc && !err->path[0])
        snprintf(err->path, sizeof err->path, "prompt");
    free(ids.v);
    return rc;
}

/* The prompt as token ids into r->seq: `prompt` (text: the tokenizer's ids, else a byte
 * vocabulary's UTF-8 bytes) or `ids`. */
static ddpd_err read_prompt(json_t *req, int64_t vocab, struct bpe *tok, struct gen_req *r,
                            struct ddpd_error *err)
{
    json_t *text = json_object_get(req, "prompt"), *ids = json_object_get(req, "ids");
    text = json_is_null(text) ? NULL : text;
    ids = json_is_null(ids) ? NULL : ids;
    if (text && ids)
        return ddpd_error_set(err, DDPD_ESPEC, "prompt", "prompt: give prompt (text) or ids, not both");
    if (!text && !ids)
        return ddpd_error_set(err, DDPD_ESPEC, "prompt",
                              "prompt: a generate request needs prompt (text) or ids");
    const char *key = text ? "prompt" : "ids";
    if (text && !json_is_string(text))
        return ddpd_error_set(err, DDPD_ESPEC, key, "prompt: expected a string");
    if (ids && !json_is_array(ids))
        return ddpd_error_set(err, DDPD_ESPEC, key, "ids: expected a list of token ids");
    if (text && vocab != 256 && !tok)
        return ddpd_error_set(
            err, DDPD_ESPEC, key,
            "prompt: text needs a tokenizer or a byte vocabulary (embedding num 256); this model's "
            "vocabulary has %" PRId64 " ids and no tokenizer: send ids",
            vocab);
    const size_t n = text ? json_string_length(text) : json_array_size(ids);
    if (n == 0)
        return ddpd_error_set(err, DDPD_ESPEC, key, "%s: at least one token is needed", key);
    if (text && tok)
        return encode_prompt(tok, text, r, err);
    if (n > INFER_MAX_PROMPT)
        return ddpd_error_set(err, DDPD_ETOOBIG, key, "%s: %zu tokens, more than the %d a prompt may hold",
                              key, n, INFER_MAX_PROMPT);
    r->prompt = (int64_t)n;
    r->seq = malloc(((size_t)n + (size_t)r->max_new) * sizeof(int32_t));
    if (!r->seq)
        return ddpd_error_set(err, DDPD_ENOMEM, key, "out of memory reading the prompt");
    if (text) {
        const unsigned char *s = (const unsigned char *)json_string_value(text);
        for (size_t i = 0; i < n; i++)
            r->seq[i] = s[i];
        return DDPD_OK;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        const json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        char path[32];
        snprintf(path, sizeof path, "ids[%zu]", i);
        if (!json_is_integer(v))
            return ddpd_error_set(err, DDPD_ESPEC, path,
                                  "%s: expected a token id (an integer in [0, %" PRId64 "))", path, vocab);
        if (id < 0 || id >= vocab)
            return ddpd_error_set(err, DDPD_ESPEC, path,
                                  "%s: %" JSON_INTEGER_FORMAT " is outside the vocabulary [0, %" PRId64 ")",
                                  path, id, vocab);
        r->seq[i] = (int32_t)id;
    }
    return DDPD_OK;
}

static ddpd_err read_request(json_t *req, int64_t vocab, struct bpe *tok, struct gen_req *r,
                             struct ddpd_error *err)
{
    int64_t seed = 0;
    r->max_new = 256;
    r->temperature = 1.0;
    r->top_k = 0;
    ddpd_err rc;
    json_t *mx = json_object_get(req, "max_new_tokens");
    if (json_is_integer(mx) && json_integer_value(mx) > INFER_MAX_NEW_TOKENS)
        return ddpd_error_set(err, DDPD_ESPEC, "max_new_tokens",
                              "max_new_tokens: %" JSON_INTEGER_FORMAT
                              " is over the cap of %d new tokens a request "
                              "may ask for",
                              json_integer_value(mx), INFER_MAX_NEW_TOKENS);
    if ((rc = infer__int(req, "max_new_tokens", 0, INFER_MAX_NEW_TOKENS, &r->max_new, err)) ||
        (rc = infer__int(req, "top_k", 0, INT32_MAX, &r->top_k, err)) ||
        (rc = infer__int(req, "seed", 0, INT64_MAX, &seed, err)))
        return rc;
    r->seed = (uint64_t)seed;
    json_t *t = json_object_get(req, "temperature"), *s = json_object_get(req, "stream");
    if (t && !json_is_null(t)) {
        if (!json_is_number(t) || !isfinite(json_number_value(t)) || json_number_value(t) < 0 ||
            json_number_value(t) > INFER_MAX_TEMP)
            return ddpd_error_set(err, DDPD_ESPEC, "temperature",
                                  "temperature: expected a number in [0, %g] (0: greedy)", INFER_MAX_TEMP);
        r->temperature = json_number_value(t);
    }
    if (s && !json_is_null(s) && !json_is_boolean(s))
        return ddpd_error_set(err, DDPD_ESPEC, "stream", "stream: expected true or false");
    r->stream = json_is_true(s);
    return read_prompt(req, vocab, tok, r, err);
}

/* The logits after seq[0..len): from the cache when it can take one more token, else the
 * window of the last block_size tokens from scratch (the prompt, and every token once the
 * sequence is longer than the window: its positions shift, as in nanoGPT's crop). */
static const float *next_logits(struct kv *g, const int32_t *seq, int64_t len, struct ddpd_error *err)
{
    if (kv_can_step(g) && kv_len(g) == len - 1)
        return kv_step(g, seq[len - 1]);
    const int64_t n = len < kv_block(g) ? len : kv_block(g);
    return kv_window(g, seq + len - n, n, err);
}

static void stream_line(struct infer *in, int32_t token, bool bytes, const char *text, size_t n)
{
    json_t *o = json_object();
    json_object_set_new(o, "token", json_integer(token));
    if (bytes)
        json_object_set_new(o, "text", json_stringn(text, n));
    infer__write(in, o);
}

void infer__generate(struct infer *in, json_t *req)
{
    struct ddpd_error err;
    ddpd_error_clear(&err);
    const double t0 = base_mono_s();
    struct gen_req r;
    memset(&r, 0, sizeof r);
    double *work = NULL;
    int32_t *order = NULL;
    char *text = NULL;
    json_t *ids = NULL;
    ddpd_err rc = DDPD_OK;
    if (!in->kv) {
        ddpd_error_set(&err, DDPD_ESPEC, "model", "%s", in->why_not);
        rc = DDPD_ESPEC;
        goto out;
    }
    const int64_t vocab = kv_vocab(in->kv), block = kv_block(in->kv);
    /* Text out: a token's bytes through the UTF-8 stream decoder, each byte adding at most
     * 6 bytes of text (a held sequence's U+FFFD and the byte's own), the end 3. */
    const bool bytes = vocab == 256 || in->tok;
    const size_t per_token = in->tok ? bpe_max_token_bytes(in->tok) * 6 : 6;
    if ((rc = read_request(req, vocab, in->tok, &r, &err)))
        goto out;
    work = malloc((size_t)vocab * sizeof *work);
    order = malloc((size_t)vocab * sizeof *order);
    text = malloc((size_t)r.max_new * per_token + UTF8_OUT_MAX + 1);
    ids = json_array();
    if (!work || !order || !text || !ids) {
        rc = ddpd_error_set(&err, DDPD_ENOMEM, "max_new_tokens", "out of memory for %" PRId64 " new tokens",
                            r.max_new);
        goto out;
    }
    struct utf8_stream u;
    utf8_stream_init(&u);
    size_t tlen = 0;
    bool cancelled = false;
    int64_t len = r.prompt;
    const float *logits = NULL;
    if (r.max_new > 0 && !(logits = next_logits(in->kv, r.seq, len, &err))) {
        rc = err.code;
        goto out;
    }
    for (int64_t k = 0; k < r.max_new; k++) {
        const int32_t tok =
            sample_next(logits, vocab, r.temperature, r.top_k, r.seed, (uint64_t)k, work, order);
        if (tok < 0) {
            rc = ddpd_error_set(&err, DDPD_ENONFINITE, "logits",
                                "the model's logits for new token %" PRId64 " are not finite (NaN or inf): "
                                "nothing to sample from",
                                k);
            goto out;
        }
        r.seq[len++] = tok;
        json_array_append_new(ids, json_integer(tok));
        /* Stops after this token at a cancel; the last token's text flushes the decoder,
         * so the stream's texts add up to the final text. */
        cancelled = k + 1 < r.max_new && infer__cancelled(in);
        const bool last = cancelled || k + 1 == r.max_new;
        size_t piece = 0;
        if (bytes) {
            size_t tb = 1;
            const unsigned char one = (unsigned char)tok;
            /* An id past the tokenizer's vocabulary (an embedding padded wider) has no text. */
            const unsigned char *b = in->tok ? bpe_token(in->tok, tok, &tb) : &one;
            for (size_t i = 0; b && i < tb; i++)
                piece += utf8_stream_feed(&u, b[i], text + tlen + piece);
            if (last)
                piece += utf8_stream_flush(&u, text + tlen + piece);
        }
        if (r.stream)
            stream_line(in, tok, bytes, text + tlen, piece);
        tlen += piece;
        if (last)
            break;
        if (!(logits = next_logits(in->kv, r.seq, len, &err))) {
            rc = err.code;
            goto out;
        }
    }
    json_t *o = json_object();
    json_object_set_new(o, "ok", json_true());
    json_object_set_new(o, "op", json_string("generate"));
    json_object_set_new(o, "ids", ids);
    ids = NULL;
    if (bytes)
        json_object_set_new(o, "text", json_stringn(text, tlen));
    json_object_set_new(o, "prompt_tokens", json_integer(r.prompt));
    json_object_set_new(o, "cropped", json_integer(r.prompt > block ? r.prompt - block : 0));
    json_object_set_new(o, "seed", json_integer((json_int_t)r.seed));
    json_object_set_new(o, "cancelled", json_boolean(cancelled));
    json_object_set_new(o, "seconds", json_real(base_mono_s() - t0));
    infer__write(in, o);
out:
    if (in->kv)
        kv_release(in->kv); /* the window's activations live for the request */
    if (rc)
        infer__fail(in, "generate", &err);
    json_decref(ids);
    free(text);
    free(order);
    free(work);
    free(r.seq);
}
