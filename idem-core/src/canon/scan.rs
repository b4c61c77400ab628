//! The scanner: bytes of a JSON text, read as serde_json reads them.
//!
//! One file for one hot loop: the scanner and the tables it branches on stay together, so
//! that its path reads in one place and stays in one unit for the optimiser.

use super::*;

/// The bytes of a JSON text.
pub(super) struct Scan<'a> {
    pub(super) b: &'a [u8],
    pub(super) i: usize,
}

/// A string as scanned: its raw bytes in the body (no escapes), or unescaped into a buffer.
pub(super) enum Text {
    Raw(Range<usize>),
    Unescaped,
}

/// A number as serde_json reads it.
pub(super) enum Number {
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> Scan<'a> {
    pub(super) fn fail<T>(&self) -> Result<T> {
        Err(JsonError { at: self.i })
    }

    #[inline]
    pub(super) fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline]
    pub(super) fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// Whitespace, then `want`.
    #[inline]
    pub(super) fn expect(&mut self, want: u8) -> Result<()> {
        self.ws();
        if self.peek() == Some(want) {
            self.i += 1;
            Ok(())
        } else {
            self.fail()
        }
    }

    /// Nothing but whitespace is left.
    pub(super) fn end(&mut self) -> Result<()> {
        self.ws();
        if self.i == self.b.len() {
            Ok(())
        } else {
            self.fail()
        }
    }

    /// `true`, `false` or `null`, starting at the current byte.
    pub(super) fn literal(&mut self, word: &[u8]) -> Result<()> {
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
    pub(super) fn string(&mut self, text: &mut Vec<u8>) -> Result<Text> {
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
        if c != b'u' {
            let Some(byte) = escape::short(c) else {
                return self.fail();
            };
            text.push(byte);
            return Ok(());
        }
        let mut code = u32::from(self.hex4()?);
        if escape::leads(code) {
            if self.peek() != Some(b'\\') {
                return self.fail();
            }
            self.i += 1;
            if self.peek() != Some(b'u') {
                return self.fail();
            }
            self.i += 1;
            let low = u32::from(self.hex4()?);
            let Some(pair) = escape::pair(code, low) else {
                return self.fail();
            };
            code = pair;
        }
        // A trailing surrogate alone is no char.
        let Some(ch) = char::from_u32(code) else {
            return self.fail();
        };
        text.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
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
    pub(super) fn canonical_number(&self) -> Option<usize> {
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
    pub(super) fn number(&mut self) -> Result<Number> {
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
    pub(super) fn skip_number(&mut self) -> Result<()> {
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
    pub(super) fn skip_value(&mut self, open: &mut Vec<u8>) -> Result<()> {
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

/// The scratch buffer, with room for a whole body of `len` bytes made on its first use,
/// instead of growing by doubling from nothing: its uses are parts of the body or of its
/// output.
#[inline]
pub(super) fn room(scratch: &mut Vec<u8>, len: usize) -> &mut Vec<u8> {
    if scratch.capacity() == 0 {
        scratch.reserve(len);
    }
    scratch
}
