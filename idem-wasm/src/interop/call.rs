//! The client module's one entry point, `call(op, input) -> answer`, as bytes: the operations
//! ([`ClientOp`]) and the tagged values ([`Wire`]) that its input and its answer are lists
//! of. One entry point instead of a binding per method keeps the module small and needs no
//! generated glue (`src/exports.rs`); `js/outbox.js` encodes the arguments and decodes the
//! answers.
//!
//! A value is a [`Wire`] tag, then:
//!
//! * [`Wire::Absent`]: nothing (`undefined` or `null` in JavaScript);
//! * [`Wire::Number`]: an `f64`, little-endian (booleans cross as 0 or 1);
//! * [`Wire::Bytes`] and [`Wire::Text`]: a `u32` byte length, little-endian, then the bytes
//!   (text in UTF-8);
//! * [`Wire::Error`], only first in an answer: the call was refused, and two texts follow,
//!   the `code` and the message of the `RangeError` to throw.
//!
//! One file for one thing, the format: the operation numbers, the tags, the reader of the
//! arguments and the writer of the answer are read together, as `js/outbox.js` writes and
//! reads the other end of the same bytes; its last 50 lines are the format's tests.

use super::ErrorParts;
use alloc::vec::Vec;

numbered! {
    /// The operations of the client's module, by number: each takes the values listed as
    /// arguments and answers the values listed after the arrow. `policy` is the retry options
    /// `base`, `cap`, `maxAttempts` and `deadline` (four numbers or absent values; see
    /// [`retry_policy`](super::retry_policy)); `entry` is an outbox entry's bytes, as persisted;
    /// an entry's *view* is `entry, key, state, outcome, attempts, lastStatus`: its bytes, its
    /// key, its [`OutboxState`](super::OutboxState), its [`FetchOutcome`](super::FetchOutcome)
    /// (absent while it is not over), its sends so far and the status of its last response
    /// (absent before one). A *next step* is `kind, outcome, status, reason`: its
    /// [`NextKind`](super::NextKind), the outcome it ends the interaction with (absent for a
    /// retry or another status query), the stored status it found (for `Executed`, when the server
    /// still had it) and why it gave up (for `Failed` and `Undetermined`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ClientOp {
        /// `method, url, body → message`: the bytes whose SHA-256 is the payload's digest, for
        /// the runtime's own SHA-256 (`crypto.subtle`).
        PayloadMessage = 0,
        /// `method, url, body → digest`: the 32-byte digest of a payload (in the full module).
        Digest = 1,
        /// `random (16 bytes) → key`: a UUID v4 key.
        KeyV4 = 2,
        /// `now, random (10 bytes) → key`: a UUID v7 key.
        KeyV7 = 3,
        /// `key, digest, …policy → view`: a new entry.
        Create = 4,
        /// `entry, …policy → view`: a persisted entry, checked (`IDEM-CLIENT-6`).
        Restore = 5,
        /// `entry, now → at`: when the entry next wants to be sent (absent: never).
        NextSend = 6,
        /// `entry, now → at`: when a status query about the key is due (absent: none is).
        NextAsk = 7,
        /// `entry, digest → ()`: refuses another payload (`IDEM-CLIENT-1`).
        CheckPayload = 8,
        /// `entry, now, digest → view`: records a send.
        Send = 9,
        /// `entry, …policy, now, randomHi, randomLo, status, retryAfter, problemType, notProcessed
        /// → next step, …view`: reports a response (`Retry-After` in seconds and the problem
        /// `type` absent when the response had none).
        OnResponse = 10,
        /// `entry, …policy, now, randomHi, randomLo, lost → next step, …view`: reports a send
        /// that got no response.
        OnNetworkError = 11,
        /// `entry, …policy, now, randomHi, randomLo, …values, canResend → next step, …view`:
        /// reports the answer to a status query: the value of the status document at each of its
        /// members ([`KeyStatus::DOCUMENT_MEMBERS`](idem_core::KeyStatus::DOCUMENT_MEMBERS),
        /// `statusMembers` in `js/client-codes/names.js`), as the JSON text `JSON.stringify`
        /// writes of it (absent where the document has none, and all absent when the answer
        /// was not a status document).
        OnStatus = 12,
        /// `entry → view`: the application acted on the final response.
        MarkProcessed = 13,
        /// `method → field`: the `Idempotency-Status` field of a settling status query.
        StatusField = 14,
        /// `client, epoch, bits, firstSeq → sequence, epoch`: a new counter numbering (numbers
        /// as decimal text). This and the other counter operations are in the full module.
        CounterNew = 15,
        /// `sequence → sequence, epoch`: a persisted counter numbering, checked (`IDEM-JS-2`).
        CounterRestore = 16,
        /// `sequence → sequence, key`: takes the number for a new request, and its key.
        CounterTake = 17,
        /// `sequence, seq → sequence`: the answer for number `seq` arrived.
        CounterDone = 18,
        /// `sequence → lowWater, open`: the low-water mark to send, and how many numbers
        /// wait for their answers.
        CounterLowWater = 19,
        /// `…values → …values`: the arguments as the module read them (for the tests that
        /// check both sides of this format).
        Echo = 20,
    }
}

impl ClientOp {
    /// The operation numbered `n`.
    pub fn from_number(n: u32) -> Option<ClientOp> {
        ClientOp::ALL.get(n as usize).copied()
    }
}

numbered! {
    /// The tag in front of each value of a call's input and answer.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Wire {
        /// No value.
        Absent = 0,
        /// An `f64`.
        Number = 1,
        /// Bytes.
        Bytes = 2,
        /// UTF-8 text.
        Text = 3,
        /// The call was refused: the code and the message follow, as texts.
        Error = 4,
    }
}

/// A value of an input, as [`Args`] reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    /// [`Wire::Absent`].
    Absent,
    /// [`Wire::Number`].
    Number(f64),
    /// [`Wire::Bytes`].
    Bytes(&'a [u8]),
    /// [`Wire::Text`].
    Text(&'a str),
}

/// Reads the values of a call's input in order. Every read fails with `IDEM-JS-2` where the
/// value is missing, of another type, or damaged: the JavaScript side encoded it wrong.
pub struct Args<'a>(pub &'a [u8]);

/// The refusal of a call the JavaScript side encoded wrong (`IDEM-JS-2`): a value missing, of
/// another type, damaged, or of another length than the operation takes.
pub fn malformed() -> ErrorParts {
    ErrorParts::range(super::CODE_WIRE, "malformed call")
}

impl<'a> Args<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ErrorParts> {
        let (head, rest) = self.0.split_at_checked(n).ok_or_else(malformed)?;
        self.0 = rest;
        Ok(head)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], ErrorParts> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or_else(malformed)?;
        self.0 = rest;
        Ok(*head)
    }

    /// The next value, whatever its type.
    pub fn value(&mut self) -> Result<Value<'a>, ErrorParts> {
        const ABSENT: u8 = Wire::Absent as u8;
        const NUMBER: u8 = Wire::Number as u8;
        const BYTES: u8 = Wire::Bytes as u8;
        const TEXT: u8 = Wire::Text as u8;
        let [tag] = self.take_array()?;
        Ok(match tag {
            ABSENT => Value::Absent,
            NUMBER => Value::Number(f64::from_le_bytes(self.take_array()?)),
            BYTES | TEXT => {
                let len = u32::from_le_bytes(self.take_array()?);
                let bytes = self.take(len as usize)?;
                if tag == BYTES {
                    Value::Bytes(bytes)
                } else {
                    Value::Text(core::str::from_utf8(bytes).map_err(|_| malformed())?)
                }
            }
            _ => return Err(malformed()),
        })
    }

    /// Whether every value was read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A number, or `None` for an absent value.
    pub fn opt_number(&mut self) -> Result<Option<f64>, ErrorParts> {
        match self.value()? {
            Value::Absent => Ok(None),
            Value::Number(n) => Ok(Some(n)),
            _ => Err(malformed()),
        }
    }

    /// A number.
    pub fn number(&mut self) -> Result<f64, ErrorParts> {
        self.opt_number()?.ok_or_else(malformed)
    }

    /// A boolean: a number other than 0.
    pub fn flag(&mut self) -> Result<bool, ErrorParts> {
        Ok(self.number()? != 0.0)
    }

    /// Bytes, or `None` for an absent value.
    pub fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>, ErrorParts> {
        match self.value()? {
            Value::Absent => Ok(None),
            Value::Bytes(b) => Ok(Some(b)),
            _ => Err(malformed()),
        }
    }

    /// Bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8], ErrorParts> {
        self.opt_bytes()?.ok_or_else(malformed)
    }

    /// Text, or `None` for an absent value.
    pub fn opt_text(&mut self) -> Result<Option<&'a str>, ErrorParts> {
        match self.value()? {
            Value::Absent => Ok(None),
            Value::Text(t) => Ok(Some(t)),
            _ => Err(malformed()),
        }
    }

    /// Text.
    pub fn text(&mut self) -> Result<&'a str, ErrorParts> {
        self.opt_text()?.ok_or_else(malformed)
    }
}

/// Writes the values of a call's answer.
#[derive(Debug, Default)]
pub struct Answer(pub Vec<u8>);

impl Answer {
    /// A value.
    pub fn value(&mut self, v: Value<'_>) -> &mut Self {
        match v {
            Value::Absent => self.0.push(Wire::Absent as u8),
            Value::Number(n) => {
                self.0.push(Wire::Number as u8);
                self.0.extend_from_slice(&n.to_le_bytes());
            }
            Value::Bytes(b) => self.sized(Wire::Bytes, b),
            Value::Text(t) => self.sized(Wire::Text, t.as_bytes()),
        }
        self
    }

    fn sized(&mut self, tag: Wire, b: &[u8]) {
        self.0.push(tag as u8);
        self.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.0.extend_from_slice(b);
    }

    /// A number.
    pub fn number(&mut self, n: f64) -> &mut Self {
        self.value(Value::Number(n))
    }

    /// A number, or an absent value.
    pub fn opt_number(&mut self, n: Option<f64>) -> &mut Self {
        self.value(n.map_or(Value::Absent, Value::Number))
    }

    /// Bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.value(Value::Bytes(b))
    }

    /// Text.
    pub fn text(&mut self, t: &str) -> &mut Self {
        self.value(Value::Text(t))
    }

    /// Text, or an absent value.
    pub fn opt_text(&mut self, t: Option<&str>) -> &mut Self {
        self.value(t.map_or(Value::Absent, Value::Text))
    }

    /// The answer of a refused call: [`Wire::Error`], the code and the message.
    pub fn error(e: &ErrorParts) -> Vec<u8> {
        let mut a = Answer(alloc::vec![Wire::Error as u8]);
        a.text(e.code).text(&e.message);
        a.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_as_written() {
        let mut a = Answer::default();
        a.value(Value::Absent)
            .number(-1.5)
            .bytes(&[1, 2, 3])
            .text("café")
            .opt_number(None)
            .opt_text(Some(""));
        let mut r = Args(&a.0);
        assert_eq!(r.opt_number().unwrap(), None);
        assert_eq!(r.number().unwrap(), -1.5);
        assert_eq!(r.bytes().unwrap(), &[1, 2, 3]);
        assert_eq!(r.text().unwrap(), "café");
        assert_eq!(r.opt_bytes().unwrap(), None);
        assert_eq!(r.opt_text().unwrap(), Some(""));
        assert!(r.is_empty());
        assert_eq!(r.value().unwrap_err().code, "IDEM-JS-2");
    }

    #[test]
    fn damaged_input_is_refused() {
        for bad in [
            &[9u8][..],
            &[1, 0, 0],
            &[2, 5, 0, 0, 0, 1],
            &[3, 2, 0, 0, 0, 0xff, 0xfe],
        ] {
            assert_eq!(Args(bad).value().unwrap_err().code, "IDEM-JS-2");
        }
        // A value of another type than the one asked for.
        assert!(Args(&[0]).number().is_err());
        assert!(Args(&[2, 0, 0, 0, 0]).text().is_err());
    }

    #[test]
    fn ops_are_numbered_in_order() {
        for (i, op) in ClientOp::ALL.iter().enumerate() {
            assert_eq!(ClientOp::from_number(i as u32), Some(*op));
        }
        assert_eq!(ClientOp::from_number(ClientOp::ALL.len() as u32), None);
        let e = Answer::error(&ErrorParts::range("IDEM-X", "m"));
        assert_eq!(e[0], Wire::Error as u8);
        let mut r = Args(&e[1..]);
        assert_eq!((r.text().unwrap(), r.text().unwrap()), ("IDEM-X", "m"));
    }
}
