//! Derived keys (`IDEM-DERIVE-1` to `IDEM-DERIVE-3`): keys computed instead of chosen.
//!
//! * [`derive_key`] gives a key to a request whose client sent none: the hash of the scope,
//!   an operation name and the request's [`Fingerprint`]. Build the fingerprint with the
//!   endpoint's [`FingerprintSpec`](crate::FingerprintSpec), whose excluded fields remove the
//!   volatile parts (timestamps, nonces) so that an honest retry derives the same key. Two
//!   requests with the same payload in the same scope and operation are then one request:
//!   use it only where that is the intended meaning (a "set" rather than an "add").
//! * [`sub_key`] gives a handler the key for each downstream call it makes: a function of its
//!   own key and a step name. A handler that runs again after a crash (a takeover with
//!   `recovered: true`) sends the same sub-keys, so the downstream services replay instead of
//!   running twice, and no handler reuses its own key or invents a random one.
//!
//! Both are deterministic, at most [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) characters, and use
//! only `A-Z a-z 0-9 - _ .`, so they are valid as an sf-string and as a bare key.

use crate::fingerprint::Fingerprint;
use crate::key::Scope;
use crate::kind::push_hex;
use alloc::string::String;
use core::fmt;
use sha2::{Digest, Sha256};

/// Every derived key starts with this.
pub const DERIVED_PREFIX: &str = "drv_";
/// At most this many characters of the step name appear in clear in a sub-key.
pub const SUB_KEY_LABEL_LEN: usize = 32;

/// Why a sub-key cannot be derived.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeriveError {
    /// The parent key is empty.
    EmptyParent,
    /// The step name is empty.
    EmptyStep,
}

impl fmt::Display for DeriveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeriveError::EmptyParent => f.write_str("a sub-key needs a non-empty parent key"),
            DeriveError::EmptyStep => f.write_str("a sub-key needs a non-empty step name"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for DeriveError {}

fn put(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The key of a request that came without one: `drv_` and 64 hex digits of SHA-256 over
/// the scope, the operation and the fingerprint's digest, each length-prefixed
/// (`IDEM-DERIVE-1`). The same inputs always give the same key; a change in any of them
/// gives another.
pub fn derive_key(scope: &Scope, operation: &str, fingerprint: &Fingerprint) -> String {
    let mut h = Sha256::new();
    h.update(b"idem-derived-v1");
    put(&mut h, scope.as_str().as_bytes());
    put(&mut h, operation.as_bytes());
    h.update(fingerprint.digest);
    let mut key = String::with_capacity(DERIVED_PREFIX.len() + 64);
    key.push_str(DERIVED_PREFIX);
    push_hex(&mut key, &h.finalize());
    key
}

/// The key for the downstream call `step` made by the handler of `parent`
/// (`IDEM-DERIVE-2`): the step name with every character outside `A-Z a-z 0-9 - _` replaced
/// by `_` and cut to [`SUB_KEY_LABEL_LEN`] characters (for people reading logs), then `.`,
/// then 64 hex digits of SHA-256 over the length-prefixed parent and step. The label only
/// helps reading: the hash alone tells pairs apart, so two different (parent, step) pairs
/// give two different keys. At most 97 characters.
pub fn sub_key(parent: &str, step: &str) -> Result<String, DeriveError> {
    if parent.is_empty() {
        return Err(DeriveError::EmptyParent);
    }
    if step.is_empty() {
        return Err(DeriveError::EmptyStep);
    }
    let mut h = Sha256::new();
    h.update(b"idem-subkey-v1");
    put(&mut h, parent.as_bytes());
    put(&mut h, step.as_bytes());
    let mut key = String::with_capacity(SUB_KEY_LABEL_LEN + 65);
    key.extend(step.chars().take(SUB_KEY_LABEL_LEN).map(|c| {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            c
        } else {
            '_'
        }
    }));
    key.push('.');
    push_hex(&mut key, &h.finalize());
    Ok(key)
}
