use core::fmt;
use core::time::Duration;

/// Milliseconds since the Unix epoch, as told by the caller.
///
/// The engine never reads a clock. Hosts pass `now` into every call; the engine tolerates
/// time that jumps backwards or forwards (a jump can only shorten or lengthen leases and
/// retention, never make an attempt skip the fencing check).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    /// The epoch itself.
    pub const ZERO: UnixMillis = UnixMillis(0);

    /// This instant plus `d`, saturating at the end of time.
    #[inline]
    pub fn saturating_add(self, d: Duration) -> UnixMillis {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        UnixMillis(self.0.saturating_add(ms))
    }

    /// Milliseconds from `self` until `later`, zero if `later` is not later.
    #[inline]
    pub fn until(self, later: UnixMillis) -> u64 {
        later.0.saturating_sub(self.0)
    }

    /// The current system time (only with the `std` feature).
    #[cfg(feature = "std")]
    pub fn now() -> UnixMillis {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        UnixMillis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

impl fmt::Display for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
