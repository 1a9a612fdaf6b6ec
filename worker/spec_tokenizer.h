/* spec_tokenizer.h — a job's `tokenizer` (its vocab.json and merges.txt, data paths) opened
 * beneath the data directory as the data files are, and checked against the model: what
 * the planner checks at submit and what the inference worker loads for text in and out. */
#ifndef DDPD_SPEC_TOKENIZER_H
#define DDPD_SPEC_TOKENIZER_H

#include "../schema/err.h"
#include "../schema/spec.h"
#include "../tokenizer/bpe.h"

/* The tokenizer of spec `s` (s->tokenizer_vocab set), its files opened beneath data_dir
 * (data_path_open's rules) and parsed, its vocabulary no larger than the embedding's
 * `num`. Returns a new tokenizer (bpe_free), or NULL with err set, its path the field
 * (tokenizer.vocab, tokenizer.merges): DDPD_ESPEC for a bad path, a file that cannot be
 * read or parsed (the message names the file and its line) or a vocabulary the model
 * cannot hold; DDPD_ENOMEM, DDPD_ETOOBIG. */
struct bpe *spec_tokenizer_open(const struct spec *s, const char *data_dir, struct ddpd_error *err);

#endif
