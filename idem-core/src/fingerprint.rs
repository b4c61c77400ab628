//! Request fingerprints (requirements `IDEM-FP-1` to `IDEM-FP-5`).
//!
//! A fingerprint is SHA-256 over the method, the target (path and query), the selected
//! headers and the body, each length-prefixed so that no two different requests can be
//! arranged to hash the same input. JSON bodies are canonicalised first (RFC 8785 where
//! practical: members sorted, no insignificant whitespace, integral numbers written as
//! integers, minimal string escapes), after removing the configured volatile fields, so an
//! honest retry that re-serialises its body or refreshes a timestamp still matches.
//!
//! Known deviation from RFC 8785: members are sorted by their UTF-8 bytes, not UTF-16 code
//! units. The two orders differ only between characters above U+FFFF and U+E000–U+FFFF;
//! both sides of a comparison use the same order, so fingerprints stay consistent.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Domain separation for the fingerprint hash; bump when the layout changes.
const DOMAIN: &[u8] = b"idem-fingerprint-v1";

/// When to treat the body as JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum JsonMode {
    /// When the content type is `application/json` or `application/*+json`.
    #[default]
    Auto,
    /// Always; a body that is not JSON is an error.
    Always,
    /// Never; the body is hashed as bytes.
    Never,
}

/// What goes into a fingerprint. The default hashes method, target and body, canonicalises
/// JSON bodies by content type, and limits bodies to 1 MiB.
#[derive(Clone, Debug)]
pub struct FingerprintSpec {
    /// Header names (case-insensitive) whose values are part of the fingerprint, for
    /// headers that change the meaning of a request (`content-type`, an API version).
    pub headers: Vec<String>,
    /// Volatile JSON fields removed before hashing, as JSON Pointers (RFC 6901), where a
    /// `*` segment matches every member or element; a bare name means a top-level field.
    pub exclude: Vec<String>,
    /// When the body is canonicalised as JSON.
    pub json: JsonMode,
    /// The largest body fingerprinted; larger bodies are refused (`IDEM-LIMIT-1`).
    pub max_body: usize,
}

impl Default for FingerprintSpec {
    fn default() -> Self {
        FingerprintSpec {
            headers: Vec::new(),
            exclude: Vec::new(),
            json: JsonMode::Auto,
            max_body: 1 << 20,
        }
    }
}

/// The parts of a request that a fingerprint covers.
#[derive(Clone, Copy, Debug)]
pub struct RequestParts<'a> {
    /// The request method, as sent.
    pub method: &'a str,
    /// Path and query, as sent.
    pub target: &'a str,
    /// The `Content-Type` header, if any.
    pub content_type: Option<&'a str>,
    /// All request headers (name, value); only those named in the spec are used.
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The request body.
    pub body: &'a [u8],
}

/// A digest of one top-level JSON member, kept so that a mismatch can say which fields
/// differ (`IDEM-FP-4`). It is diagnostic only: the full digest decides the mismatch.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FieldDigest {
    /// The member name.
    pub name: String,
    /// The first 8 bytes of SHA-256 over the member's canonical value.
    pub digest: u64,
}

/// The fingerprint of one request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint {
    /// SHA-256 over the canonical request.
    pub digest: [u8; 32],
    /// Per-member digests when the body is a JSON object, sorted by name; empty otherwise.
    pub fields: Vec<FieldDigest>,
}

impl Fingerprint {
    /// A fingerprint from a digest computed elsewhere (no field digests).
    pub fn from_digest(digest: [u8; 32]) -> Fingerprint {
        Fingerprint {
            digest,
            fields: Vec::new(),
        }
    }

    /// Whether two fingerprints describe the same request.
    #[inline]
    pub fn matches(&self, other: &Fingerprint) -> bool {
        self.digest == other.digest
    }

    /// The top-level members that differ between two JSON bodies (added, removed or
    /// changed), sorted. Empty when either body was not a JSON object, or when only the
    /// method, target or headers differ.
    pub fn differing_fields(&self, other: &Fingerprint) -> Vec<String> {
        let (mut a, mut b) = (
            self.fields.iter().peekable(),
            other.fields.iter().peekable(),
        );
        let mut out = Vec::new();
        loop {
            match (a.peek(), b.peek()) {
                (None, None) => return out,
                (Some(x), None) => {
                    out.push(x.name.clone());
                    a.next();
                }
                (None, Some(y)) => {
                    out.push(y.name.clone());
                    b.next();
                }
                (Some(x), Some(y)) => match x.name.cmp(&y.name) {
                    core::cmp::Ordering::Less => {
                        out.push(x.name.clone());
                        a.next();
                    }
                    core::cmp::Ordering::Greater => {
                        out.push(y.name.clone());
                        b.next();
                    }
                    core::cmp::Ordering::Equal => {
                        if x.digest != y.digest {
                            out.push(x.name.clone());
                        }
                        a.next();
                        b.next();
                    }
                },
            }
        }
    }
}

/// Why a request could not be fingerprinted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FingerprintError {
    /// The body is larger than [`FingerprintSpec::max_body`] (`IDEM-LIMIT-1`, HTTP 413).
    BodyTooLarge {
        /// The body's size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The body was to be canonicalised as JSON but is not valid JSON (`IDEM-FP-6`, 400).
    InvalidJson {
        /// Line of the first error (1-based).
        line: usize,
        /// Column of the first error (1-based).
        column: usize,
    },
}

impl fmt::Display for FingerprintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FingerprintError::BodyTooLarge { len, max } => {
                write!(
                    f,
                    "the request body has {len} bytes; at most {max} are accepted"
                )
            }
            FingerprintError::InvalidJson { line, column } => {
                write!(
                    f,
                    "the request body is not valid JSON (line {line}, column {column})"
                )
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for FingerprintError {}

impl FingerprintSpec {
    /// Computes the fingerprint of a request.
    pub fn fingerprint(&self, req: &RequestParts<'_>) -> Result<Fingerprint, FingerprintError> {
        if req.body.len() > self.max_body {
            return Err(FingerprintError::BodyTooLarge {
                len: req.body.len(),
                max: self.max_body,
            });
        }
        let mut h = Sha256::new();
        h.update(DOMAIN);
        put(&mut h, req.method.as_bytes());
        put(&mut h, req.target.as_bytes());
        h.update((self.headers.len() as u64).to_le_bytes());
        for name in &self.headers {
            put(&mut h, name.to_ascii_lowercase().as_bytes());
            let values = req
                .headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name));
            h.update((values.clone().count() as u64).to_le_bytes());
            for (_, v) in values {
                put(&mut h, v);
            }
        }
        let json = match self.json {
            JsonMode::Never => false,
            JsonMode::Always => true,
            JsonMode::Auto => req.content_type.is_some_and(is_json_media_type),
        };
        let mut fields = Vec::new();
        if json {
            let mut value: Value =
                serde_json::from_slice(req.body).map_err(|e| FingerprintError::InvalidJson {
                    line: e.line(),
                    column: e.column(),
                })?;
            for pointer in &self.exclude {
                remove_pointer(&mut value, pointer);
            }
            let mut canon = Vec::with_capacity(req.body.len());
            if let Value::Object(map) = &value {
                canon.push(b'{');
                for (i, (k, v)) in map.iter().enumerate() {
                    if i > 0 {
                        canon.push(b',');
                    }
                    write_str(&mut canon, k);
                    canon.push(b':');
                    let start = canon.len();
                    write_canonical(&mut canon, v);
                    let d = Sha256::digest(&canon[start..]);
                    let mut first = [0u8; 8];
                    first.copy_from_slice(&d[..8]);
                    fields.push(FieldDigest {
                        name: k.clone(),
                        digest: u64::from_le_bytes(first),
                    });
                }
                canon.push(b'}');
            } else {
                write_canonical(&mut canon, &value);
            }
            h.update(b"J");
            put(&mut h, &canon);
        } else {
            h.update(b"B");
            put(&mut h, req.body);
        }
        Ok(Fingerprint {
            digest: h.finalize().into(),
            fields,
        })
    }
}

fn put(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// `application/json`, `application/problem+json`, `application/vnd.x+json; charset=utf-8`…
fn is_json_media_type(ct: &str) -> bool {
    let essence = ct.split(';').next().unwrap_or("").trim();
    let Some((ty, sub)) = essence.split_once('/') else {
        return false;
    };
    ty.eq_ignore_ascii_case("application")
        && (sub.eq_ignore_ascii_case("json")
            || sub.len() > 5 && sub[sub.len() - 5..].eq_ignore_ascii_case("+json"))
}

/// Removes every value a pointer (with `*` wildcards) names. Missing paths are ignored.
fn remove_pointer(value: &mut Value, pointer: &str) {
    let path = pointer.strip_prefix('/').unwrap_or(pointer);
    let tokens: Vec<String> = path
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    remove_path(value, &tokens);
}

fn remove_path(value: &mut Value, tokens: &[String]) {
    let Some((first, rest)) = tokens.split_first() else {
        return;
    };
    match value {
        Value::Object(map) => {
            if rest.is_empty() {
                if first == "*" {
                    map.clear();
                } else {
                    map.remove(first.as_str());
                }
            } else if first == "*" {
                map.values_mut().for_each(|v| remove_path(v, rest));
            } else if let Some(v) = map.get_mut(first.as_str()) {
                remove_path(v, rest);
            }
        }
        Value::Array(items) => {
            if first == "*" {
                if rest.is_empty() {
                    items.clear();
                } else {
                    items.iter_mut().for_each(|v| remove_path(v, rest));
                }
            } else if let Ok(i) = first.parse::<usize>() {
                if rest.is_empty() {
                    if i < items.len() {
                        items.remove(i);
                    }
                } else if let Some(v) = items.get_mut(i) {
                    remove_path(v, rest);
                }
            }
        }
        _ => {}
    }
}

fn write_canonical(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(out, v);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // serde_json's Map is a BTreeMap here: iteration is in sorted key order.
            out.push(b'{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(out, k);
                out.push(b':');
                write_canonical(out, v);
            }
            out.push(b'}');
        }
    }
}

fn write_number(out: &mut Vec<u8>, n: &serde_json::Number) {
    use core::fmt::Write as _;
    let mut s = String::new();
    match (n.as_u64(), n.as_i64(), n.as_f64()) {
        (Some(u), _, _) => {
            let _ = write!(s, "{u}");
        }
        (_, Some(i), _) => {
            let _ = write!(s, "{i}");
        }
        // Integral floats below 2^53 are written as integers, as ECMAScript does.
        (_, _, Some(f)) if f == (f as i64) as f64 && f.abs() < 9_007_199_254_740_992.0 => {
            let _ = write!(s, "{}", f as i64);
        }
        _ => {
            let _ = write!(s, "{n}");
        }
    }
    out.extend_from_slice(s.as_bytes());
}

fn write_str(out: &mut Vec<u8>, s: &str) {
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
