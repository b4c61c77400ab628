//! Sealed records for every store, memory, Redis and Postgres (`IDEM-SEAL-1`): each record
//! is written encrypted with AES-256-GCM under a named key, with its storage key
//! authenticated beside it, in idem-core's sealed format ([`idem_core::seal`]), which the
//! JavaScript stores read and write too.

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes256Gcm, KeyInit, Nonce};
use idem_core::seal::{self, SealError, Sealed, NONCE_LEN};
use idem_core::{decode_record, encode_record, DecodeError, Record};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// The keys a store seals its records with (`IDEM-SEAL-1`, `IDEM-SEAL-2`): the first seals
/// every record written, any of them opens a record sealed with it, so a key is rotated by
/// putting a new one first and dropping the old one once no record needs it (after the key
/// retention). A record in clear is refused like one that does not open (`IDEM-SEAL-3`): a
/// store anyone could write to cannot hand a forged response in clear to a replay. While a
/// store written in clear moves to sealing, [`read_clear`](Seal::read_clear) reads those too.
///
/// ```
/// # use idem_tower::Seal;
/// let seal = Seal::new([("2026-11", [7u8; 32]), ("2026-05", [9u8; 32])]).unwrap();
/// assert_eq!(seal.key_ids().collect::<Vec<_>>(), ["2026-11", "2026-05"]);
/// ```
#[derive(Clone)]
pub struct Seal {
    keys: Arc<[(String, Aes256Gcm)]>,
    /// The head of a record sealed with the first key.
    head: Arc<[u8]>,
    /// Whether records in clear are read (a store moving to sealing).
    read_clear: bool,
}

impl fmt::Debug for Seal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The ids only: never the keys.
        f.debug_struct("Seal")
            .field("key_ids", &self.key_ids().collect::<Vec<_>>())
            .field("read_clear", &self.read_clear)
            .finish()
    }
}

/// Why a stored record could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unreadable {
    /// The bytes are not a record (idem-core's record codec says why).
    Record(DecodeError),
    /// The record is sealed with a key the store does not hold (or the store holds none).
    UnknownKey(String),
    /// The record does not open with the key its id names: it was moved from another
    /// storage key, or damaged.
    Rejected,
    /// The record is in clear, and the store reads sealed records only.
    Clear,
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unreadable::Record(e) => write!(f, "a stored value is not a record: {e}"),
            Unreadable::UnknownKey(id) => {
                write!(
                    f,
                    "a record is sealed with key {id:?}, which this store does not hold"
                )
            }
            Unreadable::Rejected => f.write_str(
                "a sealed record does not open under its storage key (moved or damaged)",
            ),
            Unreadable::Clear => {
                f.write_str("a record is stored in clear, and this store reads sealed records only")
            }
        }
    }
}

impl std::error::Error for Unreadable {}

impl Unreadable {
    /// Whether it is a sealed record this store cannot open (`IDEM-SEAL-3`), not damage of
    /// another kind.
    pub fn is_sealed(&self) -> bool {
        matches!(
            self,
            Unreadable::UnknownKey(_)
                | Unreadable::Rejected
                | Unreadable::Clear
                | Unreadable::Record(DecodeError::Sealed)
        )
    }
}

impl Seal {
    /// Seal keys by id, the one that seals first: 1 to 64 visible ASCII characters of id and
    /// 32 bytes (AES-256) of key each, ids distinct.
    pub fn new<I, S, K>(keys: I) -> Result<Seal, SealError>
    where
        I: IntoIterator<Item = (S, K)>,
        S: Into<String>,
        K: AsRef<[u8]>,
    {
        let keys: Vec<(String, K)> = keys.into_iter().map(|(id, k)| (id.into(), k)).collect();
        seal::check_keys(keys.iter().map(|(id, k)| (id.as_str(), k.as_ref().len())))?;
        let head = seal::head(&keys[0].0)?;
        let keys = keys
            .into_iter()
            .map(|(id, k)| {
                Aes256Gcm::new_from_slice(k.as_ref())
                    .map(|cipher| (id, cipher))
                    .map_err(|_| SealError::KeyLength(k.as_ref().len()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Seal {
            keys: keys.into(),
            head: head.into(),
            read_clear: false,
        })
    }

    /// Reads records stored in clear too, while a store written before sealing was turned
    /// on moves to sealing (until its key retention has passed). Off by default.
    pub fn read_clear(mut self, read: bool) -> Seal {
        self.read_clear = read;
        self
    }

    /// The key ids, the sealing one first.
    pub fn key_ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|(id, _)| id.as_str())
    }

    /// `record` sealed with the first key for `storage_key`.
    pub(crate) fn seal(&self, storage_key: &str, record: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        // A repeated nonce would break GCM: better to stop than to seal without one.
        getrandom::fill(&mut nonce).expect("the operating system's random source failed");
        let aad = seal::aad(&self.head, storage_key);
        let ciphertext = self.keys[0]
            .1
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: record,
                    aad: &aad,
                },
            )
            // Encryption fails only for inputs beyond GCM's bound (64 GiB), far past the
            // largest record a store accepts.
            .expect("a record within AES-GCM's limits");
        seal::frame(&self.head, &nonce, &ciphertext)
    }

    /// The record's bytes in clear: opened, or as they are when they were stored in clear.
    fn open<'a>(&self, storage_key: &str, bytes: &'a [u8]) -> Result<Cow<'a, [u8]>, Unreadable> {
        let sealed = match Sealed::parse(bytes) {
            Ok(Some(sealed)) => sealed,
            Ok(None) if self.read_clear => return Ok(Cow::Borrowed(bytes)),
            Ok(None) => return Err(Unreadable::Clear),
            Err(_) => return Err(Unreadable::Rejected),
        };
        let (_, cipher) = self
            .keys
            .iter()
            .find(|(id, _)| id == sealed.key_id)
            .ok_or_else(|| Unreadable::UnknownKey(sealed.key_id.to_owned()))?;
        cipher
            .decrypt(
                Nonce::from_slice(sealed.nonce),
                Payload {
                    msg: sealed.ciphertext,
                    aad: &sealed.aad(storage_key),
                },
            )
            .map(Cow::Owned)
            .map_err(|_| Unreadable::Rejected)
    }
}

/// A record's bytes as a store writes them: sealed when the store has a seal.
pub(crate) fn encode(seal: Option<&Seal>, storage_key: &str, record: &Record) -> Vec<u8> {
    let bytes = encode_record(record);
    match seal {
        Some(seal) => seal.seal(storage_key, &bytes),
        None => bytes,
    }
}

/// A record from a store's bytes, opened when sealed (`IDEM-SEAL-3` when it cannot be).
pub(crate) fn decode(
    seal: Option<&Seal>,
    storage_key: &str,
    bytes: &[u8],
) -> Result<Record, Unreadable> {
    match seal {
        Some(seal) => decode_record(&seal.open(storage_key, bytes)?),
        None => match Sealed::parse(bytes) {
            Ok(Some(sealed)) => return Err(Unreadable::UnknownKey(sealed.key_id.to_owned())),
            _ => decode_record(bytes),
        },
    }
    .map_err(Unreadable::Record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::{Fingerprint, RecordState, StoredResponse, UnixMillis};

    fn completed(body: &[u8]) -> Record {
        Record {
            version: 7,
            fence: 1,
            fingerprint: Fingerprint::from_digest([1; 32]),
            created: UnixMillis(1_000),
            key_expires: UnixMillis(9_000),
            state: RecordState::Completed {
                response: Arc::new(StoredResponse {
                    status: 201,
                    headers: vec![("x-card".into(), "4242".into())],
                    body: body.to_vec(),
                }),
                response_expires: UnixMillis(5_000),
            },
        }
    }

    #[test]
    fn a_sealed_record_holds_nothing_in_clear_and_opens_only_under_its_own_key() {
        // IDEM-SEAL-1
        let seal = Seal::new([("k1", [3u8; 32])]).unwrap();
        let record = completed(b"{\"name\":\"Ada Lovelace\"}");
        let bytes = encode(Some(&seal), "acct#POST#/orders#a", &record);
        assert!(bytes.starts_with(b"iS\x01\x02k1"));
        for clear in [&b"Ada Lovelace"[..], b"4242", b"x-card", b"iR"] {
            assert!(
                !bytes.windows(clear.len()).any(|w| w == clear),
                "{clear:?} in clear"
            );
        }
        assert_eq!(
            decode(Some(&seal), "acct#POST#/orders#a", &bytes),
            Ok(record.clone())
        );
        // Copied under another key: refused.
        assert_eq!(
            decode(Some(&seal), "acct#POST#/orders#b", &bytes),
            Err(Unreadable::Rejected)
        );
        // A flipped bit anywhere: refused, never decoded as something else.
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            let e = decode(Some(&seal), "acct#POST#/orders#a", &bad).unwrap_err();
            // Past the magic it is still a sealed record, one that does not open.
            assert!(i < 2 || e.is_sealed(), "{i}: {e}");
        }
        // Two seals of one record differ (a fresh nonce each).
        assert_ne!(bytes, encode(Some(&seal), "acct#POST#/orders#a", &record));
    }

    #[test]
    fn keys_rotate_and_an_unknown_key_is_refused() {
        // IDEM-SEAL-2, IDEM-SEAL-3
        let old = Seal::new([("2026-05", [1u8; 32])]).unwrap();
        let rotated = Seal::new([("2026-11", [2u8; 32]), ("2026-05", [1u8; 32])]).unwrap();
        let new = Seal::new([("2026-11", [2u8; 32])]).unwrap();
        let record = completed(b"ok");
        let by_old = encode(Some(&old), "s", &record);
        let by_rotated = encode(Some(&rotated), "s", &record);
        assert!(by_rotated.starts_with(b"iS\x01\x072026-11"));
        assert_eq!(decode(Some(&rotated), "s", &by_old), Ok(record.clone()));
        assert_eq!(decode(Some(&new), "s", &by_rotated), Ok(record.clone()));
        assert_eq!(
            decode(Some(&new), "s", &by_old),
            Err(Unreadable::UnknownKey("2026-05".into()))
        );
        // A store without keys refuses a sealed record; a sealing store refuses a record in
        // clear, unless it reads those while moving to sealing.
        assert_eq!(
            decode(None, "s", &by_old),
            Err(Unreadable::UnknownKey("2026-05".into()))
        );
        let clear = encode(None, "s", &record);
        assert_eq!(decode(Some(&new), "s", &clear), Err(Unreadable::Clear));
        assert!(Unreadable::Clear.is_sealed());
        let moving = new.clone().read_clear(true);
        assert_eq!(decode(Some(&moving), "s", &clear), Ok(record.clone()));
        // The key id cannot be swapped for another key's: the head is authenticated.
        let same_key_other_id = Seal::new([("2026-06", [1u8; 32])]).unwrap();
        let mut relabelled = by_old.clone();
        relabelled[4..11].copy_from_slice(b"2026-06");
        assert_eq!(
            decode(Some(&same_key_other_id), "s", &relabelled),
            Err(Unreadable::Rejected)
        );
    }

    #[test]
    fn bad_keys_are_refused_when_the_seal_is_made() {
        assert_eq!(
            Seal::new([("a", [0u8; 16])]).unwrap_err(),
            SealError::KeyLength(16)
        );
        assert_eq!(
            Seal::new(Vec::<(String, [u8; 32])>::new()).unwrap_err(),
            SealError::NoKey
        );
        assert_eq!(
            Seal::new([("a", [0u8; 32]), ("a", [1u8; 32])]).unwrap_err(),
            SealError::DuplicateKeyId
        );
        assert_eq!(
            Seal::new([("no spaces", [0u8; 32])]).unwrap_err(),
            SealError::KeyId
        );
        let debug = format!("{:?}", Seal::new([("a", [0xAB; 32])]).unwrap());
        assert!(debug.contains("\"a\"") && !debug.contains("171"), "{debug}");
    }
}
