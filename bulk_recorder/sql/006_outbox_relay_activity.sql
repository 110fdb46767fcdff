-- When a relay last published any outbox row, a transaction or a job's line (one row, stamped
-- in the relay's batch transaction with its deletes). A job reads `stalled` when its rows wait
-- and nothing at all was published for API_JOB_STALL_AFTER_S: the jobs' own last_published_at
-- (004) missed a relay busy with transaction rows queued before a job, and such a job read
-- `stalled` while a healthy relay drained them.
CREATE TABLE IF NOT EXISTS outbox_relay_activity (
    only_row          boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    last_published_at timestamptz
);
INSERT INTO outbox_relay_activity (only_row) VALUES (true) ON CONFLICT DO NOTHING;
