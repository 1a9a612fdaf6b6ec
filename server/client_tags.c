/* client_tags.c — a job's tags and notes from the command line (schema/jobmeta.h): the
 * --tag, --no-tags and --notes options that `ddpd submit` writes into the body beside the
 * spec and `ddpd patch` sends with PATCH /v1/jobs/{id}. The server checks the values; this
 * file only carries them. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"
#include "termsafe.h"

bool meta_option(struct meta_opts *m, int opt, const char *arg)
{
    switch (opt) {
    case OPT_TAG:
        if (!m->tags)
            m->tags = json_array();
        json_array_append_new(m->tags, json_string(arg));
        return true;
    case OPT_NO_TAGS: m->no_tags = true; return true;
    case OPT_NOTES: m->notes = arg; return true;
    default: return false;
    }
}

bool meta_given(const struct meta_opts *m)
{
    return m->tags || m->no_tags || m->notes;
}

void meta_put(const struct meta_opts *m, json_t *obj)
{
    if (m->tags || m->no_tags)
        json_object_set(obj, "tags", m->tags ? m->tags : json_array());
    if (m->notes)
        json_object_set_new(obj, "notes", json_string(m->notes));
}

void meta_free(struct meta_opts *m)
{
    json_decref(m->tags);
    m->tags = NULL;
}

/* ddpd patch [--tag T]... [--no-tags] [--notes TEXT] ID */
int cmd_patch(struct client *c, int argc, char **argv)
{
    static const struct option longs[] = {{"tag", required_argument, NULL, OPT_TAG},
                                          {"no-tags", no_argument, NULL, OPT_NO_TAGS},
                                          {"notes", required_argument, NULL, OPT_NOTES},
                                          COMMON_OPTIONS};
    struct opts o = {.cmd = find_command("patch")};
    struct meta_opts m = {0};
    int opt, rc;
    while ((opt = next_option(&o, argc, argv, ":h", longs)) != -1) {
        if (opt == -2) {
            meta_free(&m);
            return o.rc;
        }
        meta_option(&m, opt, optarg);
    }
    int64_t id;
    if ((rc = id_operand(c, &o, argc, argv, "patch", &id))) {
        meta_free(&m);
        return rc;
    }
    if (!meta_given(&m)) {
        fprintf(stderr,
                "ddpd patch: nothing to change: give --tag T (repeated), --no-tags or --notes TEXT\n");
        return EXIT_USAGE;
    }
    json_t *body = json_object();
    meta_put(&m, body);
    meta_free(&m);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text)
        return EXIT_FAIL;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%" PRId64, id);
    struct sink s = {.c = c, .body = {.max = ANSWER_MAX}};
    long status = request(c, "PATCH", path, text, strlen(text), REQ_PLAIN, &s);
    free(text);
    if (status == 200) {
        json_t *j = json_loads(s.body.p ? s.body.p : "", 0, NULL);
        char *tags = json_dumps(json_object_get(j, "tags"), JSON_COMPACT | JSON_ENCODE_ANY);
        char shown[SAFE_MAX];
        printf("job %" PRId64 ": tags %s\n", id, termsafe_line(shown, sizeof shown, tags ? tags : "[]"));
        free(tags);
        json_decref(j);
        rc = 0;
    } else {
        rc = status > 0 ? http_failed(c, "PATCH", path, status, &s.body, true) : EXIT_FAIL;
    }
    buf_free(&s.body);
    return rc;
}
