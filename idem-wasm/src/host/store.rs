//! The in-process store ([`MemoryStore`]) behind the generic store interface JavaScript
//! stores have (storage keys, versions as text, encoded records), and the expiry of a stored
//! record for the stores that sweep themselves.

use crate::interop::{self, ErrorParts, StoreWrite};
use alloc::string::String;
use alloc::vec::Vec;
use idem_core::{
    Applied, MemoryStore, Precondition, RecordKey, Scope, Store, UnixMillis, Write, WriteOp,
};

/// The write bytes that apply the passage of time to a stored record at `now` (drop an
/// expired response, delete an expired key), or `None` when nothing is due
/// (`IDEM-TTL-4`). `IDEM-REC-1` for bytes that are not a record.
pub fn expire(now: UnixMillis, value: &[u8]) -> Result<Option<StoreWrite>, ErrorParts> {
    let record = idem_core::decode_record(value).map_err(|e| ErrorParts::record(&e))?;
    // The write's key is not used by JS stores (they key by storage key), and expiry needs
    // no configuration.
    let key = RecordKey::new(Scope::custom(String::new()), String::new());
    Ok(idem_core::Engine::default()
        .expire(now, &key, &record)
        .map(|w| StoreWrite::from_core(&w)))
}

/// What [`store_apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreApplied {
    /// The precondition failed; nothing changed.
    Conflict = 0,
    /// The write was made.
    Applied = 1,
    /// A new record was refused: the store is full (`IDEM-STORE-3`).
    Full = 2,
}

fn not_a_storage_key() -> ErrorParts {
    ErrorParts::options("MemoryStore keys are the engine's storage keys")
}

/// The record under a storage key, encoded, with its version: the generic store interface
/// of the in-process store.
pub fn store_load(store: &MemoryStore, key: &str) -> Option<(u64, Vec<u8>)> {
    let key = interop::parse_storage_key(key)?;
    store
        .get(&key)
        .map(|r| (r.version, idem_core::encode_record(r)))
}

/// Applies a compare-and-set write given as the generic store interface passes it (the
/// version travels inside the encoded record). `IDEM-JS-1` for a key that is not a storage
/// key or a version that is not a number, `IDEM-REC-1` for bytes that are not a record.
pub fn store_apply(
    store: &mut MemoryStore,
    now: UnixMillis,
    key: &str,
    expect: Option<&str>,
    value: Option<&[u8]>,
) -> Result<StoreApplied, ErrorParts> {
    let key = interop::parse_storage_key(key).ok_or_else(not_a_storage_key)?;
    let precondition = match expect {
        None => Precondition::Absent,
        Some(v) => Precondition::Version(v.parse().map_err(|_| not_a_storage_key())?),
    };
    let op = match value {
        Some(bytes) => {
            WriteOp::Put(idem_core::decode_record(bytes).map_err(|e| ErrorParts::record(&e))?)
        }
        None => WriteOp::Delete,
    };
    Ok(
        match store.apply(
            now,
            Write {
                key,
                precondition,
                op,
            },
        ) {
            Ok(Applied::Applied) => StoreApplied::Applied,
            Ok(Applied::Conflict) => StoreApplied::Conflict,
            Err(_) => StoreApplied::Full,
        },
    )
}
