-- 001_init.sql — ddpd's first schema: jobs, their attempts and ranks, the event log and
-- the loss series (CONTRACT.md §6, §7). The build embeds this file byte for byte in
-- server/store.c (cmake/embed_migrations.cmake), which applies it when the database's
-- PRAGMA user_version is below 1. Times are seconds since the epoch (REAL).

-- One row per submitted job. AUTOINCREMENT: an id is never reused, even after the newest
-- job is deleted, so URLs, cursors and var/jobs/ID folders never point at a stranger.
CREATE TABLE jobs (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    name           TEXT    NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('queued', 'starting', 'running',
                                                     'succeeded', 'failed', 'cancelled')),
    spec           TEXT    NOT NULL CHECK (json_valid(spec)),
    world_size     INTEGER NOT NULL CHECK (world_size >= 1),
    device         TEXT    NOT NULL CHECK (device IN ('cpu', 'cuda')),
    created_at     REAL    NOT NULL,
    started_at     REAL,
    finished_at    REAL,
    attempt        INTEGER NOT NULL DEFAULT 0,   -- 0 until the first start, then 1, 2, ...
    step           INTEGER,                      -- latest optimizer step with a loss
    loss           REAL,                         -- mean over the ranks that reported it
    error          TEXT,
    pending_reason TEXT,
    max_restarts   INTEGER NOT NULL DEFAULT 0,
    restarts       INTEGER NOT NULL DEFAULT 0
);
-- GET /v1/jobs?state=... newest first, and restart recovery (jobs left starting/running).
CREATE INDEX jobs_state_id ON jobs (state, id);

-- One row per start of a job's process group (a restart makes a new attempt).
CREATE TABLE attempts (
    job         INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt     INTEGER NOT NULL,
    comm_id     TEXT,                            -- the rendezvous id, hex
    started_at  REAL    NOT NULL,
    finished_at REAL,
    outcome     TEXT,                            -- succeeded, failed, cancelled, restarted, ...
    PRIMARY KEY (job, attempt)
) WITHOUT ROWID;

-- One row per worker process of an attempt. pid + start_time (field 22 of /proc/PID/stat,
-- clock ticks after boot) recognise an orphan after a server restart even when the pid
-- has been reused. step/loss/samples_per_s: the rank's latest loss event.
CREATE TABLE ranks (
    job           INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt       INTEGER NOT NULL,
    rank          INTEGER NOT NULL,
    pid           INTEGER,
    start_time    INTEGER,
    state         TEXT    NOT NULL,
    exit_code     INTEGER,
    step          INTEGER,
    loss          REAL,
    samples_per_s REAL,
    PRIMARY KEY (job, attempt, rank)
) WITHOUT ROWID;

-- Every event the server stored for a job, in its per-job order. body is the JSON line as
-- sent to clients (with job, attempt and seq); rank is NULL for the server's own events.
CREATE TABLE events (
    job     INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq     INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    kind    TEXT    NOT NULL,
    rank    INTEGER,
    body    TEXT    NOT NULL,
    ts      REAL    NOT NULL,
    PRIMARY KEY (job, seq)
) WITHOUT ROWID;

-- The loss curve for /metrics: one value per (job, step, rank). A restart that repeats a
-- step replaces the earlier value; a non-finite loss is NULL.
CREATE TABLE loss (
    job  INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    loss REAL,
    PRIMARY KEY (job, step, rank)
) WITHOUT ROWID;
