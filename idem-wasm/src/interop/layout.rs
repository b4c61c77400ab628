//! The byte layouts JavaScript reads in place (list text, reply bytes, write bytes, context
//! bytes: see [the module docs](super)), and the storage keys of the generic store interface.

use super::ErrorParts;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use idem_core::{Precondition, RecordKey, RecordState, Scope, Write, WriteOp};

use super::to_ms;

/// The items of a list text (see the module docs). Throws `IDEM-JS-2` for text that is not
/// a list.
pub fn list(text: &str) -> Result<Vec<&str>, ErrorParts> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_once(':')
            .and_then(|(n, tail)| Some((n.parse::<usize>().ok()?, tail)))
            .ok_or_else(|| ErrorParts::wire("list"))?;
        let (item, tail) = split_utf16(tail, len).ok_or_else(|| ErrorParts::wire("list"))?;
        out.push(item);
        rest = tail;
    }
    Ok(out)
}

/// Splits `s` after `units` UTF-16 code units, if that is a character boundary.
fn split_utf16(s: &str, units: usize) -> Option<(&str, &str)> {
    // ASCII (the usual header text): one unit per byte.
    if s.as_bytes().get(..units).is_some_and(<[u8]>::is_ascii) {
        return Some(s.split_at(units));
    }
    let mut seen = 0;
    for (i, c) in s.char_indices() {
        if seen == units {
            return Some(s.split_at(i));
        }
        seen += c.len_utf16();
    }
    (seen == units).then_some((s, ""))
}

/// Appends `item` to a list text.
pub fn push_item(out: &mut String, item: &str) {
    let (digits, at) = utf16_len(item);
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
    out.push(':');
    out.push_str(item);
}

/// Appends `item` to a list text being written as UTF-8 bytes.
pub fn push_item_bytes(out: &mut Vec<u8>, item: &str) {
    let (digits, at) = utf16_len(item);
    out.extend_from_slice(&digits[at..]);
    out.push(b':');
    out.extend_from_slice(item.as_bytes());
}

/// The length of `item` in UTF-16 code units, in decimal digits (from the returned index).
fn utf16_len(item: &str) -> ([u8; 20], usize) {
    // One unit per character, two for those of four bytes (above U+FFFF): counted over the
    // bytes, each leading byte once, with no decoding.
    let n: usize = item
        .bytes()
        .map(|b| usize::from(b & 0xC0 != 0x80) + usize::from(b >= 0xF0))
        .sum();
    decimal_digits(n as u64)
}

/// `n` in decimal ASCII digits, from the returned index to the end, without `core::fmt`.
pub fn decimal_digits(mut n: u64) -> ([u8; 20], usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return (digits, at);
        }
    }
}

/// Header pairs from a flat list text `name:value:…`; an odd trailing name is dropped.
pub fn pairs(text: &str) -> Result<Vec<(String, String)>, ErrorParts> {
    let items = list(text)?;
    Ok(items
        .chunks_exact(2)
        .map(|p| (String::from(p[0]), String::from(p[1])))
        .collect())
}

/// Header pairs as a flat list text.
pub fn flatten(pairs: &[(String, String)]) -> String {
    let mut out = String::new();
    for (n, v) in pairs {
        push_item(&mut out, n);
        push_item(&mut out, v);
    }
    out
}

/// What the first byte of reply bytes says (see the module docs); the JavaScript side reads
/// the bits by these names.
#[cfg_attr(feature = "server", wasm_bindgen::prelude::wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyFlag {
    /// The reply replays a stored response ([`idem_core::Reply::is_replay`]): it carries
    /// `Idempotent-Replayed: true`.
    Replayed = 1,
}

/// Reply bytes (see the module docs) of a rendered reply, into a buffer that is cleared first
/// (and keeps its capacity).
pub fn encode_reply_into(out: &mut Vec<u8>, reply: &idem_core::Reply) {
    out.clear();
    out.push(if reply.is_replay() {
        ReplyFlag::Replayed as u8
    } else {
        0
    });
    out.extend_from_slice(&u32::from(reply.status()).to_le_bytes());
    push_head(out, reply.headers().flat_map(|(n, v)| [n, v]));
    out.extend_from_slice(reply.body());
}

/// The reply bytes of a rendered reply.
pub fn encode_reply(reply: &idem_core::Reply) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + reply.body().len());
    encode_reply_into(&mut out, reply);
    out
}

/// A write as a JavaScript store sees it: the value to put (`None` deletes), the expected
/// current version (`None`: no record may exist), the new version, and when the record next
/// needs attention (`IDEM-STORE-1`, `IDEM-TTL-4`). Versions are decimal strings: they are u64
/// values that a JavaScript number cannot hold exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreWrite {
    /// The precondition: `None` for absent, else the version the stored record must have.
    pub expect: Option<String>,
    /// The encoded record to store, or `None` to delete.
    pub value: Option<Vec<u8>>,
    /// The version of the stored record after the write (empty for a delete).
    pub version: String,
    /// When the stored record next changes on its own, in milliseconds (0 for a delete).
    pub deadline: f64,
    /// Until when the store must keep the record, in milliseconds (0 for a delete): a
    /// time-to-live of the store's own is set from this, never from `deadline`.
    pub expires: f64,
    /// Whether the write is a completion that stores the handler's response, as the engine
    /// decided it ([`idem_core::Request::completing`]): a store that commits a handler's own
    /// writes with its completion commits them only then (`IDEM-STORE-7`). Set by the host.
    pub stores_response: bool,
    /// Whether the record written is in flight (a claim, a heartbeat, or an attempt that
    /// threw left for a retry to take over): a store that holds claims in memory may keep
    /// it there while it has no record of the key (`IDEM-STORE-8`).
    pub in_flight: bool,
}

/// What the first byte of write bytes says (see the module docs); the JavaScript side reads
/// the bits by these names.
#[cfg_attr(feature = "server", wasm_bindgen::prelude::wasm_bindgen)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFlag {
    /// The record to store follows the head; without it, the write deletes.
    Value = 1,
    /// The head holds the version the stored record must have; without it, there must be no
    /// record.
    Expect = 2,
    /// [`StoreWrite::stores_response`].
    StoresResponse = 4,
    /// [`StoreWrite::in_flight`].
    InFlight = 8,
}

impl StoreWrite {
    /// The write bytes (see the module docs) into `out`, which is cleared first (and keeps
    /// its capacity).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let flag = |on: bool, f: WriteFlag| if on { f as u8 } else { 0 };
        out.clear();
        out.push(
            flag(self.value.is_some(), WriteFlag::Value)
                | flag(self.expect.is_some(), WriteFlag::Expect)
                | flag(self.stores_response, WriteFlag::StoresResponse)
                | flag(self.in_flight, WriteFlag::InFlight),
        );
        out.extend_from_slice(&self.deadline.to_le_bytes());
        out.extend_from_slice(&self.expires.to_le_bytes());
        push_head(
            out,
            core::iter::once(self.version.as_str()).chain(self.expect.as_deref()),
        );
        if let Some(value) = &self.value {
            out.extend_from_slice(value);
        }
    }

    /// Converts a core write.
    pub fn from_core(write: &Write) -> StoreWrite {
        let expect = match write.precondition {
            Precondition::Absent => None,
            Precondition::Version(v) => Some(v.to_string()),
        };
        match &write.op {
            WriteOp::Put(record) => StoreWrite {
                expect,
                value: Some(idem_core::encode_record(record)),
                version: record.version.to_string(),
                deadline: to_ms(record.next_deadline()),
                expires: to_ms(record.retained_until()),
                stores_response: false,
                in_flight: matches!(record.state, RecordState::InFlight { .. }),
            },
            WriteOp::Delete => StoreWrite {
                expect,
                value: None,
                version: String::new(),
                deadline: 0.0,
                expires: 0.0,
                stores_response: false,
                in_flight: false,
            },
        }
    }
}

/// Context bytes (see the module docs) of a handler running under `context` with `key`,
/// into a buffer that is cleared first.
pub fn encode_context_into(out: &mut Vec<u8>, context: &idem_core::Context, key: &str) {
    out.clear();
    out.extend_from_slice(&(context.fence as f64).to_le_bytes());
    out.extend_from_slice(&to_ms(context.lease_expires).to_le_bytes());
    out.extend_from_slice(&context.attempt.to_le_bytes());
    out.push(u8::from(context.recovered));
    out.extend_from_slice(key.as_bytes());
}

/// A head of reply or write bytes: its byte length as a `u32`, then `items` as list text.
fn push_head<'a>(out: &mut Vec<u8>, items: impl Iterator<Item = &'a str>) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    for item in items {
        push_item_bytes(out, item);
    }
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// Parses a storage key ([`RecordKey::storage_key`]) back into the record key.
pub fn parse_storage_key(s: &str) -> Option<RecordKey> {
    let (len, rest) = s.split_once(':')?;
    let len: usize = len.parse().ok()?;
    if !rest.is_char_boundary(len) {
        return None;
    }
    let (scope, key) = rest.split_at(len);
    let key = RecordKey::new(Scope::custom(scope), key);
    (key.storage_key() == s).then_some(key)
}
