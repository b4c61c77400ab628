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
