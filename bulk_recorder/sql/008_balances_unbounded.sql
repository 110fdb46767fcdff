-- Balances hold any sum of allowed amounts. numeric(38,18) capped a balance below 10^20, the
-- largest single amount, so the second credit of 60000000000000000000.00 to one account was
-- refused (22003) and its transaction dead-lettered though the contract allows it. numeric
-- without a typmod keeps every digit a sum of 18-decimal amounts has (a sum's scale is its
-- terms' largest, so 18 at most) and holds 131,072 integer digits: past reach. Dropping the
-- typmod is binary-compatible, so PostgreSQL changes the catalog only: no table rewrite, the
-- stored values as they were.
ALTER TABLE balances ALTER COLUMN available TYPE numeric;
