-- The cluster migration — a shared cluster (docs/scheduling.md, docs/security.md): named
-- users with roles, tokens and limits; every job's and sweep's owner; the job state
-- `preempted`; each job's preemptions and running time. The build embeds this file byte
-- for byte in server/store.c, which applies it with foreign keys off (the jobs table is
-- rebuilt: SQLite cannot change a CHECK) and checks them before it commits.

-- One user: a name, a role, the SHA-256 of the bearer token (hex; the token itself is
-- shown once and never stored) and the limits an admin sets (NULL: no limit).
CREATE TABLE users (
    name          TEXT    PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
    role          TEXT    NOT NULL CHECK (role IN ('admin', 'user', 'viewer')),
    token_sha256  TEXT    NOT NULL UNIQUE CHECK (length(token_sha256) = 64),
    max_priority  INTEGER NOT NULL DEFAULT 50 CHECK (max_priority BETWEEN 0 AND 100),
    max_gpus      INTEGER CHECK (max_gpus IS NULL OR max_gpus >= 0),
    max_cpu_ranks INTEGER CHECK (max_cpu_ranks IS NULL OR max_cpu_ranks >= 0),
    max_queued    INTEGER CHECK (max_queued IS NULL OR max_queued >= 0),
    created_at    REAL    NOT NULL,
    rotated_at    REAL
) WITHOUT ROWID;

-- The jobs table as before with the state `preempted` (stopped at a checkpoint for a job
-- of higher priority, waiting to resume), and three columns: owner (the user who
-- submitted it; NULL for jobs from before users, which only an admin may act on),
-- preemptions (how many times), run_s (seconds it has run over its ended attempts, for
-- time_limit), preempt_by (the job it is being preempted for, while it drains: a server
-- restarted then puts it back in the queue as preempted).
CREATE TABLE jobs_new (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    name           TEXT    NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('queued', 'starting', 'running', 'preempted',
                                                     'succeeded', 'failed', 'cancelled')),
    spec           TEXT    NOT NULL CHECK (json_valid(spec)),
    world_size     INTEGER NOT NULL CHECK (world_size >= 1),
    device         TEXT    NOT NULL CHECK (device IN ('cpu', 'cuda')),
    created_at     REAL    NOT NULL,
    started_at     REAL,
    finished_at    REAL,
    attempt        INTEGER NOT NULL DEFAULT 0,
    step           INTEGER,
    loss           REAL,
    error          TEXT,
    pending_reason TEXT,
    max_restarts   INTEGER NOT NULL DEFAULT 0,
    restarts       INTEGER NOT NULL DEFAULT 0,
    restart_history TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(restart_history)),
    resumed_from   INTEGER CHECK (resumed_from IS NULL OR resumed_from > 0),
    resume_step    INTEGER
        CHECK ((resume_step IS NULL) = (resumed_from IS NULL) AND (resume_step IS NULL OR resume_step >= 0)),
    total_steps    INTEGER CHECK (total_steps IS NULL OR total_steps > 0),
    resume_force   INTEGER NOT NULL DEFAULT 0
        CHECK (resume_force IN (0, 1) AND (resume_force = 0 OR resumed_from IS NOT NULL)),
    stop_reason    TEXT,
    eval_step      INTEGER,
    eval_loss      REAL,
    eval_accuracy  REAL,
    best_eval_loss REAL,
    best_eval_loss_step INTEGER,
    best_eval_accuracy REAL,
    best_eval_accuracy_step INTEGER,
    notes          TEXT,
    stop_at        INTEGER,
    owner          TEXT,
    preemptions    INTEGER NOT NULL DEFAULT 0 CHECK (preemptions >= 0),
    run_s          REAL    NOT NULL DEFAULT 0,
    preempt_by     INTEGER
);
INSERT INTO jobs_new (id, name, state, spec, world_size, device, created_at, started_at,
        finished_at, attempt, step, loss, error, pending_reason, max_restarts, restarts,
        restart_history, resumed_from, resume_step, total_steps, resume_force, stop_reason,
        eval_step, eval_loss, eval_accuracy, best_eval_loss, best_eval_loss_step,
        best_eval_accuracy, best_eval_accuracy_step, notes, stop_at)
    SELECT id, name, state, spec, world_size, device, created_at, started_at,
        finished_at, attempt, step, loss, error, pending_reason, max_restarts, restarts,
        restart_history, resumed_from, resume_step, total_steps, resume_force, stop_reason,
        eval_step, eval_loss, eval_accuracy, best_eval_loss, best_eval_loss_step,
        best_eval_accuracy, best_eval_accuracy_step, notes, stop_at
    FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_new RENAME TO jobs;
CREATE INDEX jobs_state_id ON jobs (state, id);
-- A user's queued jobs, counted at each submit (max_queued).
CREATE INDEX jobs_owner_state ON jobs (owner, state);

ALTER TABLE sweeps ADD COLUMN owner TEXT;
