/* spec_tokenizer.c — a job's tokenizer files opened beneath the data directory and read
 * into a tokenizer (tokenizer/bpe.h), its size checked against the model's embedding.
 * Knows no request and no training. */
#include "spec_tokenizer.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "data.h"

struct bpe *spec_tokenizer_open(const struct spec *s, const char *data_dir, struct ddpd_error *err)
{
    struct bpe *b = NULL;
    const char *field = "tokenizer.vocab";
    int vfd = data_path_open(data_dir, field, s->tokenizer_vocab, err), mfd = -1;
    if (vfd >= 0) {
        field = "tokenizer.merges";
        mfd = data_path_open(data_dir, field, s->tokenizer_merges, err);
    }
    if (mfd >= 0 && !(b = bpe_new_fds(vfd, s->tokenizer_vocab, mfd, s->tokenizer_merges, err)))
        field = err && !strcmp(err->path, s->tokenizer_merges) ? "tokenizer.merges" : "tokenizer.vocab";
    if (!b && err) {
        /* The message names the file as the spec gives it (and the line); the path is the
         * field, and what is wrong is the spec's tokenizer, not training data. */
        snprintf(err->path, sizeof err->path, "%s", field);
        if (err->code == DDPD_EDATA)
            err->code = DDPD_ESPEC;
    }
    if (b && bpe_vocab_size(b) > spec_vocab(s)) {
        ddpd_error_set(err, DDPD_ESPEC, "tokenizer.vocab",
                       "tokenizer.vocab: %s has %" PRId64 " tokens, more than the %" PRId64
                       " ids of the model's embedding (num)",
                       s->tokenizer_vocab, bpe_vocab_size(b), spec_vocab(s));
        bpe_free(b);
        b = NULL;
    }
    if (mfd >= 0)
        close(mfd);
    if (vfd >= 0)
        close(vfd);
    return b;
}
