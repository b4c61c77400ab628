//! The script and the statements of the network stores, one copy for every language: the
//! JavaScript stores of the npm package read the same files (`idem-core/stores/`) when it is
//! built.

/// The Redis (or Valkey) compare-and-set of one record, as one Lua script
/// (`IDEM-STORE-1`, `IDEM-STORE-6`): `KEYS[1]` the record's key; `ARGV` the expected version
/// (empty: no record may exist), the new version (empty: delete), the record's bytes, and
/// until when it must be kept (ms). Returns 1 when the write was made, 0 otherwise. A record
/// is a hash: `v` its version as decimal text, `r` its bytes.
pub const REDIS_APPLY: &str = include_str!("../stores/redis-apply.lua");

/// The Postgres table (`schema`, the migration) and the statements on it (`load`, `insert`,
/// `update`, `delete`, `due`), each after a `-- name:` line. See [`postgres_statement`].
pub const POSTGRES_SQL: &str = include_str!("../stores/postgres.sql");

/// The statement of [`POSTGRES_SQL`] named `name` (its text up to the next `-- name:` line,
/// SQL comments included), or `None`.
pub fn postgres_statement(name: &str) -> Option<&'static str> {
    let mut rest = POSTGRES_SQL;
    while let Some(at) = rest.find("-- name: ") {
        let after = &rest[at + "-- name: ".len()..];
        let line_end = after.find('\n').unwrap_or(after.len());
        let body = &after[line_end..];
        let end = body.find("-- name: ").unwrap_or(body.len());
        if after[..line_end].trim() == name {
            return Some(body[..end].trim());
        }
        rest = body;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_is_found_by_name() {
        for name in ["schema", "load", "insert", "update", "delete", "due"] {
            let s = postgres_statement(name).unwrap_or_else(|| panic!("no {name}"));
            assert!(!s.contains("-- name:"), "{name}: {s}");
        }
        assert!(postgres_statement("schema")
            .unwrap()
            .contains("CREATE TABLE IF NOT EXISTS idem_records"));
        assert!(postgres_statement("insert")
            .unwrap()
            .contains("ON CONFLICT (key) DO NOTHING"));
        assert_eq!(postgres_statement("nothing"), None);
        assert!(REDIS_APPLY.contains("PEXPIREAT"));
    }
}
