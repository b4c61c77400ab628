//! Wrapping counter keys (`IDEM-CTR-1` to `IDEM-CTR-13`): per client, an epoch and a
//! sequence number of N bits, as in Raft client sessions and Kafka's idempotent producer.

use crate::engine::SharedOutcome;
use crate::engine::{Config, Engine, Outcome, RejectReason, UnknownOutcomePolicy, RETRY_SOON_SECS};
use crate::fingerprint::Fingerprint;
use crate::key::{RecordKey, Scope};
use crate::kind::{kind_scope, parse_decimal, valid_client_id, KindConfigError, KindKeyError};
use crate::record::{Precondition, Record, RecordState, Write, WriteOp};
use crate::response::StoredResponse;
use crate::session::{mask, max_window, CounterSession, CounterSlot, SlotState};
use crate::store::Finish;
use crate::time::UnixMillis;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::cmp::Ordering;
use core::fmt;

mod rules;
mod sequence;

pub(crate) use rules::Counters;
pub use sequence::CounterSequence;

/// A parsed counter key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct CounterKey {
    /// The client (1 to 64 characters of `A-Z a-z 0-9 - . _ ~`).
    pub client: String,
    /// The epoch the server gave the client's session.
    pub epoch: u64,
    /// The sequence number, below 2^bits.
    pub seq: u64,
}

/// Parses a counter key `<client>:<epoch>:<seq>` with decimal epoch and sequence, the
/// sequence below 2^`bits` (`IDEM-CTR-1`).
pub fn parse_counter_key(key: &str, bits: u8) -> Result<CounterKey, KindKeyError> {
    if key.is_empty() {
        return Err(KindKeyError::Empty);
    }
    let mut parts = key.split(':');
    let (Some(client), Some(epoch), Some(seq), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(KindKeyError::Malformed);
    };
    if !valid_client_id(client) {
        return Err(KindKeyError::BadClientId);
    }
    let epoch = parse_decimal(epoch, "epoch")?;
    let seq = parse_decimal(seq, "sequence number")?;
    if seq > mask(bits) {
        return Err(KindKeyError::SequenceBeyondBits { seq, bits });
    }
    Ok(CounterKey {
        client: String::from(client),
        epoch,
        seq,
    })
}

/// RFC 1982 comparison of two `bits`-bit serial numbers: `Some(Less)` when `a` comes before
/// `b`, `None` when the comparison is undefined (they are exactly 2^(bits-1) apart) or a
/// number does not fit in `bits`.
pub fn serial_cmp(a: u64, b: u64, bits: u8) -> Option<Ordering> {
    let m = mask(bits);
    if a > m || b > m || !(1..=64).contains(&bits) {
        return None;
    }
    let half = 1u64 << (bits - 1);
    match b.wrapping_sub(a) & m {
        0 => Some(Ordering::Equal),
        d if d < half => Some(Ordering::Less),
        d if d > half => Some(Ordering::Greater),
        _ => None,
    }
}

/// Counter settings. See `spec/KINDS.md` for the reasons behind the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterConfig {
    /// Width of the sequence number, 8 to 64 (`IDEM-CTR-1`). Default 32, as Kafka's producer
    /// sequence: wraps are rare but happen, and the rules hold across them.
    pub bits: u8,
    /// Slots in the window: how many results are retained, and how far a client may run
    /// ahead (`IDEM-CTR-8` to `IDEM-CTR-10`). 1 to min(2^(bits-2),
    /// [`MAX_WINDOW`](crate::MAX_WINDOW)). Default 8: more than Kafka's 5 requests in
    /// flight, and a session record stays small.
    pub window: u32,
}

impl Default for CounterConfig {
    fn default() -> Self {
        CounterConfig {
            bits: 32,
            window: 8,
        }
    }
}

impl CounterConfig {
    fn check(&self) -> Result<(), KindConfigError> {
        if !(8..=64).contains(&self.bits) {
            return Err(KindConfigError::BitsOutOfRange(self.bits));
        }
        let max = max_window(self.bits);
        if self.window == 0 || self.window > max {
            return Err(KindConfigError::WindowOutOfRange {
                window: self.window,
                max,
            });
        }
        Ok(())
    }
}

/// One request with a counter key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CounterAttempt<'a> {
    /// The host's scope (principal, method, route, as for opaque keys).
    pub(crate) scope: &'a Scope,
    /// The key.
    pub(crate) key: &'a CounterKey,
    /// The request's fingerprint.
    pub(crate) fingerprint: &'a Fingerprint,
    /// The client's low-water mark, if it sent one: every response below it has been
    /// received (`IDEM-CTR-11`).
    pub(crate) low_water: Option<u64>,
}

/// The right to run the handler for one slot, fenced by the slot's fence.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CounterLease {
    /// The session record.
    pub session: RecordKey,
    /// The epoch the slot belongs to.
    pub epoch: u64,
    /// The sequence number.
    pub seq: u64,
    /// The slot's fencing number for this lease.
    pub fence: u64,
    /// When the lease ends.
    pub expires: UnixMillis,
}

/// The answer to one counter request.
#[must_use = "a CounterDecision must be acted on: an Execute carries a claim that must be applied"]
#[derive(Clone, Debug, PartialEq, Eq)]
// Returned once and matched at once; the request machine boxes its execute before it
// carries the claim further.
#[allow(clippy::large_enum_variant)]
pub(crate) enum CounterDecision {
    /// Apply `write`, then run the handler under `lease`; a lost race means decide again.
    Execute {
        /// The slot lease.
        lease: CounterLease,
        /// The claim.
        write: Write,
        /// Whether an earlier attempt may have started the work (a takeover).
        recovered: bool,
    },
    /// Send the slot's stored response again.
    Replay(Arc<StoredResponse>),
    /// Another attempt holds the slot; retry after this many seconds.
    InProgress {
        /// Seconds until the slot's lease ends, at least 1.
        retry_after_secs: u64,
    },
    /// Refused; nothing runs.
    Rejected(RejectReason),
}

/// Why a session cannot be opened, or a slot completed, extended or resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CounterError {
    /// The client id is not 1 to 64 characters of `A-Z a-z 0-9 - . _ ~`.
    BadClientId,
    /// A sequence number does not fit in the session's bits.
    SequenceBeyondBits {
        /// The number.
        seq: u64,
        /// The width.
        bits: u8,
    },
    /// The lease no longer holds its slot: taken over, left the window, another epoch, or
    /// the session is gone (`IDEM-CTR-13`). Nothing may be written.
    FencedOut,
    /// A response status outside 100-599.
    InvalidStatus(u16),
    /// A heartbeat after the lease ended.
    LeaseExpired,
    /// A reconciliation of a slot that is not outcome-unknown.
    NotOutcomeUnknown,
    /// The session kept changing under its opening (a session operation); try again.
    Contended,
}

impl fmt::Display for CounterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CounterError::BadClientId => {
                f.write_str("the client id must be 1 to 64 characters of A-Z a-z 0-9 - . _ ~")
            }
            CounterError::SequenceBeyondBits { seq, bits } => {
                write!(f, "sequence number {seq} does not fit in {bits} bits")
            }
            CounterError::FencedOut => f.write_str("the lease no longer holds its slot"),
            CounterError::InvalidStatus(s) => write!(f, "invalid response status {s}"),
            CounterError::LeaseExpired => f.write_str("the lease has expired"),
            CounterError::NotOutcomeUnknown => f.write_str("the slot is not outcome-unknown"),
            CounterError::Contended => f.write_str("the session kept changing; try again"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for CounterError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(record: &mut Option<Record>, write: Write) {
        write.apply_to(record);
    }

    /// A slot held as outcome-unknown is refused and blocks the window until it is
    /// reconciled: only a held slot can be reconciled, a final outcome is then replayed, and
    /// the window moves on.
    #[test]
    fn a_held_slot_is_reconciled_by_resolve() {
        // IDEM-OUT-3 IDEM-CTR-10
        let engine = Engine::new(Config {
            unknown_outcome: UnknownOutcomePolicy::Hold,
            ..Config::default()
        })
        .unwrap();
        let counters = Counters::new(engine, CounterConfig { bits: 8, window: 4 }).unwrap();
        let scope = Scope::new("alice", "POST", "/t");
        let key = counters.session_key(&scope, "c1");
        // The session's record, as a store keeps it.
        let mut store = None;
        let now = UnixMillis(1_700_000_000_000);
        let opened = counters.open(now, &scope, "c1", 0, None, 42).unwrap();
        assert_eq!(opened.write.key, key);
        apply(&mut store, opened.write);
        let counter_key = |seq: u64| CounterKey {
            client: String::from("c1"),
            epoch: opened.epoch,
            seq,
        };
        let decide = |store: &Option<Record>, seq: u64| {
            let k = counter_key(seq);
            let f = Fingerprint::from_digest([seq as u8; 32]);
            let attempt = CounterAttempt {
                scope: &scope,
                key: &k,
                fingerprint: &f,
                low_water: None,
            };
            counters.decide(now, &attempt, store.as_ref())
        };
        let run = |store: &mut Option<Record>, seq: u64, outcome: Outcome| {
            let CounterDecision::Execute { lease, write, .. } = decide(store, seq) else {
                panic!("{seq} runs")
            };
            apply(store, write);
            let (write, finish) = counters
                .complete_shared(now, &lease, SharedOutcome::from(outcome), store.as_ref())
                .unwrap();
            apply(store, write);
            finish
        };
        let ok = |body: &str| {
            Outcome::Final(StoredResponse {
                status: 200,
                headers: Vec::new(),
                body: body.as_bytes().to_vec(),
            })
        };
        assert_eq!(
            run(&mut store, 0, Outcome::Unknown(None)),
            Finish::OutcomeUnknown
        );
        for seq in 1..4 {
            assert_eq!(run(&mut store, seq, ok("x")), Finish::Stored);
        }
        assert_eq!(
            decide(&store, 0),
            CounterDecision::Rejected(RejectReason::OutcomeUnknown)
        );
        assert!(matches!(
            decide(&store, 4),
            CounterDecision::Rejected(RejectReason::WindowFull { .. })
        ));
        assert_eq!(
            counters
                .resolve(now, &key, 1, Outcome::Retryable, store.as_ref())
                .unwrap_err(),
            CounterError::NotOutcomeUnknown
        );
        let write = counters
            .resolve(now, &key, 0, ok("a"), store.as_ref())
            .unwrap();
        apply(&mut store, write);
        assert!(matches!(
            decide(&store, 0),
            CounterDecision::Replay(r) if r.body == b"a"
        ));
        assert_eq!(run(&mut store, 4, ok("y")), Finish::Stored);
    }
}
