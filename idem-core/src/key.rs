//! Idempotency keys: the IETF `Idempotency-Key` sf-string, Stripe-style bare keys, UUIDs,
//! and the (scope, key) pair that records are stored under.
//!
//! The structured-field grammar is written out here rather than taken from a crate: the
//! maintained RFC 8941 parsers need `std`, and this crate must stay `no_std`. Only the part of
//! the grammar an Item needs is implemented: one bare item and its parameters.

use alloc::string::String;
use core::fmt;

/// The longest key accepted, in characters (IETF draft §2.1; Stripe uses the same bound).
pub const MAX_KEY_LEN: usize = 255;

/// Why a key was refused (requirements `IDEM-KEY-1`, `IDEM-KEY-2`, `IDEM-KEY-4`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// The header was absent, blank, or the key string was empty.
    Empty,
    /// The key has more than [`MAX_KEY_LEN`] characters.
    TooLong {
        /// Characters in the key (after unescaping).
        len: usize,
    },
    /// A byte that may not appear there: a control character, a non-ASCII byte, or a
    /// delimiter in a bare key.
    InvalidByte {
        /// Offset in the header value.
        at: usize,
        /// The offending byte.
        byte: u8,
    },
    /// The header holds a structured item that is not a String (a token, number, boolean or
    /// byte sequence). In strict mode a bare key is such a token.
    NotString,
    /// A backslash followed by something other than `"` or `\` inside the string.
    BadEscape {
        /// Offset of the backslash in the header value.
        at: usize,
    },
    /// The string has no closing quote.
    Unterminated,
    /// More than one item: the header holds a list (or several header lines were combined).
    List,
    /// A parameter after the string does not follow RFC 8941 §3.1.2.
    BadParameter {
        /// Offset in the header value where the parameter went wrong.
        at: usize,
    },
    /// Bytes left over after the item and its parameters.
    TrailingData {
        /// Offset of the first extra byte.
        at: usize,
    },
    /// The key is not a UUID in its RFC 9562 hyphenated text form.
    NotUuid,
    /// The UUID has another version than the one required.
    WrongUuidVersion {
        /// The version required.
        expected: UuidVersion,
        /// The version the key carries.
        found: u8,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Empty => f.write_str("the idempotency key is empty"),
            KeyError::TooLong { len } => {
                write!(
                    f,
                    "the idempotency key has {len} characters; at most {MAX_KEY_LEN} are allowed"
                )
            }
            KeyError::InvalidByte { at, byte } => {
                write!(
                    f,
                    "byte 0x{byte:02x} at offset {at} is not allowed in an idempotency key"
                )
            }
            KeyError::NotString => f.write_str(
                "the idempotency key must be a structured-field String (a quoted string)",
            ),
            KeyError::BadEscape { at } => {
                write!(
                    f,
                    "invalid escape at offset {at}: only \\\" and \\\\ are allowed"
                )
            }
            KeyError::Unterminated => {
                f.write_str("the idempotency key string has no closing quote")
            }
            KeyError::List => f.write_str("the Idempotency-Key header must hold exactly one key"),
            KeyError::BadParameter { at } => write!(f, "malformed parameter at offset {at}"),
            KeyError::TrailingData { at } => write!(f, "unexpected data at offset {at}"),
            KeyError::NotUuid => f.write_str("the idempotency key must be a UUID (8-4-4-4-12 hex)"),
            KeyError::WrongUuidVersion { expected, found } => {
                write!(
                    f,
                    "the idempotency key must be a UUID v{}; found v{found}",
                    *expected as u8
                )
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for KeyError {}

/// Parses an `Idempotency-Key` header value as the IETF draft requires: an RFC 8941 Item
/// whose bare item is a String (`"…"`), optionally followed by parameters, which are
/// checked and ignored. Returns the unescaped key.
///
/// Requirements `IDEM-KEY-1`, `IDEM-KEY-2`.
pub fn parse_opaque_strict(value: &[u8]) -> Result<String, KeyError> {
    let mut p = Parser {
        input: value,
        pos: 0,
    };
    p.skip_sp();
    if p.at_end() {
        return Err(KeyError::Empty);
    }
    if p.peek() != Some(b'"') {
        // Classify the bare item only to say why it is refused.
        return Err(match p.peek() {
            Some(b'-' | b'0'..=b'9' | b'*' | b':' | b'?' | b'@' | b'%') => KeyError::NotString,
            Some(c) if c.is_ascii_alphabetic() => KeyError::NotString,
            Some(c) => KeyError::InvalidByte { at: p.pos, byte: c },
            None => KeyError::Empty,
        });
    }
    let key = p.string()?;
    p.parameters()?;
    p.skip_sp();
    match p.peek() {
        None => {}
        Some(b',') => return Err(KeyError::List),
        Some(_) => return Err(KeyError::TrailingData { at: p.pos }),
    }
    check_len(&key)?;
    Ok(key)
}

/// Like [`parse_opaque_strict`], but also accepts a Stripe-style bare key: 1 to 255 visible
/// ASCII characters other than `"` and `,` (a comma means several header lines were
/// combined). A value that starts with `"` is always parsed as a String.
pub fn parse_opaque_lenient(value: &[u8]) -> Result<String, KeyError> {
    let start = value.iter().position(|&b| b != b' ').unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|&b| b != b' ')
        .map_or(start, |i| i + 1);
    let trimmed = &value[start..end];
    match trimmed.first() {
        None => Err(KeyError::Empty),
        Some(b'"') => parse_opaque_strict(value),
        Some(_) => {
            for (i, &b) in trimmed.iter().enumerate() {
                match b {
                    b',' => return Err(KeyError::List),
                    b'"' | 0..=0x20 | 0x7f..=0xff => {
                        return Err(KeyError::InvalidByte {
                            at: start + i,
                            byte: b,
                        })
                    }
                    _ => {}
                }
            }
            let key = String::from(core::str::from_utf8(trimmed).map_err(|_| KeyError::NotString)?);
            check_len(&key)?;
            Ok(key)
        }
    }
}

fn check_len(key: &str) -> Result<(), KeyError> {
    match key.len() {
        0 => Err(KeyError::Empty),
        len if len > MAX_KEY_LEN => Err(KeyError::TooLong { len }),
        _ => Ok(()),
    }
}

/// A UUID version that [`parse_uuid`] can require.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum UuidVersion {
    /// Random (RFC 9562 §5.4).
    V4 = 4,
    /// Unix-time ordered (RFC 9562 §5.7).
    V7 = 7,
}

/// Checks that `key` (already taken out of its header by one of the opaque parsers) is a UUID
/// in the RFC 9562 hyphenated text form, optionally of one version, and returns it in
/// lowercase so that `ABC…` and `abc…` name the same record. Requirement `IDEM-KEY-4`.
pub fn parse_uuid(key: &str, version: Option<UuidVersion>) -> Result<String, KeyError> {
    if key.len() != 36 {
        return Err(KeyError::NotUuid);
    }
    let uuid = uuid::Uuid::try_parse(key).map_err(|_| KeyError::NotUuid)?;
    if let Some(expected) = version {
        let found = uuid.get_version_num() as u8;
        if found != expected as u8 {
            return Err(KeyError::WrongUuidVersion { expected, found });
        }
    }
    let mut buf = uuid::Uuid::encode_buffer();
    Ok(String::from(uuid.hyphenated().encode_lower(&mut buf)))
}

struct Parser<'a> {
    input: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.pos).copied()
    }
    fn at_end(&self) -> bool {
        self.pos >= self.input.len()
    }
    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
    }

    /// RFC 8941 §4.2.5. The caller has checked the opening quote.
    fn string(&mut self) -> Result<String, KeyError> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(KeyError::Unterminated);
            };
            let at = self.pos;
            self.pos += 1;
            match c {
                b'\\' => match self.peek() {
                    Some(e @ (b'"' | b'\\')) => {
                        self.pos += 1;
                        out.push(e as char);
                    }
                    None => return Err(KeyError::Unterminated),
                    Some(_) => return Err(KeyError::BadEscape { at }),
                },
                b'"' => return Ok(out),
                0x20..=0x7e => out.push(c as char),
                _ => return Err(KeyError::InvalidByte { at, byte: c }),
            }
            if out.len() > MAX_KEY_LEN {
                // Keep scanning for a well-formed end only as far as the limit needs.
                return Err(KeyError::TooLong {
                    len: self.remaining_string_len(out.len()),
                });
            }
        }
    }

    /// Length of an over-long string, for the error message, without unbounded work.
    fn remaining_string_len(&self, so_far: usize) -> usize {
        let rest = &self.input[self.pos..];
        so_far + rest.iter().position(|&b| b == b'"').unwrap_or(rest.len())
    }

    /// RFC 8941 §4.2.3.2: `*( ";" *SP key [ "=" bare-item ] )`.
    fn parameters(&mut self) -> Result<(), KeyError> {
        while self.peek() == Some(b';') {
            self.pos += 1;
            self.skip_sp();
            let at = self.pos;
            match self.peek() {
                Some(c) if c.is_ascii_lowercase() || c == b'*' => self.pos += 1,
                _ => return Err(KeyError::BadParameter { at }),
            }
            while let Some(c) = self.peek() {
                if c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-.*".contains(&c) {
                    self.pos += 1;
                } else {
                    break;
                }
            }
            if self.peek() == Some(b'=') {
                self.pos += 1;
                self.bare_item()
                    .map_err(|_| KeyError::BadParameter { at })?;
            }
        }
        Ok(())
    }

    /// Skips one bare item of any type (RFC 8941 §4.2.3.1), for parameter values.
    fn bare_item(&mut self) -> Result<(), ()> {
        match self.peek().ok_or(())? {
            b'"' => self.string().map(drop).map_err(drop),
            b'-' | b'0'..=b'9' => self.number(),
            b'?' => {
                self.pos += 1;
                match self.peek() {
                    Some(b'0' | b'1') => {
                        self.pos += 1;
                        Ok(())
                    }
                    _ => Err(()),
                }
            }
            b':' => {
                self.pos += 1;
                while let Some(c) = self.peek() {
                    self.pos += 1;
                    match c {
                        b':' => return Ok(()),
                        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'+' | b'/' | b'=' => {}
                        _ => return Err(()),
                    }
                }
                Err(())
            }
            c if c.is_ascii_alphabetic() || c == b'*' => {
                self.pos += 1;
                while let Some(c) = self.peek() {
                    if is_tchar(c) || c == b':' || c == b'/' {
                        self.pos += 1;
                    } else {
                        break;
                    }
                }
                Ok(())
            }
            _ => Err(()),
        }
    }

    /// RFC 8941 §4.2.4: an Integer (at most 15 digits) or a Decimal (at most 12 integer and
    /// 3 fractional digits).
    fn number(&mut self) -> Result<(), ()> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        let int_start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let int_len = self.pos - int_start;
        if int_len == 0 {
            return Err(());
        }
        if self.peek() != Some(b'.') {
            return if int_len <= 15 { Ok(()) } else { Err(()) };
        }
        self.pos += 1;
        let frac_start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        let frac_len = self.pos - frac_start;
        if int_len <= 12 && (1..=3).contains(&frac_len) {
            Ok(())
        } else {
            Err(())
        }
    }
}

fn is_tchar(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// The longest text (a route, an inbox source) that enters a [`Scope`] as it is; a longer one
/// enters as its digest.
pub const MAX_IN_CLEAR: usize = 256;

/// `text` as a scope holds it when it is longer than [`MAX_IN_CLEAR`]: `h:` and its digest
/// (the principal's digest function), so that a record's storage key stays short enough for
/// every store to index (a Postgres key, a Redis key), whatever the client chose; `None` for
/// shorter text, which the scope holds as it is.
pub(crate) fn digest_if_long(text: &str) -> Option<String> {
    (text.len() > MAX_IN_CLEAR).then(|| digest_of(text))
}

/// `text` as a scope holds its digest: `h:` and the principal's digest function of it.
pub(crate) fn digest_of(text: &str) -> String {
    alloc::format!("h:{}", crate::request::principal_digest(text))
}

/// The namespace a key lives in (requirement `IDEM-SCOPE-1`).
///
/// The same key under two scopes names two unrelated records, so a response can never be
/// replayed across scopes. The default scope is principal + method + route: one tenant's key
/// never replays another tenant's response, and a key sent to `POST /orders` never answers
/// `POST /refunds`.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Scope(String);

impl Scope {
    /// The default scope: principal (the authenticated caller; empty for anonymous),
    /// method and route template. The parts are length-prefixed, so no choice of strings can
    /// make two different triples collide. A route longer than [`MAX_IN_CLEAR`] bytes (a
    /// request path the client chose) enters as `h:` and its digest, which no
    /// length-prefixed route begins with.
    pub fn new(principal: &str, method: &str, route: &str) -> Scope {
        let mut s = String::with_capacity(principal.len() + method.len() + route.len() + 12);
        for part in [principal, method] {
            s.push_str(crate::canon::Decimal::new(part.len() as u64).as_str());
            s.push(':');
            s.push_str(part);
        }
        if let Some(digest) = digest_if_long(route) {
            s.push_str(&digest);
        } else {
            s.push_str(crate::canon::Decimal::new(route.len() as u64).as_str());
            s.push(':');
            s.push_str(route);
        }
        Scope(s)
    }

    /// A scope the host has built itself (for example a tenant id alone). The host is then
    /// responsible for keeping scopes of different principals distinct.
    pub fn custom(scope: impl Into<String>) -> Scope {
        Scope(scope.into())
    }

    /// The scope as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The identity of a record: a key inside its scope.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct RecordKey {
    /// The namespace.
    pub scope: Scope,
    /// The key as parsed from the request.
    pub key: String,
}

impl RecordKey {
    /// Pairs a scope with a key.
    pub fn new(scope: Scope, key: impl Into<String>) -> RecordKey {
        RecordKey {
            scope,
            key: key.into(),
        }
    }

    /// One string that identifies the record, for stores that take a single key (a Durable
    /// Object name, a database primary key). Length-prefixed, so it is injective.
    pub fn storage_key(&self) -> String {
        use core::fmt::Write as _;
        let mut s = String::with_capacity(self.scope.0.len() + self.key.len() + 8);
        let _ = write!(s, "{}:{}{}", self.scope.0.len(), self.scope.0, self.key);
        s
    }

    /// The record's digest, for telemetry and logs that must tell records apart without
    /// naming them (`IDEM-EVT-2`): the first 16 bytes of the SHA-256 of
    /// [`storage_key`](Self::storage_key), in lowercase hex. One key in one scope always has
    /// the same digest; the key and the principal cannot be read back from it.
    pub fn digest(&self) -> String {
        crate::request::principal_digest(&self.storage_key())
    }
}
