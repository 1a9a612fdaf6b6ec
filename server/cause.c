/* cause.c — the choice of an attempt's failed rank (cause.h): from each rank's error event
 * and exit, never from the order the exits arrived in. Knows the events' kinds and the
 * exit codes of CONTRACT.md §6; nothing of processes or launchers. */
#include "cause.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void cause_note_line(struct cause_rank *r, const char *line, size_t len)
{
    struct event ev;
    if (!event_error_decode(line, len, &ev))
        return;
    r->has_error = true;
    r->secondary = ev.secondary;
    r->ts = isfinite(ev.ts) ? ev.ts : 0;
    snprintf(r->kind, sizeof r->kind, "%s", ev.error_kind);
    snprintf(r->message, sizeof r->message, "%s", ev.message);
}

/* A failure about the group rather than the rank: a collective that failed, a rank told
 * to stop. Its own only when no rank reports a cause of its own. */
static bool group_kind(const char *kind)
{
    return strcmp(kind, "comm") == 0 || strcmp(kind, "cancelled") == 0;
}

/* 1, 2 or 3 (cause.h's order) for a failed rank. */
static int tier(const struct cause_rank *r)
{
    if (r->has_error && !r->secondary)
        return group_kind(r->kind) ? 2 : 1;
    if (!r->has_error && r->exit == CAUSE_EXIT_OWN)
        return 1;
    return 3;
}

/* When the failure happened, as far as anyone can tell: the rank's own stamp, else when
 * its end was seen. An unknown time sorts last. */
static double when(const struct cause_rank *r)
{
    double t = r->has_error ? r->ts : r->ended_at;
    return t > 0 ? t : HUGE_VAL;
}

/* An unknown order sorts last. */
static int seen(const struct cause_rank *r)
{
    return r->order > 0 ? r->order : 1 << 30;
}

/* Whether a (failed, of tier t) goes before b (failed, of the same tier). Equal ranks
 * keep the lower index: the caller walks them in rank order. */
static bool before(const struct cause_rank *a, const struct cause_rank *b, int t)
{
    if (t < 3)
        return when(a) < when(b);
    if (a->exit != b->exit)
        return a->exit < b->exit;
    return seen(a) < seen(b);
}

int cause_pick(const struct cause_rank *ranks, int n)
{
    int best = -1, best_tier = 4;
    for (int i = 0; i < n; i++) {
        const struct cause_rank *r = &ranks[i];
        if (!r->failed)
            continue;
        int t = tier(r);
        if (t < best_tier || (t == best_tier && before(r, &ranks[best], t))) {
            best = i;
            best_tier = t;
        }
    }
    return best;
}

bool cause_preempted(const struct cause_rank *ranks, int n)
{
    bool any = false;
    for (int i = 0; i < n; i++) {
        if (ranks[i].failed)
            return false;
        any |= ranks[i].preempted;
    }
    return any;
}

int cause_exit_code(const struct cause_rank *r, int exit_code)
{
    int code = r->has_error ? ddpd_err_kind_exit(r->kind) : -1;
    return code > 0 ? code : exit_code;
}
