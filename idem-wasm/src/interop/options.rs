//! The engine options: their names, as JavaScript passes them, and the [`Policy`] they make
//! (engine, key kind, fingerprint, in-flight policy, guarded methods, response size limit),
//! with a `RangeError` citing its requirement for a value the core or this layer refuses.
//! Durations and times are JavaScript numbers of milliseconds.
//!
//! One parser per option the JavaScript side may pass, each next to the requirement it
//! cites: the file is long because the options are many, not because it does several things.

use super::{ErrorParts, CODE_OPTIONS};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::time::Duration;
use idem_core::{
    Config, CounterConfig, FingerprintSpec, InFlight, JsonMode, KeyKind, Policy, TimeKeyConfig,
    TokenSecret, UnixMillis, UnknownOutcomePolicy, UuidVersion,
};

/// The longest duration accepted in options: about 285,000 years in milliseconds, far
/// beyond any retention, and exactly representable as a JavaScript number.
const MAX_DURATION_MS: u64 = 1 << 53;

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

/// Whether `n` is a whole number (within the range of `i64`; larger values are refused by
/// every caller anyway).
pub(super) fn whole(n: f64) -> bool {
    n == (n as i64) as f64
}

pub(super) fn duration(
    name: &str,
    ms: Option<f64>,
    default: Duration,
) -> Result<Duration, ErrorParts> {
    let Some(ms) = ms else { return Ok(default) };
    if !(whole(ms) && ms > 0.0 && ms <= MAX_DURATION_MS as f64) {
        return Err(ErrorParts::about(
            CODE_OPTIONS,
            name,
            " must be a whole number of milliseconds greater than zero",
        ));
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

/// A counter number or epoch as decimal text (64-bit numbers do not fit a JavaScript
/// number): `IDEM-CTR-1` for anything else.
pub fn decimal(name: &str, text: &str) -> Result<u64, ErrorParts> {
    // Digits only (no sign), at least one, within a u64: as `str::parse` with the sign
    // refused, in a loop that is smaller in the client's module.
    let n = text.bytes().try_fold(0u64, |n, b| {
        let digit = u64::from(b.wrapping_sub(b'0'));
        (digit < 10).then_some(())?;
        n.checked_mul(10)?.checked_add(digit)
    });
    n.filter(|_| !text.is_empty())
        .ok_or_else(|| ErrorParts::about("IDEM-CTR-1", name, " must be a decimal number"))
}

/// `n` as decimal text, [`decimal`]'s inverse, written without `core::fmt`.
pub fn decimal_text(n: u64) -> String {
    let (digits, at) = super::layout::decimal_digits(n);
    // ASCII digits only.
    String::from(core::str::from_utf8(&digits[at..]).unwrap_or_default())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_read_as_str_parse_reads_digits() {
        for text in ["0", "007", "18446744073709551615", "42"] {
            assert_eq!(decimal("n", text).ok(), text.parse::<u64>().ok(), "{text}");
            assert_eq!(
                decimal_text(decimal("n", text).unwrap()),
                text.trim_start_matches('0').max("0")
            );
        }
        for bad in ["", "+1", "-1", "1 ", "18446744073709551616", "1e3", "٣"] {
            let e = decimal("epoch", bad).unwrap_err();
            assert_eq!(
                (e.code, e.message.as_str()),
                ("IDEM-CTR-1", "epoch must be a decimal number")
            );
        }
    }
}
