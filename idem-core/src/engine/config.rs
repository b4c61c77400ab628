//! The engine's settings: lease, retention, the unknown-outcome policy, and the `Retry-After`
//! bounds.

use super::*;

/// What to do with an outcome whose effect is unknown (`IDEM-OUT-3`): the handler crashed,
/// timed out, or a dependency failed in a way that may or may not have taken effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnknownOutcomePolicy {
    /// End the lease at once: the next retry takes over with `recovered: true` and must
    /// reconcile before acting (the default: it never replays an error the client cannot act
    /// on, and never runs blindly twice).
    #[default]
    Reexecute,
    /// Store the response (if there is one) and replay it, like a final outcome.
    Store,
    /// Hold the key as outcome-unknown: retries are refused (`outcome-unknown`) until the
    /// record is reconciled or its key expires.
    Hold,
}

/// Engine settings. See `spec/README.md` ("Defaults") for the reason behind each default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// How long a completed response is replayed (`IDEM-TTL-1`). Default 24 hours.
    pub response_ttl: Duration,
    /// How long a key is remembered, at least `response_ttl` (`IDEM-TTL-2`). Default 7 days.
    pub key_ttl: Duration,
    /// How long a claim lasts before another attempt may take over (`IDEM-LEASE-1`).
    /// Default 60 seconds.
    pub lease: Duration,
    /// What an unknown outcome does (`IDEM-OUT-3`). Default [`UnknownOutcomePolicy::Reexecute`].
    pub unknown_outcome: UnknownOutcomePolicy,
    /// The longest `Retry-After` an in-progress answer carries (`IDEM-CONC-3`): the time
    /// left of the lease, but never more than this, so that a client whose retry deadline is
    /// shorter than a lease comes back while the first attempt finishes. Default
    /// [`DEFAULT_MAX_RETRY_AFTER`].
    pub max_retry_after: Duration,
}

/// The `Retry-After`, in seconds, of an answer whose cause passes in a moment: a key or a
/// counter session fought over by many requests, a store that failed before anything ran, a
/// counter gap or a held outcome the client may ask about again.
pub const RETRY_SOON_SECS: u64 = 1;

/// The default of [`Config::max_retry_after`]: a few seconds, so that a retry comes back
/// while a typical handler finishes, however long its lease.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(2);

impl Default for Config {
    fn default() -> Self {
        Config {
            response_ttl: Duration::from_secs(24 * 3600),
            key_ttl: Duration::from_secs(7 * 24 * 3600),
            lease: Duration::from_secs(60),
            unknown_outcome: UnknownOutcomePolicy::Reexecute,
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
        }
    }
}

impl Config {
    /// The `Retry-After` of a request whose key is held by a lease ending at
    /// `lease_expires` (`IDEM-CONC-3`): the whole seconds left, at least one and at most
    /// [`Config::max_retry_after`].
    pub fn retry_after(&self, now: UnixMillis, lease_expires: UnixMillis) -> u64 {
        let cap = self.max_retry_after.as_secs().max(RETRY_SOON_SECS);
        now.until(lease_expires)
            .div_ceil(1000)
            .clamp(RETRY_SOON_SECS, cap)
    }
}

/// A configuration the engine refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `key_ttl` is shorter than `response_ttl`: a key would be forgotten while its response
    /// is still meant to be replayed.
    KeyTtlShorterThanResponseTtl,
    /// `lease` is longer than `key_ttl`: a lease would outlive the key it holds
    /// (`IDEM-LEASE-4`).
    LeaseLongerThanKeyTtl,
    /// A duration is zero.
    ZeroDuration(&'static str),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::KeyTtlShorterThanResponseTtl => {
                f.write_str("key_ttl must be at least response_ttl")
            }
            ConfigError::LeaseLongerThanKeyTtl => f.write_str("lease must not exceed key_ttl"),
            ConfigError::ZeroDuration(name) => write!(f, "{name} must be greater than zero"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ConfigError {}
