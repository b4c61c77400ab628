//! Streaming JSON canonicalisation (RFC 8785 where practical) for fingerprints.
//!
//! The body is parsed by serde_json and written out canonically as it is read, without
//! building a `Value` tree: each object's members are written to a scratch buffer, then
//! copied out in sorted order. Excluded fields are skipped while parsing. For the top-level
//! object the members' canonical bytes are also digested one by one, so that a mismatch can
//! name the fields that differ.

use crate::fingerprint::FieldDigest;
use alloc::borrow::Cow;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use sha2::{Digest, Sha256};

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

/// Canonicalises `body` into `out`; fills `fields` with per-member digests when the body is
/// an object.
pub(crate) fn canonicalise(
    body: &[u8],
    patterns: &[Vec<String>],
    out: &mut Vec<u8>,
    fields: &mut Vec<FieldDigest>,
) -> Result<(), serde_json::Error> {
    let roots: Vec<&[String]> = patterns.iter().map(Vec::as_slice).collect();
    let mut de = serde_json::Deserializer::from_slice(body);
    Canon {
        out,
        patterns: &roots,
        fields: Some(fields),
    }
    .deserialize(&mut de)?;
    de.end()
}

struct Canon<'a, 'p> {
    out: &'a mut Vec<u8>,
    /// The remaining tokens of every pattern that matches the path so far.
    patterns: &'a [&'p [String]],
    /// Set for the top-level value only.
    fields: Option<&'a mut Vec<FieldDigest>>,
}

/// The patterns that continue below `token`, and whether one of them ends there (the value
/// at `token` is excluded).
fn descend<'p>(
    patterns: &[&'p [String]],
    token: &str,
    index: Option<usize>,
) -> (Vec<&'p [String]>, bool) {
    let mut next = Vec::new();
    let mut excluded = false;
    for p in patterns {
        let Some((first, rest)) = p.split_first() else {
            continue;
        };
        let hit = first == "*"
            || first == token
            || index.is_some_and(|i| first.parse::<usize>() == Ok(i));
        if hit {
            if rest.is_empty() {
                excluded = true;
            } else {
                next.push(rest);
            }
        }
    }
    (next, excluded)
}

impl<'de> DeserializeSeed<'de> for Canon<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Canon<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        write_int(self.out, v, false);
        Ok(())
    }
    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        write_int(self.out, v.unsigned_abs(), v < 0);
        Ok(())
    }
    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        // Integral values below 2^53 are written as integers, as ECMAScript does; others
        // in their shortest round-trip form. serde_json never yields NaN or infinities.
        if v == (v as i64) as f64 && v.abs() < 9_007_199_254_740_992.0 {
            let i = v as i64;
            write_int(self.out, i.unsigned_abs(), i < 0);
        } else {
            self.out
                .extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
        }
        Ok(())
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        write_str(self.out, v);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.out.push(b'[');
        let mut first = true;
        let mut index = 0usize;
        loop {
            let (child, excluded) = if self.patterns.is_empty() {
                (Vec::new(), false)
            } else {
                descend(self.patterns, "", Some(index))
            };
            index += 1;
            if excluded {
                if seq.next_element::<IgnoredAny>()?.is_none() {
                    break;
                }
                continue;
            }
            let mark = self.out.len();
            if !first {
                self.out.push(b',');
            }
            let seed = Canon {
                out: &mut *self.out,
                patterns: &child,
                fields: None,
            };
            if seq.next_element_seed(seed)?.is_none() {
                self.out.truncate(mark);
                break;
            }
            first = false;
        }
        self.out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut scratch: Vec<u8> = Vec::new();
        let mut members: Vec<(Cow<'de, str>, usize, usize)> = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let (child, excluded) = if self.patterns.is_empty() {
                (Vec::new(), false)
            } else {
                descend(self.patterns, &key, None)
            };
            if excluded {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let start = scratch.len();
            map.next_value_seed(Canon {
                out: &mut scratch,
                patterns: &child,
                fields: None,
            })?;
            members.push((key, start, scratch.len()));
        }
        // Sorted by UTF-8 bytes; of duplicate names the last one wins, as in serde_json.
        members.sort_by(|a, b| a.0.cmp(&b.0));
        let mut fields = self.fields;
        self.out.push(b'{');
        let mut wrote = false;
        for (i, (name, start, end)) in members.iter().enumerate() {
            if members.get(i + 1).is_some_and(|next| next.0 == *name) {
                continue;
            }
            if wrote {
                self.out.push(b',');
            }
            wrote = true;
            write_str(self.out, name);
            self.out.push(b':');
            let value = &scratch[*start..*end];
            self.out.extend_from_slice(value);
            if let Some(fields) = fields.as_deref_mut() {
                let d = Sha256::digest(value);
                let mut first = [0u8; 8];
                first.copy_from_slice(&d[..8]);
                fields.push(FieldDigest {
                    name: String::from(&**name),
                    digest: u64::from_le_bytes(first),
                });
            }
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// Reads an object key, borrowing it from the input when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(String::from(v)))
    }
}

fn write_int(out: &mut Vec<u8>, mut v: u64, negative: bool) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if negative {
        out.push(b'-');
    }
    out.extend_from_slice(&buf[i..]);
}

/// A JSON string with RFC 8785's minimal escapes.
pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = s.as_bytes();
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
    /// Something else.
    NotString,
}

/// The value at JSON pointer `pointer` in `body`, read while parsing (no `Value` tree): the
/// members and elements off the path are skipped.
pub(crate) fn string_at(body: &[u8], pointer: &str) -> Result<Found, serde_json::Error> {
    let path = parse_patterns(&[String::from(pointer)])
        .pop()
        .unwrap_or_default();
    let path: Vec<String> = if pointer.is_empty() { Vec::new() } else { path };
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Finder { path: &path }.deserialize(&mut de)?;
    de.end()?;
    Ok(found)
}

struct Finder<'p> {
    path: &'p [String],
}

impl<'de> DeserializeSeed<'de> for Finder<'_> {
    type Value = Found;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Found, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Finder<'_> {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E>(self, v: &str) -> Result<Found, E> {
        Ok(if self.path.is_empty() {
            Found::String(String::from(v))
        } else {
            Found::Missing
        })
    }
    fn visit_bool<E>(self, _: bool) -> Result<Found, E> {
        Ok(self.scalar())
    }
    fn visit_unit<E>(self) -> Result<Found, E> {
        Ok(self.scalar())
    }
    fn visit_u64<E>(self, _: u64) -> Result<Found, E> {
        Ok(self.scalar())
    }
    fn visit_i64<E>(self, _: i64) -> Result<Found, E> {
        Ok(self.scalar())
    }
    fn visit_f64<E>(self, _: f64) -> Result<Found, E> {
        Ok(self.scalar())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        let target = self.path.first().and_then(|t| t.parse::<usize>().ok());
        let mut found = if self.path.is_empty() {
            Found::NotString
        } else {
            Found::Missing
        };
        let mut i = 0;
        loop {
            if Some(i) == target {
                match seq.next_element_seed(Finder {
                    path: &self.path[1..],
                })? {
                    Some(f) => found = f,
                    None => break,
                }
            } else if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            i += 1;
        }
        Ok(found)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let mut found = if self.path.is_empty() {
            Found::NotString
        } else {
            Found::Missing
        };
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if self.path.first().is_some_and(|t| *t == key) {
                found = map.next_value_seed(Finder {
                    path: &self.path[1..],
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

impl Finder<'_> {
    fn scalar(&self) -> Found {
        if self.path.is_empty() {
            Found::NotString
        } else {
            Found::Missing
        }
    }
}

#[cfg(test)]
mod pointer_tests {
    use super::*;

    #[test]
    fn a_pointer_finds_strings_in_objects_and_arrays_and_nothing_else() {
        let body = br#"{"a/b":{"k":"x"},"items":[{"key":"one"},{"key":"two"}],"n":7,"s":"top"}"#;
        let at = |p: &str| string_at(body, p).unwrap();
        assert_eq!(at("/a~1b/k"), Found::String("x".into()));
        assert_eq!(at("/items/1/key"), Found::String("two".into()));
        assert_eq!(at("/s"), Found::String("top".into()));
        assert_eq!(at("/n"), Found::NotString);
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
