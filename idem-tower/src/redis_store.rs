//! A store on Redis or Valkey, shared by every process that talks to it.
//!
//! The records and the script are the JavaScript `RedisStore`'s: one hash per record (`v`:
//! its version as decimal text, `r`: idem-core's record encoding) under
//! `<prefix>{<storage key>}`, and every write is idem-core's one Lua compare-and-set script
//! ([`idem_core::stores::REDIS_APPLY`]), which sets the record's time-to-live from its
//! retention (its key's expiry, or a live lease's end), never from its response's expiry.
//! A completed record's response is kept apart, under the record's key and `:response`, and
//! expires with the response: the bytes of a response are gone from Redis when the response
//! retention ends, while the key and its tombstone stay for the key retention
//! (`IDEM-STORE-9`). Reads are one script too ([`idem_core::stores::REDIS_LOAD`]). A Rust
//! service and a JavaScript one can share one Redis.

use crate::seal::{self, Seal, Unreadable};
use idem_core::stores::{redis_keys, response_apart, CALL_TIMEOUT, REDIS_PREFIX};
use idem_core::{
    Applied, AsyncStore, Precondition, Record, RecordKey, StoreFailure, UnixMillis, Write, WriteOp,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// A store on Redis or Valkey through the `redis` crate's tokio connection manager, which
/// reconnects on its own and multiplexes requests over one connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    /// A write to a record that exists: taken when Redis is at `maxmemory`.
    apply: Script,
    /// A new record's: refused then (`IDEM-STORE-3`).
    apply_new: Script,
    load: Script,
    seal: Option<Seal>,
    /// How long one store call may take.
    timeout: Duration,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("seal", &self.seal)
            .finish_non_exhaustive()
    }
}

/// Why a Redis store call failed: Redis itself, or bytes under a record key that cannot be
/// read as a record.
#[derive(Debug)]
pub enum RedisStoreError {
    /// Redis failed (connection, timeout, script error).
    Redis(RedisError),
    /// The bytes stored under the key are not a record, or a sealed one this store cannot
    /// open (`IDEM-SEAL-3`).
    Record(Unreadable),
    /// Redis did not answer the whole call in time ([`RedisStore::with_timeout`]); the write
    /// may or may not have been applied.
    Timeout(Duration),
}

impl fmt::Display for RedisStoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisStoreError::Redis(e) => write!(f, "redis: {e}"),
            RedisStoreError::Record(e) => e.fmt(f),
            RedisStoreError::Timeout(d) => {
                write!(f, "redis did not answer within {} ms", d.as_millis())
            }
        }
    }
}

impl std::error::Error for RedisStoreError {}

impl From<RedisError> for RedisStoreError {
    fn from(e: RedisError) -> Self {
        RedisStoreError::Redis(e)
    }
}

impl RedisStore {
    /// Connects to `url` (`redis://host:port/db`). A call that Redis does not answer within
    /// idem-core's [`CALL_TIMEOUT`] (2 s), and a connection not made within it, fail, and
    /// the request is answered as for any store failure (503 before the handler ran).
    pub async fn connect(url: &str) -> Result<RedisStore, RedisError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(CALL_TIMEOUT))
            .set_connection_timeout(Some(CALL_TIMEOUT));
        Ok(RedisStore::new(
            ConnectionManager::new_with_config(client, config).await?,
        ))
    }

    /// A store on a connection manager you made. Record keys start with `idem:`
    /// ([`REDIS_PREFIX`]).
    pub fn new(conn: ConnectionManager) -> RedisStore {
        RedisStore {
            conn,
            prefix: REDIS_PREFIX.to_owned(),
            apply: Script::new(idem_core::stores::REDIS_APPLY),
            apply_new: Script::new(idem_core::stores::redis_apply_new()),
            load: Script::new(idem_core::stores::REDIS_LOAD),
            seal: None,
            timeout: CALL_TIMEOUT,
        }
    }

    /// How long one store call may take as a whole (default idem-core's [`CALL_TIMEOUT`],
    /// 2 s), whatever the connection's own settings: a script Redis no longer has (after a
    /// restart) is loaded again within it. A call that runs out of time fails with
    /// [`RedisStoreError::Timeout`], which the layer answers with 503 like any store failure
    /// (`IDEM-STORE-10`).
    pub fn with_timeout(mut self, timeout: Duration) -> RedisStore {
        self.timeout = timeout;
        self
    }

    /// Seals every record this store writes with `seal`'s first key and opens records sealed
    /// with any of its keys (`IDEM-SEAL-1`, `IDEM-SEAL-2`): no response is kept in clear in
    /// Redis. Records written in clear before are still read; a record sealed with a key the
    /// seal does not hold is answered 500 `record-sealed` and never executed (`IDEM-SEAL-3`).
    pub fn with_seal(mut self, seal: Seal) -> RedisStore {
        self.seal = Some(seal);
        self
    }

    /// The connection the store talks to Redis on: a clone of the store's, for the
    /// service's own commands on the same connection.
    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// What every record key starts with (default `idem:`).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> RedisStore {
        self.prefix = prefix.into();
        self
    }

    /// The Redis keys of a record and of its response, kept apart while it lasts
    /// (idem-core's [`redis_keys`]: `<prefix>{<storage key>}` and that with `:response`, one
    /// hash slot).
    pub fn redis_keys(&self, key: &RecordKey) -> [String; 2] {
        redis_keys(&self.prefix, &key.storage_key())
    }
}

impl AsyncStore for RedisStore {
    type Error = RedisStoreError;

    fn failure(error: &RedisStoreError) -> StoreFailure {
        match error {
            RedisStoreError::Record(e) if e.is_sealed() => StoreFailure::Sealed,
            // At `maxmemory` under `noeviction`, Redis refuses writes: full, not gone
            // (`IDEM-STORE-3`).
            RedisStoreError::Redis(e) if e.code() == Some("OOM") => StoreFailure::Full,
            _ => StoreFailure::Unavailable,
        }
    }

    fn load(
        &self,
        key: &RecordKey,
    ) -> impl Future<Output = Result<Option<Record>, RedisStoreError>> + Send {
        let mut conn = self.conn.clone();
        let storage_key = key.storage_key();
        let [record, response] = redis_keys(&self.prefix, &storage_key);
        let mut invocation = self.load.key(record);
        invocation.key(response);
        let seal = self.seal.clone();
        let limit = self.timeout;
        async move {
            let found: Option<(Vec<u8>, Vec<u8>)> =
                timed(limit, invocation.invoke_async(&mut conn)).await?;
            found
                .map(|(_, bytes)| {
                    seal::decode(seal.as_ref(), &storage_key, &bytes)
                        .map_err(RedisStoreError::Record)
                })
                .transpose()
        }
    }

    fn apply(
        &self,
        _now: UnixMillis,
        write: Write,
    ) -> impl Future<Output = Result<Applied, RedisStoreError>> + Send {
        let mut conn = self.conn.clone();
        let storage_key = write.key.storage_key();
        let [record, response] = redis_keys(&self.prefix, &storage_key);
        let encode = |r: &Record| seal::encode(self.seal.as_ref(), &storage_key, r);
        let script = match write.precondition {
            Precondition::Absent => &self.apply_new,
            Precondition::Version(_) => &self.apply,
        };
        let mut invocation = script.key(record);
        invocation.key(response);
        match write.precondition {
            Precondition::Absent => invocation.arg(""),
            Precondition::Version(v) => invocation.arg(v.to_string()),
        };
        match &write.op {
            WriteOp::Put(record) => {
                let whole = encode(record);
                invocation.arg(record.version.to_string());
                match response_apart(record) {
                    // The record as it stands once its response expires is kept for the
                    // key's retention; the whole record expires with the response.
                    Some((held, until)) => invocation
                        .arg(encode(&held))
                        .arg(record.retained_until().0)
                        .arg(whole)
                        .arg(until.0),
                    None => invocation
                        .arg(whole)
                        .arg(record.retained_until().0)
                        .arg("")
                        .arg(0),
                };
            }
            WriteOp::Delete => {
                invocation.arg("").arg("").arg(0).arg("").arg(0);
            }
        };
        let limit = self.timeout;
        async move {
            let done: i64 = timed(limit, invocation.invoke_async(&mut conn)).await?;
            Ok(if done == 1 {
                Applied::Applied
            } else {
                Applied::Conflict
            })
        }
    }
}

/// `call` (a script's whole invocation: `EVALSHA`, and `SCRIPT LOAD` and `EVALSHA` again when
/// Redis lost the script), given at most `limit` to answer.
async fn timed<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisStoreError> {
    match tokio::time::timeout(limit, call).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(RedisStoreError::Timeout(limit)),
    }
}
