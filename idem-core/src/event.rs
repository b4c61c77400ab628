use core::fmt;

/// Something a host should log or count (`IDEM-EVT-1`). Every decision and every completion
/// yields exactly one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum Event {
    /// A new key was claimed; the handler runs.
    Executed,
    /// A lease had expired and this attempt took over with a new fencing number.
    TookOver {
        /// The new fencing number.
        fence: u64,
    },
    /// A stored response was replayed.
    Replayed,
    /// A duplicate arrived while the first attempt held the lease.
    InProgress,
    /// The key was reused with a different payload.
    Mismatch,
    /// A request presented a key whose response has expired: a client bug or a replay of a
    /// captured request. Security-relevant.
    TombstoneHit,
    /// A request hit a key held as outcome-unknown.
    OutcomeUnknownHit,
    /// A request was rejected before reaching the engine (bad key, full store, …).
    Rejected,
    /// A final response was stored.
    Completed,
    /// The key was released after a retryable outcome.
    Released,
    /// An unknown outcome was recorded under the configured policy.
    OutcomeUnknown,
    /// A completion or heartbeat came under a stale lease and was refused.
    FencedOut,
    /// A lease was extended by a heartbeat.
    Extended,
    /// A time or counter key named another request's record (different payload, or a wrapped
    /// counter): refused.
    Collision,
    /// A key older than the server remembers (a time key past its age, a counter below the
    /// low-water mark): a late retry or a replayed capture. Security-relevant.
    Stale,
    /// A token that this server did not issue. Security-relevant: someone is guessing.
    Forged,
    /// An inbox delivery of a message already processed, acknowledged without processing.
    Duplicate,
}

impl Event {
    /// Every event, once (`TookOver` with fence 0 stands for all its fences), for hosts that
    /// register counters up front.
    pub const ALL: &'static [Event] = &[
        Event::Executed,
        Event::TookOver { fence: 0 },
        Event::Replayed,
        Event::InProgress,
        Event::Mismatch,
        Event::TombstoneHit,
        Event::OutcomeUnknownHit,
        Event::Rejected,
        Event::Completed,
        Event::Released,
        Event::OutcomeUnknown,
        Event::FencedOut,
        Event::Extended,
        Event::Collision,
        Event::Stale,
        Event::Forged,
        Event::Duplicate,
    ];

    /// A stable name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Executed => "executed",
            Event::TookOver { .. } => "took-over",
            Event::Replayed => "replayed",
            Event::InProgress => "in-progress",
            Event::Mismatch => "mismatch",
            Event::TombstoneHit => "tombstone-hit",
            Event::OutcomeUnknownHit => "outcome-unknown-hit",
            Event::Rejected => "rejected",
            Event::Completed => "completed",
            Event::Released => "released",
            Event::OutcomeUnknown => "outcome-unknown",
            Event::FencedOut => "fenced-out",
            Event::Extended => "extended",
            Event::Collision => "collision",
            Event::Stale => "stale",
            Event::Forged => "forged",
            Event::Duplicate => "duplicate",
        }
    }

    /// Whether the event deserves a security log line: a tombstone hit or a mismatch may be
    /// an attacker replaying or probing captured keys; a fenced-out completion means two
    /// handlers ran for one key.
    pub fn is_security_relevant(&self) -> bool {
        matches!(
            self,
            Event::TombstoneHit | Event::Mismatch | Event::FencedOut | Event::Stale | Event::Forged
        )
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::Event;

    /// An exhaustive match: a new variant fails to compile here until it gets an index, and
    /// then fails the test until `Event::ALL` lists it.
    fn index(e: Event) -> usize {
        match e {
            Event::Executed => 0,
            Event::TookOver { .. } => 1,
            Event::Replayed => 2,
            Event::InProgress => 3,
            Event::Mismatch => 4,
            Event::TombstoneHit => 5,
            Event::OutcomeUnknownHit => 6,
            Event::Rejected => 7,
            Event::Completed => 8,
            Event::Released => 9,
            Event::OutcomeUnknown => 10,
            Event::FencedOut => 11,
            Event::Extended => 12,
            Event::Collision => 13,
            Event::Stale => 14,
            Event::Forged => 15,
            Event::Duplicate => 16,
        }
    }

    #[test]
    fn all_lists_every_event_once() {
        // IDEM-EVT-1
        let mut seen = [false; 17];
        for e in Event::ALL {
            assert!(!seen[index(*e)], "{e} listed twice");
            seen[index(*e)] = true;
        }
        assert!(seen.iter().all(|s| *s));
        let mut names: std::vec::Vec<&str> = Event::ALL.iter().map(Event::name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Event::ALL.len());
    }
}
