-- 003_resumed_from.sql — a job made by POST /v1/jobs/{id}/resume continues another job
-- from one of its checkpoints: resumed_from is that job's id, resume_step the step of the
-- checkpoint (both NULL for a job submitted afresh). No foreign key: the job it continues
-- may be deleted later, and the link stays as a record of where the numbers came from.
-- The build embeds this file byte for byte in server/store.c, which applies it when the
-- database's PRAGMA user_version is below 3.
ALTER TABLE jobs ADD COLUMN resumed_from INTEGER CHECK (resumed_from IS NULL OR resumed_from > 0);
ALTER TABLE jobs ADD COLUMN resume_step INTEGER
    CHECK ((resume_step IS NULL) = (resumed_from IS NULL) AND (resume_step IS NULL OR resume_step >= 0));

-- total_steps: the optimizer steps the job takes in all, when the server knows them at
-- submit (the spec's steps, or epochs times the steps per epoch of the rank with the most
-- batches, from the planner's count of the data files); NULL when only the ranks can
-- tell ({rank} files) or for jobs stored before this column.
ALTER TABLE jobs ADD COLUMN total_steps INTEGER CHECK (total_steps IS NULL OR total_steps > 0);
