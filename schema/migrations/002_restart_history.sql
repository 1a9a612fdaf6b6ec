-- 002_restart_history.sql — why each restart of a job happened, in a column of its own, so
-- that `error` says only why a job failed or was cancelled (a job that succeeded after a
-- restart kept the restart's reason as its error). The build embeds this file byte for
-- byte in server/store.c, which applies it when the database's PRAGMA user_version is below 2.
--
-- restart_history is a JSON array, oldest first, of {"attempt": N, "reason": "...",
-- "ts": T}: the attempt that ended, why the job was started again, and when.
ALTER TABLE jobs ADD COLUMN restart_history TEXT NOT NULL DEFAULT '[]'
    CHECK (json_valid(restart_history));

-- Under version 1 a job that was not failed or cancelled could hold an error only from a
-- restart (the latest one): it moves into the history. A requeued job still has the
-- attempt that ended; a started one has the next.
UPDATE jobs SET restart_history = json_array(json_object(
        'attempt', CASE WHEN state = 'queued' THEN attempt ELSE attempt - 1 END,
        'reason', error, 'ts', NULL)),
    error = NULL
    WHERE error IS NOT NULL AND state IN ('queued', 'starting', 'running', 'succeeded');
