/* users.h — named users (issue 32, docs/security.md): a role, a bearer token kept only as
 * its SHA-256, and the limits an admin sets. The values and the rules on them: names,
 * roles, tokens made and hashed with OpenSSL's libcrypto and compared in constant time, a
 * user as JSON. The rows live in the store (store.h, store_users.c); `ddpd users`
 * (users_cli.c) and the /v1/users routes (api_users.c) change them. Knows no SQL and no
 * HTTP. */
#ifndef DDPD_USERS_H
#define DDPD_USERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_t;

/* Ordered: a role may do what the roles below it may. */
enum user_role {
    USER_ROLE_VIEWER, /* reads everything, changes nothing */
    USER_ROLE_USER,   /* submits jobs and sweeps; acts on its own jobs */
    USER_ROLE_ADMIN,  /* everything, users included */
};

#define USER_NAME_MAX    64 /* bytes of a name, [A-Za-z0-9._-] */
#define USER_TOKEN_BYTES 32 /* random bytes of a token (256 bits) */
#define USER_TOKEN_HEX   (2 * USER_TOKEN_BYTES)
#define USER_HASH_HEX    64 /* hex of a SHA-256 */
#define USER_NO_LIMIT    (-1)
/* The built-in principals: the --token-file token's admin, and the caller of a server
 * with neither a token file nor users (open loopback mode). */
#define USER_ROOT  "root"
#define USER_LOCAL "local"

/* A user as the store keeps it (never its token). The limits are USER_NO_LIMIT when
 * unset; max_priority is 0..100 (SPEC_PRIORITY_DEFAULT when not given). */
struct user {
    char name[USER_NAME_MAX + 1];
    enum user_role role;
    int max_priority;
    int64_t max_gpus, max_cpu_ranks, max_queued;
    double created_at, rotated_at; /* seconds since the epoch; rotated_at 0 = never */
    bool builtin;                  /* root or local: not a row of the users table */
};

/* "admin", "user", "viewer". */
const char *user_role_name(enum user_role r);
/* The role named `s`; false when it is none of them. */
bool user_role_parse(const char *s, enum user_role *out);

/* True when `name` is 1..USER_NAME_MAX bytes of [A-Za-z0-9._-]; else false with the
 * reason in why[cap]. (Whether it is a reserved name is the caller's rule:
 * user_name_reserved.) */
bool user_name_check(const char *name, char *why, size_t cap);
/* True for the built-in principals' names (root, local), which no user may take. */
bool user_name_reserved(const char *name);

/* A new token: USER_TOKEN_BYTES from OpenSSL's RAND_bytes as lowercase hex into
 * hex[USER_TOKEN_HEX + 1]. False when the generator failed (nothing usable in hex). */
bool user_token_new(char hex[USER_TOKEN_HEX + 1]);
/* The SHA-256 of token[n] (OpenSSL EVP) as lowercase hex into hex[USER_HASH_HEX + 1].
 * False when libcrypto failed. */
bool user_token_hash(const char *token, size_t n, char hex[USER_HASH_HEX + 1]);
/* Whether two hashes (USER_HASH_HEX hex characters each) are equal, with CRYPTO_memcmp:
 * the time does not depend on where they differ. */
bool user_hash_equal(const char *a, const char *b);

/* A built-in admin without limits named `name` (USER_ROOT, USER_LOCAL). */
void user_builtin(struct user *u, const char *name);
/* A new user's defaults: role user, max_priority SPEC_PRIORITY_DEFAULT, no limits. */
void user_defaults(struct user *u);

/* {"name","role","max_priority","max_gpus","max_cpu_ranks","max_queued","created_at",
 * "rotated_at","builtin"} (null for no limit, never a token). A new reference; NULL when
 * out of memory. */
struct json_t *user_to_json(const struct user *u);

/* The limits and role of a JSON object (POST/PATCH /v1/users): "role", "max_priority"
 * (0..100), "max_gpus", "max_cpu_ranks", "max_queued" (integers >= 0, or null for no
 * limit) applied to *u; with `allow_name`, "name" is taken too (into *u, checked). Any
 * other key, or a value of the wrong kind, is false with the field in path[pcap] and the
 * sentence in why[cap]. */
bool user_from_json(const struct json_t *obj, bool allow_name, struct user *u, char *path, size_t pcap,
                    char *why, size_t cap);

#endif
