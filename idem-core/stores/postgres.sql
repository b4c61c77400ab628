-- idem: the Postgres store's table and queries (IDEM-STORE-1), read by the JavaScript
-- PostgresStore and by the Rust one; this file is the only copy. Each statement follows a
-- `-- name:` line. `schema` is the migration: run it once (the stores run it when asked),
-- it is safe to run again.
--
-- A record is one row: its storage key, its version (a u64 as decimal text, compared for
-- equality only), its bytes, `deadline`, when it next changes on its own (a response
-- expiring, a key expiring), and `expires`, until when it must be kept. Times are ms since
-- the epoch.

-- name: schema
CREATE TABLE IF NOT EXISTS idem_records (
  key      text   PRIMARY KEY,
  version  text   NOT NULL,
  value    bytea  NOT NULL,
  deadline bigint NOT NULL,
  expires  bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS idem_records_deadline ON idem_records (deadline);

-- name: load
SELECT version, value FROM idem_records WHERE key = $1;

-- name: insert
-- A claim of a key with no record: the primary key makes it one atomic step.
INSERT INTO idem_records (key, version, value, deadline, expires)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (key) DO NOTHING;

-- name: update
-- Any other write: only when the row still has the version the engine read.
UPDATE idem_records SET version = $3, value = $4, deadline = $5, expires = $6
WHERE key = $1 AND version = $2;

-- name: delete
DELETE FROM idem_records WHERE key = $1 AND version = $2;

-- name: due
-- The sweep: the records whose deadline has come, oldest first, through the deadline
-- index. Each is then expired by the engine (its response dropped, or the row deleted once
-- its key and any live lease have ended) with `update` or `delete`.
SELECT key, version, value, expires FROM idem_records WHERE deadline <= $1 ORDER BY deadline LIMIT $2;

-- name: defer
-- A due record the sweep cannot read (sealed under a key it does not hold): due again at $3,
-- the time idem-core's `stores::unopened_due` gives (when it need no longer be kept, and is
-- deleted without being read), out of the way of the records due behind it until then.
UPDATE idem_records SET deadline = $3 WHERE key = $1 AND version = $2 AND deadline < $3;
