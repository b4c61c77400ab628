//! Every conversion between JavaScript values and idem-core types, in one place.
//!
//! Most of this module is plain Rust (options text → [`Config`], header lists → pairs, core
//! errors → [`ErrorParts`], decisions → HTTP replies, the Durable Object wire format), so it
//! is tested natively by `cargo test -p idem-wasm` (`tests/interop.rs`). Only
//! [`ErrorParts::into_js`] touches a JavaScript value; the package's Node tests check the
//! errors it builds.

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

    /// Builds the JavaScript error: `code`, and for request errors `status`, `type` and
    /// `problem` (the `application/problem+json` body).
    pub fn into_js(self) -> wasm_bindgen::JsValue {
        use wasm_bindgen::JsValue;
        let error: js_sys::Error = match self.kind {
            ErrorKind::Range => js_sys::RangeError::new(&self.message).into(),
            ErrorKind::Error => js_sys::Error::new(&self.message),
        };
        let set = |name: &str, value: JsValue| {
            // Setting a property on a fresh Error object cannot fail.
            let _ = js_sys::Reflect::set(&error, &JsValue::from_str(name), &value);
        };
        set("code", JsValue::from_str(self.code));
        if let Some(p) = self.problem {
            set("status", JsValue::from(p.status));
            set("type", JsValue::from_str(p.type_uri));
            set("problem", JsValue::from_str(&p.to_json(&self.message)));
        }
        error.into()
    }
}

/// How keys are parsed (`IDEM-KEY-1`, `IDEM-KEY-2`, `IDEM-KEY-4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize)]
pub enum KeyKind {
    /// An RFC 8941 sf-string only.
    #[serde(rename = "opaque-strict")]
    OpaqueStrict,
    /// An sf-string or a Stripe-style bare key (the default).
    #[default]
    #[serde(rename = "opaque")]
    Opaque,
    /// A UUID of any version (as an sf-string or bare).
    #[serde(rename = "uuid")]
    Uuid,
    /// A UUID v4.
    #[serde(rename = "uuid-v4")]
    UuidV4,
    /// A UUID v7.
    #[serde(rename = "uuid-v7")]
    UuidV7,
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

/// The engine options as the JS layer passes them (JSON text, durations in milliseconds).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct OptionsText {
    response_ttl: Option<f64>,
    key_ttl: Option<f64>,
    lease: Option<f64>,
    unknown_outcome: Option<String>,
    key_kind: Option<KeyKind>,
    fingerprint: Option<FingerprintText>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FingerprintText {
    headers: Option<Vec<String>>,
    exclude: Option<Vec<String>>,
    json: Option<String>,
    max_body: Option<f64>,
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

fn duration(name: &str, ms: Option<f64>, default: Duration) -> Result<Duration, ErrorParts> {
    let Some(ms) = ms else { return Ok(default) };
    if !(ms.fract() == 0.0 && ms > 0.0 && ms <= MAX_DURATION_MS as f64) {
        return Err(ErrorParts::options(format!(
            "{name} must be a whole number of milliseconds greater than zero"
        )));
    }
    Ok(Duration::from_millis(ms as u64))
}

/// Parses the options JSON text.
pub fn parse_options(text: &str) -> Result<Options, ErrorParts> {
    let o: OptionsText = serde_json::from_str(text)
        .map_err(|e| ErrorParts::options(format!("invalid options: {e}")))?;
    let defaults = Config::default();
    let unknown_outcome = match o.unknown_outcome.as_deref() {
        None | Some("reexecute") => UnknownOutcomePolicy::Reexecute,
        Some("store") => UnknownOutcomePolicy::Store,
        Some("hold") => UnknownOutcomePolicy::Hold,
        Some(other) => {
            return Err(ErrorParts::options(format!(
                "unknownOutcome must be \"reexecute\", \"store\" or \"hold\", not \"{other}\""
            )))
        }
    };
    let config = Config {
        response_ttl: duration("responseTtl", o.response_ttl, defaults.response_ttl)?,
        key_ttl: duration("keyTtl", o.key_ttl, defaults.key_ttl)?,
        lease: duration("lease", o.lease, defaults.lease)?,
        unknown_outcome,
    };
    let f = o.fingerprint.unwrap_or_default();
    let mut fingerprint = FingerprintSpec::default();
    if let Some(h) = f.headers {
        fingerprint.headers = h;
    }
    if let Some(x) = f.exclude {
        fingerprint.exclude = x;
    }
    fingerprint.json = match f.json.as_deref() {
        None | Some("auto") => JsonMode::Auto,
        Some("always") => JsonMode::Always,
        Some("never") => JsonMode::Never,
        Some(other) => {
            return Err(ErrorParts::options(format!(
                "fingerprint.json must be \"auto\", \"always\" or \"never\", not \"{other}\""
            )))
        }
    };
    if let Some(max) = f.max_body {
        if !(max.fract() == 0.0 && (0.0..=MAX_DURATION_MS as f64).contains(&max)) {
            return Err(ErrorParts::options(
                "fingerprint.maxBody must be a whole number of bytes",
            ));
        }
        fingerprint.max_body = max as usize;
    }
    Ok(Options {
        config,
        key_kind: o.key_kind.unwrap_or_default(),
        fingerprint,
    })
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

/// The scope of a request: the principal enters only as a SHA-256 digest (the first 16
/// bytes, in hex), so credentials never reach a store, and no choice of principal, method
/// and route makes two scopes collide (`IDEM-SCOPE-1`, `IDEM-SCOPE-2`).
pub fn scope(principal: &str, method: &str, route: &str) -> Scope {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(principal.as_bytes());
    let mut hex = String::with_capacity(32);
    for b in &digest[..16] {
        hex.push(char::from_digit(u32::from(b >> 4), 16).unwrap_or('0'));
        hex.push(char::from_digit(u32::from(b & 15), 16).unwrap_or('0'));
    }
    Scope::new(&hex, method, route)
}

/// Pairs a flat `[name, value, name, value, …]` list (an odd trailing name is dropped).
pub fn pairs(flat: Vec<String>) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(flat.len() / 2);
    let mut it = flat.into_iter();
    while let (Some(n), Some(v)) = (it.next(), it.next()) {
        out.push((n, v));
    }
    out
}

/// Flattens header pairs for JavaScript.
pub fn flatten(pairs: &[(String, String)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(n, v)| [n.clone(), v.clone()])
        .collect()
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
}

/// The event a completion write yields once applied, as [`idem_core::Store::finish`]
/// classifies it: stored, released, or outcome-unknown.
pub fn completion_event(write: &Write) -> Event {
    idem_core::Finish::of(write).event()
}

/// Every event the core defines that is security-relevant (`IDEM-EVT-1`).
pub fn security_events() -> Vec<Event> {
    Event::ALL
        .iter()
        .copied()
        .filter(Event::is_security_relevant)
        .collect()
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
            let mut headers = r.headers.clone();
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
// that owns the key's shard; the object decides next to its storage and sends the decision
// back. Both travel as postcard bytes of these mirror types, prefixed with a tag byte.

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

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RetryText {
    base: Option<f64>,
    cap: Option<f64>,
    max_attempts: Option<f64>,
    deadline: Option<f64>,
}

/// Parses the client's retry options (JSON text, milliseconds).
pub fn parse_retry(text: &str) -> Result<idem_core::RetryPolicy, ErrorParts> {
    let r: RetryText = serde_json::from_str(text)
        .map_err(|e| ErrorParts::options(format!("invalid retry options: {e}")))?;
    let d = idem_core::RetryPolicy::default();
    let attempts = match r.max_attempts {
        None => d.max_attempts,
        Some(n) if n.fract() == 0.0 && (1.0..=1_000_000.0).contains(&n) => n as u32,
        Some(_) => {
            return Err(ErrorParts::options(
                "retry.maxAttempts must be a whole number from 1 to 1000000",
            ))
        }
    };
    Ok(idem_core::RetryPolicy {
        base: duration("retry.base", r.base, d.base)?,
        cap: duration("retry.cap", r.cap, d.cap)?,
        max_attempts: attempts,
        deadline: duration("retry.deadline", r.deadline, d.deadline)?,
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
