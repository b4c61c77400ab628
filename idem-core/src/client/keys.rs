//! The client's UUID keys (RFC 9562), for clients that have no UUID generator of their own:
//! version 4 from random bits, version 7 from the time and random bits. Written out by hand
//! (the version and variant bits, then lowercase hex with hyphens, by `kind::push_hex`), the
//! same text as the `uuid` crate's builders (a test holds them equal), so that the client's
//! module carries none of that crate.

use crate::time::UnixMillis;
use alloc::string::String;

/// A UUID version 4 key from 128 random bits (RFC 9562 §5.4), as `uuid`'s
/// `Builder::from_random_bytes` takes them.
pub fn uuid_v4_key(random: [u8; 16]) -> String {
    text(random, 4)
}

/// A UUID version 7 key (RFC 9562 §5.7) from the time (its low 48 bits of milliseconds) and
/// 80 random bits.
pub fn uuid_v7_key(now: UnixMillis, random: [u8; 10]) -> String {
    text(
        filled(now.0.to_be_bytes().into_iter().skip(2).chain(random)),
        7,
    )
}

/// The 16 bytes of a UUID from the first 16 of `bits`: no index or range to check, so that
/// the client's module carries no slice panics and their messages.
fn filled(bits: impl Iterator<Item = u8>) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    for (b, bit) in bytes.iter_mut().zip(bits) {
        *b = bit;
    }
    bytes
}

/// `bytes` with the `version` and the RFC 9562 variant set, as `8-4-4-4-12` lowercase hex.
fn text(mut bytes: [u8; 16], version: u8) -> String {
    bytes[6] = bytes[6] & 0x0f | version << 4;
    bytes[8] = bytes[8] & 0x3f | 0x80;
    let mut out = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        crate::kind::push_hex(&mut out, core::slice::from_ref(b));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use proptest::prelude::*;

    proptest! {
        /// The same text as the `uuid` crate's builders.
        #[test]
        fn same_as_the_uuid_crate(bytes in any::<[u8; 16]>(), now in any::<u64>(), random in any::<[u8; 10]>()) {
            let v4 = uuid::Builder::from_random_bytes(bytes).into_uuid();
            prop_assert_eq!(uuid_v4_key(bytes), v4.hyphenated().to_string());
            let v7 = uuid::Builder::from_unix_timestamp_millis(now, &random).into_uuid();
            prop_assert_eq!(uuid_v7_key(UnixMillis(now), random), v7.hyphenated().to_string());
        }
    }
}
