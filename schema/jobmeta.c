/* jobmeta.c — the rules for a job's tags and notes (jobmeta.h): what a body may say of
 * them and the form the store keeps. Pure checks and copies: no I/O, no store. */
#include "jobmeta.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text.h"

/* The text rule for notes: showable text (text.h), except that a note may break lines
 * and indent, which a terminal shows harmlessly. */
static ddpd_err check_notes(const char *s, size_t len, struct ddpd_error *err)
{
    for (size_t at = 0; at < len;) {
        int32_t cp = 0;
        size_t bad = at + text_find_unshowable(s + at, len - at, &cp);
        if (bad == len)
            return DDPD_OK;
        if (cp != '\n' && cp != '\t') {
            if (cp < 0)
                return ddpd_error_set(err, DDPD_ESPEC, "notes", "notes: invalid UTF-8 at byte %zu", bad + 1);
            return ddpd_error_set(err, DDPD_ESPEC, "notes",
                                  "notes: control character U+%04X at byte %zu is not allowed", (unsigned)cp,
                                  bad + 1);
        }
        at = bad + 1;
    }
    return DDPD_OK;
}

ddpd_err jobmeta_check_tag(const char *tag, const char *path, struct ddpd_error *err)
{
    size_t n = strlen(tag);
    if (n == 0)
        return ddpd_error_set(err, DDPD_ESPEC, path, "%s: a tag is not empty", path);
    if (n > JOBMETA_TAG_MAX)
        return ddpd_error_set(err, DDPD_ESPEC, path, "%s: a tag is at most %d bytes; this one has %zu", path,
                              JOBMETA_TAG_MAX, n);
    int32_t cp = 0;
    size_t at = text_find_unshowable(tag, n, &cp);
    if (at < n && cp < 0)
        return ddpd_error_set(err, DDPD_ESPEC, path, "%s: invalid UTF-8 at byte %zu", path, at + 1);
    if (at < n)
        return ddpd_error_set(err, DDPD_ESPEC, path,
                              "%s: control character U+%04X at byte %zu is not allowed", path, (unsigned)cp,
                              at + 1);
    if (tag[0] == ' ' || tag[n - 1] == ' ')
        return ddpd_error_set(err, DDPD_ESPEC, path, "%s: \"%s\" begins or ends with a space", path, tag);
    return DDPD_OK;
}

static ddpd_err read_tags(json_t *v, struct jobmeta *m, struct ddpd_error *err)
{
    if (!json_is_array(v))
        return ddpd_error_set(err, DDPD_ESPEC, "tags", "tags: expected an array of strings");
    size_t n = json_array_size(v);
    if (n > JOBMETA_TAGS_MAX)
        return ddpd_error_set(err, DDPD_ESPEC, "tags", "tags: at most %d tags; got %zu", JOBMETA_TAGS_MAX, n);
    for (size_t i = 0; i < n; i++) {
        char path[32];
        snprintf(path, sizeof path, "tags[%zu]", i);
        json_t *t = json_array_get(v, i);
        if (!json_is_string(t))
            return ddpd_error_set(err, DDPD_ESPEC, path, "%s: expected a string", path);
        const char *s = json_string_value(t);
        if (strlen(s) != json_string_length(t))
            return ddpd_error_set(err, DDPD_ESPEC, path, "%s: control character U+0000 is not allowed", path);
        ddpd_err rc = jobmeta_check_tag(s, path, err);
        if (rc)
            return rc;
        for (size_t k = 0; k < i; k++)
            if (!strcmp(s, json_string_value(json_array_get(v, k))))
                return ddpd_error_set(err, DDPD_ESPEC, path, "%s: \"%s\" is tags[%zu] already", path, s, k);
    }
    m->tags = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    m->has_tags = true;
    return m->tags ? DDPD_OK : ddpd_error_set(err, DDPD_ENOMEM, "tags", "out of memory for the tags");
}

static ddpd_err read_notes(json_t *v, struct jobmeta *m, struct ddpd_error *err)
{
    m->has_notes = true;
    if (json_is_null(v))
        return DDPD_OK;
    if (!json_is_string(v))
        return ddpd_error_set(err, DDPD_ESPEC, "notes", "notes: expected a string (or null to clear them)");
    size_t n = json_string_length(v);
    if (n > JOBMETA_NOTES_MAX)
        return ddpd_error_set(err, DDPD_ESPEC, "notes", "notes: at most %d bytes; got %zu", JOBMETA_NOTES_MAX,
                              n);
    ddpd_err rc = check_notes(json_string_value(v), n, err);
    if (rc)
        return rc;
    if (n > 0 && !(m->notes = strdup(json_string_value(v))))
        return ddpd_error_set(err, DDPD_ENOMEM, "notes", "out of memory for the notes");
    return DDPD_OK;
}

ddpd_err jobmeta_from_json(json_t *obj, bool take, struct jobmeta *m, struct ddpd_error *err)
{
    memset(m, 0, sizeof *m);
    json_t *tags = json_object_get(obj, "tags"), *notes = json_object_get(obj, "notes");
    ddpd_err rc = DDPD_OK;
    if (tags)
        rc = read_tags(tags, m, err);
    if (rc == DDPD_OK && notes)
        rc = read_notes(notes, m, err);
    if (rc == DDPD_OK && take) {
        json_object_del(obj, "tags");
        json_object_del(obj, "notes");
    }
    return rc;
}

void jobmeta_clear(struct jobmeta *m)
{
    if (!m)
        return;
    free(m->tags);
    free(m->notes);
    memset(m, 0, sizeof *m);
}
