-- The outbox under churn (issue 28, item 5): every accepted record is inserted here and deleted
-- once published, so the table turns over its whole content with every job. PostgreSQL's
-- default autovacuum waits for dead rows to reach 20% of the table and then vacuums at a
-- throttled pace (2 ms of sleep every 200 cost units), while the heap grows to hold every row
-- deleted in between. Vacuum the outbox after a fixed number of dead rows, whatever its size, and
-- at full speed: it is a small, hot table, and a vacuum that finishes fast frees its space for
-- the next job (benchmarks/RESULTS.md, "The outbox under churn"). How often autovacuum looks at
-- any table at all is the server's autovacuum_naptime (docs/operations.md).
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_cost_delay = 0
);
