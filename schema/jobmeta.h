/* jobmeta.h — a job's metadata: its tags and notes, which a user gives beside the spec's
 * keys at submit (POST /v1/jobs) or changes later (PATCH /v1/jobs/{id}). They describe the
 * job for people and for filters (GET /v1/jobs?tag=T); training never reads them, so they
 * are not part of the spec and never reach a worker. The rules here are the only ones:
 * the server checks both routes' bodies and the list filter with them. */
#ifndef DDPD_JOBMETA_H
#define DDPD_JOBMETA_H

#include <jansson.h>
#include <stdbool.h>

#include "err.h"

#define JOBMETA_TAGS_MAX  32   /* tags per job */
#define JOBMETA_TAG_MAX   64   /* bytes per tag */
#define JOBMETA_NOTES_MAX 4096 /* bytes of notes */

/* What a body said of the metadata. `tags` is the JSON text of the array as it will be
 * stored (compact; "[]" for none), `notes` the text (NULL: clear them); both owned, and
 * only meaningful when their has_ flag is set. Release with jobmeta_clear. */
struct jobmeta {
    bool has_tags, has_notes;
    char *tags, *notes;
};

/* Reads "tags" (an array of up to JOBMETA_TAGS_MAX distinct strings, each 1..
 * JOBMETA_TAG_MAX bytes of showable text (text.h) without leading or trailing spaces) and
 * "notes" (a string of showable text up to JOBMETA_NOTES_MAX bytes, newlines and tabs
 * allowed, or null) of the object `obj` (borrowed) into *m. With `take`, the two keys are
 * removed from obj, so that what is left is the spec alone. DDPD_ESPEC naming `tags`,
 * `tags[i]` or `notes`; DDPD_ENOMEM. *m is zeroed first; clear it also after an error. */
ddpd_err jobmeta_from_json(json_t *obj, bool take, struct jobmeta *m, struct ddpd_error *err);

/* DDPD_OK when `tag` is one a job may carry; else DDPD_ESPEC at `path` saying why. */
ddpd_err jobmeta_check_tag(const char *tag, const char *path, struct ddpd_error *err);

/* Frees what m owns and zeroes it. NULL is a no-op. */
void jobmeta_clear(struct jobmeta *m);

#endif
