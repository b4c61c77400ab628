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

/// The digests of a JSON object body's top-level members, sorted by name, kept so that a
/// mismatch can say which fields differ (`IDEM-FP-4`). They are diagnostic only: the full
/// digest decides the mismatch. Each is XXH3-64 over the member's canonical value.
///
/// They share one buffer, so that copying a fingerprint (the lease and the record each keep
/// one) costs one allocation, not one per member. Stored, they are a sequence of
/// `(name, digest)` pairs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldDigests {
    /// Each member as its digest (8 bytes, little-endian), its name's length (4 bytes,
    /// little-endian) and its name.
    bytes: Vec<u8>,
}

/// A member's digest and name length, before its name.
const FIELD_HEAD: usize = 12;

impl FieldDigests {
    /// The number of members (counted: this walks them).
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    /// Whether there are none (the body was not a JSON object, or an empty one).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Each member's name and digest, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> + Clone + '_ {
        let mut rest = self.bytes.as_slice();
        core::iter::from_fn(move || {
            let (head, tail) = rest.split_first_chunk::<FIELD_HEAD>()?;
            let (digest, len) = head.split_at(8);
            let digest = u64::from_le_bytes(digest.try_into().ok()?);
            let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
            let (name, tail) = tail.split_at_checked(len)?;
            rest = tail;
            // Names are pushed as whole strings.
            Some((core::str::from_utf8(name).unwrap_or_default(), digest))
        })
    }

    /// Appends a member (callers keep them sorted by name).
    pub fn push(&mut self, name: &str, digest: u64) {
        self.push_utf8(name.as_bytes(), digest);
    }

    /// [`FieldDigests::push`] for a name already checked to be UTF-8.
    pub(crate) fn push_utf8(&mut self, name: &[u8], digest: u64) {
        // Names are parts of bodies of at most a few MiB; a longer one is cut short.
        let len = u32::try_from(name.len()).unwrap_or(u32::MAX);
        self.bytes.extend_from_slice(&digest.to_le_bytes());
        self.bytes.extend_from_slice(&len.to_le_bytes());
        self.bytes.extend_from_slice(&name[..len as usize]);
    }

    /// Room for `members` more members whose names take `name_bytes` bytes.
    pub(crate) fn reserve(&mut self, members: usize, name_bytes: usize) {
        self.bytes.reserve_exact(members * FIELD_HEAD + name_bytes);
    }

    /// Bytes held beyond the struct itself.
    pub(crate) fn heap_size(&self) -> usize {
        self.bytes.len()
    }
}

impl<'a> FromIterator<(&'a str, u64)> for FieldDigests {
    fn from_iter<I: IntoIterator<Item = (&'a str, u64)>>(iter: I) -> Self {
        let mut out = FieldDigests::default();
        for (name, digest) in iter {
            out.push(name, digest);
        }
        out
    }
}

impl serde::Serialize for FieldDigests {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for pair in self.iter() {
            seq.serialize_element(&pair)?;
        }
        seq.end()
    }
}

impl<'de> serde::Deserialize<'de> for FieldDigests {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// One stored pair; the name is borrowed from the input when the format allows.
        #[derive(serde::Deserialize)]
        struct Pair<'a>(#[serde(borrow)] alloc::borrow::Cow<'a, str>, u64);

        struct Pairs;
        impl<'de> serde::de::Visitor<'de> for Pairs {
            type Value = FieldDigests;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of (name, digest) pairs")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<FieldDigests, A::Error> {
                let mut out = FieldDigests::default();
                // The length comes from the input: grow as pairs arrive, not up front.
                while let Some(Pair(name, digest)) = seq.next_element()? {
                    out.push(&name, digest);
                }
                Ok(out)
            }
        }
        deserializer.deserialize_seq(Pairs)
    }
}

/// The fingerprint of one request.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint {
    /// SHA-256 over the canonical request.
    pub digest: [u8; 32],
    /// Per-member digests when the body is a JSON object, sorted by name; empty otherwise.
    pub fields: FieldDigests,
}

impl Fingerprint {
    /// A fingerprint from a digest computed elsewhere (no field digests).
    pub fn from_digest(digest: [u8; 32]) -> Fingerprint {
        Fingerprint {
            digest,
            fields: FieldDigests::default(),
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
                (Some(&(x, _)), None) => {
                    out.push(String::from(x));
                    a.next();
                }
                (None, Some(&(y, _))) => {
                    out.push(String::from(y));
                    b.next();
                }
                (Some(&(x, dx)), Some(&(y, dy))) => match x.cmp(y) {
                    core::cmp::Ordering::Less => {
                        out.push(String::from(x));
                        a.next();
                    }
                    core::cmp::Ordering::Greater => {
                        out.push(String::from(y));
                        b.next();
                    }
                    core::cmp::Ordering::Equal => {
                        if dx != dy {
                            out.push(String::from(x));
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
        let mut fields = FieldDigests::default();
        let digest = self.hash(req, Some(&mut fields))?;
        Ok(Fingerprint { digest, fields })
    }

    /// The digest of [`FingerprintSpec::fingerprint`] alone, without the field digests (for a
    /// client's payload digest, which never names fields).
    pub fn digest(&self, req: &RequestParts<'_>) -> Result<[u8; 32], FingerprintError> {
        self.hash(req, None)
    }

    fn hash(
        &self,
        req: &RequestParts<'_>,
        fields: Option<&mut FieldDigests>,
    ) -> Result<[u8; 32], FingerprintError> {
        if req.body.len() > self.max_body {
            return Err(FingerprintError::BodyTooLarge {
                len: req.body.len(),
                max: self.max_body,
            });
        }
        let mut h = head(req.method, req.target, self.headers.len());
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
        if json {
            let patterns = crate::canon::parse_patterns(&self.exclude);
            let mut canon = Vec::with_capacity(req.body.len());
            crate::canon::canonicalise(req.body, &patterns, &mut canon, fields).map_err(|e| {
                let (line, column) = e.position(req.body);
                FingerprintError::InvalidJson { line, column }
            })?;
            h.update(b"J");
            put(&mut h, &canon);
        } else {
            put_bytes_body(&mut h, req.body);
        }
        Ok(h.finalize().into())
    }
}

/// The hash with the domain, the method, the target and the number of selected headers
/// written: what every fingerprint starts with.
fn head(method: &str, target: &str, headers: usize) -> Sha256 {
    let mut h = Sha256::new();
    head_into(&mut h, method, target, headers);
    h
}

/// Where a fingerprint's fields are laid out: the hash itself, or the bytes of a message
/// that a host hashes ([`payload_message`]).
trait Frame {
    fn bytes(&mut self, bytes: &[u8]);
}

impl Frame for Sha256 {
    fn bytes(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

impl Frame for Vec<u8> {
    fn bytes(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// The domain, the method, the target and the number of selected headers.
fn head_into(f: &mut impl Frame, method: &str, target: &str, headers: usize) {
    f.bytes(DOMAIN);
    put(f, method.as_bytes());
    put(f, target.as_bytes());
    f.bytes(&(headers as u64).to_le_bytes());
}

/// A body hashed as bytes, not as JSON.
fn put_bytes_body(f: &mut impl Frame, body: &[u8]) {
    f.bytes(b"B");
    put(f, body);
}

/// The digest of a payload as its sender sees it: method, target and body bytes, laid out
/// as a fingerprint with no selected headers and the body hashed as bytes
/// ([`JsonMode::Never`]). A client that serialised the body itself sends the same bytes on
/// every retry, so it needs no canonical form; this is the digest of an
/// [`OutboxEntry`](crate::OutboxEntry)'s payload that `idempotentFetch` uses.
pub fn payload_digest(method: &str, target: &str, body: &[u8]) -> [u8; 32] {
    let mut h = head(method, target, 0);
    put_bytes_body(&mut h, body);
    h.finalize().into()
}

/// The bytes whose SHA-256 is [`payload_digest`], for a host that hashes with its own
/// SHA-256 (a browser's WebCrypto), so that its module carries none.
pub fn payload_message(method: &str, target: &str, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + method.len() + target.len() + body.len() + 33);
    head_into(&mut m, method, target, 0);
    put_bytes_body(&mut m, body);
    m
}

fn put(f: &mut impl Frame, bytes: &[u8]) {
    f.bytes(&(bytes.len() as u64).to_le_bytes());
    f.bytes(bytes);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_message_hashes_to_the_payload_digest() {
        for (method, target, body) in [
            ("POST", "/o", &b"{}"[..]),
            ("", "", b""),
            ("PUT", "/x?y=1", &[0u8, 255, 7][..]),
        ] {
            let digest: [u8; 32] = Sha256::digest(payload_message(method, target, body)).into();
            assert_eq!(digest, payload_digest(method, target, body));
        }
    }

    #[test]
    fn the_digest_alone_is_the_fingerprints_digest() {
        let spec = FingerprintSpec {
            exclude: alloc::vec![String::from("/ts")],
            ..FingerprintSpec::default()
        };
        let request = |content_type, body| RequestParts {
            method: "POST",
            target: "/orders",
            content_type,
            headers: &[],
            body,
        };
        let json = Some("application/json");
        for req in [
            request(
                json,
                br#"{"b":[1,2.50],"a":{"y":true,"x":"\u00e9"},"ts":9}"#,
            ),
            request(json, b"[1, 2]"),
            request(None, b"\x00 raw bytes"),
        ] {
            let fingerprint = spec.fingerprint(&req).unwrap();
            assert_eq!(spec.digest(&req).unwrap(), fingerprint.digest);
        }
        let fields = spec
            .fingerprint(&request(json, br#"{"b":1,"a":2}"#))
            .unwrap();
        assert_eq!(
            fields.fields.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            ["a", "b"]
        );
        let broken = request(json, br#"{"a":"#);
        assert_eq!(
            spec.digest(&broken),
            spec.fingerprint(&broken).map(|f| f.digest)
        );
        assert!(spec.digest(&broken).is_err());
    }

    #[test]
    fn a_payload_digest_is_the_fingerprint_of_the_bytes() {
        let spec = FingerprintSpec {
            json: JsonMode::Never,
            max_body: usize::MAX,
            ..FingerprintSpec::default()
        };
        for (content_type, body) in [
            (Some("application/json"), &br#"{"b":1, "a":2}"#[..]),
            (None, b"\x00 raw bytes"),
            (None, b""),
        ] {
            let req = RequestParts {
                method: "PATCH",
                target: "/orders/7?x=1",
                content_type,
                headers: &[],
                body,
            };
            assert_eq!(
                payload_digest(req.method, req.target, body),
                spec.digest(&req).unwrap()
            );
        }
        // The bytes, not their meaning: a re-serialised body is another payload.
        assert_ne!(
            payload_digest("POST", "/o", br#"{"a":1,"b":2}"#),
            payload_digest("POST", "/o", br#"{"b":2,"a":1}"#)
        );
    }

    /// How field digests were stored before they shared one buffer: records written then
    /// must still decode, and records written now must decode where they are read as that.
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct Stored {
        name: String,
        digest: u64,
    }

    #[test]
    fn field_digests_are_stored_as_name_and_digest_pairs() {
        let pairs = [("", 1u64), ("amount", u64::MAX), ("é", 0), ("z", 42)];
        let fields: FieldDigests = pairs.iter().copied().collect();
        assert_eq!(fields.len(), 4);
        assert_eq!(fields.iter().collect::<Vec<_>>(), pairs);

        let stored: Vec<Stored> = pairs
            .iter()
            .map(|&(name, digest)| Stored {
                name: name.into(),
                digest,
            })
            .collect();
        let bytes = postcard::to_allocvec(&fields).unwrap();
        assert_eq!(bytes, postcard::to_allocvec(&stored).unwrap());
        assert_eq!(
            postcard::from_bytes::<FieldDigests>(&bytes).unwrap(),
            fields
        );
        assert_eq!(postcard::from_bytes::<Vec<Stored>>(&bytes).unwrap(), stored);

        let none = FieldDigests::default();
        assert!(none.is_empty());
        assert_eq!(postcard::to_allocvec(&none).unwrap(), [0]);
        // A count that promises more pairs than the input holds is an error, not a panic.
        assert!(postcard::from_bytes::<FieldDigests>(&[200, 1, 1, b'a', 7]).is_err());
    }

    #[test]
    fn differing_fields_are_named_once_in_order() {
        let fp = |pairs: &[(&str, u64)]| Fingerprint {
            digest: [0; 32],
            fields: pairs.iter().copied().collect(),
        };
        let a = fp(&[("a", 1), ("b", 2), ("d", 4)]);
        let b = fp(&[("b", 2), ("c", 3), ("d", 5)]);
        assert_eq!(a.differing_fields(&b), ["a", "c", "d"]);
        assert_eq!(b.differing_fields(&a), ["a", "c", "d"]);
        assert!(a.differing_fields(&a).is_empty());
    }
}
