//! Unix-time keys: a client timestamp in milliseconds, optionally with a client id
//! (`IDEM-TIME-1` to `IDEM-TIME-5`).

use crate::engine::{Attempt, Decision, Engine, RejectReason};
use crate::key::{RecordKey, Scope};
use crate::kind::KindKeyError;
use crate::kind::{kind_scope, parse_decimal, valid_client_id, KindConfigError};
use crate::record::Record;
use crate::time::UnixMillis;
use alloc::format;
use alloc::string::String;
use core::time::Duration;

/// A parsed time key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TimeKey {
    /// The client that chose the timestamp, if the key names one.
    pub client: Option<String>,
    /// The timestamp.
    pub at: UnixMillis,
}

/// Parses a time key: `<millis>` or `<client>:<millis>`, where `millis` is an unsigned
/// decimal number of milliseconds since the Unix epoch (at most 64 bits) and `client` is 1
/// to 64 characters of `A-Z a-z 0-9 - . _ ~` (`IDEM-TIME-1`). The key is what
/// [`parse_opaque_strict`](crate::parse_opaque_strict) or
/// [`parse_opaque_lenient`](crate::parse_opaque_lenient) took out of the header.
pub fn parse_time_key(key: &str) -> Result<TimeKey, KindKeyError> {
    if key.is_empty() {
        return Err(KindKeyError::Empty);
    }
    let (client, millis) = match key.split_once(':') {
        None => (None, key),
        Some((client, millis)) => {
            if !valid_client_id(client) {
                return Err(KindKeyError::BadClientId);
            }
            (Some(String::from(client)), millis)
        }
    };
    let at = UnixMillis(parse_decimal(millis, "timestamp")?);
    Ok(TimeKey { client, at })
}

/// A time key as a request presents it: [`parse_time_key`] of `key`, with the client that
/// `client` names when the key names none: a host's client header beside the key, so that
/// clients sending bare timestamps are told apart (`IDEM-TIME-1`). A key that names its own
/// client keeps it; a client header that is not a client id is refused as the key would be.
pub fn time_key_of(key: &str, client: Option<&str>) -> Result<TimeKey, KindKeyError> {
    let mut k = parse_time_key(key)?;
    if let (None, Some(c)) = (&k.client, client) {
        let c = c.trim();
        if !valid_client_id(c) {
            return Err(KindKeyError::BadClientId);
        }
        k.client = Some(String::from(c));
    }
    Ok(k)
}

/// Settings for time keys. See `spec/KINDS.md` for the reasons behind the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeKeyConfig {
    /// How far ahead of the server's clock a timestamp may be (`IDEM-TIME-2`). Default 5
    /// minutes: more than the skew of any clock kept by NTP, less than would let a client
    /// with a wrong clock pile up keys.
    pub max_ahead: Duration,
    /// How old a timestamp may be (`IDEM-TIME-3`). Default 24 hours, the default response
    /// retention: a retry is either answered from the record or refused as stale.
    pub max_age: Duration,
}

impl Default for TimeKeyConfig {
    fn default() -> Self {
        TimeKeyConfig {
            max_ahead: Duration::from_secs(5 * 60),
            max_age: Duration::from_secs(24 * 3600),
        }
    }
}

impl TimeKeyConfig {
    /// These bounds fitted to a key retention of `key_ttl`, as a policy with time keys
    /// requires ([`Policy::with_keys`](crate::Policy::with_keys): `max_age + max_ahead <=
    /// key_ttl`): the clock skew at most a quarter of the retention,
    /// the maximum age at most what is left of it (and at least a millisecond). A host hands
    /// its settings here instead of clamping them itself.
    pub fn fit(self, key_ttl: Duration) -> TimeKeyConfig {
        let max_ahead = self.max_ahead.min(key_ttl / 4);
        let max_age = self
            .max_age
            .min(key_ttl.saturating_sub(max_ahead))
            .max(Duration::from_millis(1));
        TimeKeyConfig { max_ahead, max_age }
    }
}

/// The rules of time keys: an [`Engine`] plus the time window.
///
/// A policy whose keys are timestamps ([`KeyKind::Time`](crate::KeyKind::Time)) parses the
/// key ([`parse_time_key`]); its machine checks the window before it reads anything
/// ([`TimeKeys::check`]), then decides on the record under [`TimeKeys::record_key`]
/// ([`TimeKeys::decide`]). Completion, heartbeats and expiry go through
/// [`TimeKeys::engine`] as for opaque keys. [`Engine::decide`] alone would skip the window
/// and replay or run what this type refuses.
///
/// A timestamp is a cheap key, but two clients (or one client twice) can pick the same
/// millisecond for different requests, and a server that forgets old keys must not let an old
/// timestamp run again. So a time key is accepted only inside a window around `now`:
///
/// * at most [`TimeKeyConfig::max_ahead`] in the future (clock skew), else 400
///   `key-from-future`;
/// * younger than [`TimeKeyConfig::max_age`], else 412 `key-stale` (as OASIS Repeatable
///   Requests answers a stale `Repeatability-First-Sent`).
///
/// [`TimeKeys::new`] requires `max_age + max_ahead <= key_ttl`. A record created at `c` for a
/// timestamp `t` was accepted with `t <= c + max_ahead`, and lives until at least
/// `c + key_ttl >= t - max_ahead + key_ttl >= t + max_age`; a later attempt with `t` is
/// accepted only while `now < t + max_age`. So whenever `t` is accepted its record (if any)
/// is still there: a key whose record was purged can never run again. The argument needs a
/// clock that does not jump back by more than `key_ttl - max_age - max_ahead` after a purge
/// (six days with the defaults); see `spec/KINDS.md`.
///
/// Inside the window the engine decides as for any key, with one difference: the same
/// (scope, client, timestamp) with a different payload is a **collision**
/// ([`RejectReason::Collision`], 422 `key-collision`), never a replay and never an execution.
#[derive(Clone, Debug)]
pub(crate) struct TimeKeys {
    engine: Engine,
    max_ahead_ms: u64,
    max_age_ms: u64,
}

impl TimeKeys {
    /// Time keys over `engine`; refuses a window that would outlive the key retention.
    pub(crate) fn new(engine: Engine, config: TimeKeyConfig) -> Result<TimeKeys, KindConfigError> {
        if config.max_age.is_zero() {
            return Err(KindConfigError::ZeroDuration("max_age"));
        }
        if config
            .max_age
            .checked_add(config.max_ahead)
            .is_none_or(|d| d > engine.config().key_ttl)
        {
            return Err(KindConfigError::ExceedsKeyRetention("max_age + max_ahead"));
        }
        Ok(TimeKeys {
            max_ahead_ms: millis(config.max_ahead),
            max_age_ms: millis(config.max_age),
            engine,
        })
    }

    /// The engine (for completion, heartbeats and expiry).
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Where the record for `key` lives: in the time-key scope of `scope` (`IDEM-KIND-1`),
    /// under the client id and the timestamp as a canonical decimal, so `007` and `7` name
    /// the same record.
    pub(crate) fn record_key(&self, scope: &Scope, key: &TimeKey) -> RecordKey {
        RecordKey::new(
            kind_scope(scope, "time"),
            format!("{}:{}", key.client.as_deref().unwrap_or(""), key.at.0),
        )
    }

    /// Whether a key with timestamp `at` is still ahead of the window at `now` (refused as
    /// from the future).
    pub(crate) fn ahead_of_window(&self, now: UnixMillis, at: UnixMillis) -> bool {
        now.until(at) > self.max_ahead_ms
    }

    /// Whether `key` is inside the window at `now` (`IDEM-TIME-2`, `IDEM-TIME-3`).
    pub(crate) fn check(&self, now: UnixMillis, key: &TimeKey) -> Result<(), RejectReason> {
        if self.ahead_of_window(now, key.at) {
            return Err(RejectReason::FromFuture {
                ahead_ms: now.until(key.at),
            });
        }
        if key.at.until(now) >= self.max_age_ms {
            return Err(RejectReason::Stale);
        }
        Ok(())
    }

    /// Decides an attempt whose `attempt.key` is [`TimeKeys::record_key`] of `key`, given the
    /// record read for it. Outside the window: rejected. Inside: as [`Engine::decide`],
    /// except that a different payload is a [`RejectReason::Collision`] (`IDEM-TIME-4`).
    pub(crate) fn decide(
        &self,
        now: UnixMillis,
        key: &TimeKey,
        attempt: &Attempt<'_>,
        stored: Option<&Record>,
    ) -> Decision {
        if let Err(reason) = self.check(now, key) {
            return Decision::Rejected(reason);
        }
        match self.engine.decide(now, attempt, stored) {
            Decision::Mismatch { .. } => Decision::Rejected(RejectReason::Collision),
            other => other,
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
