-- 006_best.sql — why a job ended before its last step: early_stop's "early_stopped at
-- step S (best S' = v)", from rank 0's done event (its stop_reason); NULL for a job that
-- ran to its end, failed or was cancelled, and for the rows of older servers. The build
-- embeds this file byte for byte in server/store.c.
ALTER TABLE jobs ADD COLUMN stop_reason TEXT;
