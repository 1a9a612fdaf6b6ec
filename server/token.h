/* token.h — the bearer token of `Authorization: Bearer <token>`: one line of printable
 * ASCII without spaces, at most TOKEN_MAX bytes. The server reads it from --token-file;
 * the client from --token-file or DDPD_TOKEN, by the same rules. */
#ifndef DDPD_TOKEN_H
#define DDPD_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

#define TOKEN_MAX 4095

/* True when buf[n] (n > 0) is a token a client can send; else false with the reason
 * (naming the offset and the byte) in why[cap]. */
bool token_check(const char *buf, size_t n, char *why, size_t cap);

/* The token of a token file: the file's bytes less the whitespace that ends them. Returns
 * a new string (caller frees), or NULL with the reason in why[cap]. */
char *token_read_file(const char *path, char *why, size_t cap);

#endif
