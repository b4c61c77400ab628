//! JSON canonicalisation (RFC 8785 where practical) for fingerprints, by a purpose-built
//! scanner: the body is validated and written out canonically in one pass, with no value
//! tree and no allocation per nested object (one output buffer, and scratch buffers shared
//! by every level). Each object's members are written in input order, `"key":value`; when
//! their names are not already in order, they are then put in sorted order in place.
//! Excluded fields are skipped while scanning. For the top-level object the
//! members' canonical bytes are also digested one by one, so that a mismatch can name the
//! fields that differ.
//!
//! The canonical form, and which bodies are refused, are those of the serde_json-based
//! canonicaliser this replaces (a unit test races the two): numbers are read as serde_json
//! reads them (integers that fit stay integers, other numbers become the `f64` its default
//! parser computes), integral floats below 2^53 are written as integers and other floats in
//! their shortest round-trip form, strings with RFC 8785's minimal escapes, nesting up to
//! 127 levels; a skipped (excluded) value is only checked for its syntax.

use crate::fingerprint::FieldDigests;
use alloc::string::String;
use alloc::vec::Vec;
use core::ops::Range;

#[cfg(test)]
mod reference;

/// Exclusion patterns: each a JSON Pointer split into unescaped tokens (`*` matches all).
pub(crate) fn parse_patterns(pointers: &[String]) -> Vec<Vec<String>> {
    pointers
        .iter()
        .map(|p| {
            let path = p.strip_prefix('/').unwrap_or(p);
            path.split('/')
                .map(|t| t.replace("~1", "/").replace("~0", "~"))
                .collect()
        })
        .collect()
}

/// Where a body stops being JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JsonError {
    /// The index of the offending byte (the body's length at its end).
    at: usize,
}

impl JsonError {
    /// The 1-based line, and the column (bytes up to and including the offending one).
    pub(crate) fn position(&self, body: &[u8]) -> (usize, usize) {
        let end = (self.at + 1).min(body.len());
        let seen = &body[..end];
        let line = 1 + seen.iter().filter(|&&b| b == b'\n').count();
        let line_start = seen.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        (line, end - line_start)
    }
}

type Result<T> = core::result::Result<T, JsonError>;

/// Containers nest at most this deep (serde_json's limit, so the same bodies are refused).
const MAX_DEPTH: usize = 127;

/// Canonicalises `body` into `out`; with `fields`, fills them with per-member digests when
/// the body is an object.
pub(crate) fn canonicalise(
    body: &[u8],
    patterns: &[Vec<String>],
    out: &mut Vec<u8>,
    fields: Option<&mut FieldDigests>,
) -> Result<()> {
    let mut c = Canon {
        s: Scan { b: body, i: 0 },
        out: Out {
            body,
            buf: out,
            run: 0..0,
        },
        // Room for the members of a few nested objects up front (each growth is an
        // allocation and a copy). Bodies without escapes whose objects are in order never use
        // the scratch.
        members: Vec::with_capacity(32),
        keys: Vec::new(),
        scratch: Vec::new(),
        patterns: patterns.iter().map(Vec::as_slice).collect(),
    };
    let roots = 0..c.patterns.len();
    c.value(0, roots, fields)?;
    c.s.end()?;
    c.out.flush();
    Ok(())
}

/// The bytes of a JSON text.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

/// A string as scanned: its raw bytes in the body (no escapes), or unescaped into a buffer.
enum Text {
    Raw(Range<usize>),
    Unescaped,
}

/// A number as serde_json reads it.
enum Number {
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> Scan<'a> {
    fn fail<T>(&self) -> Result<T> {
        Err(JsonError { at: self.i })
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// Whitespace, then `want`.
    #[inline]
    fn expect(&mut self, want: u8) -> Result<()> {
        self.ws();
        if self.peek() == Some(want) {
            self.i += 1;
            Ok(())
        } else {
            self.fail()
        }
    }

    /// Nothing but whitespace is left.
    fn end(&mut self) -> Result<()> {
        self.ws();
        if self.i == self.b.len() {
            Ok(())
        } else {
            self.fail()
        }
    }

    /// `true`, `false` or `null`, starting at the current byte.
    fn literal(&mut self, word: &[u8]) -> Result<()> {
        for &want in word {
            if self.peek() != Some(want) {
                return self.fail();
            }
            self.i += 1;
        }
        Ok(())
    }

    /// A string whose opening quote is the current byte, unescaped and checked to be UTF-8
    /// with paired surrogates. An escaped string is unescaped into `text`. The common case,
    /// a string without escapes, is inlined where strings are read (not in WebAssembly, whose
    /// module is built for size: there the compiler decides, as for the calls below).
    #[cfg_attr(not(target_arch = "wasm32"), inline(always))]
    fn string(&mut self, text: &mut Vec<u8>) -> Result<Text> {
        self.i += 1;
        let start = self.i;
        let (end, ascii) = special(self.b, self.i);
        self.i = end;
        if self.peek() == Some(b'"') {
            let raw = start..self.i;
            if !ascii && core::str::from_utf8(&self.b[raw.clone()]).is_err() {
                return self.fail();
            }
            self.i += 1;
            return Ok(Text::Raw(raw));
        }
        self.escaped(start, text)
    }

    /// The rest of a string from its first escape (or where it stops being a string), at
    /// the current byte; `start` is where its text began.
    #[inline(never)]
    fn escaped(&mut self, start: usize, text: &mut Vec<u8>) -> Result<Text> {
        if self.peek() != Some(b'\\') {
            return self.fail();
        }
        let text = room(text, self.b.len());
        text.clear();
        text.extend_from_slice(&self.b[start..self.i]);
        loop {
            match self.peek() {
                Some(b'"') => {
                    if core::str::from_utf8(text).is_err() {
                        return self.fail();
                    }
                    self.i += 1;
                    return Ok(Text::Unescaped);
                }
                Some(b'\\') => {
                    self.i += 1;
                    self.escape(text)?;
                }
                // A control character, or the end.
                _ => return self.fail(),
            }
            let from = self.i;
            self.i = special(self.b, self.i).0;
            text.extend_from_slice(&self.b[from..self.i]);
        }
    }

    fn escape(&mut self, text: &mut Vec<u8>) -> Result<()> {
        let Some(c) = self.peek() else {
            return self.fail();
        };
        self.i += 1;
        let byte = match c {
            b'"' | b'\\' | b'/' => c,
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let n = self.hex4()?;
                let code = match n {
                    0xDC00..=0xDFFF => return self.fail(),
                    0xD800..=0xDBFF => {
                        // A leading surrogate: a trailing one must follow.
                        if self.peek() != Some(b'\\') {
                            return self.fail();
                        }
                        self.i += 1;
                        if self.peek() != Some(b'u') {
                            return self.fail();
                        }
                        self.i += 1;
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return self.fail();
                        }
                        0x1_0000 + ((u32::from(n) - 0xD800) << 10 | (u32::from(low) - 0xDC00))
                    }
                    _ => u32::from(n),
                };
                let Some(ch) = char::from_u32(code) else {
                    return self.fail();
                };
                text.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                return Ok(());
            }
            _ => return self.fail(),
        };
        text.push(byte);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u16> {
        let Some(digits) = self.b.get(self.i..self.i + 4) else {
            self.i = self.b.len();
            return self.fail();
        };
        let mut n = 0u16;
        for &d in digits {
            let v = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return self.fail(),
            };
            n = n << 4 | u16::from(v);
        }
        self.i += 4;
        Ok(n)
    }

    /// A string that is skipped: its escapes are checked for their form only, and its bytes
    /// are not checked to be UTF-8 (as serde_json skips an ignored string).
    fn skip_string(&mut self) -> Result<()> {
        self.i += 1;
        loop {
            self.i = special(self.b, self.i).0;
            match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.i += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                            self.i += 1;
                        }
                        Some(b'u') => {
                            self.i += 1;
                            self.hex4()?;
                        }
                        _ => return self.fail(),
                    }
                }
                _ => return self.fail(),
            }
        }
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
    }

    /// The end of the number at the current byte when its text is already its canonical
    /// form, so that it can be copied as it stands; `None` for any other number (and for
    /// anything that is not a number). Those are:
    /// * integers of up to 18 digits, other than `-0` (read as a `u64` or `i64`, written
    ///   back digit for digit);
    /// * decimals `I.F` with no exponent, at most 15 significant digits, a last digit of `F`
    ///   that is not 0, and, when `I` is 0, at most 4 zeros leading `F`. At most 15 digits,
    ///   the significand and the power of ten are exact in an `f64`, so the one division
    ///   [`Scan::f64_from_parts`] makes is correctly rounded; two decimals of at most 15
    ///   digits never round to the same `f64`, so the shortest form that reads back as it
    ///   is these same digits, which ryu writes as `I.F` for these magnitudes (0.00001 up
    ///   to 10^15).
    #[inline]
    fn canonical_number(&self) -> Option<usize> {
        let b = self.b;
        let mut i = self.i;
        let negative = b.get(i) == Some(&b'-');
        if negative {
            i += 1;
        }
        let int_start = i;
        while let Some(b'0'..=b'9') = b.get(i) {
            i += 1;
        }
        let int = &b[int_start..i];
        if int.is_empty() || int.len() > 1 && int[0] == b'0' {
            return None;
        }
        match b.get(i) {
            Some(b'.') => {}
            Some(b'e' | b'E') => return None,
            // An integer: `-0` is written `0`.
            _ if int.len() > 18 || negative && int == b"0" => return None,
            _ => return Some(i),
        }
        i += 1;
        let frac_start = i;
        while let Some(b'0'..=b'9') = b.get(i) {
            i += 1;
        }
        let frac = &b[frac_start..i];
        if matches!(b.get(i), Some(b'e' | b'E')) || frac.last().is_none_or(|&d| d == b'0') {
            return None;
        }
        let significant = if int == b"0" {
            let zeros = frac.iter().take_while(|&&d| d == b'0').count();
            if zeros > 4 {
                return None;
            }
            frac.len() - zeros
        } else {
            int.len() + frac.len()
        };
        (significant <= 15).then_some(i)
    }

    /// A number, read as serde_json reads it without `float_roundtrip`.
    fn number(&mut self) -> Result<Number> {
        let positive = if self.peek() == Some(b'-') {
            self.i += 1;
            false
        } else {
            true
        };
        let Some(first) = self.peek() else {
            return self.fail();
        };
        let significand = match first {
            b'0' => {
                self.i += 1;
                // Only one leading zero.
                if let Some(b'0'..=b'9') = self.peek() {
                    return self.fail();
                }
                0
            }
            b'1'..=b'9' => {
                self.i += 1;
                let mut significand = u64::from(first - b'0');
                while let Some(c @ b'0'..=b'9') = self.peek() {
                    let digit = u64::from(c - b'0');
                    if overflows(significand, digit) {
                        return self.long_integer(positive, significand).map(Number::F64);
                    }
                    self.i += 1;
                    significand = significand * 10 + digit;
                }
                significand
            }
            _ => return self.fail(),
        };
        Ok(match self.peek() {
            Some(b'.') => Number::F64(self.fraction(positive, significand, 0)?),
            Some(b'e' | b'E') => Number::F64(self.exponent(positive, significand, 0)?),
            _ if positive => Number::U64(significand),
            _ => {
                let negative = (significand as i64).wrapping_neg();
                // Below i64::MIN, or -0: a float.
                if negative >= 0 {
                    Number::F64(-(significand as f64))
                } else {
                    Number::I64(negative)
                }
            }
        })
    }

    /// The digits of an integer part past what a u64 holds: each one is a power of ten.
    #[cold]
    fn long_integer(&mut self, positive: bool, significand: u64) -> Result<f64> {
        let mut exponent = 0i32;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
            exponent = exponent.saturating_add(1);
        }
        match self.peek() {
            Some(b'.') => self.fraction(positive, significand, exponent),
            Some(b'e' | b'E') => self.exponent(positive, significand, exponent),
            _ => self.f64_from_parts(positive, significand, exponent),
        }
    }

    /// A fraction, from its `.`.
    fn fraction(&mut self, positive: bool, mut significand: u64, before: i32) -> Result<f64> {
        self.i += 1;
        let mut after = 0i32;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            let digit = u64::from(c - b'0');
            if overflows(significand, digit) {
                // Further digits are dropped.
                self.digits();
                let exponent = before.saturating_add(after);
                return match self.peek() {
                    Some(b'e' | b'E') => self.exponent(positive, significand, exponent),
                    _ => self.f64_from_parts(positive, significand, exponent),
                };
            }
            self.i += 1;
            significand = significand * 10 + digit;
            after -= 1;
        }
        if after == 0 {
            // No digit after the point.
            return self.fail();
        }
        let exponent = before.saturating_add(after);
        match self.peek() {
            Some(b'e' | b'E') => self.exponent(positive, significand, exponent),
            _ => self.f64_from_parts(positive, significand, exponent),
        }
    }

    /// An exponent, from its `e`.
    fn exponent(&mut self, positive: bool, significand: u64, start: i32) -> Result<f64> {
        self.i += 1;
        let positive_exp = match self.peek() {
            Some(b'+') => {
                self.i += 1;
                true
            }
            Some(b'-') => {
                self.i += 1;
                false
            }
            _ => true,
        };
        let mut exp = match self.peek() {
            Some(c @ b'0'..=b'9') => i32::from(c - b'0'),
            _ => return self.fail(),
        };
        self.i += 1;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            self.i += 1;
            let digit = i32::from(c - b'0');
            if exp >= i32::MAX / 10 && (exp > i32::MAX / 10 || digit > i32::MAX % 10) {
                // Out of range: zero for a zero significand or a negative exponent.
                if significand != 0 && positive_exp {
                    return self.fail();
                }
                self.digits();
                return Ok(if positive { 0.0 } else { -0.0 });
            }
            exp = exp * 10 + digit;
        }
        let exponent = if positive_exp {
            start.saturating_add(exp)
        } else {
            start.saturating_sub(exp)
        };
        self.f64_from_parts(positive, significand, exponent)
    }

    /// `significand × 10^exponent` as serde_json's default parser computes it: one multiply
    /// or divide by a power of ten (repeated divisions by 1e308 below that).
    fn f64_from_parts(&self, positive: bool, significand: u64, mut exponent: i32) -> Result<f64> {
        let mut f = significand as f64;
        loop {
            match POW10.get(exponent.unsigned_abs() as usize) {
                Some(&pow) => {
                    if exponent >= 0 {
                        f *= pow;
                        if f.is_infinite() {
                            return self.fail();
                        }
                    } else {
                        f /= pow;
                    }
                    break;
                }
                None => {
                    if f == 0.0 {
                        break;
                    }
                    if exponent >= 0 {
                        return self.fail();
                    }
                    f /= 1e308;
                    exponent += 308;
                }
            }
        }
        Ok(if positive { f } else { -f })
    }

    /// A number that is skipped: its form only.
    fn skip_number(&mut self) -> Result<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.i += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return self.fail();
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            _ => return self.fail(),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return self.fail();
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return self.fail();
            }
            self.digits();
        }
        Ok(())
    }

    /// Skips one value of any depth without recursion, checking its syntax (a skipped value
    /// has no depth limit, as in serde_json). `open` holds the containers entered.
    fn skip_value(&mut self, open: &mut Vec<u8>) -> Result<()> {
        open.clear();
        loop {
            // A value.
            self.ws();
            match self.peek() {
                Some(b'[') => {
                    self.i += 1;
                    self.ws();
                    if self.peek() == Some(b']') {
                        self.i += 1;
                    } else {
                        open.push(b']');
                        continue;
                    }
                }
                Some(b'{') => {
                    self.i += 1;
                    self.ws();
                    if self.peek() == Some(b'}') {
                        self.i += 1;
                    } else {
                        open.push(b'}');
                        self.skip_key()?;
                        continue;
                    }
                }
                Some(b'"') => self.skip_string()?,
                Some(b't') => self.literal(b"true")?,
                Some(b'f') => self.literal(b"false")?,
                Some(b'n') => self.literal(b"null")?,
                Some(b'-' | b'0'..=b'9') => self.skip_number()?,
                _ => return self.fail(),
            }
            // After a value: close what ends here, or go on to the next member or element.
            loop {
                let Some(&close) = open.last() else {
                    return Ok(());
                };
                self.ws();
                match self.peek() {
                    Some(b',') => {
                        self.i += 1;
                        if close == b'}' {
                            self.skip_key()?;
                        }
                        break;
                    }
                    Some(c) if c == close => {
                        self.i += 1;
                        open.pop();
                    }
                    _ => return self.fail(),
                }
            }
        }
    }

    /// A skipped object's key and its colon.
    fn skip_key(&mut self) -> Result<()> {
        self.ws();
        if self.peek() != Some(b'"') {
            return self.fail();
        }
        self.skip_string()?;
        self.expect(b':')
    }
}

/// Whether `digit` more would overflow `significand` (serde_json's test).
#[inline]
fn overflows(significand: u64, digit: u64) -> bool {
    significand >= u64::MAX / 10 && (significand > u64::MAX / 10 || digit > u64::MAX % 10)
}

/// The index of the first `"`, `\` or control character at or after `i` (the length if
/// none), eight bytes at a time; and whether every byte before it is ASCII (`false` may
/// also mean a byte after it in the same eight is not), so that a caller can skip checking
/// them for UTF-8.
#[inline]
fn special(b: &[u8], mut i: usize) -> (usize, bool) {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let mut seen = 0u64;
    while let Some(chunk) = b.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        let control = x.wrapping_sub(ONES * 0x20) & !x;
        let q = x ^ (ONES * u64::from(b'"'));
        let quote = q.wrapping_sub(ONES) & !q;
        let s = x ^ (ONES * u64::from(b'\\'));
        let backslash = s.wrapping_sub(ONES) & !s;
        let hits = (control | quote | backslash) & HIGH;
        seen |= x;
        if hits != 0 {
            // The lowest flagged byte is exact; borrows only flag bytes above it.
            return (i + (hits.trailing_zeros() / 8) as usize, seen & HIGH == 0);
        }
        i += 8;
    }
    while let Some(&c) = b.get(i) {
        if c == b'"' || c == b'\\' || c < 0x20 {
            break;
        }
        seen |= u64::from(c);
        i += 1;
    }
    (i, seen & HIGH == 0)
}

/// An object member written so far: its key, and where it is in `out` (`"key":value`) and
/// where its value starts.
struct Member {
    key: Key,
    /// The key's first eight bytes, big-endian, zero-padded: members whose prefixes differ
    /// are ordered by them as by their whole keys, without reading the keys.
    prefix: u64,
    span: Range<usize>,
    value: usize,
}

/// A key's first eight bytes as a big-endian number, zero-padded.
#[inline]
fn prefix_of(key: &[u8]) -> u64 {
    if let Some(first) = key.first_chunk::<8>() {
        return u64::from_be_bytes(*first);
    }
    let at = |i: usize| u64::from(key[i]) << (56 - 8 * i);
    match key.len() {
        0 => 0,
        // The first and last four bytes, overlapping: shared bytes land where they belong
        // in both, so or-ing them changes nothing.
        len @ 4..=7 => {
            let head = key.first_chunk::<4>().map_or(0, |b| u32::from_be_bytes(*b));
            let tail = key.last_chunk::<4>().map_or(0, |b| u32::from_be_bytes(*b));
            u64::from(head) << 32 | u64::from(tail) << (8 * (8 - len))
        }
        // One to three bytes: the first, the middle and the last (some of them the same).
        len => at(0) | at(len / 2) | at(len - 1),
    }
}

/// The scratch buffer, with room for a whole body of `len` bytes made on its first use,
/// instead of growing by doubling from nothing: its uses are parts of the body or of its
/// output.
#[inline]
fn room(scratch: &mut Vec<u8>, len: usize) -> &mut Vec<u8> {
    if scratch.capacity() == 0 {
        scratch.reserve(len);
    }
    scratch
}

/// Objects of at most this many members are put in order by a permutation of their
/// numbers (see [`Canon::finish_object`]).
const SMALL_OBJECT: usize = 16;

/// Where a member's (unescaped) key is: in the body, or in the keys buffer.
#[derive(Clone)]
enum Key {
    Body(Range<usize>),
    Unescaped(Range<usize>),
}

/// The canonical output: the bytes written, then a run of body bytes that the output
/// repeats as they stand, not copied yet. Each token the output takes unchanged from the
/// body extends the run when it follows it in the body, so that a body mostly in canonical
/// form (no whitespace, members in order) is copied in a few large pieces, not token by
/// token.
struct Out<'a, 'o> {
    body: &'a [u8],
    buf: &'o mut Vec<u8>,
    /// Body bytes that follow `buf` in the output.
    run: Range<usize>,
}

impl Out<'_, '_> {
    /// The output's length, the run included.
    #[inline]
    fn len(&self) -> usize {
        self.buf.len() + self.run.len()
    }

    /// Appends the body's bytes `from`.
    #[inline]
    fn copy(&mut self, from: Range<usize>) {
        if from.start != self.run.end {
            self.flush();
            self.run.start = from.start;
        }
        self.run.end = from.end;
    }

    /// Copies the run, so that `buf` holds the whole output.
    #[inline]
    fn flush(&mut self) {
        if !self.run.is_empty() {
            self.buf.extend_from_slice(&self.body[self.run.clone()]);
            self.run.start = self.run.end;
        }
    }

    /// Appends a string the body holds without escapes at `raw`, with its quotes.
    #[inline]
    fn quoted(&mut self, raw: Range<usize>) {
        self.copy(raw.start - 1..raw.end + 1);
    }

    /// The whole output, for bytes that are not the body's.
    #[inline]
    fn bytes(&mut self) -> &mut Vec<u8> {
        self.flush();
        self.buf
    }
}

struct Canon<'a, 'o, 'p> {
    s: Scan<'a>,
    out: Out<'a, 'o>,
    /// The members of every object being written, innermost last.
    members: Vec<Member>,
    /// Unescaped keys of those members.
    keys: Vec<u8>,
    /// One buffer for three uses that never overlap: the current string, unescaped; an
    /// object's members while they are put in order; the containers of a skipped value. Its
    /// first use makes room for the body's length, so that it grows once at most.
    scratch: Vec<u8>,
    /// Exclusion patterns: the roots, then what remains of each that matches the path so far,
    /// one range per level.
    patterns: Vec<&'p [String]>,
}

fn key_bytes<'k>(body: &'k [u8], keys: &'k [u8], key: &Key) -> &'k [u8] {
    match key {
        Key::Body(r) => &body[r.clone()],
        Key::Unescaped(r) => &keys[r.clone()],
    }
}

impl Canon<'_, '_, '_> {
    /// One value, written canonically. Inlined where values are read, so that a string, a
    /// number or a literal costs no call; objects and arrays are the calls (outside
    /// WebAssembly, see [`Scan::string`]).
    #[cfg_attr(not(target_arch = "wasm32"), inline(always))]
    fn value(
        &mut self,
        depth: usize,
        patterns: Range<usize>,
        fields: Option<&mut FieldDigests>,
    ) -> Result<()> {
        self.s.ws();
        match self.s.peek() {
            Some(b'{') => self.object(depth + 1, patterns, fields),
            Some(b'[') => self.array(depth + 1, patterns),
            Some(b'"') => self.string(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => {
                if let Some(end) = self.s.canonical_number() {
                    self.out.copy(self.s.i..end);
                    self.s.i = end;
                    return Ok(());
                }
                match self.s.number()? {
                    Number::U64(v) => write_int(self.out.bytes(), v, false),
                    Number::I64(v) => write_int(self.out.bytes(), v.unsigned_abs(), v < 0),
                    Number::F64(v) => write_f64(self.out.bytes(), v),
                }
                Ok(())
            }
            _ => self.s.fail(),
        }
    }

    /// A string, written canonically: as it stands when it has no escapes.
    #[inline]
    fn string(&mut self) -> Result<()> {
        match self.s.string(&mut self.scratch)? {
            Text::Raw(raw) => self.out.quoted(raw),
            Text::Unescaped => write_bytes(self.out.bytes(), &self.scratch),
        }
        Ok(())
    }

    /// `true`, `false` or `null`.
    fn literal(&mut self, word: &[u8]) -> Result<()> {
        let at = self.s.i;
        self.s.literal(word)?;
        self.out.copy(at..self.s.i);
        Ok(())
    }

    /// The byte just scanned, which the output repeats.
    #[inline]
    fn keep_last(&mut self) {
        self.out.copy(self.s.i - 1..self.s.i);
    }

    /// The patterns that continue below `token` (pushed as a new range), and whether one of
    /// them ends there (the value at `token` is excluded).
    fn descend(
        &mut self,
        patterns: Range<usize>,
        key: Option<&Key>,
        index: usize,
    ) -> (Range<usize>, bool) {
        let start = self.patterns.len();
        let mut excluded = false;
        for p in patterns {
            let Some((first, rest)) = self.patterns[p].split_first() else {
                continue;
            };
            let hit = first == "*"
                || match key {
                    Some(key) => first.as_bytes() == key_bytes(self.s.b, &self.keys, key),
                    // Array elements: by index (or an empty token).
                    None => first.is_empty() || first.parse::<usize>() == Ok(index),
                };
            if hit {
                if rest.is_empty() {
                    excluded = true;
                } else {
                    self.patterns.push(rest);
                }
            }
        }
        (start..self.patterns.len(), excluded)
    }

    #[cfg_attr(not(target_arch = "wasm32"), inline(never))]
    fn array(&mut self, depth: usize, patterns: Range<usize>) -> Result<()> {
        if depth > MAX_DEPTH {
            return self.s.fail();
        }
        self.s.i += 1;
        self.keep_last();
        self.s.ws();
        if self.s.peek() == Some(b']') {
            self.s.i += 1;
            self.keep_last();
            return Ok(());
        }
        let mut written = false;
        let mut index = 0;
        // Where the comma before this element is.
        let mut comma = 0;
        loop {
            let mark = self.patterns.len();
            let (child, excluded) = if patterns.is_empty() {
                (mark..mark, false)
            } else {
                self.descend(patterns.clone(), None, index)
            };
            index += 1;
            if excluded {
                self.s.skip_value(&mut self.scratch)?;
            } else {
                if written {
                    self.out.copy(comma..comma + 1);
                }
                written = true;
                self.value(depth, child.clone(), None)?;
            }
            self.patterns.truncate(mark);
            self.s.ws();
            match self.s.peek() {
                Some(b',') => {
                    comma = self.s.i;
                    self.s.i += 1;
                }
                Some(b']') => {
                    self.s.i += 1;
                    self.keep_last();
                    return Ok(());
                }
                _ => return self.s.fail(),
            }
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), inline(never))]
    fn object(
        &mut self,
        depth: usize,
        patterns: Range<usize>,
        fields: Option<&mut FieldDigests>,
    ) -> Result<()> {
        if depth > MAX_DEPTH {
            return self.s.fail();
        }
        self.s.i += 1;
        self.keep_last();
        let start = self.out.len();
        let first_member = self.members.len();
        let first_key = self.keys.len();
        self.s.ws();
        if self.s.peek() == Some(b'}') {
            self.s.i += 1;
            self.keep_last();
            return Ok(());
        }
        // Where the comma before this member is.
        let mut comma = 0;
        loop {
            self.s.ws();
            if self.s.peek() != Some(b'"') {
                return self.s.fail();
            }
            let key = match self.s.string(&mut self.scratch)? {
                Text::Raw(raw) => Key::Body(raw),
                Text::Unescaped => {
                    let at = self.keys.len();
                    self.keys.extend_from_slice(&self.scratch);
                    Key::Unescaped(at..self.keys.len())
                }
            };
            self.s.expect(b':')?;
            let colon = self.s.i - 1;
            let mark = self.patterns.len();
            let (child, excluded) = if patterns.is_empty() {
                (mark..mark, false)
            } else {
                self.descend(patterns.clone(), Some(&key), 0)
            };
            if excluded {
                self.s.skip_value(&mut self.scratch)?;
            } else {
                // Written in place, `"key":value`, in the order of the body.
                if self.members.len() > first_member {
                    self.out.copy(comma..comma + 1);
                }
                let at = self.out.len();
                match &key {
                    Key::Body(raw) => self.out.quoted(raw.clone()),
                    Key::Unescaped(r) => write_bytes(self.out.bytes(), &self.keys[r.clone()]),
                }
                self.out.copy(colon..colon + 1);
                let value = self.out.len();
                self.value(depth, child.clone(), None)?;
                let prefix = prefix_of(key_bytes(self.s.b, &self.keys, &key));
                self.members.push(Member {
                    key,
                    prefix,
                    span: at..self.out.len(),
                    value,
                });
            }
            self.patterns.truncate(mark);
            self.s.ws();
            match self.s.peek() {
                Some(b',') => {
                    comma = self.s.i;
                    self.s.i += 1;
                }
                Some(b'}') => {
                    self.s.i += 1;
                    break;
                }
                _ => return self.s.fail(),
            }
        }
        self.finish_object(start, first_member, first_key, fields);
        self.keep_last();
        Ok(())
    }

    /// Puts the members written since `start` in order: sorted by the UTF-8 bytes of their
    /// names; of duplicate names the last one wins, as in serde_json. Members already in
    /// order (names strictly ascending) stay where they were written. The closing brace is
    /// the caller's.
    fn finish_object(
        &mut self,
        start: usize,
        first_member: usize,
        first_key: usize,
        mut fields: Option<&mut FieldDigests>,
    ) {
        let Canon {
            s,
            out,
            members,
            keys,
            scratch,
            ..
        } = self;
        let body = s.b;
        let name = |m: &Member| key_bytes(body, keys, &m.key);
        let members = &mut members[first_member..];
        let sorted = members
            .windows(2)
            .all(|w| order(body, keys, &w[0], &w[1]).is_lt());
        if sorted && fields.is_none() {
            // Nothing to read or move.
            self.members.truncate(first_member);
            self.keys.truncate(first_key);
            return;
        }
        let out = out.bytes();
        if let Some(fields) = fields.as_deref_mut() {
            let name_bytes = members.iter().map(|m| name(m).len()).sum();
            fields.reserve(members.len(), name_bytes);
        }
        if sorted {
            if let Some(fields) = fields {
                for m in members.iter() {
                    push_field(fields, name(m), &out[m.value..m.span.end]);
                }
            }
        } else {
            // The order of a small object is found as a permutation, by an insertion sort of
            // member numbers (moving a byte, not a member); a larger one's members are
            // sorted. Both are stable, so that of equal names the last one is last.
            let mut perm = [0u8; SMALL_OBJECT];
            let small = members.len() <= SMALL_OBJECT;
            if small {
                for i in 0..members.len() {
                    let mut j = i;
                    while j > 0
                        && order(body, keys, &members[perm[j - 1] as usize], &members[i]).is_gt()
                    {
                        perm[j] = perm[j - 1];
                        j -= 1;
                    }
                    perm[j] = i as u8;
                }
            } else {
                members.sort_by(|a, b| order(body, keys, a, b));
            }
            let members = &*members;
            let nth = |k: usize| {
                if small {
                    &members[perm[k] as usize]
                } else {
                    &members[k]
                }
            };
            let scratch = room(scratch, body.len());
            scratch.clear();
            scratch.extend_from_slice(&out[start..]);
            out.truncate(start);
            let mut wrote = false;
            for i in 0..members.len() {
                let m = nth(i);
                // Equal names are neighbours now: of those, the last one is written.
                if i + 1 < members.len() && {
                    let next = nth(i + 1);
                    next.prefix == m.prefix && name(next) == name(m)
                } {
                    continue;
                }
                if wrote {
                    out.push(b',');
                }
                wrote = true;
                out.extend_from_slice(&scratch[m.span.start - start..m.span.end - start]);
                if let Some(fields) = fields.as_deref_mut() {
                    let value = &scratch[m.value - start..m.span.end - start];
                    push_field(fields, name(m), value);
                }
            }
        }
        self.members.truncate(first_member);
        self.keys.truncate(first_key);
    }
}

/// Members in the order of their names' bytes. Prefixes that differ order keys as their
/// whole bytes do; a tie (a shared first eight bytes, or shorter keys that differ only by
/// trailing NULs) goes to the full comparison.
#[inline]
fn order(body: &[u8], keys: &[u8], a: &Member, b: &Member) -> core::cmp::Ordering {
    a.prefix
        .cmp(&b.prefix)
        .then_with(|| key_bytes(body, keys, &a.key).cmp(key_bytes(body, keys, &b.key)))
}

/// A top-level member's digest: XXH3-64 over its canonical value.
fn push_field(fields: &mut FieldDigests, name: &[u8], value: &[u8]) {
    // Checked to be UTF-8 when it was scanned.
    fields.push_utf8(name, xxhash_rust::xxh3::xxh3_64(value));
}

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
fn write_f64(out: &mut Vec<u8>, v: f64) {
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
fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
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

/// What a JSON pointer finds in a body.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// Nothing there.
    Missing,
    /// A string.
    String(String),
    /// A number, as its text in the body.
    Number(String),
    /// `true` or `false`.
    Bool(bool),
    /// Something else.
    NotString,
}

/// The value at JSON pointer `pointer` in `body`, read while scanning: the members and
/// elements off the path are skipped.
pub(crate) fn string_at(body: &[u8], pointer: &str) -> Result<Found> {
    let path: Vec<String> = if pointer.is_empty() {
        Vec::new()
    } else {
        parse_patterns(&[String::from(pointer)])
            .pop()
            .unwrap_or_default()
    };
    let mut f = Finder {
        s: Scan { b: body, i: 0 },
        text: Vec::new(),
        open: Vec::new(),
    };
    let found = f.find(0, &path)?;
    f.s.end()?;
    Ok(found)
}

struct Finder<'a> {
    s: Scan<'a>,
    text: Vec<u8>,
    open: Vec<u8>,
}

impl Finder<'_> {
    fn found(path: &[String]) -> Found {
        if path.is_empty() {
            Found::NotString
        } else {
            Found::Missing
        }
    }

    fn boolean(path: &[String], value: bool) -> Found {
        if path.is_empty() {
            Found::Bool(value)
        } else {
            Found::Missing
        }
    }

    fn find(&mut self, depth: usize, path: &[String]) -> Result<Found> {
        self.s.ws();
        match self.s.peek() {
            Some(b'"') => {
                let text = match self.s.string(&mut self.text)? {
                    Text::Raw(raw) => &self.s.b[raw],
                    Text::Unescaped => &self.text[..],
                };
                Ok(if path.is_empty() {
                    Found::String(String::from_utf8_lossy(text).into_owned())
                } else {
                    Found::Missing
                })
            }
            Some(b'[') => self.array(depth + 1, path),
            Some(b'{') => self.object(depth + 1, path),
            Some(b't') => self.s.literal(b"true").map(|()| Self::boolean(path, true)),
            Some(b'f') => self
                .s
                .literal(b"false")
                .map(|()| Self::boolean(path, false)),
            Some(b'n') => self.s.literal(b"null").map(|()| Self::found(path)),
            Some(b'-' | b'0'..=b'9') => {
                let start = self.s.i;
                self.s.number()?;
                Ok(if path.is_empty() {
                    let text = &self.s.b[start..self.s.i];
                    Found::Number(String::from_utf8_lossy(text).into_owned())
                } else {
                    Found::Missing
                })
            }
            _ => self.s.fail(),
        }
    }

    fn array(&mut self, depth: usize, path: &[String]) -> Result<Found> {
        if depth > MAX_DEPTH {
            return self.s.fail();
        }
        self.s.i += 1;
        let mut found = Self::found(path);
        self.s.ws();
        if self.s.peek() == Some(b']') {
            self.s.i += 1;
            return Ok(found);
        }
        let target = path.first().and_then(|t| t.parse::<usize>().ok());
        let mut i = 0;
        loop {
            if Some(i) == target {
                found = self.find(depth, &path[1..])?;
            } else {
                self.s.skip_value(&mut self.open)?;
            }
            i += 1;
            self.s.ws();
            match self.s.peek() {
                Some(b',') => self.s.i += 1,
                Some(b']') => {
                    self.s.i += 1;
                    return Ok(found);
                }
                _ => return self.s.fail(),
            }
        }
    }

    fn object(&mut self, depth: usize, path: &[String]) -> Result<Found> {
        if depth > MAX_DEPTH {
            return self.s.fail();
        }
        self.s.i += 1;
        let mut found = Self::found(path);
        self.s.ws();
        if self.s.peek() == Some(b'}') {
            self.s.i += 1;
            return Ok(found);
        }
        loop {
            self.s.ws();
            if self.s.peek() != Some(b'"') {
                return self.s.fail();
            }
            let on_path = {
                let key = match self.s.string(&mut self.text)? {
                    Text::Raw(raw) => &self.s.b[raw],
                    Text::Unescaped => &self.text[..],
                };
                path.first().is_some_and(|t| t.as_bytes() == key)
            };
            self.s.expect(b':')?;
            if on_path {
                found = self.find(depth, &path[1..])?;
            } else {
                self.s.skip_value(&mut self.open)?;
            }
            self.s.ws();
            match self.s.peek() {
                Some(b',') => self.s.i += 1,
                Some(b'}') => {
                    self.s.i += 1;
                    return Ok(found);
                }
                _ => return self.s.fail(),
            }
        }
    }
}

/// 10^0 to 10^308, each the nearest `f64`.
#[rustfmt::skip]
static POW10: [f64; 309] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9,
    1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19,
    1e20, 1e21, 1e22, 1e23, 1e24, 1e25, 1e26, 1e27, 1e28, 1e29,
    1e30, 1e31, 1e32, 1e33, 1e34, 1e35, 1e36, 1e37, 1e38, 1e39,
    1e40, 1e41, 1e42, 1e43, 1e44, 1e45, 1e46, 1e47, 1e48, 1e49,
    1e50, 1e51, 1e52, 1e53, 1e54, 1e55, 1e56, 1e57, 1e58, 1e59,
    1e60, 1e61, 1e62, 1e63, 1e64, 1e65, 1e66, 1e67, 1e68, 1e69,
    1e70, 1e71, 1e72, 1e73, 1e74, 1e75, 1e76, 1e77, 1e78, 1e79,
    1e80, 1e81, 1e82, 1e83, 1e84, 1e85, 1e86, 1e87, 1e88, 1e89,
    1e90, 1e91, 1e92, 1e93, 1e94, 1e95, 1e96, 1e97, 1e98, 1e99,
    1e100, 1e101, 1e102, 1e103, 1e104, 1e105, 1e106, 1e107, 1e108, 1e109,
    1e110, 1e111, 1e112, 1e113, 1e114, 1e115, 1e116, 1e117, 1e118, 1e119,
    1e120, 1e121, 1e122, 1e123, 1e124, 1e125, 1e126, 1e127, 1e128, 1e129,
    1e130, 1e131, 1e132, 1e133, 1e134, 1e135, 1e136, 1e137, 1e138, 1e139,
    1e140, 1e141, 1e142, 1e143, 1e144, 1e145, 1e146, 1e147, 1e148, 1e149,
    1e150, 1e151, 1e152, 1e153, 1e154, 1e155, 1e156, 1e157, 1e158, 1e159,
    1e160, 1e161, 1e162, 1e163, 1e164, 1e165, 1e166, 1e167, 1e168, 1e169,
    1e170, 1e171, 1e172, 1e173, 1e174, 1e175, 1e176, 1e177, 1e178, 1e179,
    1e180, 1e181, 1e182, 1e183, 1e184, 1e185, 1e186, 1e187, 1e188, 1e189,
    1e190, 1e191, 1e192, 1e193, 1e194, 1e195, 1e196, 1e197, 1e198, 1e199,
    1e200, 1e201, 1e202, 1e203, 1e204, 1e205, 1e206, 1e207, 1e208, 1e209,
    1e210, 1e211, 1e212, 1e213, 1e214, 1e215, 1e216, 1e217, 1e218, 1e219,
    1e220, 1e221, 1e222, 1e223, 1e224, 1e225, 1e226, 1e227, 1e228, 1e229,
    1e230, 1e231, 1e232, 1e233, 1e234, 1e235, 1e236, 1e237, 1e238, 1e239,
    1e240, 1e241, 1e242, 1e243, 1e244, 1e245, 1e246, 1e247, 1e248, 1e249,
    1e250, 1e251, 1e252, 1e253, 1e254, 1e255, 1e256, 1e257, 1e258, 1e259,
    1e260, 1e261, 1e262, 1e263, 1e264, 1e265, 1e266, 1e267, 1e268, 1e269,
    1e270, 1e271, 1e272, 1e273, 1e274, 1e275, 1e276, 1e277, 1e278, 1e279,
    1e280, 1e281, 1e282, 1e283, 1e284, 1e285, 1e286, 1e287, 1e288, 1e289,
    1e290, 1e291, 1e292, 1e293, 1e294, 1e295, 1e296, 1e297, 1e298, 1e299,
    1e300, 1e301, 1e302, 1e303, 1e304, 1e305, 1e306, 1e307, 1e308,
];

#[cfg(test)]
mod prefix_tests {
    use super::prefix_of;

    #[test]
    fn a_prefix_is_the_first_eight_bytes_big_endian_zero_padded() {
        let bytes: alloc::vec::Vec<u8> = (1..=12u8).map(|b| b.wrapping_mul(37)).collect();
        for len in 0..=bytes.len() {
            let key = &bytes[..len];
            let mut padded = [0u8; 8];
            let n = len.min(8);
            padded[..n].copy_from_slice(&key[..n]);
            assert_eq!(prefix_of(key), u64::from_be_bytes(padded), "{len} bytes");
        }
    }
}

#[cfg(test)]
mod pointer_tests {
    use super::*;

    #[test]
    fn a_pointer_finds_strings_in_objects_and_arrays_and_nothing_else() {
        let body = br#"{"a/b":{"k":"x"},"items":[{"key":"one"},{"key":"two"}],"n":7,"f":-1.5e3,"s":"top","t":true,"u":false,"z":null}"#;
        let at = |p: &str| string_at(body, p).unwrap();
        assert_eq!(at("/a~1b/k"), Found::String("x".into()));
        assert_eq!(at("/items/1/key"), Found::String("two".into()));
        assert_eq!(at("/s"), Found::String("top".into()));
        assert_eq!(at("/n"), Found::Number("7".into()));
        assert_eq!(at("/f"), Found::Number("-1.5e3".into()));
        assert_eq!(at("/t"), Found::Bool(true));
        assert_eq!(at("/u"), Found::Bool(false));
        assert_eq!(at("/t/deeper"), Found::Missing);
        assert_eq!(at("/z"), Found::NotString);
        assert_eq!(at("/items"), Found::NotString);
        assert_eq!(at("/items/2/key"), Found::Missing);
        assert_eq!(at("/s/deeper"), Found::Missing);
        assert_eq!(at("/nope"), Found::Missing);
        assert_eq!(
            string_at(br#""whole""#, "").unwrap(),
            Found::String("whole".into())
        );
        assert!(string_at(b"{not json", "/a").is_err());
        assert!(string_at(br#"{"a":"x"} trailing"#, "/a").is_err());
    }
}
