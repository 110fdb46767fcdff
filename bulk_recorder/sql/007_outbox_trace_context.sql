-- The trace context of the request that wrote an outbox row (W3C TraceContext), so that the
-- relay's publish continues that request's trace and puts it in the message's headers. NULL
-- when tracing is off (no OTLP endpoint) or the row was written before this migration: the
-- relay then starts a new trace for it. The api role's INSERT and the relay's SELECT on the
-- table cover the new columns (grants.sql grants them on the whole table).
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS traceparent text;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS tracestate text;
