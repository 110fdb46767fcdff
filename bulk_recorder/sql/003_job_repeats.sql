-- A job's lines whose annotation id was already recorded, by another job or outside any job.
--
-- The recorder's insert keeps the first row of an id (ON CONFLICT (id) DO NOTHING), so such a
-- line never gets a credit_annotations row carrying its own job's id. The recorder records
-- (job_id, annotation_id) here instead, in the same database transaction, and only for rows the
-- insert ignored: a job's progress is its own rows plus these. The key makes a redelivery
-- harmless (ON CONFLICT DO NOTHING), and an id the job owns itself is never recorded here.
CREATE TABLE IF NOT EXISTS credit_annotation_job_repeats (
    job_id        uuid NOT NULL,
    annotation_id uuid NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, annotation_id)
);
