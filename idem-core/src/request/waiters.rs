//! Who waits for which key in one host (`IDEM-CONC-2`).

use super::*;

/// Who is waiting for which key, in one host: only the latest waiter for a key keeps
/// waiting (`IDEM-CONC-2`). A host keeps one and passes it to every
/// [`Request::poll`]; hosts that never wait can pass a fresh one.
#[derive(Debug, Default)]
pub struct Waiters {
    latest: HashMap<String, (u64, UnixMillis)>,
    next: u64,
}

impl Waiters {
    pub(super) fn enter(&mut self, key: &RecordKey, until: UnixMillis, now: UnixMillis) -> u64 {
        // Waiters that were dropped without leaving (their client went away) are pruned
        // once their bound has passed, whenever the map has doubled.
        if self.latest.len() >= 64 && self.latest.len().is_power_of_two() {
            self.latest.retain(|_, (_, u)| *u > now);
        }
        self.next += 1;
        self.latest.insert(key.storage_key(), (self.next, until));
        self.next
    }

    pub(super) fn is_latest(&self, key: &RecordKey, ticket: u64) -> bool {
        self.latest
            .get(key.storage_key().as_str())
            .is_some_and(|(t, _)| *t == ticket)
    }

    pub(super) fn leave(&mut self, key: &RecordKey, ticket: u64) {
        let k = key.storage_key();
        if self
            .latest
            .get(k.as_str())
            .is_some_and(|(t, _)| *t == ticket)
        {
            self.latest.remove(k.as_str());
        }
    }

    /// Keys with someone waiting.
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }
}
