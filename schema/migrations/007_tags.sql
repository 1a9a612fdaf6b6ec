-- 006_tags.sql — a job's tags and notes: metadata that a user gives at submit or changes
-- later with PATCH /v1/jobs/{id}, which training never reads (schema/jobmeta.h). The
-- build embeds this file byte for byte in server/store.c, which applies it when the
-- database's PRAGMA user_version is below this migration's number.

-- Free text about the job; NULL when it has none.
ALTER TABLE jobs ADD COLUMN notes TEXT;

-- One row per tag of a job, `pos` its place in the job's list (tags are shown in the
-- order the user gave them). The primary key (tag, job) is what GET /v1/jobs?tag=T reads:
-- one range of the index, newest job first; the second index reads a job's own tags.
CREATE TABLE job_tags (
    tag TEXT NOT NULL,
    job INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    pos INTEGER NOT NULL,
    PRIMARY KEY (tag, job)
) WITHOUT ROWID;
CREATE INDEX job_tags_job ON job_tags (job, pos);
