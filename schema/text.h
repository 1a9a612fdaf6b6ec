/* text.h — the rule for text a user gives that others are shown: a job's name, its data
 * paths and column names (and tags, when they come), which `ddpd jobs`, the dashboard and
 * error messages print. Such text is valid UTF-8 without control characters, so that
 * nothing a user submits can move a terminal's cursor, clear its screen or set its title.
 * Pure functions: no allocation, no I/O. */
#ifndef DDPD_TEXT_H
#define DDPD_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* The offset of the first thing in s[0..len) that shown text may not hold, or len when
 * there is none: a control character (C0 U+0000..U+001F, tab and newline included; DEL
 * U+007F; C1 U+0080..U+009F), whose code point goes to *cp, or a byte that does not begin
 * a valid UTF-8 sequence (overlong, surrogate, past U+10FFFF, cut short), for which *cp is
 * -1. */
size_t text_find_unshowable(const char *s, size_t len, int32_t *cp);

/* DDPD_OK when s[0..len) is showable text; otherwise DDPD_ESPEC (422) at `path` saying
 * what and where, counting bytes from 1: "control character U+001B at byte 5 is not
 * allowed", "invalid UTF-8 at byte 3". */
ddpd_err text_check_showable(const char *s, size_t len, const char *path, struct ddpd_error *err);

#endif
