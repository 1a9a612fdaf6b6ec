-- 005_event_budget.sql — a job's stored events are bounded: past `ddpd serve
-- --job-events-max` loss events, the event writer thins the older ones (store_budget.c),
-- and their bytes count against `--job-disk-quota`. The build embeds this file byte for
-- byte in server/store.c, which applies it when the database's PRAGMA user_version is
-- below 5.

-- The step of a loss event, so that thinning finds a step's rows without parsing each
-- body; NULL for the other kinds, and for the rows stored before this column (the writer
-- reads their body's step instead).
ALTER TABLE events ADD COLUMN step INTEGER;

-- What each job's stored events take, kept by the writer in the transaction that stores
-- or thins them: rows, the bytes of their JSON bodies, how many are loss events, and how
-- many loss events the latest thinning left (the next one waits for a quarter of the
-- budget more, so that a job that cannot get under it is not thinned at every commit).
CREATE TABLE event_usage (
    job         INTEGER PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    events      INTEGER NOT NULL,
    bytes       INTEGER NOT NULL,
    loss_events INTEGER NOT NULL,
    thinned     INTEGER NOT NULL DEFAULT 0
);
INSERT INTO event_usage (job, events, bytes, loss_events)
    SELECT job, count(*), sum(length(CAST(body AS BLOB))), sum(kind = 'loss') FROM events GROUP BY job;
