//! The sealed form of a record, for a store whose records leave the process
//! (`IDEM-SEAL-1`): the record's bytes ([`encode_record`](crate::encode_record)) encrypted
//! with AES-256-GCM under a named key, with the record's storage key authenticated beside
//! them, so that a sealed record copied under another key is refused, not replayed.
//!
//! This module holds the format, one copy for every language; the cipher is the host's (a
//! RustCrypto crate in Rust, WebCrypto in JavaScript), so that no cipher goes into the
//! engine or the WebAssembly module.
//!
//! ```text
//! sealed  = "iS" 0x01 id_len:u8 key_id  nonce:12  ciphertext‖tag:16
//!           └────── head ──────────────┘
//! aad     = head ‖ storage key (UTF-8)
//! plaintext = the record's encoding ("iR" …)
//! ```
//!
//! The head is authenticated too: a key id changed in place makes the record unreadable,
//! never readable under another key. A nonce is 12 random bytes per record written; one key
//! seals at most 2³² records before it is rotated (NIST SP 800-38D's bound for random
//! nonces), and rotation is a list of keys: the first seals, any opens (`IDEM-SEAL-2`).

use alloc::vec::Vec;
use core::fmt;

/// What a sealed record starts with. A record's encoding starts with `iR`, so the two never
/// mistake each other.
pub const SEAL_MAGIC: &[u8; 2] = b"iS";
/// The format version written after [`SEAL_MAGIC`].
pub const SEAL_FORMAT_VERSION: u8 = 1;
/// Bytes of an AES-256 key.
pub const KEY_LEN: usize = 32;
/// Bytes of a GCM nonce.
pub const NONCE_LEN: usize = 12;
/// Bytes of a GCM tag, at the end of the ciphertext.
pub const TAG_LEN: usize = 16;
/// The longest key id.
pub const MAX_KEY_ID_LEN: usize = 64;

/// Why a key id or a sealed record cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SealError {
    /// A key id is empty, longer than [`MAX_KEY_ID_LEN`], or not visible ASCII.
    KeyId,
    /// A key is not [`KEY_LEN`] bytes.
    KeyLength(usize),
    /// Two keys have the same id.
    DuplicateKeyId,
    /// No key was given.
    NoKey,
    /// The bytes start as a sealed record but end early or carry a version this build
    /// cannot read.
    Malformed,
}

impl fmt::Display for SealError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SealError::KeyId => write!(
                f,
                "a seal key id is 1 to {MAX_KEY_ID_LEN} visible ASCII characters"
            ),
            SealError::KeyLength(n) => {
                write!(f, "a seal key is {KEY_LEN} bytes (AES-256), not {n}")
            }
            SealError::DuplicateKeyId => f.write_str("two seal keys have the same id"),
            SealError::NoKey => f.write_str("sealing needs at least one key"),
            SealError::Malformed => f.write_str("a sealed record is malformed"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for SealError {}

/// Checks a key id: 1 to [`MAX_KEY_ID_LEN`] visible ASCII characters.
pub fn check_key_id(id: &str) -> Result<(), SealError> {
    if id.is_empty() || id.len() > MAX_KEY_ID_LEN || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(SealError::KeyId);
    }
    Ok(())
}

/// Checks a list of keys as a host is given them for rotation (`IDEM-SEAL-2`): at least
/// one, every id valid and distinct, every key [`KEY_LEN`] bytes. The first seals.
pub fn check_keys<'a>(keys: impl IntoIterator<Item = (&'a str, usize)>) -> Result<(), SealError> {
    let mut seen: Vec<&str> = Vec::new();
    for (id, len) in keys {
        check_key_id(id)?;
        if len != KEY_LEN {
            return Err(SealError::KeyLength(len));
        }
        if seen.contains(&id) {
            return Err(SealError::DuplicateKeyId);
        }
        seen.push(id);
    }
    if seen.is_empty() {
        return Err(SealError::NoKey);
    }
    Ok(())
}

/// The start of a record sealed under `key_id`: magic, version, the id.
pub fn head(key_id: &str) -> Result<Vec<u8>, SealError> {
    check_key_id(key_id)?;
    let mut out = Vec::with_capacity(4 + key_id.len());
    out.extend_from_slice(SEAL_MAGIC);
    out.push(SEAL_FORMAT_VERSION);
    // At most MAX_KEY_ID_LEN (64) bytes: it fits.
    out.push(key_id.len() as u8);
    out.extend_from_slice(key_id.as_bytes());
    Ok(out)
}

/// The data authenticated with a record sealed with `head` under `storage_key`.
pub fn aad(head: &[u8], storage_key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + storage_key.len());
    out.extend_from_slice(head);
    out.extend_from_slice(storage_key.as_bytes());
    out
}

/// A sealed record: `head`, the nonce, and the ciphertext with its tag, as the cipher gave it.
pub fn frame(head: &[u8], nonce: &[u8; NONCE_LEN], ciphertext: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(head.len() + NONCE_LEN + ciphertext.len());
    out.extend_from_slice(head);
    out.extend_from_slice(nonce);
    out.extend_from_slice(ciphertext);
    out
}

/// Whether `bytes` are a sealed record (they start with [`SEAL_MAGIC`]); a record's own
/// encoding never does.
pub fn is_sealed(bytes: &[u8]) -> bool {
    bytes.starts_with(SEAL_MAGIC)
}

/// A sealed record taken apart, to be opened with the key its id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sealed<'a> {
    head: &'a [u8],
    /// The id of the key it was sealed with.
    pub key_id: &'a str,
    /// Its nonce.
    pub nonce: &'a [u8; NONCE_LEN],
    /// The ciphertext with its tag.
    pub ciphertext: &'a [u8],
}

impl<'a> Sealed<'a> {
    /// Takes a sealed record apart: `Ok(None)` for bytes that are not sealed (a record in
    /// clear), [`SealError::Malformed`] for a sealed record that is cut short or of another
    /// version.
    pub fn parse(bytes: &'a [u8]) -> Result<Option<Sealed<'a>>, SealError> {
        if !is_sealed(bytes) {
            return Ok(None);
        }
        let (&version, rest) = bytes[2..].split_first().ok_or(SealError::Malformed)?;
        let (&id_len, rest) = rest.split_first().ok_or(SealError::Malformed)?;
        let id_len = usize::from(id_len);
        if version != SEAL_FORMAT_VERSION || rest.len() < id_len + NONCE_LEN + TAG_LEN {
            return Err(SealError::Malformed);
        }
        let (id, rest) = rest.split_at(id_len);
        let key_id = core::str::from_utf8(id).map_err(|_| SealError::Malformed)?;
        check_key_id(key_id).map_err(|_| SealError::Malformed)?;
        let (nonce, ciphertext) = rest.split_at(NONCE_LEN);
        Ok(Some(Sealed {
            head: &bytes[..4 + id_len],
            key_id,
            nonce: nonce.try_into().map_err(|_| SealError::Malformed)?,
            ciphertext,
        }))
    }

    /// The data authenticated with it when it was sealed under `storage_key`.
    pub fn aad(&self, storage_key: &str) -> Vec<u8> {
        aad(self.head, storage_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_parses_back_and_its_aad_binds_the_head_and_the_storage_key() {
        // IDEM-SEAL-1
        let h = head("2026-11").unwrap();
        let bytes = frame(&h, &[7; NONCE_LEN], &[9; 40]);
        let sealed = Sealed::parse(&bytes).unwrap().unwrap();
        assert_eq!(sealed.key_id, "2026-11");
        assert_eq!(sealed.nonce, &[7; NONCE_LEN]);
        assert_eq!(sealed.ciphertext, &[9; 40]);
        assert_eq!(
            sealed.aad("acct#POST#/orders#k"),
            aad(&h, "acct#POST#/orders#k")
        );
        assert!(
            sealed.aad("a").ends_with(b"a") && sealed.aad("a").starts_with(b"iS\x01\x072026-11")
        );
        assert_ne!(sealed.aad("k1"), sealed.aad("k2"));
    }

    #[test]
    fn records_in_clear_are_not_sealed_and_damaged_frames_are_refused() {
        assert_eq!(Sealed::parse(b"iR\x01\x00"), Ok(None));
        assert_eq!(Sealed::parse(b""), Ok(None));
        let good = frame(&head("k").unwrap(), &[0; NONCE_LEN], &[1; TAG_LEN]);
        assert!(Sealed::parse(&good).unwrap().is_some());
        for cut in 2..good.len() {
            assert_eq!(
                Sealed::parse(&good[..cut]),
                Err(SealError::Malformed),
                "{cut}"
            );
        }
        let mut v2 = good.clone();
        v2[2] = 2;
        assert_eq!(Sealed::parse(&v2), Err(SealError::Malformed));
        let mut bad_id = good;
        bad_id[4] = b' ';
        assert_eq!(Sealed::parse(&bad_id), Err(SealError::Malformed));
    }

    #[test]
    fn keys_are_checked_for_rotation() {
        // IDEM-SEAL-2
        assert_eq!(check_keys([("a", 32), ("b", 32)]), Ok(()));
        assert_eq!(check_keys([]), Err(SealError::NoKey));
        assert_eq!(check_keys([("a", 16)]), Err(SealError::KeyLength(16)));
        assert_eq!(
            check_keys([("a", 32), ("a", 32)]),
            Err(SealError::DuplicateKeyId)
        );
        assert_eq!(check_keys([("", 32)]), Err(SealError::KeyId));
        assert_eq!(check_keys([("a b", 32)]), Err(SealError::KeyId));
        let long = "x".repeat(MAX_KEY_ID_LEN + 1);
        assert_eq!(head(&long), Err(SealError::KeyId));
        assert!(head(&long[1..]).is_ok());
    }
}
