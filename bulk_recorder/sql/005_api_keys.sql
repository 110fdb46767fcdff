-- API keys for the ingest API, and the client each request and job belongs to.
--
-- A key is shown once, when `bulk-recorder api-key create` makes it, and only its SHA-256 is
-- stored: the key carries 256 random bits, so its hash cannot be reversed by guessing, and a fast
-- hash lets every request be checked with one index look-up. A key's name is its client: the
-- keys made under one name (several at once while a client rotates its key) share that client's
-- jobs and Idempotency-Keys. A revoked key is kept, with revoked_at set.
CREATE TABLE IF NOT EXISTS api_keys (
    id         uuid PRIMARY KEY,
    name       text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    key_hash   bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    prefix     text NOT NULL,                -- the key's first characters, to recognise it
    scopes     text[] NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);
CREATE INDEX IF NOT EXISTS api_keys_name_idx ON api_keys (name);

-- The client (api_keys.name) that made each request and job. '' is the anonymous client of
-- API_AUTH=off, and of every row written before this migration (no key name is empty). An
-- Idempotency-Key is unique per client, no longer globally: the same key from two clients is two
-- requests. A transaction id stays unique in the ledger (the primary key), whoever sends it.
ALTER TABLE transaction_requests
    ADD COLUMN IF NOT EXISTS client text NOT NULL DEFAULT '';
ALTER TABLE transaction_requests
    DROP CONSTRAINT IF EXISTS transaction_requests_idempotency_key_key;
CREATE UNIQUE INDEX IF NOT EXISTS transaction_requests_client_key_idx
    ON transaction_requests (client, idempotency_key);

ALTER TABLE credit_annotation_jobs
    ADD COLUMN IF NOT EXISTS client text NOT NULL DEFAULT '';
ALTER TABLE credit_annotation_jobs
    DROP CONSTRAINT IF EXISTS credit_annotation_jobs_idempotency_key_key;
CREATE UNIQUE INDEX IF NOT EXISTS credit_annotation_jobs_client_key_idx
    ON credit_annotation_jobs (client, idempotency_key);
