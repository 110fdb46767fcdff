-- Retention (issue 28): `bulk-recorder retention` removes idempotency records and finished jobs
-- past their window, oldest first, a bounded batch at a time. These indexes let each batch find
-- its oldest rows without scanning the table.
CREATE INDEX IF NOT EXISTS transaction_requests_created_idx
    ON transaction_requests (created_at);
CREATE INDEX IF NOT EXISTS credit_annotation_jobs_created_idx
    ON credit_annotation_jobs (created_at);
CREATE INDEX IF NOT EXISTS credit_annotation_job_repeats_recorded_idx
    ON credit_annotation_job_repeats (recorded_at);
