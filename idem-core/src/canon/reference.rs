//! The serde_json-based canonicaliser the scanner replaced, kept as the reference the
//! scanner is raced against: the same bodies accepted, the same canonical bytes, the same
//! field digests.

use super::{write_int, write_str};
use crate::fingerprint::FieldDigests;
use alloc::borrow::Cow;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Canonicalises `body` into `out`; fills `fields` with per-member digests when the body is
/// an object.
pub(super) fn canonicalise(
    body: &[u8],
    patterns: &[Vec<String>],
    out: &mut Vec<u8>,
    fields: &mut FieldDigests,
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
    fields: Option<&'a mut FieldDigests>,
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
                fields.push(name, xxhash_rust::xxh3::xxh3_64(value));
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

/// JSON text of every shape the scanner must agree on, with the spellings that matter:
/// whitespace, escapes, number forms (long, signed, exponents, out of range), duplicate
/// names, deep nesting; and now and then one byte broken.
mod race {
    use super::super::{canonicalise, parse_patterns, write::SMALL_OBJECT};
    use crate::fingerprint::FieldDigests;
    use alloc::format;
    use alloc::string::{String, ToString};
    use alloc::vec;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    fn ws() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => Just(String::new()),
            1 => Just(" ".to_string()),
            1 => Just("\n\t \r".to_string()),
        ]
    }

    fn number() -> impl Strategy<Value = String> {
        let int = prop_oneof![
            Just("0".to_string()),
            "[1-9][0-9]{0,3}",
            "[1-9][0-9]{15,25}",
            "[1-9][0-9]{10,18}",
            Just("18446744073709551615".to_string()),
            Just("18446744073709551616".to_string()),
            Just("9223372036854775808".to_string()),
            Just("9007199254740993".to_string()),
            "0[0-9]",
        ];
        let frac = prop_oneof![
            4 => Just(String::new()),
            2 => "\\.[0-9]{1,4}",
            1 => "\\.[0-9]{15,30}",
            1 => "\\.0{0,6}[0-9]{1,16}",
            1 => Just(".".to_string()),
        ];
        let exp = prop_oneof![
            4 => Just(String::new()),
            2 => "[eE][+-]?[0-9]{1,3}",
            1 => "[eE]-?[0-9]{9,12}",
            1 => Just("e".to_string()),
        ];
        ("-?", int, frac, exp).prop_map(|(sign, i, f, e)| format!("{sign}{i}{f}{e}"))
    }

    fn string() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            6 => "[a-z~/*0-9]{0,3}",
            // Past eight bytes: the scanner's word loop, and its ASCII shortcut.
            1 => "[a-z]{8,19}",
            1 => "[\u{e9}\u{1f600}\u{7f}]",
            1 => prop_oneof![
                Just("\\\"".to_string()),
                Just("\\\\".to_string()),
                Just("\\/".to_string()),
                Just("\\b\\f\\n\\r\\t".to_string()),
                Just("\\u0061".to_string()),
                Just("\\u00E9".to_string()),
                Just("\\u0000\\u001f".to_string()),
                Just("\\ud83d\\ude00".to_string()),
                Just("\\ud83d".to_string()),
                Just("\\ude00".to_string()),
                Just("\\ud83dx".to_string()),
                Just("\\x".to_string()),
                Just("\\u12".to_string()),
                Just("\t".to_string()),
            ],
        ];
        prop::collection::vec(piece, 0..4).prop_map(|p| format!("\"{}\"", p.concat()))
    }

    fn value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("true".to_string()),
            Just("false".to_string()),
            Just("null".to_string()),
            Just("nul".to_string()),
            number(),
            string(),
        ];
        leaf.prop_recursive(6, 48, 5, |inner| {
            let name = prop_oneof![
                4 => "[a-d]".prop_map(|n| format!("\"{n}\"")),
                // Names that share their first eight bytes, or end inside them.
                1 => "(abcdefg|abcdefgh)[a-c]?".prop_map(|n| format!("\"{n}\"")),
                1 => string(),
            ];
            prop_oneof![
                (
                    prop::collection::vec((ws(), inner.clone(), ws()), 0..5),
                    any::<bool>()
                )
                    .prop_map(|(items, trailing)| {
                        let items: Vec<String> = items
                            .into_iter()
                            .map(|(a, v, b)| format!("{a}{v}{b}"))
                            .collect();
                        let comma = if trailing && !items.is_empty() {
                            ","
                        } else {
                            ""
                        };
                        format!("[{}{comma}]", items.join(","))
                    }),
                prop::collection::vec((name, ws(), inner), 0..5).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(k, w, v)| format!("{k}{w}:{w}{v}"))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        (
            ws(),
            value(),
            ws(),
            prop::option::weighted(0.1, (any::<prop::sample::Index>(), any::<u8>())),
        )
            .prop_map(|(a, v, b, broken)| {
                let mut bytes = format!("{a}{v}{b}").into_bytes();
                if let Some((at, byte)) = broken {
                    if !bytes.is_empty() {
                        let i = at.index(bytes.len());
                        bytes[i] = byte;
                    }
                }
                bytes
            })
    }

    fn excluded() -> impl Strategy<Value = Vec<String>> {
        let pointer = prop_oneof![
            Just("a".to_string()),
            Just("/b/*".to_string()),
            Just("/*/0".to_string()),
            Just("/c/d".to_string()),
            Just("/*".to_string()),
            Just("/a/1/b".to_string()),
            Just("/d//c".to_string()),
        ];
        prop::collection::vec(pointer, 0..3)
    }

    fn deep(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        #[test]
        fn the_scanner_agrees_with_serde_json(body in body(), exclude in excluded()) {
            let patterns = parse_patterns(&exclude);
            let (mut out, mut fields) = (Vec::new(), FieldDigests::default());
            let scanned = canonicalise(&body, &patterns, &mut out, Some(&mut fields));
            let (mut want, mut want_fields) = (Vec::new(), FieldDigests::default());
            let reference = super::canonicalise(&body, &patterns, &mut want, &mut want_fields);
            prop_assert_eq!(scanned.is_ok(), reference.is_ok(), "{:?}", String::from_utf8_lossy(&body));
            if scanned.is_ok() {
                prop_assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(&want));
                prop_assert_eq!(fields, want_fields);
            }
        }
    }

    /// Objects wider than the proptest above builds: 0 to 40 members, on both sides of
    /// `SMALL_OBJECT`, with few names (so that duplicates and shared prefixes are common) and
    /// values that are objects of their own, in or out of order.
    fn wide() -> impl Strategy<Value = String> {
        let name = prop_oneof!["[a-e]", "(abcdefg|abcdefgh)[a-b]?", "field_[0-9]{1,3}",];
        let leaf = prop_oneof![
            (0u32..100).prop_map(|n| n.to_string()),
            "[a-c]{0,3}".prop_map(|s| format!("\"{s}\"")),
        ];
        let member = |value: BoxedStrategy<String>| {
            prop::collection::vec((name.clone(), value), 0..40).prop_map(|members| {
                let members: Vec<String> = members
                    .into_iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect();
                format!("{{{}}}", members.join(","))
            })
        };
        let inner = member(leaf.clone().boxed());
        member(prop_oneof![3 => leaf, 1 => inner].boxed())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn wide_objects_agree_with_serde_json(body in wide()) {
            prop_assert!(agrees(&body));
        }
    }

    /// The scanner and the reference both accept `body` or both refuse it, and agree on the
    /// canonical bytes and the field digests; whether they accepted it.
    fn agrees(body: &str) -> bool {
        let (mut out, mut fields) = (Vec::new(), FieldDigests::default());
        let scanned = canonicalise(body.as_bytes(), &[], &mut out, Some(&mut fields));
        let (mut want, mut want_fields) = (Vec::new(), FieldDigests::default());
        let reference = super::canonicalise(body.as_bytes(), &[], &mut want, &mut want_fields);
        assert_eq!(scanned.is_ok(), reference.is_ok(), "{body}");
        // What is written before a refusal means nothing.
        if scanned.is_ok() {
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&want),
                "{body}"
            );
            assert_eq!(fields, want_fields, "{body}");
        }
        scanned.is_ok()
    }

    /// Numbers copied as they stand (`Scan::canonical_number`) and numbers read and written
    /// again agree with serde_json at the edges of the copy: 15 and 16 significant digits,
    /// 4 and 5 zeros after `0.`, 18 and 19 integer digits, trailing zeros, `-0`.
    #[test]
    fn numbers_copied_as_they_stand_agree_with_serde_json() {
        let mut numbers: Vec<String> = Vec::new();
        for digits in [
            "1",
            "7",
            "25",
            "123456789",
            "999999999999999",
            "9999999999999999",
            "100000000000001",
        ] {
            for point in 0..=digits.len() {
                let (int, frac) = digits.split_at(point);
                let int = if int.is_empty() { "0" } else { int };
                for zeros in 0..=6 {
                    let pad = "0".repeat(zeros);
                    for trail in ["", "0"] {
                        if int == "0" || zeros == 0 {
                            numbers.push(format!("{int}.{pad}{frac}{trail}"));
                        }
                    }
                }
                numbers.push(int.to_string());
            }
        }
        for n in [
            "0",
            "-0",
            "0.0",
            "-0.0",
            "-0.5",
            "999999999999999999",
            "-999999999999999999",
        ] {
            numbers.push(n.to_string());
        }
        numbers.push("9999999999999999999".to_string());
        numbers.push("-9999999999999999999".to_string());
        numbers.push("-9223372036854775808".to_string());
        for n in numbers.clone() {
            if !n.starts_with('-') {
                numbers.push(format!("-{n}"));
            }
        }
        for n in &numbers {
            agrees(&format!("[{n}]"));
        }
    }

    /// Names are ordered by an eight-byte prefix first: names that tie on it, end inside it,
    /// or differ only by a NUL there are put in the reference's order, and of duplicates the
    /// last one is kept.
    #[test]
    fn names_that_share_a_prefix_are_ordered_as_the_reference_orders_them() {
        let names = [
            "abcdefgh",
            "abcdefgh\\u0000",
            "abcdefghi",
            "abcdefg",
            "abcdefgi",
            "a",
            "a\\u0000",
            "",
            "\\u0000",
            "\u{e9}",
            "abcdefgh",
            "zzzzzzza",
            "aaaaaaaz",
            // Seven bytes and eight with a NUL: one prefix read whole, one folded, equal.
            "abcdefg\\u0000",
            // Escaped, the same name as "abcdefgh": a duplicate.
            "\\u0061bcdefgh",
        ];
        // Small objects are put in order by a permutation, larger ones by sorting their
        // members (SMALL_OBJECT): counts on both sides of the line, with names repeated.
        for count in [names.len(), SMALL_OBJECT, SMALL_OBJECT + 1, 2 * names.len()] {
            for shift in 0..names.len() {
                let members: Vec<String> = (0..count)
                    .map(|i| format!("\"{}\":{i}", names[(i + shift) % names.len()]))
                    .collect();
                assert!(
                    agrees(&format!("{{{}}}", members.join(","))),
                    "{count} members"
                );
            }
        }
        // Already in order, or not, with keys that tie on their prefix: an object in order
        // stays as it was written, one out of order is put in order.
        for body in [
            r#"{"a":1,"a\u0000":2}"#,
            r#"{"a\u0000":1,"a":2}"#,
            r#"{"abcdefg":1,"abcdefg\u0000":2,"abcdefgh":3}"#,
            r#"{"abcdefgh":1,"abcdefg\u0000":2,"abcdefg":3}"#,
        ] {
            assert!(agrees(body));
        }
    }

    /// A string the scanner reads eight bytes at a time is still refused when a byte that
    /// is not UTF-8 sits anywhere in it: in a word, in the word with its closing quote, or in
    /// the bytes after the last word.
    #[test]
    fn bytes_that_are_not_utf8_are_refused_wherever_they_sit() {
        for len in [1, 7, 8, 9, 15, 16, 17, 23] {
            for at in 0..len {
                for bad in [0x80u8, 0xc3, 0xff] {
                    let mut text = vec![b'x'; len];
                    text[at] = bad;
                    for body in [
                        [b"\"".as_slice(), &text, b"\""].concat(),
                        [b"{\"".as_slice(), &text, b"\":1}"].concat(),
                        // After an escape: the unescaped text is checked, not the flag.
                        [b"\"\\n".as_slice(), &text, b"\""].concat(),
                    ] {
                        let (mut out, mut fields) = (Vec::new(), FieldDigests::default());
                        assert!(
                            canonicalise(&body, &[], &mut out, Some(&mut fields)).is_err(),
                            "{body:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn nesting_limits_agree() {
        for levels in [126, 127, 128, 129] {
            for body in [deep(levels), format!("{{\"a\":{}}}", deep(levels - 1))] {
                let (mut out, mut fields) = (Vec::new(), FieldDigests::default());
                let scanned =
                    canonicalise(body.as_bytes(), &[], &mut out, Some(&mut fields)).is_ok();
                let reference =
                    super::canonicalise(body.as_bytes(), &[], &mut out, &mut fields).is_ok();
                assert_eq!(scanned, reference, "{levels} levels");
            }
        }
        // A skipped value has no depth limit in either, and no recursion in the scanner.
        let body = format!("{{\"a\":{},\"b\":1}}", deep(100_000));
        let patterns = parse_patterns(&["a".to_string()]);
        let (mut out, mut fields) = (Vec::new(), FieldDigests::default());
        assert!(canonicalise(body.as_bytes(), &patterns, &mut out, Some(&mut fields)).is_ok());
        assert_eq!(out, b"{\"b\":1}");
    }
}
