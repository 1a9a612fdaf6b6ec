-- The ASHA migration — sweeps by successive halving (method "asha", server/sweep/sweep_asha.c):
-- a job may pause, and a trial runs as a chain of jobs, one per rung, each resumed from
-- the one before. The build embeds this file byte for byte in server/store.c.

-- A job's pause: its ranks stop after this step with its checkpoint written and no final
-- model (the job document's stop_at; the job then succeeds with the stop_reason "paused
-- at step S"). NULL for a job that runs to its last step.
ALTER TABLE jobs ADD COLUMN stop_at INTEGER;

-- A trial's rung: the one its latest job runs to (0 for grid and random trials), and the
-- rungs it completed, oldest first: a JSON array of {"rung": k, "step": S, "job": id,
-- "metric": value or null}. The controller's promotions are decided from these alone,
-- so a restarted server decides as the killed one did.
ALTER TABLE sweep_trials ADD COLUMN rung INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sweep_trials ADD COLUMN rungs TEXT NOT NULL DEFAULT '[]';
