//! The HTTP face of every refusal: status, `application/problem+json` type (RFC 9457) and the
//! requirement it comes from. Hosts render these; they never invent their own codes.

use crate::fingerprint::FingerprintError;
use crate::key::KeyError;
use alloc::string::String;

/// An error response: the status and problem type that a refusal maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Problem {
    /// HTTP status code.
    pub status: u16,
    /// Stable short name; the problem `type` is `urn:idem:problem:` followed by it.
    pub slug: &'static str,
    /// The problem `type` URI.
    pub type_uri: &'static str,
    /// A short human-readable summary (the problem `title`).
    pub title: &'static str,
    /// The requirement ID in `spec/requirements.toml` that defines this response.
    pub requirement: &'static str,
}

macro_rules! problem {
    ($status:expr, $slug:literal, $title:literal, $req:literal) => {
        Problem {
            status: $status,
            slug: $slug,
            type_uri: concat!("urn:idem:problem:", $slug),
            title: $title,
            requirement: $req,
        }
    };
}

impl Problem {
    /// No `Idempotency-Key` header on an endpoint that requires one (IETF draft §2.7).
    pub const MISSING_KEY: Problem = problem!(
        400,
        "missing-key",
        "Idempotency-Key header is required",
        "IDEM-KEY-3"
    );
    /// The key is not a valid key of the configured kind.
    pub const MALFORMED_KEY: Problem = problem!(
        400,
        "malformed-key",
        "Idempotency-Key is malformed",
        "IDEM-KEY-1"
    );
    /// Another request with the same key is being processed (IETF draft §2.7).
    pub const IN_PROGRESS: Problem = problem!(
        409,
        "in-progress",
        "A request with this Idempotency-Key is in progress",
        "IDEM-CONC-1"
    );
    /// The key was used with a different request (IETF draft §2.7).
    pub const MISMATCH: Problem = problem!(
        422,
        "key-reuse-mismatch",
        "Idempotency-Key was used with a different request",
        "IDEM-FP-1"
    );
    /// The key's stored response has expired; the key may not be used again yet.
    pub const KEY_EXPIRED: Problem = problem!(
        410,
        "key-expired",
        "The response for this Idempotency-Key has expired",
        "IDEM-TTL-3"
    );
    /// An earlier attempt's outcome is unknown and is being reconciled.
    pub const OUTCOME_UNKNOWN: Problem = problem!(
        409,
        "outcome-unknown",
        "The outcome of an earlier attempt is unknown",
        "IDEM-OUT-3"
    );
    /// The store cannot take another key now.
    pub const STORE_FULL: Problem = problem!(
        503,
        "store-full",
        "The idempotency store is full",
        "IDEM-STORE-3"
    );
    /// The store failed; nothing was executed.
    pub const STORE_UNAVAILABLE: Problem = problem!(
        503,
        "store-unavailable",
        "The idempotency store is unavailable",
        "IDEM-STORE-4"
    );
    /// The body is too large to fingerprint.
    pub const BODY_TOO_LARGE: Problem = problem!(
        413,
        "body-too-large",
        "The request body is too large",
        "IDEM-LIMIT-1"
    );
    /// The body was declared JSON but is not.
    pub const INVALID_JSON: Problem = problem!(
        400,
        "invalid-json",
        "The request body is not valid JSON",
        "IDEM-FP-6"
    );

    /// The problem for a refused key: empty header values count as missing keys.
    pub fn for_key_error(e: &KeyError) -> Problem {
        match e {
            KeyError::Empty => Problem::MISSING_KEY,
            _ => Problem::MALFORMED_KEY,
        }
    }

    /// The problem for a request that could not be fingerprinted.
    pub fn for_fingerprint_error(e: &FingerprintError) -> Problem {
        match e {
            FingerprintError::BodyTooLarge { .. } => Problem::BODY_TOO_LARGE,
            FingerprintError::InvalidJson { .. } => Problem::INVALID_JSON,
        }
    }

    /// Renders the `application/problem+json` body, with `detail` and the requirement ID as
    /// an extension member.
    pub fn to_json(&self, detail: &str) -> String {
        let body = serde_json::json!({
            "type": self.type_uri,
            "title": self.title,
            "status": self.status,
            "detail": detail,
            "requirement": self.requirement,
        });
        // Serialising a Value to a String cannot fail.
        serde_json::to_string(&body).unwrap_or_default()
    }
}
