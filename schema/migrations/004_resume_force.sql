-- 004_resume_force.sql — a job made by POST /v1/jobs/{id}/resume?force=true starts from its
-- checkpoint even where a data file changed since that checkpoint was written (the data
-- fingerprints the checkpoint records, docs/spec.md "Checkpoints"). Kept with the job, not
-- in memory: the supervisor hands it to the ranks of every attempt that starts from that
-- checkpoint, also after a server restart while the job was queued. 0 for every other job.
-- The build embeds this file byte for byte in server/store.c, which applies it when the
-- database's PRAGMA user_version is below 4.
ALTER TABLE jobs ADD COLUMN resume_force INTEGER NOT NULL DEFAULT 0
    CHECK (resume_force IN (0, 1) AND (resume_force = 0 OR resumed_from IS NOT NULL));
