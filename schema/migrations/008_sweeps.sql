-- The sweeps migration — hyper-parameter sweeps (POST /v1/sweeps, server/sweep/): a sweep and
-- its trials, each trial run as an ordinary job. All of a sweep's state is here, so that
-- a restarted server's controller goes on with it. The build embeds this file byte for
-- byte in server/store.c.

-- One sweep: the request as the client sent it (body), its method, metric and mode, how
-- many of its jobs may be queued or running at once, and its state: running, succeeded
-- (every trial ended), cancelled.
CREATE TABLE sweeps (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at   REAL NOT NULL,
    finished_at  REAL,
    state        TEXT NOT NULL,
    method       TEXT NOT NULL,
    metric       TEXT NOT NULL,
    mode         TEXT NOT NULL,
    max_parallel INTEGER NOT NULL,
    body         TEXT NOT NULL
);
CREATE INDEX sweeps_state ON sweeps (state);

-- One trial: its values ({"<dotted.path>": value}), its spec (the base with them set),
-- its job (NULL until the controller submits it; not a foreign key: a user may delete
-- the job, and the trial keeps its record), its state (pending until it has a job, then
-- its job's, final once the job ended) and its metric (NULL when the job reported none).
CREATE TABLE sweep_trials (
    sweep  INTEGER NOT NULL REFERENCES sweeps (id) ON DELETE CASCADE,
    idx    INTEGER NOT NULL,
    params TEXT NOT NULL,
    spec   TEXT NOT NULL,
    job    INTEGER,
    state  TEXT NOT NULL,
    metric REAL,
    PRIMARY KEY (sweep, idx)
);
