//! [`members_at`]: a few members of a small JSON document, read in one pass by a reader
//! written for size. The client reads the server's status document with it, so the client's
//! module carries this reader and not the canonicaliser's scanner, which is built for speed.
//! It accepts and refuses what the scanner does (a test races it against the scanner's
//! reader on any bytes): strings on the paths are unescaped and checked to be UTF-8 with
//! paired surrogates, skipped strings only for the form of their escapes, as serde_json
//! skips an ignored string; numbers are checked for their syntax only.

use super::{escape, Found};
use alloc::string::String;
use alloc::vec::Vec;

/// The values at `N` member paths of `body` (each a list of member names from the top-level
/// object; no array indices), found in one pass (the last of duplicate members wins), or
/// `None` when the body is not JSON. A string is unescaped, a number kept as its text,
/// `true` and `false` read; any other value is [`Found::NotString`], and a path with no
/// value [`Found::Missing`].
pub(crate) fn members_at<const N: usize>(body: &[u8], paths: [&[&str]; N]) -> Option<[Found; N]> {
    let mut r = Reader {
        b: body,
        i: 0,
        text: Vec::new(),
    };
    let mut found = core::array::from_fn(|_| Found::Missing);
    r.value(&paths, &mut found, (1u64 << N) - 1, 0)?;
    r.ws();
    (r.i == body.len()).then_some(found)
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
    /// The string read last, unescaped.
    text: Vec<u8>,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// The current byte, consumed.
    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    /// Whitespace, then `want`.
    fn eat(&mut self, want: u8) -> Option<()> {
        self.ws();
        (self.next()? == want).then_some(())
    }

    /// The rest of `word` after its first byte, which the caller has seen.
    fn literal(&mut self, word: &[u8]) -> Option<()> {
        word.iter()
            .try_for_each(|&w| (self.next()? == w).then_some(()))
    }

    fn hex4(&mut self) -> Option<u32> {
        let mut n = 0;
        for _ in 0..4 {
            n = n << 4 | char::from(self.next()?).to_digit(16)?;
        }
        Some(n)
    }

    /// A string at its opening quote. `read`: unescaped into `text` and checked to be UTF-8
    /// with paired surrogates; otherwise skipped, its escapes checked for their form only.
    fn string(&mut self, read: bool) -> Option<()> {
        self.i += 1;
        self.text.clear();
        loop {
            let c = self.next()?;
            match c {
                b'"' => break,
                b'\\' => {
                    let e = self.next()?;
                    if e != b'u' {
                        self.text.push(escape::short(e)?);
                        continue;
                    }
                    let mut code = self.hex4()?;
                    if read {
                        if escape::leads(code) {
                            self.literal(b"\\u")?;
                            code = escape::pair(code, self.hex4()?)?;
                        }
                        let ch = char::from_u32(code)?;
                        self.text
                            .extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                }
                0..=0x1f => return None,
                _ => self.text.push(c),
            }
        }
        if read {
            core::str::from_utf8(&self.text).ok()?;
        }
        Some(())
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - start
    }

    /// A number's syntax: a sign, an integer without leading zeros, a fraction, an
    /// exponent.
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let int = self.i;
        let n = self.digits();
        if n == 0 || n > 1 && self.b[int] == b'0' {
            return None;
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            (self.digits() > 0).then_some(())?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            (self.digits() > 0).then_some(())?;
        }
        Some(())
    }

    /// Skips one value of any depth, checking its syntax, without recursion: `open` holds
    /// the closing bracket of each container entered.
    fn skip(&mut self) -> Option<()> {
        let mut open = Vec::new();
        loop {
            self.ws();
            match self.peek()? {
                c @ (b'[' | b'{') => {
                    self.i += 1;
                    self.ws();
                    let close = c + 2;
                    if self.peek() == Some(close) {
                        self.i += 1;
                    } else {
                        open.push(close);
                        if close == b'}' {
                            self.key()?;
                        }
                        continue;
                    }
                }
                b'"' => self.string(false)?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => self.number()?,
            }
            // After a value: close what ends here, or go on to the next member or element.
            loop {
                let Some(&close) = open.last() else {
                    return Some(());
                };
                self.ws();
                let c = self.next()?;
                if c == b',' {
                    if close == b'}' {
                        self.key()?;
                    }
                    break;
                }
                (c == close).then_some(())?;
                open.pop();
            }
        }
    }

    /// A skipped object's key and its colon.
    fn key(&mut self) -> Option<()> {
        self.ws();
        (self.peek()? == b'"').then_some(())?;
        self.string(false)?;
        self.eat(b':')
    }

    /// The value at the current position, on the paths in the bit set `on`, `depth` member
    /// names down.
    fn value<const N: usize>(
        &mut self,
        paths: &[&[&str]; N],
        found: &mut [Found; N],
        on: u64,
        depth: usize,
    ) -> Option<()> {
        self.ws();
        let start = self.i;
        let deeper = (0..N).any(|i| on & (1 << i) != 0 && paths[i].len() > depth);
        let value = match self.peek()? {
            b'"' => {
                self.string(true)?;
                Found::String(owned(&self.text))
            }
            b'-' | b'0'..=b'9' => {
                self.number()?;
                Found::Number(owned(&self.b[start..self.i]))
            }
            b't' => self.literal(b"true").map(|()| Found::Bool(true))?,
            b'f' => self.literal(b"false").map(|()| Found::Bool(false))?,
            b'{' if deeper => {
                self.object(paths, found, on, depth)?;
                Found::NotString
            }
            _ => {
                self.skip()?;
                Found::NotString
            }
        };
        if let Some(i) = (0..N).find(|&i| on & (1 << i) != 0 && paths[i].len() == depth) {
            found[i] = value;
        }
        Some(())
    }

    fn object<const N: usize>(
        &mut self,
        paths: &[&[&str]; N],
        found: &mut [Found; N],
        on: u64,
        depth: usize,
    ) -> Option<()> {
        self.i += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            (self.peek()? == b'"').then_some(())?;
            self.string(true)?;
            let mut next = 0;
            for (i, path) in paths.iter().enumerate() {
                if on & (1 << i) != 0 && path.get(depth).is_some_and(|t| t.as_bytes() == self.text)
                {
                    next |= 1 << i;
                }
            }
            self.eat(b':')?;
            if next != 0 {
                self.value(paths, found, next, depth + 1)?;
            } else {
                self.skip()?;
            }
            self.ws();
            match self.next()? {
                b',' => {}
                b'}' => return Some(()),
                _ => return None,
            }
        }
    }
}

/// Text the reader checked: a UTF-8 string, or a number's ASCII (the empty fallback is never
/// taken).
fn owned(text: &[u8]) -> String {
    core::str::from_utf8(text)
        .map(String::from)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use proptest::prelude::*;

    const PATHS: [&[&str]; 4] = [
        &["status"],
        &["response", "status"],
        &["response", "replayable"],
        &["retryAfter"],
    ];

    /// What the scanner's reader makes of `body`.
    fn scanner(body: &[u8]) -> Option<[Found; 4]> {
        super::super::pointer::members_at_scan(body, PATHS).ok()
    }

    /// Bits of JSON, valid and broken, that documents are made of.
    const PIECES: &[&[u8]] = &[
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b" ",
        b"\n",
        b"\"status\"",
        b"\"response\"",
        b"\"replayable\"",
        b"\"retryAfter\"",
        b"\"completed\"",
        b"\"in-progress\"",
        b"\"st\\u0061tus\"",
        b"\"\\ud83d\\ude00\"",
        b"\"\\ud83d\"",
        b"\"\\udc00\"",
        b"\"\\ud83d\\u0041\"",
        b"\"\\ud83d\\ud83d\"",
        b"\"\\ud83dx\"",
        b"\"\xff\xfe\"",
        b"\"\\x\"",
        b"\"\xc3\xa9\"",
        b"\"\\u00e9\"",
        b"\"a\\\"b\"",
        b"\"\\/\\b\\f\\n\\r\\t\"",
        b"\"\\u12g4\"",
        b"\"\x01\"",
        b"201",
        b"-0",
        b"01",
        b"1.",
        b"1.5e3",
        b"2E-2",
        b"1e",
        b"-",
        b"true",
        b"false",
        b"null",
        b"tru",
        b"nul",
        b"\"",
        b"\\",
    ];

    fn piece() -> impl Strategy<Value = &'static [u8]> {
        prop::sample::select(PIECES.to_vec())
    }

    fn document() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            // Pieces in any order: mostly not JSON.
            prop::collection::vec(piece(), 0..24).prop_map(|p| p.concat()),
            // Status documents, with pieces spliced in.
            (
                prop::sample::select(vec![
                    r#"{"key":"k","status":"completed","response":{"status":201,"replayable":true}}"#,
                    r#"{"status":"in-progress","retryAfter":3}"#,
                    r#" { "status" : "expired" , "x" : [1, {"a": null}, "\u00ff"] } "#,
                    r#"{"response":{"status":201},"response":5,"status":"completed"}"#,
                    r#"{"response":[{"status":1}],"status":"released","status":"held"}"#,
                ]),
                any::<prop::sample::Index>(),
                piece(),
                any::<bool>(),
            )
                .prop_map(|(doc, at, piece, splice)| {
                    let mut d = doc.as_bytes().to_vec();
                    if splice {
                        let at = at.index(d.len() + 1);
                        d.splice(at..at, piece.iter().copied());
                    }
                    d
                }),
            prop::collection::vec(any::<u8>(), 0..40),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// The same bodies accepted, and the same values found, as the scanner's reader.
        #[test]
        fn reads_as_the_scanner(body in document()) {
            prop_assert_eq!(members_at(&body, PATHS), scanner(&body), "{:?}", String::from_utf8_lossy(&body));
        }
    }

    #[test]
    fn known_documents() {
        let [status, code, replayable, retry] = members_at(
            br#"{"status":"completed","response":{"status":201,"replayable":true},"retryAfter":1.5e1}"#,
            PATHS,
        )
        .unwrap();
        assert_eq!(status, Found::String("completed".into()));
        assert_eq!(code, Found::Number("201".into()));
        assert_eq!(replayable, Found::Bool(true));
        assert_eq!(retry, Found::Number("1.5e1".into()));
        assert_eq!(members_at(b"{\"status\":\"\\ud800\"}", PATHS), None);
        assert_eq!(members_at(b"[1,2] x", PATHS), None);
    }
}
