//! The Durable Object wire format.
//!
//! A worker identifies the request and sends its ticket (record key, fingerprint, key data)
//! to the Durable Object that owns the key; the object claims next to its storage and sends
//! back what it claimed. Both travel as postcard bytes of the core's serde types, prefixed
//! with a tag byte.

use super::ErrorParts;
use alloc::vec::Vec;
use idem_core::{Claimed, Ticket};
use serde::{Deserialize, Serialize};

const WIRE_TICKET: u8 = b'T';
const WIRE_CLAIMED: u8 = b'C';

fn tagged<T: Serialize>(tag: u8, value: &T) -> Vec<u8> {
    // Serialising plain data into a Vec cannot fail.
    postcard::to_extend(value, alloc::vec![tag]).unwrap_or_default()
}

fn untag<'a, T: Deserialize<'a>>(tag: u8, what: &str, bytes: &'a [u8]) -> Result<T, ErrorParts> {
    match bytes.split_first() {
        Some((&t, rest)) if t == tag => match postcard::take_from_bytes(rest) {
            Ok((v, [])) => Ok(v),
            _ => Err(ErrorParts::wire(what)),
        },
        _ => Err(ErrorParts::wire(what)),
    }
}

/// Encodes a ticket for the Durable Object that owns its key.
pub fn encode_ticket(ticket: &Ticket) -> Vec<u8> {
    tagged(WIRE_TICKET, ticket)
}

/// Decodes a ticket (`IDEM-JS-2`).
pub fn decode_ticket(bytes: &[u8]) -> Result<Ticket, ErrorParts> {
    untag(WIRE_TICKET, "ticket", bytes)
}

/// Encodes what a Durable Object claimed, for the worker that asked.
pub fn encode_claimed(claimed: &Claimed) -> Vec<u8> {
    tagged(WIRE_CLAIMED, claimed)
}

/// Decodes what a Durable Object claimed (`IDEM-JS-2`). An object that claimed answers an
/// execute as `Claimed::Execute`, with its write applied; an execute inside
/// `Claimed::Done` would carry a write nobody applied, and is refused like damaged bytes.
pub fn decode_claimed(bytes: &[u8]) -> Result<Claimed, ErrorParts> {
    match untag(WIRE_CLAIMED, "claim", bytes)? {
        Claimed::Done(idem_core::Decision::Execute { .. }) => Err(ErrorParts::wire("claim")),
        claimed => Ok(claimed),
    }
}
