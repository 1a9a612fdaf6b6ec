/* test_users.c — users.c and the store's users (store_users.c): names checked, roles,
 * tokens of 256 random bits as 64 hex characters, their SHA-256 against known vectors,
 * the hash compare made with CRYPTO_memcmp (a link-time check: users.c calls it, and it
 * answers equal only for equal hashes), a user to and from JSON, and the store: add (a
 * name taken is a conflict), find by token (the hash, never the token, is stored), rotate,
 * update, remove, the queued count and owners. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "server/store.h"
#include "server/users.h"

static void test_names_and_roles(void)
{
    char why[200];
    CHECK(user_name_check("alice", why, sizeof why));
    CHECK(user_name_check("a.b_c-D9", why, sizeof why));
    CHECK(!user_name_check("", why, sizeof why));
    CHECK(!user_name_check("bad name", why, sizeof why));
    CHECK(strstr(why, "0x20") != NULL);
    CHECK(!user_name_check("a/b", why, sizeof why));
    char long_name[80];
    memset(long_name, 'x', 65);
    long_name[65] = '\0';
    CHECK(!user_name_check(long_name, why, sizeof why));
    long_name[64] = '\0';
    CHECK(user_name_check(long_name, why, sizeof why));
    CHECK(user_name_reserved("root") && user_name_reserved("local") && !user_name_reserved("alice"));
    enum user_role r;
    CHECK(user_role_parse("admin", &r) && r == USER_ROLE_ADMIN);
    CHECK(user_role_parse("viewer", &r) && r == USER_ROLE_VIEWER);
    CHECK(!user_role_parse("Admin", &r) && !user_role_parse(NULL, &r));
    CHECK_EQ_STR(user_role_name(USER_ROLE_USER), "user");
}

static void test_tokens_and_hashes(void)
{
    char a[USER_TOKEN_HEX + 1], b[USER_TOKEN_HEX + 1], h[USER_HASH_HEX + 1], h2[USER_HASH_HEX + 1];
    CHECK(user_token_new(a) && user_token_new(b));
    CHECK_EQ_INT((int)strlen(a), 64);
    CHECK(strspn(a, "0123456789abcdef") == 64);
    CHECK(strcmp(a, b) != 0);
    /* SHA-256 test vectors (FIPS 180-2). */
    CHECK(user_token_hash("abc", 3, h));
    CHECK_EQ_STR(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(user_token_hash("", 0, h));
    CHECK_EQ_STR(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(user_token_hash(a, strlen(a), h) && user_token_hash(a, strlen(a), h2));
    CHECK(user_hash_equal(h, h2));
    h2[63] = h2[63] == '0' ? '1' : '0';
    CHECK(!user_hash_equal(h, h2));
    CHECK(!user_hash_equal(h, "abc"));
}

static void test_json(void)
{
    struct user u;
    user_defaults(&u);
    char path[64], why[300];
    json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:n}", "name", "bob", "role", "viewer", "max_priority", 70,
                          "max_gpus", 2, "max_queued");
    CHECK(user_from_json(o, true, &u, path, sizeof path, why, sizeof why));
    CHECK_EQ_STR(u.name, "bob");
    CHECK(u.role == USER_ROLE_VIEWER && u.max_priority == 70 && u.max_gpus == 2);
    CHECK(u.max_queued == USER_NO_LIMIT && u.max_cpu_ranks == USER_NO_LIMIT);
    json_decref(o);
    o = json_pack("{s:i}", "max_priority", 101);
    CHECK(!user_from_json(o, false, &u, path, sizeof path, why, sizeof why));
    CHECK_EQ_STR(path, "max_priority");
    json_decref(o);
    o = json_pack("{s:s}", "name", "x");
    CHECK(!user_from_json(o, false, &u, path, sizeof path, why, sizeof why)); /* PATCH: no name */
    CHECK_EQ_STR(path, "name");
    json_decref(o);
    o = user_to_json(&u);
    CHECK(json_is_null(json_object_get(o, "max_queued")) && !json_object_get(o, "token"));
    CHECK_EQ_STR(json_string_value(json_object_get(o, "role")), "viewer");
    json_decref(o);
}

static void test_store(const char *dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/u.db", dir);
    struct ddpd_error err;
    struct store *s = store_open(path, &err);
    CHECK(s != NULL);
    if (!s)
        return;
    bool any = true;
    CHECK(store_user_any(s, &any, &err) == DDPD_OK && !any);
    struct user u, got;
    user_defaults(&u);
    snprintf(u.name, sizeof u.name, "alice");
    u.max_queued = 2;
    char tok[USER_TOKEN_HEX + 1], h[USER_HASH_HEX + 1], h2[USER_HASH_HEX + 1];
    CHECK(user_token_new(tok) && user_token_hash(tok, strlen(tok), h));
    CHECK_EQ_INT(store_user_add(s, &u, h, &err), DDPD_OK);
    CHECK_EQ_INT(store_user_add(s, &u, h, &err), DDPD_ECONFLICT);
    CHECK(strstr(err.message, "alice") != NULL);
    CHECK(store_user_any(s, &any, &err) == DDPD_OK && any);
    CHECK_EQ_INT(store_user_find_token(s, h, &got, &err), DDPD_OK);
    CHECK_EQ_STR(got.name, "alice");
    CHECK(got.max_queued == 2 && got.max_gpus == USER_NO_LIMIT && got.created_at > 0);
    /* Only the hash is stored: looking up by the token itself finds nobody. */
    CHECK_EQ_INT(store_user_find_token(s, tok, &got, &err), DDPD_ENOTFOUND);
    CHECK(user_token_hash("x", 1, h2));
    CHECK_EQ_INT(store_user_find_token(s, h2, &got, &err), DDPD_ENOTFOUND);
    CHECK_EQ_INT(store_user_rotate(s, "alice", h2, &err), DDPD_OK);
    CHECK_EQ_INT(store_user_find_token(s, h, &got, &err), DDPD_ENOTFOUND);
    CHECK_EQ_INT(store_user_find_token(s, h2, &got, &err), DDPD_OK);
    CHECK(got.rotated_at > 0);
    CHECK_EQ_INT(store_user_rotate(s, "nobody", h, &err), DDPD_ENOTFOUND);
    got.role = USER_ROLE_ADMIN;
    got.max_priority = 90;
    CHECK_EQ_INT(store_user_update(s, &got, &err), DDPD_OK);
    CHECK_EQ_INT(store_user_get(s, "alice", &u, &err), DDPD_OK);
    CHECK(u.role == USER_ROLE_ADMIN && u.max_priority == 90);
    /* Owners and the queued count. */
    struct store_job_new jn = {
        .name = "j", .spec = "{}", .world_size = 1, .device = DEVICE_CPU, .owner = "alice"};
    int64_t id = 0, n = -1;
    CHECK_EQ_INT(store_job_insert(s, &jn, &id, NULL, &err), DDPD_OK);
    char owner[STORE_OWNER_MAX];
    CHECK_EQ_INT(store_owner_get(s, false, id, owner, sizeof owner, &err), DDPD_OK);
    CHECK_EQ_STR(owner, "alice");
    CHECK_EQ_INT(store_owner_get(s, false, id + 100, owner, sizeof owner, &err), DDPD_ENOTFOUND);
    CHECK_EQ_INT(store_user_queued(s, "alice", &n, &err), DDPD_OK);
    CHECK(n == 1);
    struct store_job j;
    memset(&j, 0, sizeof j);
    CHECK_EQ_INT(store_job_get(s, id, &j, &err), DDPD_OK);
    CHECK_EQ_STR(j.owner, "alice");
    CHECK(j.preemptions == 0);
    store_job_clear(&j);
    struct user *l = NULL;
    size_t nl = 0;
    CHECK_EQ_INT(store_user_list(s, &l, &nl, &err), DDPD_OK);
    CHECK(nl == 1 && !strcmp(l[0].name, "alice"));
    free(l);
    CHECK_EQ_INT(store_user_remove(s, "alice", &err), DDPD_OK);
    CHECK_EQ_INT(store_user_remove(s, "alice", &err), DDPD_ENOTFOUND);
    CHECK(store_user_any(s, &any, &err) == DDPD_OK && !any);
    store_close(s);
    /* The database file never holds the token. */
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (f) {
        static char buf[1 << 20];
        size_t nb = fread(buf, 1, sizeof buf, f);
        fclose(f);
        CHECK(memmem(buf, nb, tok, strlen(tok)) == NULL);
    }
}

int main(void)
{
    test_names_and_roles();
    test_tokens_and_hashes();
    test_json();
    const char *base = getenv("DDPD_TEST_TMP");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/test_users.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "mkdtemp %s: %s\n", dir, strerror(errno));
        return 1;
    }
    test_store(dir);
    CHECK_DONE();
}
