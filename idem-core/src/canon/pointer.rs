//! Reading one value at a JSON pointer while scanning, skipping what is off the path.

use super::*;

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

impl Found {
    /// What one value's JSON text reads as, written by a host's own serialiser from a document
    /// it parsed (JavaScript's `JSON.stringify` of the value): a string is its text, a number
    /// its text, `true` and `false` read, anything else (`null`, an object, an array) is
    /// [`Found::NotString`]. A string with escapes is also [`Found::NotString`]: the names read
    /// this way have no characters that a serialiser escapes.
    pub(crate) fn of_json_text(text: &str) -> Found {
        match text.as_bytes() {
            [b'"', inner @ .., b'"'] if inner.iter().all(|&b| b != b'\\') => {
                // `get`, not an index: no panic path (and its message) in the client's module.
                text.get(1..text.len() - 1)
                    .map_or(Found::NotString, |s| Found::String(String::from(s)))
            }
            b"true" => Found::Bool(true),
            b"false" => Found::Bool(false),
            [b'-' | b'0'..=b'9', ..] => Found::Number(String::from(text)),
            _ => Found::NotString,
        }
    }
}

/// Text the scan read: a string it checked to be UTF-8, or a number's ASCII digits and signs
/// (so the empty fallback is never taken).
fn owned(text: &[u8]) -> String {
    core::str::from_utf8(text)
        .map(String::from)
        .unwrap_or_default()
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

/// The values at `N` member paths of `body` (each a list of member names from the top-level
/// object; no array indices), found in one pass: the last of duplicate members wins, a string
/// is unescaped, a number kept as its text (checked for its syntax only), `true` and `false`
/// read, any other value [`Found::NotString`], and a path with no value [`Found::Missing`].
/// An error when the body is not JSON.
pub(crate) fn members_at<const N: usize>(body: &[u8], paths: [&[&str]; N]) -> Result<[Found; N]> {
    let mut m = Members {
        s: Scan { b: body, i: 0 },
        text: Vec::new(),
        open: Vec::new(),
        found: core::array::from_fn(|_| Found::Missing),
    };
    m.value(&paths, (1u64 << N) - 1, 0)?;
    m.s.end()?;
    Ok(m.found)
}

/// [`members_at`]'s scan: `on` is a bit set of the paths the value is on, `depth` the
/// number of member names read to reach it.
struct Members<'a, const N: usize> {
    s: Scan<'a>,
    text: Vec<u8>,
    open: Vec<u8>,
    found: [Found; N],
}

impl<const N: usize> Members<'_, N> {
    fn value(&mut self, paths: &[&[&str]; N], on: u64, depth: usize) -> Result<()> {
        self.s.ws();
        let here = |i: usize| on & (1 << i) != 0 && paths[i].len() == depth;
        let deeper = (0..N).any(|i| on & (1 << i) != 0 && paths[i].len() > depth);
        let found = match self.s.peek() {
            Some(b'"') => Found::String(match self.s.string(&mut self.text)? {
                Text::Raw(raw) => owned(&self.s.b[raw]),
                Text::Unescaped => owned(&self.text),
            }),
            Some(b'-' | b'0'..=b'9') => {
                let start = self.s.i;
                self.s.skip_number()?;
                Found::Number(owned(&self.s.b[start..self.s.i]))
            }
            Some(b't') => self.s.literal(b"true").map(|()| Found::Bool(true))?,
            Some(b'f') => self.s.literal(b"false").map(|()| Found::Bool(false))?,
            Some(b'{') if deeper => {
                self.object(paths, on, depth)?;
                Found::NotString
            }
            _ => {
                self.s.skip_value(&mut self.open)?;
                Found::NotString
            }
        };
        let mut found = Some(found);
        for i in (0..N).filter(|&i| here(i)) {
            if let Some(f) = found.take() {
                self.found[i] = f;
            }
        }
        Ok(())
    }

    fn object(&mut self, paths: &[&[&str]; N], on: u64, depth: usize) -> Result<()> {
        self.s.i += 1;
        self.s.ws();
        if self.s.peek() == Some(b'}') {
            self.s.i += 1;
            return Ok(());
        }
        loop {
            self.s.ws();
            if self.s.peek() != Some(b'"') {
                return self.s.fail();
            }
            let mut next = 0;
            {
                let key = match self.s.string(&mut self.text)? {
                    Text::Raw(raw) => &self.s.b[raw],
                    Text::Unescaped => &self.text[..],
                };
                for (i, path) in paths.iter().enumerate() {
                    if on & (1 << i) != 0 && path.get(depth).is_some_and(|t| t.as_bytes() == key) {
                        next |= 1 << i;
                    }
                }
            }
            self.s.expect(b':')?;
            if next != 0 {
                self.value(paths, next, depth + 1)?;
            } else {
                self.s.skip_value(&mut self.open)?;
            }
            self.s.ws();
            match self.s.peek() {
                Some(b',') => self.s.i += 1,
                Some(b'}') => {
                    self.s.i += 1;
                    return Ok(());
                }
                _ => return self.s.fail(),
            }
        }
    }
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
                    Found::String(owned(text))
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
                    Found::Number(owned(text))
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

    #[test]
    fn members_are_found_in_one_pass_as_a_pointer_finds_each() {
        let bodies: [&[u8]; 6] = [
            br#"{"a/b":{"k":"x"},"n":7,"f":-1.5e3,"s":"top","t":true,"u":false,"z":null,"o":{"k":[1,{"k":2}]},"s":"last"}"#,
            br#" { "o" : { "k" : "\u00e9" , "n" : 12 } , "t" : [ ] } "#,
            br#"["not", "an", "object"]"#,
            br#""whole""#,
            b"{}",
            br#"{"o":{"k":1}}"#,
        ];
        let paths: [&[&str]; 9] = [
            &["a/b", "k"],
            &["n"],
            &["f"],
            &["s"],
            &["t"],
            &["u"],
            &["z"],
            &["o", "k"],
            &["o", "n"],
        ];
        for body in bodies {
            let found = members_at(body, paths).unwrap();
            for (path, found) in paths.iter().zip(found) {
                let mut pointer = String::new();
                for token in *path {
                    pointer.push('/');
                    pointer.push_str(&token.replace('~', "~0").replace('/', "~1"));
                }
                assert_eq!(found, string_at(body, &pointer).unwrap(), "{pointer}");
            }
        }
        for bad in [
            &b"{not json"[..],
            br#"{"s":"x"} trailing"#,
            br#"{"s":01}"#,
            b"",
        ] {
            assert!(members_at(bad, paths).is_err());
            assert!(string_at(bad, "/s").is_err());
        }
    }
}
