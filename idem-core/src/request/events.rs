//! The events a request yields (`IDEM-EVT-1`), kept until the host reads them.

use super::*;

/// The events a request has yielded and the host has not read yet.
#[derive(Debug, Default)]
pub(super) struct Events {
    pub(super) ring: [Option<Event>; 4],
    pub(super) head: usize,
    pub(super) len: usize,
}

impl Events {
    pub(super) fn push(&mut self, e: Event) {
        if self.len == self.ring.len() {
            // The host does not read events: keep the latest.
            self.head = (self.head + 1) % self.ring.len();
            self.len -= 1;
        }
        self.ring[(self.head + self.len) % self.ring.len()] = Some(e);
        self.len += 1;
    }

    pub(super) fn pop(&mut self) -> Option<Event> {
        if self.len == 0 {
            return None;
        }
        let e = self.ring[self.head].take();
        self.head = (self.head + 1) % self.ring.len();
        self.len -= 1;
        e
    }
}
