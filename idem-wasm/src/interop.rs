//! Every conversion between JavaScript values and idem-core types, in one place.
//!
//! Most of this module is plain Rust (engine options → a [`Policy`], list texts → pairs, core
//! errors → [`ErrorParts`], writes and replies → what the JavaScript side reads, the Durable
//! Object wire format), so it is tested natively by `cargo test -p idem-wasm`
//! (`tests/interop.rs`). What touches JavaScript values is in `lib.rs`.
//!
//! # What crosses the boundary
//!
//! Every code that crosses is defined here or in idem-core, once: the steps of the request
//! machine, the handler's outcome and the heartbeat states are `#[wasm_bindgen]` enums the
//! JavaScript side imports by name; the engine options are read from the options object by
//! the names in [`ENGINE_OPTIONS`]; event names come from [`Event::ALL`]. Four byte layouts
//! remain, for speed, and `test/boundary.test.mjs` checks both sides against each other:
//!
//! * **List text**: a list of strings as one string, each item written as its length in
//!   UTF-16 code units (a JavaScript string's `length`), a colon, and the item:
//!   `["ab", "c"]` is `2:ab1:c`. Header lists are flat `[name, value, …]` lists.
//! * **Reply bytes**: a `u8` of [`ReplyFlag`]s (what the engine says of the reply, so that
//!   JavaScript never infers it from the headers), `u32` status, `u32` byte length of the
//!   head, the head (the header list as list text, UTF-8), then the body. Integers are
//!   little-endian.
//! * **Write bytes** (a store write, [`StoreWrite`]): a `u8` of [`WriteFlag`]s, `f64`
//!   deadline, `f64` expiry, `u32` byte length of the head, the head (list text: the version,
//!   then the expected version when [`WriteFlag::Expect`] is set), then the record bytes when
//!   [`WriteFlag::Value`] is set. Numbers are little-endian.
//! * **Context bytes** (what a running handler is told): `f64` fencing number, `f64` end of
//!   the lease (milliseconds since the epoch), `u64` the attempt's identity
//!   ([`idem_core::Context::attempt`]), a `u8` that is 1 when the handler takes over from an
//!   attempt whose lease expired, then the key (UTF-8). Numbers are little-endian.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::time::Duration;
use idem_core::{
    Claimed, CompleteError, Config, ConfigError, CounterConfig, DecodeError, Event,
    FingerprintSpec, InFlight, JsonMode, KeyKind, KindConfigError, Policy, Precondition, RecordKey,
    RecordState, Refusal, Scope, Ticket, TimeKeyConfig, TokenSecret, UnixMillis,
    UnknownOutcomePolicy, UuidVersion, Write, WriteOp,
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

/// A JavaScript error before it is built: class, stable `code` (a requirement ID), message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorParts {
    /// The error class.
    pub kind: ErrorKind,
    /// The stable `code` property: a requirement ID from `spec/requirements.toml`.
    pub code: &'static str,
    /// The message.
    pub message: String,
}

impl ErrorParts {
    /// A `RangeError` with this code.
    pub fn range(code: &'static str, message: impl Into<String>) -> ErrorParts {
        ErrorParts {
            kind: ErrorKind::Range,
            code,
            message: message.into(),
        }
    }

    /// A bad option.
    pub fn options(message: impl Into<String>) -> ErrorParts {
        ErrorParts::range(CODE_OPTIONS, message)
    }

    /// A refusal as an error (the client side, which throws instead of answering): its
    /// requirement is the code.
    pub fn refusal(r: &Refusal) -> ErrorParts {
        ErrorParts::range(r.requirement, r.detail.clone())
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
            ConfigError::LeaseLongerThanKeyTtl => "IDEM-LEASE-4",
            _ => CODE_OPTIONS,
        };
        ErrorParts::range(code, e.to_string())
    }

    /// A key kind configuration the core refuses.
    pub fn kind_config(e: &KindConfigError) -> ErrorParts {
        ErrorParts::options(e.to_string())
    }

    /// A completion the core refuses.
    pub fn complete(e: &CompleteError) -> ErrorParts {
        let code = match e {
            CompleteError::LeaseExpired => "IDEM-LEASE-3",
            CompleteError::NotOutcomeUnknown => "IDEM-OUT-3",
            _ => "IDEM-OUT-1",
        };
        ErrorParts::range(code, e.to_string())
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

/// The steps of the request machine ([`idem_core::Step`]), as the JavaScript side sees
/// them: what a slot's `poll` returns.
#[wasm_bindgen::prelude::wasm_bindgen]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Read the record (or ask the store that claims itself).
    Claim = 0,
    /// Read the record.
    Load = 1,
    /// Apply the write of `takeWrite`.
    Apply = 2,
    /// Poll again at `waitUntil`.
    WaitUntil = 3,
    /// Run the handler.
    Run = 4,
    /// Waiting for an input.
    Idle = 5,
    /// Send the reply.
    Reply = 6,
    /// The outcome is recorded: send the handler's response.
    Done = 7,
}

/// What became of a delivery to an inbox ([`idem_core::Delivery`]), as JavaScript reads it:
/// its name is `deliveryNames()[outcome]`.
#[wasm_bindgen::prelude::wasm_bindgen]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// Processed now.
    Processed = 0,
    /// Processed now, taking over from a delivery whose processing was interrupted.
    Recovered = 1,
    /// Already processed: acknowledge it.
    Duplicate = 2,
    /// Another delivery is being processed: deliver again later.
    InProgress = 3,
    /// The same id with another payload: acknowledged, not processed.
    Conflict = 4,
    /// An earlier delivery's outcome is held: not acknowledged.
    Held = 5,
    /// Processing failed: deliver again.
    Failed = 6,
    /// Refused before it was claimed.
    Refused = 7,
}

impl DeliveryOutcome {
    /// The outcome of a core delivery.
    pub fn of(d: &idem_core::Delivery) -> DeliveryOutcome {
        use idem_core::Delivery;
        match d {
            Delivery::Processed { recovered: false } => DeliveryOutcome::Processed,
            Delivery::Processed { recovered: true } => DeliveryOutcome::Recovered,
            Delivery::Duplicate => DeliveryOutcome::Duplicate,
            Delivery::InProgress { .. } => DeliveryOutcome::InProgress,
            Delivery::Conflict { .. } => DeliveryOutcome::Conflict,
            Delivery::Held => DeliveryOutcome::Held,
            Delivery::Failed => DeliveryOutcome::Failed,
            _ => DeliveryOutcome::Refused,
        }
    }

    /// Every outcome, by index, with a core delivery of its kind.
    pub const ALL: [(DeliveryOutcome, idem_core::Delivery); 8] = [
        (
            DeliveryOutcome::Processed,
            idem_core::Delivery::Processed { recovered: false },
        ),
        (
            DeliveryOutcome::Recovered,
            idem_core::Delivery::Processed { recovered: true },
        ),
        (DeliveryOutcome::Duplicate, idem_core::Delivery::Duplicate),
        (
            DeliveryOutcome::InProgress,
            idem_core::Delivery::InProgress {
                retry_after_secs: 0,
            },
        ),
        (
            DeliveryOutcome::Conflict,
            idem_core::Delivery::Conflict {
                differing: Vec::new(),
            },
        ),
        (DeliveryOutcome::Held, idem_core::Delivery::Held),
        (DeliveryOutcome::Failed, idem_core::Delivery::Failed),
        (DeliveryOutcome::Refused, idem_core::Delivery::Refused),
    ];
}

/// The names of the delivery outcomes in index order, comma-separated, and which of them the
/// sender is told were received (a bit mask over the indices): the core's.
pub fn delivery_names() -> (String, u32) {
    let mut names = String::new();
    let mut acknowledged = 0;
    for (i, (outcome, delivery)) in DeliveryOutcome::ALL.iter().enumerate() {
        debug_assert_eq!(*outcome as usize, i);
        if i > 0 {
            names.push(',');
        }
        names.push_str(delivery.name());
        if delivery.acknowledge() {
            acknowledged |= 1 << i;
        }
    }
    (names, acknowledged)
}

/// What the handler's run came to.
#[wasm_bindgen::prelude::wasm_bindgen]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ran {
    /// It answered: the response is classified by status (`IDEM-OUT-4`).
    Answered = 0,
    /// It threw, or its response could not be read: an unknown outcome (`IDEM-OUT-3`).
    Threw = 1,
    /// It reports that nothing happened: the key is released (`IDEM-OUT-2`).
    NothingHappened = 2,
    /// A delivery's processing is done ([`idem_core::Inbox::processed`]).
    Processed = 3,
}

/// Where a request's heartbeats stand ([`idem_core::Heartbeat`]).
#[wasm_bindgen::prelude::wasm_bindgen]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatState {
    /// None asked for, or one is on its way.
    Quiet = 0,
    /// The lease was extended.
    Extended = 1,
    /// The lease was taken over, or the outcome is already in (`IDEM-LEASE-2`).
    FencedOut = 2,
    /// The lease had ended (`IDEM-LEASE-3`).
    Expired = 3,
    /// The store failed (`IDEM-STORE-4`).
    Failed = 4,
}

impl HeartbeatState {
    /// The state of a core heartbeat.
    pub fn of(h: idem_core::Heartbeat) -> HeartbeatState {
        match h {
            idem_core::Heartbeat::Quiet => HeartbeatState::Quiet,
            idem_core::Heartbeat::Extended(_) => HeartbeatState::Extended,
            idem_core::Heartbeat::FencedOut => HeartbeatState::FencedOut,
            idem_core::Heartbeat::Expired => HeartbeatState::Expired,
            idem_core::Heartbeat::Failed(_) => HeartbeatState::Failed,
        }
    }
}

/// The names of the engine options, read from the options object of `withIdempotency` and
/// `Idempotency` (and sent to a Durable Object so that it builds the same engine). The
/// JavaScript side refuses any other name it does not know itself.
pub const ENGINE_OPTIONS: &[&str] = &[
    "responseTtl",
    "keyTtl",
    "lease",
    "maxRetryAfter",
    "unknownOutcome",
    "keyKind",
    "fingerprint",
    "inFlight",
    "methods",
    "keys",
    "maxResponseBytes",
    "timeKeys",
    "counter",
    "token",
    "keyFallback",
];

/// The members of `timeKeys` (`keyKind: "unix-time"`), `counter` (`keyKind: "counter"`)
/// and `token` (`keyKind: "token"`).
pub const KIND_OPTIONS: &[(&str, &[&str])] = &[
    // `clientHeader` is read by the JavaScript side: the header whose value goes before the
    // timestamp.
    ("timeKeys", &["maxAhead", "maxAge", "clientHeader"]),
    ("counter", &["bits", "window"]),
    ("token", &["secret", "ttl"]),
];

/// The members of `fingerprint`.
pub const FINGERPRINT_OPTIONS: &[&str] = &["headers", "exclude", "json", "maxBody"];

/// The engine options as read from JavaScript: each `None` when absent (the default).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineOptions {
    /// `responseTtl`, ms.
    pub response_ttl: Option<f64>,
    /// `keyTtl`, ms.
    pub key_ttl: Option<f64>,
    /// `lease`, ms.
    pub lease: Option<f64>,
    /// `maxRetryAfter`, ms: the longest `Retry-After` of an in-progress answer.
    pub max_retry_after: Option<f64>,
    /// `unknownOutcome`: `reexecute`, `store` or `hold`.
    pub unknown_outcome: Option<String>,
    /// `keyKind`: `opaque`, `opaque-strict`, `uuid`, `uuid-v4`, `uuid-v7`, `unix-time`,
    /// `counter`, `token`.
    pub key_kind: Option<String>,
    /// `timeKeys.maxAhead` and `timeKeys.maxAge`, ms.
    pub time_keys: (Option<f64>, Option<f64>),
    /// `counter.bits` and `counter.window`.
    pub counter: (Option<f64>, Option<f64>),
    /// `token.secret` (64 hex digits) and `token.ttl` (ms).
    pub token: (Option<String>, Option<f64>),
    /// `keyFallback`: where a request without a key header finds its key.
    pub key_fallback: Option<idem_core::KeyFallback>,
    /// `fingerprint.headers`.
    pub headers: Vec<String>,
    /// `fingerprint.exclude`.
    pub exclude: Vec<String>,
    /// `fingerprint.json`: `auto`, `always`, `never`.
    pub json: Option<String>,
    /// `fingerprint.maxBody`, bytes.
    pub max_body: Option<f64>,
    /// `inFlight`: `None` or `"reject"` to refuse, else the wait bound and poll interval.
    pub in_flight: Option<(f64, Option<f64>)>,
    /// `methods`.
    pub methods: Option<Vec<String>>,
    /// `keys`: `required` or `optional`.
    pub keys: Option<String>,
    /// `maxResponseBytes`: the largest response the store keeps.
    pub max_response_bytes: Option<f64>,
}

/// Whether `n` is a whole number (within the range of `i64`; larger values are refused by
/// every caller anyway).
fn whole(n: f64) -> bool {
    n == (n as i64) as f64
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

fn bytes_option(name: &str, n: Option<f64>) -> Result<Option<usize>, ErrorParts> {
    match n {
        None => Ok(None),
        Some(n) if whole(n) && (0.0..=MAX_DURATION_MS as f64).contains(&n) => Ok(Some(n as usize)),
        Some(_) => Err(ErrorParts::options(format!(
            "{name} must be a whole number of bytes"
        ))),
    }
}

fn choice<T: Copy>(
    name: &str,
    value: Option<&str>,
    choices: &[(&str, T)],
) -> Result<T, ErrorParts> {
    let Some(value) = value else {
        return Ok(choices[0].1);
    };
    choices
        .iter()
        .find(|(n, _)| *n == value)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
            ErrorParts::options(format!("{name} must be {}", names.join(", ")))
        })
}

/// The policy for the options: the engine, key kind, fingerprint, in-flight policy, guarded
/// methods and response size limit. `IDEM-TTL-2` when `keyTtl < responseTtl`,
/// `IDEM-LEASE-4` when `lease > keyTtl`, `IDEM-JS-1` for anything else.
pub fn policy(o: &EngineOptions) -> Result<Policy, ErrorParts> {
    let defaults = Config::default();
    let unknown_outcome = choice(
        "unknownOutcome",
        o.unknown_outcome.as_deref(),
        &[
            ("reexecute", UnknownOutcomePolicy::Reexecute),
            ("store", UnknownOutcomePolicy::Store),
            ("hold", UnknownOutcomePolicy::Hold),
        ],
    )?;
    let config = Config {
        response_ttl: duration("responseTtl", o.response_ttl, defaults.response_ttl)?,
        key_ttl: duration("keyTtl", o.key_ttl, defaults.key_ttl)?,
        lease: duration("lease", o.lease, defaults.lease)?,
        unknown_outcome,
        max_retry_after: duration("maxRetryAfter", o.max_retry_after, defaults.max_retry_after)?,
    };
    let engine = idem_core::Engine::new(config).map_err(|e| ErrorParts::config(&e))?;
    let kind = choice(
        "keyKind",
        o.key_kind.as_deref(),
        &[
            ("opaque", 0u8),
            ("opaque-strict", 1),
            ("uuid", 2),
            ("uuid-v4", 3),
            ("uuid-v7", 4),
            ("unix-time", 5),
            ("counter", 6),
            ("token", 7),
        ],
    )?;
    let kind = match kind {
        0 => KeyKind::Opaque,
        1 => KeyKind::OpaqueStrict,
        2 => KeyKind::Uuid(None),
        3 => KeyKind::Uuid(Some(UuidVersion::V4)),
        4 => KeyKind::Uuid(Some(UuidVersion::V7)),
        5 => {
            // The defaults fit the key retention; bounds given are checked against it.
            let d = TimeKeyConfig::default().fit(engine.config().key_ttl);
            KeyKind::Time(TimeKeyConfig {
                max_ahead: duration("timeKeys.maxAhead", o.time_keys.0, d.max_ahead)?,
                max_age: duration("timeKeys.maxAge", o.time_keys.1, d.max_age)?,
            })
        }
        6 => {
            let d = CounterConfig::default();
            let small = |name: &str, v: Option<f64>, default: u32| match v {
                None => Ok(default),
                Some(n) if whole(n) && (0.0..=f64::from(u32::MAX)).contains(&n) => Ok(n as u32),
                Some(_) => Err(ErrorParts::options(format!(
                    "{name} must be a whole number"
                ))),
            };
            KeyKind::Counter(CounterConfig {
                bits: small("counter.bits", o.counter.0, u32::from(d.bits))?.min(255) as u8,
                window: small("counter.window", o.counter.1, d.window)?,
            })
        }
        _ => {
            let secret = token_secret(o.token.0.as_deref())?;
            let Some(ttl) = o.token.1 else {
                return Err(ErrorParts::options(
                    "keyKind \"token\" needs token.ttl: how long an issued token stays valid, in ms",
                ));
            };
            KeyKind::Token {
                secret,
                ttl: duration("token.ttl", Some(ttl), Duration::ZERO)?,
            }
        }
    };
    let uses = |name: &str, given: bool, kind: &str| {
        if given && o.key_kind.as_deref() != Some(kind) {
            Err(ErrorParts::options(format!(
                "options.{name} applies to keyKind \"{kind}\" only"
            )))
        } else {
            Ok(())
        }
    };
    uses("timeKeys", o.time_keys != (None, None), "unix-time")?;
    uses("counter", o.counter != (None, None), "counter")?;
    uses("token", o.token != (None, None), "token")?;
    let mut fingerprint = FingerprintSpec {
        headers: o.headers.iter().map(|h| h.to_ascii_lowercase()).collect(),
        exclude: o.exclude.clone(),
        json: choice(
            "fingerprint.json",
            o.json.as_deref(),
            &[
                ("auto", JsonMode::Auto),
                ("always", JsonMode::Always),
                ("never", JsonMode::Never),
            ],
        )?,
        ..FingerprintSpec::default()
    };
    if let Some(max) = bytes_option("fingerprint.maxBody", o.max_body)? {
        fingerprint.max_body = max;
    }
    let in_flight = match o.in_flight {
        None => InFlight::Reject,
        Some((wait, poll)) => InFlight::Wait {
            max: duration("inFlight.wait", Some(wait), Duration::ZERO)?,
            poll: duration("inFlight.poll", poll, Duration::from_millis(25))?,
        },
    };
    let keys_required = choice(
        "keys",
        o.keys.as_deref(),
        &[("required", true), ("optional", false)],
    )?;
    if o.key_fallback.is_some()
        && !matches!(
            kind,
            KeyKind::Opaque | KeyKind::OpaqueStrict | KeyKind::Uuid(_)
        )
    {
        return Err(ErrorParts::options(
            "options.keyFallback applies to opaque and UUID keys only",
        ));
    }
    let mut policy = Policy::new(engine)
        .with_key_fallback(o.key_fallback.clone().unwrap_or_default())
        .with_keys(kind)
        .map_err(|e| ErrorParts::kind_config(&e))?
        .with_fingerprint(fingerprint)
        .with_in_flight(in_flight)
        .map_err(|e| ErrorParts::config(&e))?
        .with_keys_required(keys_required);
    if let Some(methods) = &o.methods {
        policy = policy.with_methods(methods.iter().map(|m| m.to_ascii_uppercase()));
    }
    if let Some(max) = bytes_option("maxResponseBytes", o.max_response_bytes)? {
        policy = policy.with_max_response_bytes(max);
    }
    Ok(policy)
}

/// A counter number or epoch as decimal text (64-bit numbers do not fit a JavaScript
/// number): `IDEM-CTR-1` for anything else.
pub fn decimal(name: &str, text: &str) -> Result<u64, ErrorParts> {
    text.parse::<u64>()
        .ok()
        .filter(|_| text.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| ErrorParts::range("IDEM-CTR-1", format!("{name} must be a decimal number")))
}

/// The token secret: 32 bytes as 64 hex digits.
fn token_secret(hex: Option<&str>) -> Result<TokenSecret, ErrorParts> {
    let bad = || {
        ErrorParts::options(
            "keyKind \"token\" needs token.secret: 32 random bytes as 64 hex digits, the same on every instance",
        )
    };
    let hex = hex.ok_or_else(bad)?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut secret = [0u8; 32];
    for (i, byte) in secret.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
            .map_err(|_| bad())?;
    }
    Ok(TokenSecret(secret))
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
    // ASCII (the usual header text): one unit per byte.
    if s.as_bytes().get(..units).is_some_and(<[u8]>::is_ascii) {
        return Some(s.split_at(units));
    }
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
    // One unit per character, two for those of four bytes (above U+FFFF): counted over the
    // bytes, each leading byte once, with no decoding.
    let mut n: usize = item
        .bytes()
        .map(|b| usize::from(b & 0xC0 != 0x80) + usize::from(b >= 0xF0))
        .sum();
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

/// A write as a JavaScript store sees it: the value to put (`None` deletes), the expected
/// current version (`None`: no record may exist), the new version, and when the record next
/// needs attention (`IDEM-STORE-1`, `IDEM-TTL-4`). Versions are decimal strings: they are u64
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
    /// Until when the store must keep the record, in milliseconds (0 for a delete): a
    /// time-to-live of the store's own is set from this, never from `deadline`.
    pub expires: f64,
    /// Whether the write is a completion that stores the handler's response, as the engine
    /// decided it ([`idem_core::Request::completing`]): a store that commits a handler's own
    /// writes with its completion commits them only then (`IDEM-STORE-7`). Set by the host.
    pub stores_response: bool,
    /// Whether the record written is in flight (a claim, a heartbeat, or an attempt that
    /// threw left for a retry to take over): a store that holds claims in memory may keep
    /// it there while it has no record of the key (`IDEM-STORE-8`).
    pub in_flight: bool,
}

/// What the first byte of write bytes says (see the module docs); the JavaScript side reads
/// the bits by these names.
#[wasm_bindgen::prelude::wasm_bindgen]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFlag {
    /// The record to store follows the head; without it, the write deletes.
    Value = 1,
    /// The head holds the version the stored record must have; without it, there must be no
    /// record.
    Expect = 2,
    /// [`StoreWrite::stores_response`].
    StoresResponse = 4,
    /// [`StoreWrite::in_flight`].
    InFlight = 8,
}

impl StoreWrite {
    /// The write bytes (see the module docs) into `out`, which is cleared first (and keeps
    /// its capacity).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let flag = |on: bool, f: WriteFlag| if on { f as u8 } else { 0 };
        out.clear();
        out.push(
            flag(self.value.is_some(), WriteFlag::Value)
                | flag(self.expect.is_some(), WriteFlag::Expect)
                | flag(self.stores_response, WriteFlag::StoresResponse)
                | flag(self.in_flight, WriteFlag::InFlight),
        );
        out.extend_from_slice(&self.deadline.to_le_bytes());
        out.extend_from_slice(&self.expires.to_le_bytes());
        push_head(
            out,
            core::iter::once(self.version.as_str()).chain(self.expect.as_deref()),
        );
        if let Some(value) = &self.value {
            out.extend_from_slice(value);
        }
    }

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
                expires: to_ms(record.retained_until()),
                stores_response: false,
                in_flight: matches!(record.state, RecordState::InFlight { .. }),
            },
            WriteOp::Delete => StoreWrite {
                expect,
                value: None,
                version: String::new(),
                deadline: 0.0,
                expires: 0.0,
                stores_response: false,
                in_flight: false,
            },
        }
    }
}

/// The index of `event` in [`Event::ALL`] (events with data compare by name).
pub fn event_index(event: Event) -> Option<u8> {
    Event::ALL
        .iter()
        .position(|e| e.name() == event.name())
        .map(|i| i as u8)
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

/// What the first byte of reply bytes says (see the module docs); the JavaScript side reads
/// the bits by these names.
#[wasm_bindgen::prelude::wasm_bindgen]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyFlag {
    /// The reply replays a stored response ([`idem_core::Reply::is_replay`]): it carries
    /// `Idempotent-Replayed: true`.
    Replayed = 1,
}

/// Reply bytes (see the module docs) of a rendered reply, into a buffer that is cleared first
/// (and keeps its capacity).
pub fn encode_reply_into(out: &mut Vec<u8>, reply: &idem_core::Reply) {
    out.clear();
    out.push(if reply.is_replay() {
        ReplyFlag::Replayed as u8
    } else {
        0
    });
    out.extend_from_slice(&u32::from(reply.status()).to_le_bytes());
    push_head(out, reply.headers().flat_map(|(n, v)| [n, v]));
    out.extend_from_slice(reply.body());
}

/// Context bytes (see the module docs) of a handler running under `context` with `key`,
/// into a buffer that is cleared first.
pub fn encode_context_into(out: &mut Vec<u8>, context: &idem_core::Context, key: &str) {
    out.clear();
    out.extend_from_slice(&(context.fence as f64).to_le_bytes());
    out.extend_from_slice(&to_ms(context.lease_expires).to_le_bytes());
    out.extend_from_slice(&context.attempt.to_le_bytes());
    out.push(u8::from(context.recovered));
    out.extend_from_slice(key.as_bytes());
}

/// A head of reply or write bytes: its byte length as a `u32`, then `items` as list text.
fn push_head<'a>(out: &mut Vec<u8>, items: impl Iterator<Item = &'a str>) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    for item in items {
        push_item_bytes(out, item);
    }
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// The reply bytes of a rendered reply.
pub fn encode_reply(reply: &idem_core::Reply) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + reply.body().len());
    encode_reply_into(&mut out, reply);
    out
}

// --- The Durable Object wire format -----------------------------------------------------
//
// A worker identifies the request and sends its ticket (record key, fingerprint, key data)
// to the Durable Object that owns the key; the object claims next to its storage and sends
// back what it claimed. Both travel as postcard bytes of the core's serde types, prefixed
// with a tag byte.

const WIRE_TICKET: u8 = b'T';
const WIRE_CLAIMED: u8 = b'C';

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

/// Encodes a ticket for the Durable Object that owns its key.
pub fn encode_ticket(ticket: &Ticket) -> Vec<u8> {
    tagged(WIRE_TICKET, ticket)
}

/// Decodes a ticket (`IDEM-JS-2`).
pub fn decode_ticket(bytes: &[u8]) -> Result<Ticket, ErrorParts> {
    untag(WIRE_TICKET, "ticket", bytes)
}

/// Encodes what a Durable Object claimed, for the worker that asked.
pub fn encode_claimed(claimed: &Claimed) -> Vec<u8> {
    tagged(WIRE_CLAIMED, claimed)
}

/// Decodes what a Durable Object claimed (`IDEM-JS-2`). An object that claimed answers an
/// execute as `Claimed::Execute`, with its write applied; an execute inside
/// `Claimed::Done` would carry a write nobody applied, and is refused like damaged bytes.
pub fn decode_claimed(bytes: &[u8]) -> Result<Claimed, ErrorParts> {
    match untag(WIRE_CLAIMED, "claim", bytes)? {
        Claimed::Done(idem_core::Decision::Execute { .. }) => Err(ErrorParts::wire("claim")),
        claimed => Ok(claimed),
    }
}

// --- The client ---------------------------------------------------------------------------

/// The client's retry options as read from JavaScript (`retry: { base, cap, maxAttempts,
/// deadline }`, ms), each `None` for the default.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RetryOptions {
    /// `base`.
    pub base: Option<f64>,
    /// `cap`.
    pub cap: Option<f64>,
    /// `maxAttempts`.
    pub max_attempts: Option<f64>,
    /// `deadline`.
    pub deadline: Option<f64>,
}

/// The client's retry policy (`IDEM-JS-1` for a bad value).
pub fn retry_policy(o: &RetryOptions) -> Result<idem_core::RetryPolicy, ErrorParts> {
    let d = idem_core::RetryPolicy::default();
    let attempts = match o.max_attempts {
        None => d.max_attempts,
        Some(n) if whole(n) && (1.0..=1_000_000.0).contains(&n) => n as u32,
        Some(_) => {
            return Err(ErrorParts::options(
                "retry.maxAttempts must be a whole number from 1 to 1000000",
            ))
        }
    };
    Ok(idem_core::RetryPolicy {
        base: duration("retry.base", o.base, d.base)?,
        cap: duration("retry.cap", o.cap, d.cap)?,
        max_attempts: attempts,
        deadline: duration("retry.deadline", o.deadline, d.deadline)?,
    })
}

/// What `idempotentFetch` resolves to, as JavaScript reads it: its result's `outcome` is
/// `outcomeNames()[outcome]` ([`FetchOutcome::name`]).
#[wasm_bindgen::prelude::wasm_bindgen]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchOutcome {
    /// A final 2xx or 3xx.
    Completed = 0,
    /// A deterministic 4xx.
    Rejected = 1,
    /// Given up, and nothing can have been processed.
    Failed = 2,
    /// Given up, and some attempt may have been processed.
    Undetermined = 3,
}

impl FetchOutcome {
    /// Every outcome, by index.
    pub const ALL: [FetchOutcome; 4] = [
        FetchOutcome::Completed,
        FetchOutcome::Rejected,
        FetchOutcome::Failed,
        FetchOutcome::Undetermined,
    ];

    /// Its name in the result of `idempotentFetch`.
    pub fn name(self) -> &'static str {
        match self {
            FetchOutcome::Completed => "completed",
            FetchOutcome::Rejected => "rejected",
            FetchOutcome::Failed => "failed",
            FetchOutcome::Undetermined => "undetermined",
        }
    }

    fn of_class(class: idem_core::Completion) -> FetchOutcome {
        match class {
            idem_core::Completion::Succeeded => FetchOutcome::Completed,
            idem_core::Completion::Rejected => FetchOutcome::Rejected,
        }
    }

    /// The outcome of an entry that is over, or `None` while it is not.
    pub fn of_state(s: &idem_core::EntryState) -> Option<FetchOutcome> {
        use idem_core::EntryState as S;
        match s {
            S::Answered { class, .. } | S::Processed { class, .. } => {
                Some(FetchOutcome::of_class(*class))
            }
            S::Failed { .. } => Some(FetchOutcome::Failed),
            S::Undetermined { .. } => Some(FetchOutcome::Undetermined),
            _ => None,
        }
    }

    /// The outcome a next step ends the interaction with, or `None` for a retry.
    pub fn of_next(n: &idem_core::NextStep) -> Option<FetchOutcome> {
        use idem_core::NextStep as N;
        match n {
            N::Complete { class, .. } => Some(FetchOutcome::of_class(*class)),
            N::Failed { .. } => Some(FetchOutcome::Failed),
            N::Undetermined { .. } => Some(FetchOutcome::Undetermined),
            N::Retry { .. } => None,
        }
    }
}

/// The names of the outcomes in index order, comma-separated.
pub fn outcome_names() -> String {
    let names: Vec<&str> = FetchOutcome::ALL.iter().map(|o| o.name()).collect();
    names.join(",")
}

/// What the outbox says to do after a result ([`idem_core::NextStep`]), as JavaScript reads
/// `Next.kind`.
#[wasm_bindgen::prelude::wasm_bindgen]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextKind {
    /// The interaction is complete: act on the response.
    Complete = 0,
    /// Send again after the backoff.
    Retry = 1,
    /// Given up, and nothing can have been processed.
    Failed = 2,
    /// Given up, and some attempt may have been processed.
    Undetermined = 3,
}

impl NextKind {
    /// The kind of a core next step.
    pub fn of(n: &idem_core::NextStep) -> NextKind {
        use idem_core::NextStep as N;
        match n {
            N::Complete { .. } => NextKind::Complete,
            N::Failed { .. } => NextKind::Failed,
            N::Undetermined { .. } => NextKind::Undetermined,
            N::Retry { .. } => NextKind::Retry,
        }
    }
}

/// Where an outbox entry stands ([`idem_core::EntryState`]), as JavaScript reads
/// `Outbox.state`.
#[wasm_bindgen::prelude::wasm_bindgen]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutboxState {
    /// Not sent yet.
    Created = 0,
    /// Sent, and no result reported: its effect is unknown.
    Sent = 1,
    /// Waiting to be sent again.
    Waiting = 2,
    /// A final response arrived.
    Answered = 3,
    /// The application acted on the final response.
    Processed = 4,
    /// Given up, and nothing can have been processed.
    Failed = 5,
    /// Given up, and some attempt may have been processed.
    Undetermined = 6,
}

impl OutboxState {
    /// The state of a core entry.
    pub fn of(s: &idem_core::EntryState) -> OutboxState {
        use idem_core::EntryState as S;
        match s {
            S::Created => OutboxState::Created,
            S::Sent => OutboxState::Sent,
            S::Waiting { .. } => OutboxState::Waiting,
            S::Answered { .. } => OutboxState::Answered,
            S::Processed { .. } => OutboxState::Processed,
            S::Failed { .. } => OutboxState::Failed,
            S::Undetermined { .. } => OutboxState::Undetermined,
        }
    }
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

/// A give-up reason's name for JavaScript.
pub fn give_up_name(g: idem_core::GiveUp) -> &'static str {
    match g {
        idem_core::GiveUp::Deadline => "deadline",
        idem_core::GiveUp::Budget => "budget",
        idem_core::GiveUp::KeyForgotten => "key-forgotten",
    }
}
