//! The outbox entry's byte format (`IDEM-CLIENT-6`): the magic `iO`, a format-version byte,
//! then the entry's fields in postcard's encoding, written and read by hand
//! ([`persist`](crate::persist)) so that the client's module carries no serde machinery. The
//! bytes are those `postcard` writes for the entry's serde derive (a test holds them equal):
//! entries stored by earlier builds still read.
//!
//! The fields, in order: the key (a string), the payload digest (32 bytes), the state (its
//! variant index, then its fields), the attempts, the first send (an option of milliseconds),
//! whether some attempt may have been processed, and the last status (an option).

use super::{check_key, Completion, EntryState, GiveUp, OutboxEntry};
use crate::persist::{Reader, Writer};
use crate::time::UnixMillis;
use alloc::vec::Vec;
use core::fmt;

/// The format version written by [`encode_entry`].
pub const ENTRY_FORMAT_VERSION: u8 = 1;
/// The largest encoded entry [`decode_entry`] accepts.
pub const MAX_ENTRY_BYTES: usize = 1024;
const ENTRY_MAGIC: &[u8; 2] = b"iO";

/// Why bytes are not an outbox entry (`IDEM-CLIENT-6`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryDecodeError {
    /// More than [`MAX_ENTRY_BYTES`].
    TooLarge {
        /// The input's size.
        len: usize,
    },
    /// The input does not start with the entry magic.
    NotAnEntry,
    /// A format version this build cannot read.
    UnsupportedVersion(u8),
    /// The structure is damaged or truncated, or bytes follow it.
    Malformed,
    /// The structure decodes but breaks an invariant (the message names it).
    Invalid(&'static str),
}

impl fmt::Display for EntryDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryDecodeError::TooLarge { len } => write!(
                f,
                "outbox entry of {len} bytes exceeds the limit of {MAX_ENTRY_BYTES}"
            ),
            EntryDecodeError::NotAnEntry => f.write_str("not an outbox entry (bad magic)"),
            EntryDecodeError::UnsupportedVersion(v) => {
                write!(f, "unsupported outbox entry format version {v}")
            }
            EntryDecodeError::Malformed => f.write_str("outbox entry is malformed"),
            EntryDecodeError::Invalid(why) => write!(f, "invalid outbox entry: {why}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for EntryDecodeError {}

/// Encodes an entry: the magic `iO`, a format-version byte, then the entry in `postcard`.
pub fn encode_entry(entry: &OutboxEntry) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + entry.key.len());
    out.extend_from_slice(ENTRY_MAGIC);
    out.push(ENTRY_FORMAT_VERSION);
    let mut w = Writer(out);
    w.bytes(entry.key.as_bytes());
    w.0.extend_from_slice(&entry.payload);
    write_state(&mut w, &entry.state);
    w.varint(u64::from(entry.attempts));
    w.option(entry.first_sent, |w, t| w.varint(t.0));
    w.byte(u8::from(entry.maybe_processed));
    w.option(entry.last_status, |w, s| w.varint(u64::from(s)));
    w.0
}

/// The state: its variant index (in declaration order), then its fields.
fn write_state(w: &mut Writer, state: &EntryState) {
    let class = |c: &Completion| u64::from(matches!(c, Completion::Rejected));
    let reason = |g: &GiveUp| match g {
        GiveUp::Deadline => 0,
        GiveUp::Budget => 1,
        GiveUp::KeyForgotten => 2,
        GiveUp::Interrupted => 3,
        GiveUp::Refused => 4,
    };
    match state {
        EntryState::Created => w.varint(0),
        EntryState::Sent => w.varint(1),
        EntryState::Waiting { until } => {
            w.varint(2);
            w.varint(until.0);
        }
        EntryState::Answered { class: c, status } | EntryState::Processed { class: c, status } => {
            w.varint(if matches!(state, EntryState::Answered { .. }) {
                3
            } else {
                4
            });
            w.varint(class(c));
            w.varint(u64::from(*status));
        }
        EntryState::Failed { reason: g } => {
            w.varint(5);
            w.varint(reason(g));
        }
        EntryState::Undetermined { reason: g } => {
            w.varint(6);
            w.varint(reason(g));
        }
        EntryState::Asking { until, asks } => {
            w.varint(7);
            w.varint(until.0);
            w.varint(u64::from(*asks));
        }
        EntryState::Executed { status } => {
            w.varint(8);
            w.option(*status, |w, s| w.varint(u64::from(s)));
        }
        EntryState::NotExecuted => w.varint(9),
    }
}

/// The state [`write_state`] wrote, or `None` where postcard would fail.
fn read_state(r: &mut Reader<'_>) -> Option<EntryState> {
    let class = |r: &mut Reader<'_>| match r.u32()? {
        0 => Some(Completion::Succeeded),
        1 => Some(Completion::Rejected),
        _ => None,
    };
    let reason = |r: &mut Reader<'_>| {
        Some(match r.u32()? {
            0 => GiveUp::Deadline,
            1 => GiveUp::Budget,
            2 => GiveUp::KeyForgotten,
            3 => GiveUp::Interrupted,
            4 => GiveUp::Refused,
            _ => return None,
        })
    };
    Some(match r.u32()? {
        0 => EntryState::Created,
        1 => EntryState::Sent,
        2 => EntryState::Waiting {
            until: UnixMillis(r.u64()?),
        },
        3 => EntryState::Answered {
            class: class(r)?,
            status: r.u16()?,
        },
        4 => EntryState::Processed {
            class: class(r)?,
            status: r.u16()?,
        },
        5 => EntryState::Failed { reason: reason(r)? },
        6 => EntryState::Undetermined { reason: reason(r)? },
        7 => EntryState::Asking {
            until: UnixMillis(r.u64()?),
            asks: r.u32()?,
        },
        8 => EntryState::Executed {
            status: r.option(Reader::u16)?,
        },
        9 => EntryState::NotExecuted,
        _ => return None,
    })
}

/// The entry's fields after the version byte, or `None` where postcard would fail.
fn read_entry(bytes: &[u8]) -> Option<OutboxEntry> {
    let mut r = Reader(bytes);
    let key = r.str()?;
    let (&payload, rest) = r.0.split_first_chunk::<32>()?;
    r.0 = rest;
    let entry = OutboxEntry {
        key: key.into(),
        payload,
        state: read_state(&mut r)?,
        attempts: r.u32()?,
        first_sent: r.option(|r| r.u64().map(UnixMillis))?,
        maybe_processed: r.bool()?,
        last_status: r.option(Reader::u16)?,
    };
    r.0.is_empty().then_some(entry)
}

/// Decodes an entry written by [`encode_entry`], checking its invariants; never panics.
pub fn decode_entry(bytes: &[u8]) -> Result<OutboxEntry, EntryDecodeError> {
    if bytes.len() > MAX_ENTRY_BYTES {
        return Err(EntryDecodeError::TooLarge { len: bytes.len() });
    }
    let Some((magic, [version, rest @ ..])) = bytes.split_first_chunk::<2>() else {
        return Err(EntryDecodeError::NotAnEntry);
    };
    if magic != ENTRY_MAGIC {
        return Err(EntryDecodeError::NotAnEntry);
    }
    if *version != ENTRY_FORMAT_VERSION {
        return Err(EntryDecodeError::UnsupportedVersion(*version));
    }
    let entry = read_entry(rest).ok_or(EntryDecodeError::Malformed)?;
    check_key(&entry.key).map_err(|_| EntryDecodeError::Invalid("invalid key"))?;
    let sent = entry.attempts > 0;
    if sent != entry.first_sent.is_some() || sent == matches!(entry.state, EntryState::Created) {
        return Err(EntryDecodeError::Invalid(
            "attempts, first send and state disagree",
        ));
    }
    let status = match entry.state {
        EntryState::Executed { status } => status,
        _ => None,
    };
    if entry
        .last_status
        .into_iter()
        .chain(status)
        .any(|s| !(200..=599).contains(&s))
    {
        return Err(EntryDecodeError::Invalid("status outside 200-599"));
    }
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counter::CounterSequence;
    use proptest::prelude::*;

    fn completion() -> impl Strategy<Value = Completion> {
        prop_oneof![Just(Completion::Succeeded), Just(Completion::Rejected)]
    }

    fn give_up() -> impl Strategy<Value = GiveUp> {
        prop_oneof![
            Just(GiveUp::Deadline),
            Just(GiveUp::Budget),
            Just(GiveUp::KeyForgotten),
            Just(GiveUp::Interrupted),
            Just(GiveUp::Refused),
        ]
    }

    fn state() -> impl Strategy<Value = EntryState> {
        let millis = any::<u64>().prop_map(UnixMillis);
        prop_oneof![
            Just(EntryState::Created),
            Just(EntryState::Sent),
            millis
                .clone()
                .prop_map(|until| EntryState::Waiting { until }),
            (completion(), any::<u16>())
                .prop_map(|(class, status)| EntryState::Answered { class, status }),
            (completion(), any::<u16>())
                .prop_map(|(class, status)| EntryState::Processed { class, status }),
            give_up().prop_map(|reason| EntryState::Failed { reason }),
            give_up().prop_map(|reason| EntryState::Undetermined { reason }),
            (millis, any::<u32>()).prop_map(|(until, asks)| EntryState::Asking { until, asks }),
            any::<Option<u16>>().prop_map(|status| EntryState::Executed { status }),
            Just(EntryState::NotExecuted),
        ]
    }

    /// Any entry, invariants or not: the encoding does not depend on them.
    fn entry() -> impl Strategy<Value = OutboxEntry> {
        (
            "[ -~]{0,300}",
            any::<[u8; 32]>(),
            state(),
            any::<u32>(),
            any::<Option<u64>>(),
            any::<bool>(),
            any::<Option<u16>>(),
        )
            .prop_map(
                |(key, payload, state, attempts, first_sent, maybe_processed, last_status)| {
                    OutboxEntry {
                        key,
                        payload,
                        state,
                        attempts,
                        first_sent: first_sent.map(UnixMillis),
                        maybe_processed,
                        last_status,
                    }
                },
            )
    }

    fn postcard_entry(e: &OutboxEntry) -> Vec<u8> {
        postcard::to_extend(e, b"iO\x01".to_vec()).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The bytes are postcard's, and read back to the same entry.
        #[test]
        fn entry_bytes_are_postcards(e in entry()) {
            let bytes = encode_entry(&e);
            prop_assert_eq!(&bytes, &postcard_entry(&e));
            prop_assert_eq!(read_entry(&bytes[3..]), Some(e));
        }

        /// Any bytes read as postcard reads them: the same entry, or a failure for both.
        #[test]
        fn entry_reads_as_postcard(e in entry(), cut in any::<prop::sample::Index>(),
                                   flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4)) {
            let mut bytes = encode_entry(&e)[3..].to_vec();
            for (at, b) in flips {
                let at = at.index(bytes.len());
                bytes[at] = b;
            }
            bytes.truncate(cut.index(bytes.len() + 1));
            let theirs = match postcard::take_from_bytes::<OutboxEntry>(&bytes) {
                Ok((e, [])) => Some(e),
                _ => None,
            };
            prop_assert_eq!(read_entry(&bytes), theirs);
        }

        /// Random bytes read as postcard reads them.
        #[test]
        fn noise_reads_as_postcard(bytes in prop::collection::vec(any::<u8>(), 0..80)) {
            let theirs = match postcard::take_from_bytes::<OutboxEntry>(&bytes) {
                Ok((e, [])) => Some(e),
                _ => None,
            };
            prop_assert_eq!(read_entry(&bytes), theirs);
            prop_assert_eq!(
                CounterSequence::from_bytes(&bytes),
                postcard::from_bytes::<CounterSequence>(&bytes).ok()
            );
        }

        /// A counter sequence's bytes are postcard's, and read back (damaged, as postcard
        /// reads them).
        #[test]
        fn sequence_bytes_are_postcards(
            client in "[a-z0-9]{1,64}", epoch in any::<u64>(), bits in 8u8..=64,
            first in any::<u64>(), taken in 0usize..40, done in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
            flip in any::<Option<(prop::sample::Index, u8)>>(),
        ) {
            let first = if bits == 64 { first } else { first & ((1u64 << bits) - 1) };
            let mut s = CounterSequence::new(&client, epoch, bits, first).unwrap();
            let seqs: Vec<u64> = (0..taken).map(|_| s.take().unwrap()).collect();
            for i in done {
                if !seqs.is_empty() {
                    s.done(seqs[i.index(seqs.len())]);
                }
            }
            let mut bytes = s.to_bytes();
            prop_assert_eq!(&bytes, &postcard::to_allocvec(&s).unwrap());
            prop_assert_eq!(CounterSequence::from_bytes(&bytes), Some(s));
            if let Some((at, b)) = flip {
                let at = at.index(bytes.len());
                bytes[at] = b;
                prop_assert_eq!(
                    CounterSequence::from_bytes(&bytes),
                    postcard::from_bytes::<CounterSequence>(&bytes).ok()
                );
            }
        }
    }

    /// Overlong and out-of-range varints, as postcard takes them.
    #[test]
    fn varints_as_postcard() {
        let mut e = OutboxEntry::new("k", [7; 32]).unwrap();
        e.last_status = Some(200);
        let good = encode_entry(&e)[3..].to_vec();
        let end = good.len() - 2;
        for tail in [
            &[1u8, 0x80, 0x00][..],
            &[1, 0xff, 0xff, 0x03],
            &[1, 0xff, 0xff, 0x04],
            &[1, 0x80, 0x80, 0x80],
            &[1, 0x80, 0x80, 0x00],
        ] {
            let mut bytes = good[..end].to_vec();
            bytes.extend_from_slice(tail);
            let theirs = postcard::take_from_bytes::<OutboxEntry>(&bytes)
                .ok()
                .filter(|(_, rest)| rest.is_empty())
                .map(|(e, _)| e);
            assert_eq!(read_entry(&bytes), theirs, "{tail:?}");
        }
    }
}
