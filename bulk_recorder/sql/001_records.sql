-- Records written by the recorder. Amounts are exact: numeric(38,18), never floats.
CREATE TABLE IF NOT EXISTS transactions (
    id              uuid PRIMARY KEY,
    organization_id uuid NOT NULL,
    ledger_id       uuid NOT NULL,
    description     text,
    status          text NOT NULL CHECK (status IN ('PENDING', 'APPROVED', 'CANCELED')),
    asset_code      text NOT NULL,
    amount          numeric(38, 18) NOT NULL CHECK (amount > 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    metadata        jsonb,
    recorded_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS transactions_ledger_created_idx
    ON transactions (organization_id, ledger_id, created_at);

-- Double-entry legs. Inserted only for transactions that are new in the same DB transaction, so
-- an operation id that already belongs to another transaction is a real conflict (poison row).
CREATE TABLE IF NOT EXISTS operations (
    id             uuid PRIMARY KEY,
    transaction_id uuid NOT NULL REFERENCES transactions (id),
    account_id     uuid NOT NULL,
    type           text NOT NULL CHECK (type IN ('DEBIT', 'CREDIT')),
    amount         numeric(38, 18) NOT NULL CHECK (amount > 0),
    asset_code     text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS operations_transaction_idx ON operations (transaction_id);
CREATE INDEX IF NOT EXISTS operations_account_idx ON operations (account_id, created_at);

CREATE TABLE IF NOT EXISTS credit_annotations (
    id            uuid PRIMARY KEY,
    job_id        uuid,
    document      text NOT NULL,
    document_type text NOT NULL CHECK (document_type IN ('CPF', 'CNPJ')),
    kind          text NOT NULL CHECK (kind IN ('RESTRICTION', 'RELEASE')),
    creditor      text NOT NULL,
    amount        numeric(38, 18) NOT NULL CHECK (amount >= 0),
    occurred_on   date NOT NULL,
    reason        text,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS credit_annotations_document_idx ON credit_annotations (document);
CREATE INDEX IF NOT EXISTS credit_annotations_job_idx
    ON credit_annotations (job_id) WHERE job_id IS NOT NULL;

-- Effects: available balance per account and asset, moved only by APPROVED transactions that
-- the insert reports as new, in the same DB transaction (exactly-once effect).
CREATE TABLE IF NOT EXISTS balances (
    account_id uuid NOT NULL,
    asset_code text NOT NULL,
    available  numeric(38, 18) NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, asset_code)
);
