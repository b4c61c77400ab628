//! Numbers and strings written out as canonical JSON text, without `core::fmt`.

use alloc::vec::Vec;

pub(crate) fn write_int(out: &mut Vec<u8>, v: u64, negative: bool) {
    if negative {
        out.push(b'-');
    }
    out.extend_from_slice(Decimal::new(v).as_bytes());
}

/// A number's decimal digits, written without `core::fmt`.
pub(crate) struct Decimal {
    digits: [u8; 20],
    at: usize,
}

impl Decimal {
    pub(crate) fn new(mut v: u64) -> Decimal {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                return Decimal { digits, at };
            }
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.digits[self.at..]
    }

    pub(crate) fn as_str(&self) -> &str {
        // ASCII digits only.
        core::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

/// Integral values below 2^53 as integers, as ECMAScript writes them; others in their
/// shortest round-trip form. Never NaN or infinite (those are refused while reading).
pub(super) fn write_f64(out: &mut Vec<u8>, v: f64) {
    if v == (v as i64) as f64 && v.abs() < 9_007_199_254_740_992.0 {
        let i = v as i64;
        write_int(out, i.unsigned_abs(), i < 0);
    } else {
        out.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
    }
}

/// A JSON string with RFC 8785's minimal escapes.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    write_bytes(out, s.as_bytes());
}

/// [`write_str`] for bytes known to be UTF-8.
pub(super) fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0a => b"\\n",
            0x0c => b"\\f",
            0x0d => b"\\r",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if esc.is_empty() {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 15) as usize],
            ]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}
