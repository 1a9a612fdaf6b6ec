-- *_job_metrics.sql — each job's final and best eval metrics, kept by the event writer
-- in the transaction that stores the eval events, so that GET /v1/jobs shows them for
-- every job without reading its events (the job list of the dashboard, `ddpd compare`).
-- The build embeds this file byte for byte in server/store.c, which applies it when the
-- database's PRAGMA user_version is below this file's number.
--
-- eval_*: the eval event of the highest step (of a step run again after a restart, the
-- latest); eval_loss NULL when that loss was not finite, eval_accuracy NULL for a loss
-- other than cross_entropy. best_eval_loss: the lowest finite eval loss, best_eval_accuracy
-- the highest accuracy, each with the step of its first occurrence.
ALTER TABLE jobs ADD COLUMN eval_step INTEGER;
ALTER TABLE jobs ADD COLUMN eval_loss REAL;
ALTER TABLE jobs ADD COLUMN eval_accuracy REAL;
ALTER TABLE jobs ADD COLUMN best_eval_loss REAL;
ALTER TABLE jobs ADD COLUMN best_eval_loss_step INTEGER;
ALTER TABLE jobs ADD COLUMN best_eval_accuracy REAL;
ALTER TABLE jobs ADD COLUMN best_eval_accuracy_step INTEGER;

-- The jobs stored before this version: the same numbers from their eval events, once.
UPDATE jobs SET
    eval_step = (SELECT json_extract(body, '$.step') FROM events
                 WHERE job = jobs.id AND kind = 'eval' ORDER BY json_extract(body, '$.step') DESC, seq DESC LIMIT 1),
    eval_loss = (SELECT json_extract(body, '$.loss') FROM events
                 WHERE job = jobs.id AND kind = 'eval' ORDER BY json_extract(body, '$.step') DESC, seq DESC LIMIT 1),
    eval_accuracy = (SELECT json_extract(body, '$.accuracy') FROM events
                     WHERE job = jobs.id AND kind = 'eval' ORDER BY json_extract(body, '$.step') DESC, seq DESC LIMIT 1),
    best_eval_loss = (SELECT json_extract(body, '$.loss') FROM events
                      WHERE job = jobs.id AND kind = 'eval' AND json_extract(body, '$.loss') IS NOT NULL
                      ORDER BY json_extract(body, '$.loss'), json_extract(body, '$.step') LIMIT 1),
    best_eval_loss_step = (SELECT json_extract(body, '$.step') FROM events
                           WHERE job = jobs.id AND kind = 'eval' AND json_extract(body, '$.loss') IS NOT NULL
                           ORDER BY json_extract(body, '$.loss'), json_extract(body, '$.step') LIMIT 1),
    best_eval_accuracy = (SELECT json_extract(body, '$.accuracy') FROM events
                          WHERE job = jobs.id AND kind = 'eval' AND json_extract(body, '$.accuracy') IS NOT NULL
                          ORDER BY json_extract(body, '$.accuracy') DESC, json_extract(body, '$.step') LIMIT 1),
    best_eval_accuracy_step = (SELECT json_extract(body, '$.step') FROM events
                               WHERE job = jobs.id AND kind = 'eval' AND json_extract(body, '$.accuracy') IS NOT NULL
                               ORDER BY json_extract(body, '$.accuracy') DESC, json_extract(body, '$.step') LIMIT 1)
    WHERE EXISTS (SELECT 1 FROM events WHERE job = jobs.id AND kind = 'eval');
