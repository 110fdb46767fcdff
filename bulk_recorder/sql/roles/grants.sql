-- Least privilege for bulk-recorder: one NOLOGIN role per service, holding only what it needs.
--
-- Run by the schema's owner (the role that runs `bulk-recorder migrate`), after the migrations,
-- in the application's database. `bulk-recorder migrate --grant-roles PREFIX` runs it; by hand:
--
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 \
--        -c "SET bulk_recorder.role_prefix = 'myapp'" -f grants.sql
--
-- It creates the roles PREFIX_recorder, PREFIX_relay and PREFIX_api (NOLOGIN) when they do not
-- exist (creating them needs CREATEROLE; else a DBA creates them first), then sets their
-- privileges afresh: whatever they held on the schema's tables is revoked first, so a run after
-- a new migration leaves exactly what is below. Log in as your own LOGIN roles, each granted one
-- of these: `GRANT myapp_recorder TO recorder_login;`.
--
-- None of them may run DDL: no CREATE on the schema, no ownership, no TRUNCATE, no other schema.
-- TEMPORARY stays with PUBLIC's default: the API stages job uploads in a temporary table.
-- In sync mode (RABBITMQ_TRANSACTION_ASYNC=false) the API writes the records itself: grant its
-- login role PREFIX_recorder as well.
DO $grants$
DECLARE
    prefix   text := current_setting('bulk_recorder.role_prefix');
    recorder text := prefix || '_recorder';
    relay    text := prefix || '_relay';
    api      text := prefix || '_api';
    app      text;
    member   text;
BEGIN
    SELECT c.relnamespace::regnamespace::text INTO app
    FROM pg_class AS c WHERE c.oid = to_regclass('schema_migrations');
    IF app IS NULL THEN
        RAISE EXCEPTION 'schema_migrations not found: run bulk-recorder migrate first';
    END IF;
    -- the application's schema is for its owner to change (PostgreSQL 15 revokes this by
    -- default for public; a database made by an older version may still grant it)
    EXECUTE format('REVOKE CREATE ON SCHEMA %s FROM PUBLIC', app);

    FOREACH member IN ARRAY ARRAY[recorder, relay, api] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = member) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', member);
        END IF;
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %s FROM %I', app, member);
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA %s FROM %I', app, member);
        EXECUTE format('REVOKE CREATE ON SCHEMA %s FROM %I', app, member);
        EXECUTE format('GRANT USAGE ON SCHEMA %s TO %I', app, member);
        -- every service migrates at start-up: it reads what is applied (and changes nothing)
        EXECUTE format('GRANT SELECT ON %s.schema_migrations TO %I', app, member);
    END LOOP;

    -- recorder: insert records (ON CONFLICT ... RETURNING id reads the ids), move balances
    EXECUTE format('GRANT SELECT, INSERT ON %1$s.transactions, %1$s.credit_annotations TO %2$I',
                   app, recorder);
    EXECUTE format('GRANT INSERT ON %1$s.operations, %1$s.credit_annotation_job_repeats TO %2$I',
                   app, recorder);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE (available, updated_at) ON %s.balances TO %I',
                   app, recorder);

    -- relay: claim (FOR UPDATE), delete what the broker confirmed, mark what it refused,
    -- and count a job's published and parked rows, with the time of its last publish (and of
    -- its last publish of any row)
    EXECUTE format('GRANT SELECT, DELETE, UPDATE (attempts, last_error, available_at, parked_at)'
                   ' ON %s.outbox TO %I', app, relay);
    EXECUTE format('GRANT SELECT, UPDATE (published, dead_lettered, last_published_at)'
                   ' ON %s.credit_annotation_jobs TO %I', app, relay);
    EXECUTE format('GRANT SELECT, UPDATE (last_published_at) ON %s.outbox_relay_activity TO %I',
                   app, relay);

    -- api: requests and jobs with their outbox rows; a job's progress reads the records
    EXECUTE format('GRANT SELECT, INSERT ON %1$s.transaction_requests, %1$s.outbox TO %2$I',
                   app, api);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE (recorded, completed_at)'
                   ' ON %s.credit_annotation_jobs TO %I', app, api);
    EXECUTE format('GRANT SELECT ON %1$s.credit_annotations, %1$s.credit_annotation_job_repeats,'
                   ' %1$s.outbox_relay_activity TO %2$I', app, api);
    -- api: check each request's key (the keys are made and revoked by the owner's CLI)
    EXECUTE format('GRANT SELECT ON %s.api_keys TO %I', app, api);
END
$grants$;
