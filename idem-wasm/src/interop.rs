//! Every conversion between JavaScript values and idem-core types, in one place.
//!
//! Most of this module is plain Rust (option numbers → [`Config`], list texts → pairs, core
//! errors → [`ErrorParts`], decisions → HTTP replies, writes and replies → the byte layouts
//! the JavaScript side reads, the Durable Object wire format), so it is tested natively by
//! `cargo test -p idem-wasm` (`tests/interop.rs`). Only [`ErrorParts::into_js`] touches a
//! JavaScript value; the package's Node tests check the errors it builds.
//!
//! # Layouts shared with `js/wire.js`
//!
//! Data crosses the boundary in as few calls as possible, as numbers, one string or one
//! byte array, never as JSON text:
//!
//! * **List text**: a list of strings as one string, each item written as its length in
//!   UTF-16 code units (a JavaScript string's `length`), a colon, and the item:
//!   `["ab", "c"]` is `2:ab1:c`. Header lists are flat `[name, value, …]` lists.
//! * **Reply bytes**: `u32` status, `u32` byte length of the head, the head (the header list
//!   as list text, UTF-8), then the body. Integers are little-endian.
//! * **Write bytes**: flags (`1`: a version is expected, `2`: a record is put, else the
//!   record is deleted), the event index (`255`: none), the lengths of the expected version
//!   and the new version (decimal ASCII), the deadline as an `f64`, the two versions, then
//!   the encoded record.
//! * **Claim codes**: a `u32` whose low three bits are the [`Kind`], bit 3 is `recovered`,
//!   and bits 4 and up are the event's index in [`Event::ALL`].

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::time::Duration;
use idem_core::{
    Claim, CompleteError, Config, ConfigError, Decision, DecodeError, Event, Fingerprint,
    FingerprintError, FingerprintSpec, JsonMode, KeyError, Precondition, Problem, RecordKey, Scope,
    UnixMillis, UnknownOutcomePolicy, UuidVersion, Write, WriteOp,
};
use serde::{Deserialize, Serialize};

/// The `code` of an option the JS API refuses (`IDEM-JS-1`).
pub const CODE_OPTIONS: &str = "IDEM-JS-1";
/// The `code` of a wire message (Durable Object protocol) that does not decode (`IDEM-JS-2`).
pub const CODE_WIRE: &str = "IDEM-JS-2";

/// The longest duration accepted in options: about 285,000 years in milliseconds, far
/// beyond any retention, and exactly representable as a JavaScript number.
const MAX_DURATION_MS: u64 = 1 << 53;

/// Which JavaScript error class to throw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// `RangeError`: the caller passed something invalid.
    Range,
    /// `Error`: anything else.
    Error,
}

/// A JavaScript error before it is built: class, stable `code` (a requirement ID), message,
/// and for errors that answer an HTTP request, the problem response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorParts {
    /// The error class.
    pub kind: ErrorKind,
    /// The stable `code` property: a requirement ID from `spec/requirements.toml`.
    pub code: &'static str,
    /// The message.
    pub message: String,
    /// The problem to answer with, when the error is about an HTTP request.
    pub problem: Option<Problem>,
}

impl ErrorParts {
    fn range(code: &'static str, message: impl Into<String>) -> ErrorParts {
        ErrorParts {
            kind: ErrorKind::Range,
            code,
            message: message.into(),
            problem: None,
        }
    }

    fn problem(problem: Problem, message: String) -> ErrorParts {
        ErrorParts {
            kind: ErrorKind::Range,
            code: problem.requirement,
            message,
            problem: Some(problem),
        }
    }

    /// A bad option.
    pub fn options(message: impl Into<String>) -> ErrorParts {
        ErrorParts::range(CODE_OPTIONS, message)
    }

    /// A refused idempotency key: `IDEM-KEY-3` when it is missing, `IDEM-KEY-1` otherwise
    /// (`IDEM-KEY-5` for several keys, `IDEM-KEY-4` for a bad UUID).
    pub fn key(e: &KeyError) -> ErrorParts {
        let mut parts = ErrorParts::problem(Problem::for_key_error(e), e.to_string());
        parts.code = match e {
            KeyError::Empty => "IDEM-KEY-3",
            KeyError::List => "IDEM-KEY-5",
            KeyError::NotUuid | KeyError::WrongUuidVersion { .. } => "IDEM-KEY-4",
            _ => "IDEM-KEY-1",
        };
        parts
    }

    /// A body that cannot be fingerprinted.
    pub fn fingerprint(e: &FingerprintError) -> ErrorParts {
        ErrorParts::problem(Problem::for_fingerprint_error(e), e.to_string())
    }

    /// Stored bytes that are not a record.
    pub fn record(e: &DecodeError) -> ErrorParts {
        ErrorParts::range("IDEM-REC-1", format!("stored value: {e}"))
    }

    /// Wire bytes that do not decode.
    pub fn wire(what: &str) -> ErrorParts {
        ErrorParts::range(CODE_WIRE, format!("malformed {what}"))
    }

    /// An engine configuration the core refuses.
    pub fn config(e: &ConfigError) -> ErrorParts {
        let code = match e {
            ConfigError::KeyTtlShorterThanResponseTtl => "IDEM-TTL-2",
            _ => CODE_OPTIONS,
        };
        ErrorParts::range(code, e.to_string())
    }

    /// A completion or heartbeat the core refuses.
    pub fn complete(e: &CompleteError) -> ErrorParts {
        let code = match e {
            CompleteError::LeaseExpired => "IDEM-LEASE-3",
            CompleteError::NotOutcomeUnknown => "IDEM-OUT-3",
            _ => "IDEM-OUT-1",
        };
        ErrorParts::range(code, e.to_string())
    }

    /// The reply for an error about an HTTP request (`application/problem+json`).
    pub fn reply(&self) -> Option<Reply> {
        self.problem.map(|p| problem_reply(p, &self.message, None))
    }

    /// Builds the JavaScript error, with the `code` property.
    pub fn into_js(self) -> wasm_bindgen::JsValue {
        use wasm_bindgen::JsValue;
        let error: js_sys::Error = match self.kind {
            ErrorKind::Range => js_sys::RangeError::new(&self.message).into(),
            ErrorKind::Error => js_sys::Error::new(&self.message),
        };
        // Setting a property on a fresh Error object cannot fail.
        let _ = js_sys::Reflect::set(&error, &JsValue::from_str("code"), &self.code.into());
        error.into()
    }
}

/// How keys are parsed (`IDEM-KEY-1`, `IDEM-KEY-2`, `IDEM-KEY-4`). The discriminants are
/// the numbers the JavaScript side passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KeyKind {
    /// An sf-string or a Stripe-style bare key (the default; `"opaque"`).
    #[default]
    Opaque = 0,
    /// An RFC 8941 sf-string only (`"opaque-strict"`).
    OpaqueStrict = 1,
    /// A UUID of any version, as an sf-string or bare (`"uuid"`).
    Uuid = 2,
    /// A UUID v4 (`"uuid-v4"`).
    UuidV4 = 3,
    /// A UUID v7 (`"uuid-v7"`).
    UuidV7 = 4,
}

impl KeyKind {
    /// Parses a header value (`None` when the header is absent).
    pub fn parse(self, value: Option<&str>) -> Result<String, KeyError> {
        let value = value.unwrap_or("").as_bytes();
        let key = match self {
            KeyKind::OpaqueStrict => return idem_core::parse_opaque_strict(value),
            _ => idem_core::parse_opaque_lenient(value)?,
        };
        match self {
            KeyKind::Uuid => idem_core::parse_uuid(&key, None),
            KeyKind::UuidV4 => idem_core::parse_uuid(&key, Some(UuidVersion::V4)),
            KeyKind::UuidV7 => idem_core::parse_uuid(&key, Some(UuidVersion::V7)),
            _ => Ok(key),
        }
    }
}

/// Everything the engine side of the JS API is configured with.
#[derive(Clone, Debug)]
pub struct Options {
    /// The engine configuration.
    pub config: Config,
    /// How keys are parsed.
    pub key_kind: KeyKind,
    /// What goes into fingerprints.
    pub fingerprint: FingerprintSpec,
}

/// The positions of the option numbers passed to [`options`]. `NaN` (or a missing number)
/// means the default.
pub mod opt {
    /// `responseTtl`, ms.
    pub const RESPONSE_TTL: usize = 0;
    /// `keyTtl`, ms.
    pub const KEY_TTL: usize = 1;
    /// `lease`, ms.
    pub const LEASE: usize = 2;
    /// `unknownOutcome`: 0 `reexecute`, 1 `store`, 2 `hold`.
    pub const UNKNOWN_OUTCOME: usize = 3;
    /// `keyKind`: a [`super::KeyKind`] discriminant.
    pub const KEY_KIND: usize = 4;
    /// `fingerprint.json`: 0 `auto`, 1 `always`, 2 `never`.
    pub const JSON: usize = 5;
    /// `fingerprint.maxBody`, bytes.
    pub const MAX_BODY: usize = 6;
}

/// Whether `n` is a whole number (within the range of `i64`; larger values are refused by
/// every caller anyway).
fn whole(n: f64) -> bool {
    n == (n as i64) as f64
}

fn number(numbers: &[f64], at: usize) -> Option<f64> {
    numbers.get(at).copied().filter(|n| !n.is_nan())
}

fn duration(name: &str, ms: Option<f64>, default: Duration) -> Result<Duration, ErrorParts> {
    let Some(ms) = ms else { return Ok(default) };
    if !(whole(ms) && ms > 0.0 && ms <= MAX_DURATION_MS as f64) {
        return Err(ErrorParts::options(format!(
            "{name} must be a whole number of milliseconds greater than zero"
        )));
    }
    Ok(Duration::from_millis(ms as u64))
}

fn choice(name: &str, n: Option<f64>, count: u8) -> Result<u8, ErrorParts> {
    match n {
        None => Ok(0),
        Some(n) if whole(n) && (0.0..f64::from(count)).contains(&n) => Ok(n as u8),
        Some(_) => Err(ErrorParts::options(format!("{name} is not a known choice"))),
    }
}

/// The engine options from the numbers the JavaScript side passes (see [`opt`]) and the
/// fingerprint's header names and excluded fields as list texts.
pub fn options(numbers: &[f64], headers: &str, exclude: &str) -> Result<Options, ErrorParts> {
    let defaults = Config::default();
    let unknown_outcome = match choice("unknownOutcome", number(numbers, opt::UNKNOWN_OUTCOME), 3)?
    {
        0 => UnknownOutcomePolicy::Reexecute,
        1 => UnknownOutcomePolicy::Store,
        _ => UnknownOutcomePolicy::Hold,
    };
    let config = Config {
        response_ttl: duration(
            "responseTtl",
            number(numbers, opt::RESPONSE_TTL),
            defaults.response_ttl,
        )?,
        key_ttl: duration("keyTtl", number(numbers, opt::KEY_TTL), defaults.key_ttl)?,
        lease: duration("lease", number(numbers, opt::LEASE), defaults.lease)?,
        unknown_outcome,
    };
    let key_kind = match choice("keyKind", number(numbers, opt::KEY_KIND), 5)? {
        0 => KeyKind::Opaque,
        1 => KeyKind::OpaqueStrict,
        2 => KeyKind::Uuid,
        3 => KeyKind::UuidV4,
        _ => KeyKind::UuidV7,
    };
    let mut fingerprint = FingerprintSpec {
        headers: owned(list(headers)?),
        exclude: owned(list(exclude)?),
        ..FingerprintSpec::default()
    };
    fingerprint.json = match choice("fingerprint.json", number(numbers, opt::JSON), 3)? {
        0 => JsonMode::Auto,
        1 => JsonMode::Always,
        _ => JsonMode::Never,
    };
    if let Some(max) = number(numbers, opt::MAX_BODY) {
        if !(whole(max) && (0.0..=MAX_DURATION_MS as f64).contains(&max)) {
            return Err(ErrorParts::options(
                "fingerprint.maxBody must be a whole number of bytes",
            ));
        }
        fingerprint.max_body = max as usize;
    }
    Ok(Options {
        config,
        key_kind,
        fingerprint,
    })
}

fn owned(items: Vec<&str>) -> Vec<String> {
    items.into_iter().map(String::from).collect()
}

/// Milliseconds from JavaScript (`Date.now()`) as core time; negative or non-finite values
/// clamp to the epoch, fractions are dropped.
pub fn millis(ms: f64) -> UnixMillis {
    if ms.is_finite() && ms > 0.0 {
        UnixMillis(ms as u64)
    } else {
        UnixMillis::ZERO
    }
}

/// Core time as a JavaScript number.
pub fn to_ms(t: UnixMillis) -> f64 {
    t.0 as f64
}

/// A u64 from two u32 halves (random values come from `crypto.getRandomValues` in JS).
pub fn u64_from_halves(hi: u32, lo: u32) -> u64 {
    (u64::from(hi) << 32) | u64::from(lo)
}

/// The principal as it enters a scope: a SHA-256 digest (the first 16 bytes, in hex), so
/// credentials never reach a store.
pub fn principal_digest(principal: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(principal.as_bytes());
    let mut hex = String::with_capacity(32);
    for b in &digest[..16] {
        hex.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        hex.push(char::from_digit(u32::from(b & 15), 16).unwrap_or('0'));
    }
    hex
}

/// The scope of a request: the principal enters only as its digest
/// ([`principal_digest`]), and no choice of principal, method and route makes two scopes
/// collide (`IDEM-SCOPE-1`, `IDEM-SCOPE-2`).
pub fn scope(principal: &str, method: &str, route: &str) -> Scope {
    Scope::new(&principal_digest(principal), method, route)
}

/// The items of a list text (see the module docs). Throws `IDEM-JS-2` for text that is not
/// a list.
pub fn list(text: &str) -> Result<Vec<&str>, ErrorParts> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_once(':')
            .and_then(|(n, tail)| Some((n.parse::<usize>().ok()?, tail)))
            .ok_or_else(|| ErrorParts::wire("list"))?;
        let (item, tail) = split_utf16(tail, len).ok_or_else(|| ErrorParts::wire("list"))?;
        out.push(item);
        rest = tail;
    }
    Ok(out)
}

/// Splits `s` after `units` UTF-16 code units, if that is a character boundary.
fn split_utf16(s: &str, units: usize) -> Option<(&str, &str)> {
    let mut seen = 0;
    for (i, c) in s.char_indices() {
        if seen == units {
            return Some(s.split_at(i));
        }
        seen += c.len_utf16();
    }
    (seen == units).then_some((s, ""))
}

/// Appends `item` to a list text.
pub fn push_item(out: &mut String, item: &str) {
    let (digits, at) = utf16_len(item);
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
    out.push(':');
    out.push_str(item);
}

/// Appends `item` to a list text being written as UTF-8 bytes.
pub fn push_item_bytes(out: &mut Vec<u8>, item: &str) {
    let (digits, at) = utf16_len(item);
    out.extend_from_slice(&digits[at..]);
    out.push(b':');
    out.extend_from_slice(item.as_bytes());
}

/// The length of `item` in UTF-16 code units, in decimal digits (from the returned index).
fn utf16_len(item: &str) -> ([u8; 20], usize) {
    let mut n = item.encode_utf16().count();
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return (digits, at);
        }
    }
}

/// Header pairs from a flat list text `name:value:…`; an odd trailing name is dropped.
pub fn pairs(text: &str) -> Result<Vec<(String, String)>, ErrorParts> {
    let items = list(text)?;
    Ok(items
        .chunks_exact(2)
        .map(|p| (String::from(p[0]), String::from(p[1])))
        .collect())
}

/// Header pairs as a flat list text.
pub fn flatten(pairs: &[(String, String)]) -> String {
    let mut out = String::new();
    for (n, v) in pairs {
        push_item(&mut out, n);
        push_item(&mut out, v);
    }
    out
}

/// A write as a store sees it: the value to put (`None` deletes), the expected current
/// version (`None`: no record may exist), the new version, and when the record next needs
/// attention (`IDEM-STORE-1`, `IDEM-TTL-4`). Versions are decimal strings: they are u64
/// values that a JavaScript number cannot hold exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreWrite {
    /// The precondition: `None` for absent, else the version the stored record must have.
    pub expect: Option<String>,
    /// The encoded record to store, or `None` to delete.
    pub value: Option<Vec<u8>>,
    /// The version of the stored record after the write (empty for a delete).
    pub version: String,
    /// When the stored record next changes on its own, in milliseconds (0 for a delete).
    pub deadline: f64,
}

impl StoreWrite {
    /// Converts a core write.
    pub fn from_core(write: &Write) -> StoreWrite {
        let expect = match write.precondition {
            Precondition::Absent => None,
            Precondition::Version(v) => Some(v.to_string()),
        };
        match &write.op {
            WriteOp::Put(record) => StoreWrite {
                expect,
                value: Some(idem_core::encode_record(record)),
                version: record.version.to_string(),
                deadline: to_ms(record.next_deadline()),
            },
            WriteOp::Delete => StoreWrite {
                expect,
                value: None,
                version: String::new(),
                deadline: 0.0,
            },
        }
    }

    /// The write bytes (see the module docs), with the event the write yields once applied.
    pub fn encode(&self, event: Option<Event>) -> Vec<u8> {
        let expect = self.expect.as_deref().unwrap_or("");
        let value = self.value.as_deref().unwrap_or(&[]);
        let mut out = Vec::with_capacity(12 + expect.len() + self.version.len() + value.len());
        out.push(u8::from(self.expect.is_some()) | (u8::from(self.value.is_some()) << 1));
        out.push(event.map_or(NO_EVENT, event_index));
        out.push(expect.len() as u8);
        out.push(self.version.len() as u8);
        out.extend_from_slice(&self.deadline.to_le_bytes());
        out.extend_from_slice(expect.as_bytes());
        out.extend_from_slice(self.version.as_bytes());
        out.extend_from_slice(value);
        out
    }
}

/// The event index that means "no event" in write bytes.
pub const NO_EVENT: u8 = 255;

/// The index of `event` in [`Event::ALL`] (events with data compare by name).
pub fn event_index(event: Event) -> u8 {
    Event::ALL
        .iter()
        .position(|e| e.name() == event.name())
        .map_or(NO_EVENT, |i| i as u8)
}

/// The names of [`Event::ALL`], comma-separated, in index order.
pub fn event_names() -> String {
    let mut out = String::new();
    for (i, e) in Event::ALL.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(e.name());
    }
    out
}

/// A bit mask over event indices: the security-relevant events (`IDEM-EVT-1`).
pub fn security_mask() -> u32 {
    Event::ALL
        .iter()
        .enumerate()
        .filter(|(_, e)| e.is_security_relevant())
        .fold(0, |mask, (i, _)| mask | (1 << i))
}

/// The event a completion write yields once applied, as [`idem_core::Store::finish`]
/// classifies it: stored, released, or outcome-unknown.
pub fn completion_event(write: &Write) -> Event {
    idem_core::Finish::of(write).event()
}

/// What a claim tells the host to do: the low bits of a claim code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Run the handler under the lease.
    Execute = 0,
    /// Send the stored response again.
    Replay = 1,
    /// Another attempt holds the lease: 409 with `Retry-After`.
    InProgress = 2,
    /// The key was used for a different request: 422.
    Mismatch = 3,
    /// Refused: the key's response expired (410) or its outcome is unknown (409).
    Rejected = 4,
    /// The store is full (`IDEM-STORE-3`): 503, nothing runs.
    Full = 5,
}

/// A claim code (see the module docs).
pub fn code(kind: Kind, recovered: bool, event: Event) -> u32 {
    kind as u32 | (u32::from(recovered) << 3) | (u32::from(event_index(event)) << 4)
}

/// The claim code of a claim.
pub fn claim_code(claim: &Claim) -> u32 {
    let (kind, recovered) = match claim {
        Claim::Execute { recovered, .. } => (Kind::Execute, *recovered),
        Claim::Done(Decision::Replay(_)) => (Kind::Replay, false),
        Claim::Done(Decision::InProgress { .. }) => (Kind::InProgress, false),
        Claim::Done(Decision::Mismatch { .. }) => (Kind::Mismatch, false),
        Claim::Done(_) => (Kind::Rejected, false),
    };
    code(kind, recovered, claim.event())
}

/// Parses a storage key ([`RecordKey::storage_key`]) back into the record key.
pub fn parse_storage_key(s: &str) -> Option<RecordKey> {
    let (len, rest) = s.split_once(':')?;
    let len: usize = len.parse().ok()?;
    if !rest.is_char_boundary(len) {
        return None;
    }
    let (scope, key) = rest.split_at(len);
    let key = RecordKey::new(Scope::custom(scope), key);
    (key.storage_key() == s).then_some(key)
}

/// An HTTP reply: status, header pairs, body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Header pairs.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Reply {
    /// The reply bytes (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        encode_reply(self.status, &self.headers, &[], &self.body)
    }
}

/// The header a replay adds (`IDEM-REPLAY-2`).
pub const REPLAYED: &[(&str, &str)] = &[("idempotent-replayed", "true")];

/// Reply bytes (see the module docs) from the parts: the headers, then `extra` headers.
pub fn encode_reply(
    status: u16,
    headers: &[(String, String)],
    extra: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    encode_reply_into(&mut out, status, headers, extra, body);
    out
}

/// [`encode_reply`] into a buffer that is cleared first (and keeps its capacity).
pub fn encode_reply_into(
    out: &mut Vec<u8>,
    status: u16,
    headers: &[(String, String)],
    extra: &[(&str, &str)],
    body: &[u8],
) {
    out.clear();
    out.extend_from_slice(&u32::from(status).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    for (n, v) in headers {
        push_item_bytes(out, n);
        push_item_bytes(out, v);
    }
    for (n, v) in extra {
        push_item_bytes(out, n);
        push_item_bytes(out, v);
    }
    let head = (out.len() - 8) as u32;
    out[4..8].copy_from_slice(&head.to_le_bytes());
    out.extend_from_slice(body);
}

/// The reply for a problem: `application/problem+json` with the core's body.
pub fn problem_reply(problem: Problem, detail: &str, retry_after: Option<u64>) -> Reply {
    let mut headers = alloc::vec![(
        String::from("content-type"),
        String::from("application/problem+json"),
    )];
    if let Some(secs) = retry_after {
        headers.push((String::from("retry-after"), secs.to_string()));
    }
    Reply {
        status: problem.status,
        headers,
        body: problem.to_json(detail).into_bytes(),
    }
}

/// The reply for a decision that does not execute: the stored response with
/// `Idempotent-Replayed: true` (`IDEM-REPLAY-1`, `IDEM-REPLAY-2`), or the problem
/// (`IDEM-CONC-1` with `Retry-After`, `IDEM-FP-1` naming the differing fields, `IDEM-TTL-3`,
/// `IDEM-OUT-3`). `None` for [`Decision::Execute`].
pub fn decision_reply(decision: &Decision) -> Option<Reply> {
    match decision {
        Decision::Execute { .. } => None,
        Decision::Replay(r) => {
            let mut headers = Vec::with_capacity(r.headers.len() + 1);
            headers.extend_from_slice(&r.headers);
            headers.push((String::from("idempotent-replayed"), String::from("true")));
            Some(Reply {
                status: r.status,
                headers,
                body: r.body.clone(),
            })
        }
        Decision::InProgress { retry_after_secs } => Some(problem_reply(
            Problem::IN_PROGRESS,
            "another request with this key is being processed; retry later",
            Some(*retry_after_secs),
        )),
        Decision::Mismatch { differing } => {
            let detail = if differing.is_empty() {
                String::from("the key was used with a different request")
            } else {
                format!(
                    "the key was used with a different request; differing fields: {}",
                    differing.join(", ")
                )
            };
            Some(problem_reply(Problem::MISMATCH, &detail, None))
        }
        Decision::Rejected(reason) => Some(problem_reply(
            reason.problem(),
            &reason.to_string(),
            reason.retry_after_secs(),
        )),
    }
}

/// The reply for a store failure: `store-full` (`IDEM-STORE-3`) or `store-unavailable`
/// (`IDEM-STORE-4`), with `Retry-After`.
pub fn store_reply(full: bool, detail: &str) -> Reply {
    let problem = if full {
        Problem::STORE_FULL
    } else {
        Problem::STORE_UNAVAILABLE
    };
    problem_reply(problem, detail, Some(1))
}

// --- The Durable Object wire format -----------------------------------------------------
//
// A worker computes the attempt (key, scope, fingerprint) and sends it to the Durable Object
// that owns the key's shard; the object decides next to its storage and sends the claim
// back. Both travel as postcard bytes of the core's serde types, prefixed with a tag byte.

const WIRE_ATTEMPT: u8 = b'A';
const WIRE_DECISION: u8 = b'D';

fn tagged<T: Serialize>(tag: u8, value: &T) -> Vec<u8> {
    // Serialising plain data into a Vec cannot fail.
    postcard::to_extend(value, alloc::vec![tag]).unwrap_or_default()
}

fn untag<'a, T: Deserialize<'a>>(tag: u8, what: &str, bytes: &'a [u8]) -> Result<T, ErrorParts> {
    match bytes.split_first() {
        Some((&t, rest)) if t == tag => match postcard::take_from_bytes(rest) {
            Ok((v, [])) => Ok(v),
            _ => Err(ErrorParts::wire(what)),
        },
        _ => Err(ErrorParts::wire(what)),
    }
}

/// Encodes an attempt for the Durable Object that owns its key.
pub fn encode_attempt(key: &RecordKey, fingerprint: &Fingerprint) -> Vec<u8> {
    tagged(WIRE_ATTEMPT, &(key, fingerprint))
}

/// Decodes an attempt.
pub fn decode_attempt(bytes: &[u8]) -> Result<(RecordKey, Fingerprint), ErrorParts> {
    untag(WIRE_ATTEMPT, "attempt", bytes)
}

/// Encodes a claim (a decision whose write the object has applied) for the worker that
/// asked.
pub fn encode_claim(claim: &Claim) -> Vec<u8> {
    tagged(WIRE_DECISION, claim)
}

/// Decodes a claim.
pub fn decode_claim(bytes: &[u8]) -> Result<Claim, ErrorParts> {
    untag(WIRE_DECISION, "claim", bytes)
}

// --- The client ---------------------------------------------------------------------------

/// The client's retry policy from `[base, cap, maxAttempts, deadline]` (ms; `NaN` for the
/// default).
pub fn retry_policy(numbers: &[f64]) -> Result<idem_core::RetryPolicy, ErrorParts> {
    let d = idem_core::RetryPolicy::default();
    let attempts = match number(numbers, 2) {
        None => d.max_attempts,
        Some(n) if whole(n) && (1.0..=1_000_000.0).contains(&n) => n as u32,
        Some(_) => {
            return Err(ErrorParts::options(
                "retry.maxAttempts must be a whole number from 1 to 1000000",
            ))
        }
    };
    Ok(idem_core::RetryPolicy {
        base: duration("retry.base", number(numbers, 0), d.base)?,
        cap: duration("retry.cap", number(numbers, 1), d.cap)?,
        max_attempts: attempts,
        deadline: duration("retry.deadline", number(numbers, 3), d.deadline)?,
    })
}

/// The `code` of a client error: `IDEM-CLIENT-1` for a changed payload, `IDEM-KEY-1` for a
/// bad key, `IDEM-CLIENT-7` for a call in the wrong state.
pub fn client_error(e: &idem_core::ClientError) -> ErrorParts {
    use idem_core::ClientError as E;
    let code = match e {
        E::PayloadChanged => "IDEM-CLIENT-1",
        E::InvalidKey(_) => "IDEM-KEY-1",
        E::InvalidStatus(_) => "IDEM-CLIENT-2",
        _ => "IDEM-CLIENT-7",
    };
    ErrorParts::range(code, e.to_string())
}

/// A UUID v7 key (RFC 9562 §5.7) from the time and 80 random bits.
pub fn uuid_v7_key(now: UnixMillis, random: [u8; 10]) -> String {
    let uuid = uuid::Builder::from_unix_timestamp_millis(now.0, &random).into_uuid();
    let mut buf = uuid::Uuid::encode_buffer();
    String::from(uuid.hyphenated().encode_lower(&mut buf))
}

/// A state's name for JavaScript.
pub fn state_name(s: &idem_core::EntryState) -> &'static str {
    use idem_core::EntryState as S;
    match s {
        S::Created => "created",
        S::Sent => "sent",
        S::Waiting { .. } => "waiting",
        S::Answered { .. } => "answered",
        S::Processed { .. } => "processed",
        S::Failed { .. } => "failed",
        S::Undetermined { .. } => "undetermined",
    }
}

/// A give-up reason's name for JavaScript.
pub fn give_up_name(g: idem_core::GiveUp) -> &'static str {
    match g {
        idem_core::GiveUp::Deadline => "deadline",
        idem_core::GiveUp::Budget => "budget",
        idem_core::GiveUp::KeyForgotten => "key-forgotten",
    }
}
