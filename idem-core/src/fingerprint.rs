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
    /// XXH3-64 over the member's canonical value (diagnostic, so a fast hash).
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
            let patterns = crate::canon::parse_patterns(&self.exclude);
            let mut canon = Vec::with_capacity(req.body.len());
            crate::canon::canonicalise(req.body, &patterns, &mut canon, &mut fields).map_err(
                |e| {
                    let (line, column) = e.position(req.body);
                    FingerprintError::InvalidJson { line, column }
                },
            )?;
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
