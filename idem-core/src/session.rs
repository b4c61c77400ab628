//! The session of a counter-key client as its record holds it: the epoch, the window and its
//! slots (`IDEM-CTR-12`). The rules that read and write it are the counter rules'
//! (`counter.rs`); this is their data, below the record that keeps it.

use crate::fingerprint::Fingerprint;
use crate::response::StoredResponse;
use crate::time::UnixMillis;
use alloc::sync::Arc;
use alloc::vec::Vec;

/// The largest counter window, whatever the width: a session record holds up to this many
/// responses.
pub const MAX_WINDOW: u32 = 1024;

/// All ones in the low `bits` bits: the largest sequence number of that width.
pub(crate) fn mask(bits: u8) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// The largest window of `bits`-bit sequence numbers: a quarter of the range, so that
/// every serial comparison in the window is defined, and at most [`MAX_WINDOW`].
pub(crate) fn max_window(bits: u8) -> u32 {
    let quarter = 1u64 << (bits.clamp(2, 64) - 2);
    quarter.min(u64::from(MAX_WINDOW)) as u32
}

/// The session of one counter-key client, as its record holds it
/// ([`RecordState::Counter`](crate::RecordState::Counter)): the epoch, the window and its slots (`IDEM-CTR-12`). The rules
/// that read and write it are in `spec/KINDS.md`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CounterSession {
    /// The current epoch.
    pub epoch: u64,
    /// Width of sequence numbers, fixed for the epoch.
    pub bits: u8,
    /// Window size, fixed for the epoch.
    pub window: u32,
    /// The low-water mark: sequences serially below it are stale.
    pub low: u64,
    /// One past the highest sequence claimed.
    pub next: u64,
    /// The claimed sequences in `[low, next)`, in serial order from `low`.
    pub slots: Vec<CounterSlot>,
}

/// One claimed sequence number.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CounterSlot {
    /// The sequence number.
    pub seq: u64,
    /// Fencing number of the current (or last) lease on the slot; grows on every takeover.
    pub fence: u64,
    /// Fingerprint of the request that claimed it.
    pub fingerprint: Fingerprint,
    /// Where it is in its lifecycle.
    pub state: SlotState,
}

/// Lifecycle of a [`CounterSlot`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SlotState {
    /// A handler holds the slot's lease until `lease_expires`.
    InFlight {
        /// After this another attempt may take over.
        lease_expires: UnixMillis,
    },
    /// The final response, replayed while the slot is in the window.
    Completed {
        /// The response.
        response: Arc<StoredResponse>,
    },
    /// The outcome is unknown and the policy holds the slot until it is reconciled.
    OutcomeUnknown {
        /// When it became unknown.
        since: UnixMillis,
    },
}

impl SlotState {
    /// In flight or outcome-unknown: the window may not slide over it.
    pub(crate) fn unsettled(&self) -> bool {
        !matches!(self, SlotState::Completed { .. })
    }
}

impl CounterSession {
    pub(crate) fn mask(&self) -> u64 {
        mask(self.bits)
    }

    /// Offset of `seq` from `base`, modulo 2^bits.
    pub(crate) fn dist(&self, base: u64, seq: u64) -> u64 {
        seq.wrapping_sub(base) & self.mask()
    }

    pub(crate) fn slot(&self, seq: u64) -> Option<&CounterSlot> {
        self.slots.iter().find(|s| s.seq == seq)
    }

    /// The first slot in `[from, to)` that the window may not drop.
    pub(crate) fn first_unsettled_between(&self, from: u64, to: u64) -> Option<&CounterSlot> {
        // Slots below `from` are at a distance of at least 2^bits - window, far beyond
        // `limit`, so they are never counted.
        let limit = self.dist(from, to);
        self.slots
            .iter()
            .find(|s| self.dist(from, s.seq) < limit && s.state.unsettled())
    }

    /// Bytes held, for store accounting.
    pub fn size(&self) -> usize {
        core::mem::size_of::<CounterSession>()
            + self
                .slots
                .iter()
                .map(|s| {
                    core::mem::size_of::<CounterSlot>()
                        + match &s.state {
                            SlotState::Completed { response } => response.size(),
                            _ => 0,
                        }
                })
                .sum::<usize>()
    }

    /// The invariants a decoded session must hold (`IDEM-REC-1`).
    pub(crate) fn validate(&self) -> Result<(), &'static str> {
        if !(8..=64).contains(&self.bits) {
            return Err("counter bits outside 8-64");
        }
        if self.window == 0 || self.window > max_window(self.bits) {
            return Err("counter window out of range");
        }
        let m = self.mask();
        if self.low > m || self.next > m {
            return Err("counter mark beyond its bits");
        }
        let used = self.dist(self.low, self.next);
        if used > u64::from(self.window) {
            return Err("counter window overfull");
        }
        let mut last = None;
        for s in &self.slots {
            if s.seq > m {
                return Err("counter slot beyond its bits");
            }
            let d = self.dist(self.low, s.seq);
            if d >= used || last.is_some_and(|l| d <= l) {
                return Err("counter slots out of order or outside the window");
            }
            last = Some(d);
            if let SlotState::Completed { response } = &s.state {
                if !(100..=599).contains(&response.status) {
                    return Err("response status outside 100-599");
                }
            }
        }
        Ok(())
    }
}
