//! A compact, versioned byte format for records, for stores outside Rust (a Durable Object,
//! a database column). `IDEM-REC-1`.
//!
//! Layout: the magic bytes `iR`, one format-version byte, then the record in `postcard`
//! (varint integers, length-prefixed strings and bytes). Decoding checks the total size
//! first, then the magic and version, then the structure, then the record's invariants, and
//! never panics or allocates more than the input could justify.

use crate::record::{Record, RecordState};
use alloc::vec::Vec;
use core::fmt;

/// The format version written by [`encode_record`].
pub const RECORD_FORMAT_VERSION: u8 = 1;
/// The largest encoded record accepted by [`decode_record`] (16 MiB).
pub const MAX_RECORD_BYTES: usize = 16 << 20;
const MAGIC: &[u8; 2] = b"iR";

/// Why bytes are not a record.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// More than [`MAX_RECORD_BYTES`].
    TooLarge {
        /// The input's size.
        len: usize,
    },
    /// The input ends early.
    Truncated,
    /// The input does not start with the record magic: it is something else.
    NotARecord,
    /// The input is a sealed record ([`crate::seal`]): the store that read it opens it
    /// first, and a store without the key it names cannot (`IDEM-SEAL-3`).
    Sealed,
    /// A format version this build cannot read.
    UnsupportedVersion(u8),
    /// The structure is damaged.
    Malformed,
    /// Bytes after the record.
    TrailingBytes(usize),
    /// The structure decodes but breaks an invariant (the message names it).
    Invalid(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooLarge { len } => {
                write!(
                    f,
                    "record of {len} bytes exceeds the limit of {MAX_RECORD_BYTES}"
                )
            }
            DecodeError::Truncated => f.write_str("record is truncated"),
            DecodeError::NotARecord => f.write_str("not an idem record (bad magic)"),
            DecodeError::Sealed => f.write_str("the record is sealed and was not opened"),
            DecodeError::UnsupportedVersion(v) => {
                write!(f, "unsupported record format version {v}")
            }
            DecodeError::Malformed => f.write_str("record is malformed"),
            DecodeError::TrailingBytes(n) => write!(f, "{n} unexpected bytes after the record"),
            DecodeError::Invalid(why) => write!(f, "invalid record: {why}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for DecodeError {}

/// Encodes a record.
pub fn encode_record(record: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + record.size());
    out.extend_from_slice(MAGIC);
    out.push(RECORD_FORMAT_VERSION);
    // Serialising plain data into a Vec cannot fail.
    postcard::to_extend(record, out).unwrap_or_default()
}

/// Decodes a record written by [`encode_record`].
pub fn decode_record(bytes: &[u8]) -> Result<Record, DecodeError> {
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(DecodeError::TooLarge { len: bytes.len() });
    }
    if crate::seal::is_sealed(bytes) {
        return Err(DecodeError::Sealed);
    }
    if bytes.len() < 3 {
        return Err(if MAGIC.starts_with(bytes) {
            DecodeError::Truncated
        } else {
            DecodeError::NotARecord
        });
    }
    if &bytes[..2] != MAGIC {
        return Err(DecodeError::NotARecord);
    }
    if bytes[2] != RECORD_FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion(bytes[2]));
    }
    let (record, rest): (Record, _) =
        postcard::take_from_bytes(&bytes[3..]).map_err(|e| match e {
            postcard::Error::DeserializeUnexpectedEnd => DecodeError::Truncated,
            _ => DecodeError::Malformed,
        })?;
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes(rest.len()));
    }
    validate(&record)?;
    Ok(record)
}

fn validate(r: &Record) -> Result<(), DecodeError> {
    let names = r.fingerprint.fields.iter().map(|(name, _)| name);
    if !names.is_sorted_by(|a, b| a < b) {
        return Err(DecodeError::Invalid(
            "field digests are not sorted and unique",
        ));
    }
    if r.key_expires < r.created {
        return Err(DecodeError::Invalid("key expires before it was created"));
    }
    if let RecordState::Completed { response, .. } = &r.state {
        if !(100..=599).contains(&response.status) {
            return Err(DecodeError::Invalid("response status outside 100-599"));
        }
    }
    if let RecordState::Counter { session } = &r.state {
        session.validate().map_err(DecodeError::Invalid)?;
    }
    Ok(())
}
