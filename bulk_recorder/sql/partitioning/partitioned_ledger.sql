-- Ledger tables partitioned by time (issue 28): a deployment's choice, not a migration.
--
-- Applied once, by the schema's owner, on a freshly migrated database whose ledger tables are
-- still EMPTY (`bulk-recorder partitions --apply` runs it; by hand:
-- psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f partitioned_ledger.sql). It replaces
-- `transactions`, `operations` and `credit_annotations` with tables of the same columns,
-- constraints, indexes and foreign key, partitioned BY RANGE (id). Run it again and it changes
-- nothing; run it on a ledger table that holds rows and it refuses (SQLSTATE 55000), touching
-- nothing. The privileges granted on the three tables are granted again on the new ones.
--
-- Why a range of ids is a range of time: a UUIDv7 (RFC 9562) starts with its 48-bit Unix
-- millisecond timestamp, and PostgreSQL orders uuids byte by byte, so every v7 id made in
-- [t1, t2) lies in [bulk_recorder_uuid_bound(t1), bulk_recorder_uuid_bound(t2)). The primary key
-- stays (id): it includes the partition key, so `ON CONFLICT (id) DO NOTHING` still works.
--
-- There is no DEFAULT partition, on purpose: an id that no partition covers (a v4 id, whose 48
-- "timestamp" bits are random, or a v7 id older than the first partition or further ahead than
-- the last) is refused with SQLSTATE 23514, and the recorder dead-letters that record alone.
-- A default partition holding rows would block creating any partition whose range they overlap.
-- See docs/operations.md, "Partitioned ledger tables".

-- The smallest uuid of the millisecond `at` falls in: its 48-bit Unix ms, every other bit 0.
CREATE OR REPLACE FUNCTION bulk_recorder_uuid_bound(at timestamptz) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (
    WITH h AS (
        SELECT lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0') AS ms
    )
    SELECT (substr(ms, 1, 8) || '-' || substr(ms, 9, 4) || '-0000-0000-000000000000')::uuid
    FROM h
);

-- The time a bound stands for (the inverse of bulk_recorder_uuid_bound, to the millisecond).
CREATE OR REPLACE FUNCTION bulk_recorder_uuid_time(id uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN to_timestamp(
    ('x' || lpad(substr(replace(id::text, '-', ''), 1, 12), 16, '0'))::bit(64)::bigint / 1000.0
);

-- The [lower, upper) bounds of the range partitions of `parent` (NULL: MINVALUE/MAXVALUE).
CREATE OR REPLACE FUNCTION bulk_recorder_partitions(parent regclass)
RETURNS TABLE (partition regclass, lower uuid, upper uuid)
LANGUAGE sql STABLE
AS $$
    SELECT c.oid::regclass,
           (regexp_match(b.bound, 'FROM \(''([0-9a-f-]{36})''\)'))[1]::uuid,
           (regexp_match(b.bound, 'TO \(''([0-9a-f-]{36})''\)'))[1]::uuid
    FROM pg_inherits AS i
    JOIN pg_class AS c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) AS b
    WHERE i.inhparent = parent AND b.bound <> 'DEFAULT'
$$;

-- Create the partitions of the three ledger tables covering [from_at, to_at), one per `span`
-- ('day', 'week' or 'month', UTC; a week starts on Monday), and return the names it created.
-- Idempotent and gap-free: a period, or the part of it, that existing partitions already cover
-- is skipped, so it may run as often as wanted (and with another span after a change).
CREATE OR REPLACE FUNCTION bulk_recorder_create_partitions(
    from_at timestamptz, to_at timestamptz, span text
) RETURNS SETOF text
LANGUAGE plpgsql
AS $$
DECLARE
    parent  text;
    step    interval;
    start   timestamp;
    lo      uuid;
    hi      uuid;
    period_end uuid;
    covered uuid;
    name    text;
BEGIN
    IF span NOT IN ('day', 'week', 'month') THEN
        RAISE EXCEPTION 'span must be day, week or month, not %', span
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    step := ('1 ' || span)::interval;
    FOREACH parent IN ARRAY ARRAY['transactions', 'operations', 'credit_annotations'] LOOP
        start := date_trunc(span, from_at AT TIME ZONE 'UTC');
        WHILE start AT TIME ZONE 'UTC' < to_at LOOP
            lo := bulk_recorder_uuid_bound(start AT TIME ZONE 'UTC');
            period_end := bulk_recorder_uuid_bound((start + step) AT TIME ZONE 'UTC');
            start := start + step;
            WHILE lo < period_end LOOP
                -- a partition covers lo: go on from its upper bound
                SELECT p.upper INTO covered FROM bulk_recorder_partitions(parent::regclass) AS p
                WHERE (p.lower IS NULL OR p.lower <= lo) AND (p.upper IS NULL OR p.upper > lo);
                IF FOUND THEN
                    EXIT WHEN covered IS NULL;  -- up to MAXVALUE
                    lo := covered;
                    CONTINUE;
                END IF;
                -- else a partition from lo up to the period's end or the next partition
                SELECT coalesce((SELECT p.lower
                                 FROM bulk_recorder_partitions(parent::regclass) AS p
                                 WHERE p.lower > lo AND p.lower < period_end
                                 ORDER BY p.lower LIMIT 1), period_end)
                INTO hi;
                name := parent || '_p' || to_char(bulk_recorder_uuid_time(lo) AT TIME ZONE 'UTC',
                                                  'YYYYMMDD');
                IF bulk_recorder_uuid_time(lo) <> date_trunc('day', bulk_recorder_uuid_time(lo)
                                                             AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                THEN
                    name := name || to_char(bulk_recorder_uuid_time(lo) AT TIME ZONE 'UTC',
                                            '"_"HH24MISSMS');
                END IF;
                EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                               name, parent, lo, hi);
                RETURN NEXT name;
                lo := hi;
            END LOOP;
        END LOOP;
    END LOOP;
END
$$;

-- Replace the three ledger tables with partitioned ones, once, while they are empty.
DO $partition$
DECLARE
    ledger   text;
    ledgers  oid[];
    has_rows boolean;
    item     record;
    rebuild  text[] := '{}';
BEGIN
    IF (SELECT count(*) FROM pg_partitioned_table AS p
        WHERE p.partrelid IN (to_regclass('transactions'), to_regclass('operations'),
                              to_regclass('credit_annotations'))) = 3 THEN
        RETURN;  -- applied before
    END IF;
    IF to_regclass('transactions') IS NULL OR to_regclass('operations') IS NULL
       OR to_regclass('credit_annotations') IS NULL THEN
        RAISE EXCEPTION 'the ledger tables are missing: run bulk-recorder migrate first'
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    ledgers := ARRAY['transactions'::regclass, 'operations'::regclass,
                     'credit_annotations'::regclass]::oid[];
    FOREACH ledger IN ARRAY ARRAY['operations', 'transactions', 'credit_annotations'] LOOP
        -- locked first, so that no insert lands between the check and the drop
        EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE', ledger);
        EXECUTE format('SELECT EXISTS (SELECT FROM %I)', ledger) INTO STRICT has_rows;
        IF has_rows THEN
            RAISE EXCEPTION '% holds rows: the ledger tables can be partitioned only while '
                            'they are empty (this never moves or deletes a ledger row)', ledger
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
    END LOOP;
    -- What the migrations made of the tables, read from the catalog so that a later migration's
    -- change carries over: keys and indexes, then foreign keys, then the privileges granted.
    FOR item IN
        SELECT 1 AS step, pg_get_indexdef(i.indexrelid) AS ddl
        FROM pg_index AS i
        WHERE i.indrelid = ANY(ledgers)
          AND NOT EXISTS (SELECT FROM pg_constraint AS c WHERE c.conindid = i.indexrelid
                                                           AND c.conrelid = i.indrelid)
        UNION ALL
        SELECT CASE c.contype WHEN 'f' THEN 2 ELSE 1 END,
               format('ALTER TABLE %s ADD CONSTRAINT %I %s', c.conrelid::regclass, c.conname,
                      pg_get_constraintdef(c.oid))
        FROM pg_constraint AS c
        WHERE c.conrelid = ANY(ledgers) AND c.contype IN ('p', 'u', 'f', 'x')
        UNION ALL
        SELECT 3, format('GRANT %s ON %s TO %s', a.privilege_type, c.oid::regclass,
                         a.grantee::regrole)
        FROM pg_class AS c CROSS JOIN LATERAL aclexplode(c.relacl) AS a
        WHERE c.oid = ANY(ledgers) AND a.grantee <> c.relowner AND a.grantee <> 0
        ORDER BY 1, 2
    LOOP
        rebuild := rebuild || item.ddl;
    END LOOP;
    -- The same columns (types, defaults, NOT NULL), CHECK constraints (same names), storage
    -- and comments, partitioned by id; then the old tables go and the new take their names.
    FOREACH ledger IN ARRAY ARRAY['transactions', 'operations', 'credit_annotations'] LOOP
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS'
                       ' INCLUDING GENERATED INCLUDING IDENTITY INCLUDING STORAGE'
                       ' INCLUDING COMPRESSION INCLUDING COMMENTS) PARTITION BY RANGE (id)',
                       ledger || '_partitioned', ledger);
    END LOOP;
    DROP TABLE operations, transactions, credit_annotations;
    FOREACH ledger IN ARRAY ARRAY['transactions', 'operations', 'credit_annotations'] LOOP
        EXECUTE format('ALTER TABLE %I RENAME TO %I', ledger || '_partitioned', ledger);
    END LOOP;
    FOREACH ledger IN ARRAY rebuild LOOP
        EXECUTE ledger;
    END LOOP;
END
$partition$;

-- The span `bulk-recorder partitions` makes new partitions with (set by its --span).
CREATE TABLE IF NOT EXISTS ledger_partitioning (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    span     text NOT NULL DEFAULT 'week' CHECK (span IN ('day', 'week', 'month'))
);
INSERT INTO ledger_partitioning (only_row) VALUES (true) ON CONFLICT DO NOTHING;
