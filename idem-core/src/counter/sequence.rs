//! The client side of counter keys: one client's numbering within a session epoch.

use super::*;
use crate::persist::{Reader, Writer};

/// The client side of counter keys: one client's numbering within a session epoch. It hands
/// out the next number for each new logical request, so that a number is never used for two
/// requests while the server may still hold it, and keeps the low-water mark the client
/// sends with every request (`IDEM-CTR-11`): the oldest number whose answer has not
/// arrived, or the next number when none is open. Persist it (serde) after every change, so
/// that a restarted client continues its sequence: its serde form, or the same bytes in
/// postcard's encoding from [`CounterSequence::to_bytes`] without serde.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CounterSequence {
    client: String,
    epoch: u64,
    bits: u8,
    next: u64,
    /// Numbers handed out whose answers have not arrived, oldest first.
    open: Vec<u64>,
}

impl CounterSequence {
    /// The numbering of `client` in session `epoch`, `bits` wide, from `first_seq` (the first
    /// number the session was opened with).
    pub fn new(
        client: &str,
        epoch: u64,
        bits: u8,
        first_seq: u64,
    ) -> Result<CounterSequence, CounterError> {
        if !valid_client_id(client) {
            return Err(CounterError::BadClientId);
        }
        if !(8..=64).contains(&bits) || first_seq > mask(bits) {
            return Err(CounterError::SequenceBeyondBits {
                seq: first_seq,
                bits,
            });
        }
        Ok(CounterSequence {
            client: String::from(client),
            epoch,
            bits,
            next: first_seq,
            open: Vec::new(),
        })
    }

    /// The client id.
    pub fn client(&self) -> &str {
        &self.client
    }

    /// The session epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The number for a new logical request; the next one wraps modulo 2^bits.
    ///
    /// `None` when that number is still open: the numbering went all the way round (2^bits
    /// numbers since one whose answer never arrived), and handing it out again would send a
    /// second logical request under the key of one the server may still hold. The open one
    /// is to be answered or reconciled first.
    pub fn take(&mut self) -> Option<u64> {
        let seq = self.next;
        if self.open.contains(&seq) {
            return None;
        }
        self.next = seq.wrapping_add(1) & mask(self.bits);
        self.open.push(seq);
        Some(seq)
    }

    /// The key of number `seq`: `client:epoch:seq`.
    pub fn key(&self, seq: u64) -> String {
        let mut key = String::with_capacity(self.client.len() + 42);
        key.push_str(&self.client);
        key.push(':');
        crate::kind::push_decimal(&mut key, self.epoch);
        key.push(':');
        crate::kind::push_decimal(&mut key, seq);
        key
    }

    /// The low-water mark to send: every answer below it has arrived.
    pub fn low_water(&self) -> u64 {
        self.open.first().copied().unwrap_or(self.next)
    }

    /// The answer for `seq` arrived (or the request is given up for good): it no longer
    /// holds the low-water mark back.
    pub fn done(&mut self, seq: u64) {
        self.open.retain(|s| *s != seq);
    }

    /// Numbers handed out whose answers have not arrived.
    pub fn open(&self) -> &[u64] {
        &self.open
    }

    /// The sequence as bytes, to persist after every change: exactly what `postcard` writes
    /// for its serde form, written by hand.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(
            32 + self.client.len() + 10 * self.open.len(),
        ));
        w.bytes(self.client.as_bytes());
        w.varint(self.epoch);
        w.byte(self.bits);
        w.varint(self.next);
        w.varint(self.open.len() as u64);
        for &n in &self.open {
            w.varint(n);
        }
        w.0
    }

    /// A sequence from bytes of [`CounterSequence::to_bytes`] (or of postcard's encoding of
    /// its serde form), or `None` where postcard would fail. As postcard's `from_bytes`,
    /// bytes after the sequence are ignored.
    pub fn from_bytes(bytes: &[u8]) -> Option<CounterSequence> {
        let mut r = Reader(bytes);
        let client = r.str()?.into();
        let epoch = r.u64()?;
        let bits = r.byte()?;
        let next = r.u64()?;
        let n = r.len()?;
        // Each number takes at least one byte: a longer count is damaged.
        if n > r.0.len() {
            return None;
        }
        let mut open = Vec::with_capacity(n);
        for _ in 0..n {
            open.push(r.u64()?);
        }
        Some(CounterSequence {
            client,
            epoch,
            bits,
            next,
            open,
        })
    }
}
