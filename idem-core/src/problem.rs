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
    /// A status query settled the key as never to run before any request used it
    /// (`IDEM-STATUS-3`).
    pub const KEY_SETTLED: Problem = problem!(
        409,
        "key-settled",
        "This Idempotency-Key was settled as never to run",
        "IDEM-STATUS-3"
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
    /// The key's record is sealed and cannot be opened here (a key the server no longer
    /// holds, a record moved from another key, damage): nothing is executed and nothing is
    /// replayed until the key that sealed it is given back. 500: the server's to fix.
    pub const SEALED: Problem = problem!(
        500,
        "record-sealed",
        "The record of this Idempotency-Key cannot be opened",
        "IDEM-SEAL-3"
    );
    /// A final response too large for the store was not kept: the key is held with this
    /// answer instead, so that a retry never runs the handler again and learns that the
    /// original answer cannot be replayed. 410 like an expired response: the client cannot
    /// get it any more.
    pub const RESPONSE_NOT_STORED: Problem = problem!(
        410,
        "response-not-stored",
        "The response for this Idempotency-Key was too large to keep",
        "IDEM-STORE-5"
    );
    /// The principal the host gave for a request is unusable (empty).
    pub const NO_PRINCIPAL: Problem = problem!(
        500,
        "no-principal",
        "The server could not tell who sent the request",
        "IDEM-SCOPE-3"
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
    /// A time or counter key that names another request: a different payload with the same
    /// (scope, client, timestamp), or a counter slot (possibly reached by a wrap) that holds
    /// another request. 422 like a key-reuse mismatch: retrying the same key cannot
    /// succeed; the type tells the client to choose a new key rather than fix a bug.
    pub const KEY_COLLISION: Problem = problem!(
        422,
        "key-collision",
        "The Idempotency-Key collides with another request",
        "IDEM-TIME-4"
    );
    /// A time key older than the maximum age, or a counter below the low-water mark. 412, as
    /// OASIS Repeatable Requests answers a stale first-sent time: the key's precondition
    /// (that the server still remembers it) does not hold.
    pub const KEY_STALE: Problem = problem!(
        412,
        "key-stale",
        "The Idempotency-Key is older than the server remembers",
        "IDEM-TIME-3"
    );
    /// A time key too far ahead of the server's clock: the client's clock is wrong.
    pub const KEY_FROM_FUTURE: Problem = problem!(
        400,
        "key-from-future",
        "The Idempotency-Key timestamp is too far in the future",
        "IDEM-TIME-2"
    );
    /// A counter key from a client that has no session.
    pub const UNKNOWN_CLIENT: Problem = problem!(
        412,
        "unknown-client",
        "The client has no session for counter keys",
        "IDEM-CTR-3"
    );
    /// A counter key from an epoch older than the session's.
    pub const STALE_EPOCH: Problem = problem!(
        412,
        "stale-epoch",
        "The counter key's epoch has been replaced",
        "IDEM-CTR-4"
    );
    /// A counter key from an epoch the session never opened.
    pub const UNKNOWN_EPOCH: Problem = problem!(
        412,
        "unknown-epoch",
        "The counter key's epoch is unknown",
        "IDEM-CTR-4"
    );
    /// A low-water mark beyond the next sequence number.
    pub const INVALID_LOW_WATER: Problem = problem!(
        400,
        "invalid-low-water",
        "The low-water mark is beyond the next sequence number",
        "IDEM-CTR-11"
    );
    /// A counter that skips a whole window: retry once the missing numbers have arrived.
    pub const COUNTER_GAP: Problem = problem!(
        409,
        "counter-gap",
        "The sequence number is too far ahead",
        "IDEM-CTR-9"
    );
    /// The window cannot slide past a request still in progress: retry later.
    pub const COUNTER_WINDOW_FULL: Problem = problem!(
        409,
        "counter-window-full",
        "Too many earlier requests are still in progress",
        "IDEM-CTR-10"
    );
    /// A token this server did not issue for this scope.
    pub const TOKEN_FORGED: Problem = problem!(
        400,
        "token-forged",
        "The token was not issued by this server",
        "IDEM-TOKEN-3"
    );
    /// An attempt whose lease another attempt took over, answered when no outcome of the
    /// key is recorded yet: its own handler's answer was not recorded and may describe
    /// work that was rolled back (`IDEM-LEASE-5`).
    pub const SUPERSEDED: Problem = problem!(
        409,
        "superseded",
        "This attempt was superseded by another attempt with the same Idempotency-Key",
        "IDEM-LEASE-5"
    );
    /// An authentic token that the store does not hold.
    pub const TOKEN_UNKNOWN: Problem =
        problem!(400, "token-unknown", "The token is unknown", "IDEM-TOKEN-4");
    /// An authentic token presented after its expiry without having been used.
    pub const TOKEN_EXPIRED: Problem = problem!(
        410,
        "token-expired",
        "The token has expired",
        "IDEM-TOKEN-4"
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
        self.to_json_with(detail, self.requirement)
    }

    /// [`Problem::to_json`] citing `requirement` instead of the problem's own (a more
    /// specific rule behind the same problem type).
    pub fn to_json_with(&self, detail: &str, requirement: &str) -> String {
        // Members in sorted order, strings with the canonical escapes.
        let mut out = alloc::vec::Vec::with_capacity(160 + detail.len());
        out.extend_from_slice(b"{\"detail\":");
        crate::canon::write_str(&mut out, detail);
        out.extend_from_slice(b",\"requirement\":");
        crate::canon::write_str(&mut out, requirement);
        out.extend_from_slice(b",\"status\":");
        crate::canon::write_int(&mut out, u64::from(self.status), false);
        out.extend_from_slice(b",\"title\":");
        crate::canon::write_str(&mut out, self.title);
        out.extend_from_slice(b",\"type\":");
        crate::canon::write_str(&mut out, self.type_uri);
        out.push(b'}');
        // Only UTF-8 went in.
        String::from_utf8(out).unwrap_or_default()
    }
}
