-- Producer side: the transactional outbox and what the ingest API remembers about requests.
--
-- The API writes its work (a transaction request, or a job) and the outbox rows that announce it
-- in ONE database transaction, then NOTIFYs bulk_recorder_outbox. The relay claims unsent rows
-- with FOR UPDATE SKIP LOCKED, publishes them with publisher confirms and deletes them in the
-- same database transaction, only after the broker confirmed. A crash between publish and
-- delete leaves the rows in place: they are published again and the recorder's idempotent
-- insert absorbs the duplicate.

CREATE TABLE IF NOT EXISTS outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    record_type  text NOT NULL CHECK (record_type IN ('transaction', 'credit_annotation')),
    record_id    uuid NOT NULL,
    job_id       uuid,
    body         bytea NOT NULL,            -- the message body, published byte for byte
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Set in the future after the broker refused a publish (nack or unroutable return).
    available_at timestamptz NOT NULL DEFAULT '-infinity',
    attempts     integer NOT NULL DEFAULT 0, -- broker refusals only; outages do not count
    last_error   text,
    parked_at    timestamptz                 -- refused too often: kept here, no longer retried
);
-- What the relay scans, in id order: every row not parked (sent rows are deleted).
CREATE INDEX IF NOT EXISTS outbox_pending_idx ON outbox (id) WHERE parked_at IS NULL;

-- One row per accepted POST /v1/transactions (both modes), written in the same database
-- transaction as the outbox row (async) or the transaction itself (sync): a repeat of the same
-- id or Idempotency-Key is answered from here, never with a second row.
CREATE TABLE IF NOT EXISTS transaction_requests (
    transaction_id  uuid PRIMARY KEY,
    idempotency_key text UNIQUE,
    request_hash    bytea NOT NULL,         -- sha256 of the canonical JSON of the body
    mode            text NOT NULL CHECK (mode IN ('async', 'sync')),
    status_code     smallint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- One row per accepted POST /v1/credit-annotation-jobs; its outbox rows carry its id.
CREATE TABLE IF NOT EXISTS credit_annotation_jobs (
    id                   uuid PRIMARY KEY,
    idempotency_key      text UNIQUE,
    request_hash         bytea,             -- sha256 of content type and body; set at commit
    content_type         text NOT NULL,
    accepted             integer NOT NULL DEFAULT 0,
    rejected             integer NOT NULL DEFAULT 0,
    rejections           jsonb NOT NULL DEFAULT '[]', -- the first rejected lines and reasons
    rejections_truncated boolean NOT NULL DEFAULT false,
    published            integer NOT NULL DEFAULT 0, -- moved by the relay, with its delete
    dead_lettered        integer NOT NULL DEFAULT 0, -- outbox rows the relay parked
    recorded             integer,                    -- frozen once the job is complete
    created_at           timestamptz NOT NULL DEFAULT now(),
    completed_at         timestamptz
);
