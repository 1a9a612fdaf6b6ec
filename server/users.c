/* users.c — the rules of named users: names, roles, tokens (OpenSSL's RAND_bytes for the
 * token, EVP's SHA-256 for what is stored, CRYPTO_memcmp to compare), a user to and from
 * JSON. No hand-written crypto, no SQL, no HTTP. */
#include "users.h"

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>

#include "../schema/spec.h"

static const char *const role_names[] = {"viewer", "user", "admin"};

const char *user_role_name(enum user_role r)
{
    return (unsigned)r < 3 ? role_names[r] : "?";
}

bool user_role_parse(const char *s, enum user_role *out)
{
    for (int i = 0; i < 3 && s; i++)
        if (!strcmp(s, role_names[i])) {
            *out = (enum user_role)i;
            return true;
        }
    return false;
}

bool user_name_check(const char *name, char *why, size_t cap)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > USER_NAME_MAX) {
        snprintf(why, cap, "a user name is 1 to %d characters of A-Z a-z 0-9 . _ -; got %zu", USER_NAME_MAX,
                 n);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                  c == '_' || c == '-';
        if (!ok) {
            snprintf(
                why, cap,
                "a user name is 1 to %d characters of A-Z a-z 0-9 . _ -; byte 0x%02x at offset %zu is not",
                USER_NAME_MAX, c, i);
            return false;
        }
    }
    return true;
}

bool user_name_reserved(const char *name)
{
    return !strcmp(name, USER_ROOT) || !strcmp(name, USER_LOCAL);
}

static void to_hex(const unsigned char *b, size_t n, char *hex)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = digits[b[i] >> 4];
        hex[2 * i + 1] = digits[b[i] & 15];
    }
    hex[2 * n] = '\0';
}

bool user_token_new(char hex[USER_TOKEN_HEX + 1])
{
    unsigned char b[USER_TOKEN_BYTES];
    hex[0] = '\0';
    if (RAND_bytes(b, sizeof b) != 1)
        return false;
    to_hex(b, sizeof b, hex);
    OPENSSL_cleanse(b, sizeof b);
    return true;
}

bool user_token_hash(const char *token, size_t n, char hex[USER_HASH_HEX + 1])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    hex[0] = '\0';
    if (EVP_Digest(token, n, md, &len, EVP_sha256(), NULL) != 1 || len != USER_HASH_HEX / 2)
        return false;
    to_hex(md, len, hex);
    return true;
}

bool user_hash_equal(const char *a, const char *b)
{
    if (strlen(a) != USER_HASH_HEX || strlen(b) != USER_HASH_HEX)
        return false;
    return CRYPTO_memcmp(a, b, USER_HASH_HEX) == 0;
}

void user_defaults(struct user *u)
{
    memset(u, 0, sizeof *u);
    u->role = USER_ROLE_USER;
    u->max_priority = SPEC_PRIORITY_DEFAULT;
    u->max_gpus = u->max_cpu_ranks = u->max_queued = USER_NO_LIMIT;
}

void user_builtin(struct user *u, const char *name)
{
    user_defaults(u);
    snprintf(u->name, sizeof u->name, "%s", name);
    u->role = USER_ROLE_ADMIN;
    u->max_priority = 100;
    u->builtin = true;
}

static json_t *limit_json(int64_t v)
{
    return v < 0 ? json_null() : json_integer(v);
}

json_t *user_to_json(const struct user *u)
{
    json_t *o = json_pack("{s:s, s:s, s:i, s:o, s:o, s:o, s:b}", "name", u->name, "role",
                          user_role_name(u->role), "max_priority", u->max_priority, "max_gpus",
                          limit_json(u->max_gpus), "max_cpu_ranks", limit_json(u->max_cpu_ranks),
                          "max_queued", limit_json(u->max_queued), "builtin", u->builtin);
    if (o && !u->builtin) {
        json_object_set_new(o, "created_at", json_real(u->created_at));
        json_object_set_new(o, "rotated_at", u->rotated_at > 0 ? json_real(u->rotated_at) : json_null());
    }
    return o;
}

/* A limit: an integer in [0, max] or null (no limit; only where `nullable`). */
static bool limit_from(const json_t *v, const char *key, int64_t max, bool nullable, int64_t *out, char *why,
                       size_t cap)
{
    if (nullable && json_is_null(v)) {
        *out = USER_NO_LIMIT;
        return true;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max) {
        snprintf(why, cap, "%s: expected an integer from 0 to %lld%s", key, (long long)max,
                 nullable ? ", or null for no limit" : "");
        return false;
    }
    *out = json_integer_value(v);
    return true;
}

bool user_from_json(const json_t *obj, bool allow_name, struct user *u, char *path, size_t pcap, char *why,
                    size_t cap)
{
    const char *key;
    json_t *v;
    path[0] = '\0';
    if (!json_is_object(obj)) {
        snprintf(why, cap, "expected a JSON object of a user's fields");
        return false;
    }
    json_object_foreach ((json_t *)obj, key, v) {
        snprintf(path, pcap, "%s", key);
        int64_t n;
        if (allow_name && !strcmp(key, "name")) {
            if (!json_is_string(v)) {
                snprintf(why, cap, "name: expected a string");
                return false;
            }
            char w[160];
            if (!user_name_check(json_string_value(v), w, sizeof w)) {
                snprintf(why, cap, "name: %s", w);
                return false;
            }
            snprintf(u->name, sizeof u->name, "%s", json_string_value(v));
        } else if (!strcmp(key, "role")) {
            if (!json_is_string(v) || !user_role_parse(json_string_value(v), &u->role)) {
                snprintf(why, cap, "role: expected \"admin\", \"user\" or \"viewer\"");
                return false;
            }
        } else if (!strcmp(key, "max_priority")) {
            if (!limit_from(v, key, 100, false, &n, why, cap))
                return false;
            u->max_priority = (int)n;
        } else if (!strcmp(key, "max_gpus")) {
            if (!limit_from(v, key, 1 << 20, true, &u->max_gpus, why, cap))
                return false;
        } else if (!strcmp(key, "max_cpu_ranks")) {
            if (!limit_from(v, key, 1 << 20, true, &u->max_cpu_ranks, why, cap))
                return false;
        } else if (!strcmp(key, "max_queued")) {
            if (!limit_from(v, key, 1 << 30, true, &u->max_queued, why, cap))
                return false;
        } else {
            snprintf(
                why, cap,
                "unknown key '%s'; a user has %srole, max_priority, max_gpus, max_cpu_ranks and max_queued",
                key, allow_name ? "name, " : "");
            return false;
        }
    }
    path[0] = '\0';
    return true;
}
