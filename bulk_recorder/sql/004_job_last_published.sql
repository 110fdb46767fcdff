-- When the relay last published a row of the job (set with the job's published count, in the
-- same database transaction as the delete). The job status says `stalled` when rows still wait
-- and nothing has been published for API_JOB_STALL_AFTER_S, neither for the job (since this, or
-- since the job was accepted) nor for any other job (the index makes that max() one lookup).
ALTER TABLE credit_annotation_jobs ADD COLUMN IF NOT EXISTS last_published_at timestamptz;
CREATE INDEX IF NOT EXISTS credit_annotation_jobs_last_published_idx
    ON credit_annotation_jobs (last_published_at);
