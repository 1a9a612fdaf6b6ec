/* store_cluster.c — what the supervisor reads of the shared cluster (docs/scheduling.md):
 * a job's owner with the owner's running limits, its preemptions and its running time. */
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>

#include "store.h"
#include "store_impl.h"

static int int_or_none(sqlite3_stmt *st, int col)
{
    return sqlite3_column_type(st, col) == SQLITE_NULL ? -1 : sqlite3_column_int(st, col);
}

ddpd_err store_job_weight(struct store *s, int64_t id, struct store_job_weight *out, struct ddpd_error *err)
{
    *out = (struct store_job_weight){.max_gpus = -1, .max_cpu_ranks = -1};
    struct conn *c = reader_get(s, err);
    if (!c)
        return err ? err->code : DDPD_EIO;
    ddpd_err e = DDPD_OK;
    sqlite3_stmt *st = stmt(c, R_JOB_WEIGHT, err);
    if (!st) {
        e = err ? err->code : DDPD_EINTERNAL;
        goto out;
    }
    sqlite3_bind_int64(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        snprintf(out->owner, sizeof out->owner, "%s", col_text(st, 0));
        out->max_gpus = int_or_none(st, 1);
        out->max_cpu_ranks = int_or_none(st, 2);
        out->preemptions = sqlite3_column_int(st, 3);
        out->run_s = sqlite3_column_double(st, 4);
        out->preempt_by = sqlite3_column_int64(st, 5);
    } else if (rc == SQLITE_DONE) {
        e = ddpd_error_set(err, DDPD_ENOTFOUND, "", "job %lld not found", (long long)id);
    } else {
        e = sq_fail(err, c->db, rc, "read job weight");
    }
    stmt_done(st);
out:
    reader_put(s, c);
    return e;
}
