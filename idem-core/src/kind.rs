//! What the key kinds share: their own scopes, client ids, decimal fields and configuration
//! errors. Their claims run through the request machine ([`crate::Request`]).

use crate::key::Scope;
use crate::problem::Problem;
use alloc::format;
use alloc::string::String;
use core::fmt;

/// The longest client id accepted by time and counter keys.
pub const MAX_CLIENT_ID_LEN: usize = 64;

/// The scope where records of one key kind live: the host's scope followed by `#` and the
/// kind (`IDEM-KIND-1`). A scope built by [`Scope::new`] is a sequence of length-prefixed
/// parts, so the suffix can never make it equal to another scope built by [`Scope::new`], and
/// two kinds never share a record.
pub(crate) fn kind_scope(scope: &Scope, kind: &str) -> Scope {
    Scope::custom(format!("{}#{}", scope.as_str(), kind))
}

/// 1 to [`MAX_CLIENT_ID_LEN`] characters out of `A-Z a-z 0-9 - . _ ~` (the URI unreserved set):
/// no `:`, so `client:number` splits one way only, and nothing a header or a log needs to
/// escape.
pub(crate) fn valid_client_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_CLIENT_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
}

/// Why a time or counter key does not parse (`IDEM-TIME-1`, `IDEM-CTR-1`). Every variant
/// maps to 400 `malformed-key` ([`KindKeyError::problem`]); nothing is claimed or executed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KindKeyError {
    /// The key is empty.
    Empty,
    /// The key does not have the expected `:`-separated parts.
    Malformed,
    /// The client id is not 1 to 64 characters of `A-Z a-z 0-9 - . _ ~`.
    BadClientId,
    /// A number starts with a minus sign.
    Negative {
        /// Which part of the key.
        field: &'static str,
    },
    /// A number is empty or holds something other than the digits 0 to 9.
    NotNumeric {
        /// Which part of the key.
        field: &'static str,
    },
    /// A number does not fit in 64 bits.
    TooLarge {
        /// Which part of the key.
        field: &'static str,
    },
    /// A counter's sequence number does not fit in the configured number of bits.
    SequenceBeyondBits {
        /// The sequence number sent.
        seq: u64,
        /// The configured width.
        bits: u8,
    },
}

impl KindKeyError {
    /// The error response: 400 `malformed-key`.
    pub fn problem(&self) -> Problem {
        Problem::MALFORMED_KEY
    }
}

impl fmt::Display for KindKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KindKeyError::Empty => f.write_str("the idempotency key is empty"),
            KindKeyError::Malformed => {
                f.write_str("the idempotency key does not have the expected parts")
            }
            KindKeyError::BadClientId => write!(
                f,
                "the client id must be 1 to {MAX_CLIENT_ID_LEN} characters of A-Z a-z 0-9 - . _ ~"
            ),
            KindKeyError::Negative { field } => write!(f, "the {field} must not be negative"),
            KindKeyError::NotNumeric { field } => {
                write!(f, "the {field} must be a decimal number")
            }
            KindKeyError::TooLarge { field } => {
                write!(f, "the {field} does not fit in 64 bits")
            }
            KindKeyError::SequenceBeyondBits { seq, bits } => {
                write!(f, "sequence number {seq} does not fit in {bits} bits")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for KindKeyError {}

/// Parses an unsigned decimal number of at most 64 bits.
pub(crate) fn parse_decimal(s: &str, field: &'static str) -> Result<u64, KindKeyError> {
    if s.starts_with('-') {
        return Err(KindKeyError::Negative { field });
    }
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(KindKeyError::NotNumeric { field });
    }
    s.bytes()
        .try_fold(0u64, |n, d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
        .ok_or(KindKeyError::TooLarge { field })
}

/// Appends `n` in decimal, [`parse_decimal`]'s inverse (without `core::fmt`, which a
/// client's WebAssembly module does not otherwise need).
pub(crate) fn push_decimal(out: &mut String, n: u64) {
    out.push_str(crate::canon::Decimal::new(n).as_str());
}

/// A key-kind configuration that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KindConfigError {
    /// A duration is zero.
    ZeroDuration(&'static str),
    /// The setting would let a key outlive its record: it must not exceed the engine's key
    /// retention (`key_ttl`).
    ExceedsKeyRetention(&'static str),
    /// Counter sequences must have 8 to 64 bits.
    BitsOutOfRange(u8),
    /// The counter window must hold 1 to `max` slots, where `max` is 2^(bits-2) (so that
    /// every serial-number comparison the window needs is defined) and at most
    /// [`MAX_WINDOW`](crate::MAX_WINDOW).
    WindowOutOfRange {
        /// The window asked for.
        window: u32,
        /// The largest window allowed with these bits.
        max: u32,
    },
}

impl fmt::Display for KindConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KindConfigError::ZeroDuration(name) => write!(f, "{name} must be greater than zero"),
            KindConfigError::ExceedsKeyRetention(name) => {
                write!(f, "{name} must not exceed the key retention (key_ttl)")
            }
            KindConfigError::BitsOutOfRange(bits) => {
                write!(f, "counter sequences need 8 to 64 bits, not {bits}")
            }
            KindConfigError::WindowOutOfRange { window, max } => {
                write!(
                    f,
                    "the counter window must hold 1 to {max} slots, not {window}"
                )
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for KindConfigError {}

/// Appends the lowercase hex form of `bytes`.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)] as char);
        out.push(HEX[usize::from(b & 15)] as char);
    }
}

/// Decodes lowercase hex into `out`; `None` unless `s` is exactly `2 * out.len()` lowercase
/// hex digits.
pub(crate) fn decode_hex(s: &str, out: &mut [u8]) -> Option<()> {
    let s = s.as_bytes();
    if s.len() != out.len() * 2 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        *o = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(())
}
