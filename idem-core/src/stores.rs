//! The script and the statements of the network stores, one copy for every language: the
//! JavaScript stores of the npm package read the same files (`idem-core/stores/`) when it is
//! built. And how long a call to one may take.

use crate::record::{Record, RecordState};
use crate::time::UnixMillis;

/// The Redis (or Valkey) compare-and-set of one record, as one Lua script
/// (`IDEM-STORE-1`, `IDEM-STORE-6`, `IDEM-STORE-9`): `KEYS[1]` the record's key, `KEYS[2]` its
/// response's ([`REDIS_RESPONSE_SUFFIX`]); `ARGV` the expected version (empty: no record may
/// exist), the new version (empty: delete), the record's bytes (without its response when
/// it is kept apart), until when it must be kept (ms), and, for a response kept apart
/// ([`response_apart`]), the whole record and when the response expires (ms). Returns 1 when
/// the write was made, 0 otherwise. A record is a hash: `v` its version as decimal text, `r`
/// its bytes. Its first line flags it to run when Redis is at `maxmemory` (Redis 7, Valkey
/// 7.2): send it for a write to a record that exists, and [`redis_apply_new`] for a new
/// record's (`IDEM-STORE-3`).
pub const REDIS_APPLY: &str = include_str!("../stores/redis-apply.lua");

/// [`REDIS_APPLY`] without its flags line, for the write of a new record: Redis at
/// `maxmemory` refuses it, and the store is full (`IDEM-STORE-3`), while writes to the
/// records it holds still go through.
pub fn redis_apply_new() -> &'static str {
    REDIS_APPLY
        .split_once('\n')
        .map_or(REDIS_APPLY, |(_, rest)| rest)
}

/// The read of one record written by [`REDIS_APPLY`], as one Lua script: `KEYS` as there.
/// Returns nil, or the version and the bytes of the record (with its response while that is
/// kept, as its tombstone after).
pub const REDIS_LOAD: &str = include_str!("../stores/redis-load.lua");

/// What the Redis key of a record's response adds to the record's own key (`KEYS[2]` of
/// [`REDIS_APPLY`] and [`REDIS_LOAD`]): the same hash slot, since the record's key ends with
/// its hash tag.
pub const REDIS_RESPONSE_SUFFIX: &str = ":response";

/// How long one call to a network store may take, the wait for a connection included,
/// unless its host says otherwise: a store that stopped answering (a partitioned connection,
/// a hung server) fails the call then, and the request is answered as for any store failure
/// (503 before the handler ran, `IDEM-STORE-4`; the lease left to expire after). The call's
/// write may still be made later; the engine never counts on it either way. Long past a
/// healthy store's answer, short enough that the client is still waiting for the 503.
pub const CALL_TIMEOUT: core::time::Duration = core::time::Duration::from_secs(2);

/// What a Redis store's keys start with unless its host says otherwise.
pub const REDIS_PREFIX: &str = "idem:";

/// The Redis keys of the record with `storage_key` under `prefix`, `KEYS[1]` and `KEYS[2]` of
/// [`REDIS_APPLY`] and [`REDIS_LOAD`]: the record's, `<prefix>{<storage key>}` (the braces
/// are a hash tag, so that the record and its response share a cluster slot), and its
/// response's, that and [`REDIS_RESPONSE_SUFFIX`]. Every store on Redis, in every language,
/// names its keys so, and so shares its records with the others.
pub fn redis_keys(prefix: &str, storage_key: &str) -> [alloc::string::String; 2] {
    let record = alloc::format!("{prefix}{{{storage_key}}}");
    let response = alloc::format!("{record}{REDIS_RESPONSE_SUFFIX}");
    [record, response]
}

/// For a store that drops a response when it expires, apart from its record
/// (`IDEM-STORE-9`): the record as it stands once its response has expired (its tombstone,
/// with the same version, so that a compare-and-set on it still holds), and when the
/// response expires. `None` for a record with no response that expires before the record.
///
/// Between the response's expiry and the next write the store then holds the tombstone where
/// the engine would read the completed record past its response's expiry, and both decide
/// alike: 410 `key-expired`, never a replay, never an execution.
pub fn response_apart(record: &Record) -> Option<(Record, UnixMillis)> {
    match &record.state {
        RecordState::Completed {
            response_expires, ..
        } if *response_expires < record.retained_until() => Some((
            Record {
                state: RecordState::Tombstone,
                ..record.clone()
            },
            *response_expires,
        )),
        _ => None,
    }
}

/// What a store's sweep does with a due record it cannot open (sealed under a key it does not
/// hold, `IDEM-SEAL-3`), from `expires`, until when the record must be kept, which the store
/// keeps in clear beside it: `None` to delete it now (it need no longer be kept, which takes
/// no reading), or when it is due again: then, so that it does not stand in front of the
/// records due behind it. Never expired any other way: what is due in it cannot be read.
pub fn unopened_due(expires: UnixMillis, now: UnixMillis) -> Option<UnixMillis> {
    (expires > now).then_some(expires)
}

/// The Postgres table (`schema`, the migration) and the statements on it (`load`, `insert`,
/// `update`, `delete`, `due`, `defer`), each after a `-- name:` line. See [`postgres_statement`].
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
    fn an_unopened_record_is_deleted_once_it_need_no_longer_be_kept() {
        // IDEM-SEAL-3
        let expires = UnixMillis(10_000);
        assert_eq!(unopened_due(expires, UnixMillis(9_999)), Some(expires));
        assert_eq!(unopened_due(expires, UnixMillis(10_000)), None);
        assert_eq!(unopened_due(expires, UnixMillis(20_000)), None);
    }

    #[test]
    fn every_statement_is_found_by_name() {
        for name in [
            "schema", "load", "insert", "update", "delete", "due", "defer",
        ] {
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
        assert!(REDIS_APPLY.starts_with("#!lua flags=allow-oom\n"));
        assert!(redis_apply_new().starts_with("-- idem:"));
        assert_eq!(redis_apply_new().len(), REDIS_APPLY.len() - 22);
        assert!(REDIS_LOAD.contains("HMGET"));
        let [record, response] = redis_keys(REDIS_PREFIX, "acct#POST#/orders#k");
        assert_eq!(record, "idem:{acct#POST#/orders#k}");
        assert_eq!(response, "idem:{acct#POST#/orders#k}:response");
    }

    #[test]
    fn a_response_is_kept_apart_until_it_expires() {
        // IDEM-STORE-9
        use crate::fingerprint::Fingerprint;
        use crate::response::StoredResponse;
        use alloc::sync::Arc;
        let completed = Record {
            version: 7,
            fence: 1,
            fingerprint: Fingerprint::from_digest([1; 32]),
            created: UnixMillis(1_000),
            key_expires: UnixMillis(9_000),
            state: RecordState::Completed {
                response: Arc::new(StoredResponse {
                    status: 201,
                    headers: alloc::vec![],
                    body: b"secret".to_vec(),
                }),
                response_expires: UnixMillis(5_000),
            },
        };
        let (held, until) = response_apart(&completed).expect("a response kept apart");
        assert_eq!(until, UnixMillis(5_000));
        assert_eq!(held.state, RecordState::Tombstone);
        assert_eq!((held.version, held.key_expires), (7, UnixMillis(9_000)));
        assert!(!crate::encode_record(&held)
            .windows(6)
            .any(|w| w == b"secret"));
        // A response that lives as long as its record, and records without one, stay whole.
        let whole = Record {
            key_expires: UnixMillis(5_000),
            ..completed.clone()
        };
        assert_eq!(response_apart(&whole), None);
        let tomb = Record {
            state: RecordState::Tombstone,
            ..completed
        };
        assert_eq!(response_apart(&tomb), None);
    }
}
