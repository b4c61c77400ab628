//! postcard's encoding of the values the client persists (its outbox entries and counter
//! sequences), written out by hand: varints, byte strings, options, booleans and enum
//! variant indices, exactly as `postcard` 1 writes and reads them
//! (<https://postcard.jamesmunns.com/wire-format>). The client's module then carries no
//! serde machinery; the types keep their serde derives, and tests hold both encodings
//! equal.

use alloc::vec::Vec;

/// Appends postcard's encoding of values to a buffer.
pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    /// An unsigned integer of any width as a LEB128 varint.
    pub(crate) fn varint(&mut self, mut n: u64) {
        while n >= 0x80 {
            self.0.push(n as u8 | 0x80);
            n >>= 7;
        }
        self.0.push(n as u8);
    }

    /// A byte or a boolean, as one byte.
    pub(crate) fn byte(&mut self, b: u8) {
        self.0.push(b);
    }

    /// A string or byte string: its length, then its bytes.
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    /// An option: a 0, or a 1 and the value.
    pub(crate) fn option<T>(&mut self, v: Option<T>, write: impl FnOnce(&mut Self, T)) {
        match v {
            None => self.byte(0),
            Some(v) => {
                self.byte(1);
                write(self, v);
            }
        }
    }
}

/// Reads postcard's encoding of values from the front of a slice. Every read is `None` where
/// postcard's would be an error.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    /// One byte.
    pub(crate) fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    /// A varint of a `bits`-wide integer, with postcard's checks: at most `ceil(bits / 7)`
    /// bytes, the last of that many no larger than the bits left.
    fn varint(&mut self, bits: u32) -> Option<u64> {
        let max = bits.div_ceil(7);
        let mut out = 0u64;
        for i in 0..max {
            let b = self.byte()?;
            out |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                let last_max = (1u16 << (bits - 7 * (max - 1))) - 1;
                return (i < max - 1 || u16::from(b) <= last_max).then_some(out);
            }
        }
        None
    }

    /// A `u16`.
    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.varint(16).map(|n| n as u16)
    }

    /// A `u32` (and an enum's variant index).
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.varint(32).map(|n| n as u32)
    }

    /// A `u64`.
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.varint(64)
    }

    /// A length (a `usize`, as wide as the target's).
    pub(crate) fn len(&mut self) -> Option<usize> {
        self.varint(usize::BITS).map(|n| n as usize)
    }

    /// A boolean: 0 or 1.
    pub(crate) fn bool(&mut self) -> Option<bool> {
        match self.byte()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    /// A string's or byte string's bytes.
    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.len()?;
        let (b, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(b)
    }

    /// A string (UTF-8).
    pub(crate) fn str(&mut self) -> Option<&'a str> {
        core::str::from_utf8(self.bytes()?).ok()
    }

    /// An option: a 0, or a 1 and the value.
    pub(crate) fn option<T>(
        &mut self,
        read: impl FnOnce(&mut Self) -> Option<T>,
    ) -> Option<Option<T>> {
        match self.byte()? {
            0 => Some(None),
            1 => read(self).map(Some),
            _ => None,
        }
    }
}
