-- The indexes earn their cost (issue 28, item 3). Two indexes of 001 serve no query this project
-- runs (the recorder, the API, retention, the DLQ tools and the audits read by id, by
-- transaction, by job and by ledger, never by account or by document), and both lead with a
-- random key, so every insert changes a page of its own and, after each checkpoint, writes that
-- whole page to the WAL once more as the table grows: measured at 3M transactions with
-- time-ordered ids, operations_account_idx wrote 5,917 of a transaction's 10,927 WAL bytes, and
-- without it the WAL fell to 4,137 bytes (benchmarks/RESULTS.md, "Growth"). A deployment that
-- reads account statements or documents from this database creates them again, knowing the cost
-- (docs/performance.md, "The indexes and the queries they serve").
DROP INDEX IF EXISTS operations_account_idx;
DROP INDEX IF EXISTS credit_annotations_document_idx;
