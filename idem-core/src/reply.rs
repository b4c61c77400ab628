//! Every answer a host sends without running its handler, rendered in one place: replays of
//! stored responses, `application/problem+json` refusals (RFC 9457) with idem's types, the
//! documents of the operations beside the guarded request (a token, a session, a delivery's
//! receipt), and the `about:blank` problems of the HTTP edge ([`Plain`]), with their status,
//! headers (`Idempotent-Replayed`, `Retry-After`, `Content-Type`, `Cache-Control`,
//! `Allow`) and body.

use crate::engine::{Decision, RejectReason, RETRY_SOON_SECS};
use crate::fingerprint::FingerprintError;
use crate::key::KeyError;
use crate::kind::KindKeyError;
use crate::problem::Problem;
use crate::response::StoredResponse;
use crate::store::StoreFailure;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;

/// The header a replayed response carries (`IDEM-REPLAY-2`), lowercase.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";
/// The request header that carries the key (IETF draft §2), lowercase.
pub const KEY_HEADER: &str = "idempotency-key";
/// The request header that carries a counter client's low-water mark (`IDEM-CTR-11`): every
/// response below it was received. Lowercase.
pub const LOW_WATER_HEADER: &str = "idempotency-low-water";
/// The field that makes a `GET` a status query (`IDEM-STATUS-1`): the method of the request
/// asked about, with `settle` to settle an unknown key (`POST; settle`). Lowercase.
pub const STATUS_HEADER: &str = "idempotency-status";
/// The media type of a status document (`IDEM-STATUS-1`).
pub const STATUS_MEDIA_TYPE: &str = "application/vnd.idem.key-status+json";

/// A refusal before or instead of running the handler: the problem, the requirement it
/// enforces (sometimes more specific than the problem's own, for example `IDEM-KEY-5` for a
/// `malformed-key` that is really two keys), a human-readable detail, and when the same
/// request may be retried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The problem type and status.
    pub problem: Problem,
    /// The requirement ID in `spec/requirements.toml` the refusal enforces; also the `code`
    /// of errors that report it.
    pub requirement: &'static str,
    /// The `detail` member.
    pub detail: String,
    /// `Retry-After`, in seconds, for refusals that a later retry can overcome.
    pub retry_after: Option<u64>,
}

impl Refusal {
    /// A refusal with the problem's own requirement.
    pub fn new(problem: Problem, detail: impl Into<String>) -> Refusal {
        Refusal {
            problem,
            requirement: problem.requirement,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// A refused key: `missing-key` (`IDEM-KEY-3`) for an absent or empty one, otherwise
    /// `malformed-key` citing `IDEM-KEY-5` for several keys, `IDEM-KEY-6` for a key that is
    /// too long, `IDEM-KEY-4` for a bad UUID and `IDEM-KEY-1` for the rest.
    pub fn key(e: &KeyError) -> Refusal {
        let requirement = match e {
            KeyError::Empty => "IDEM-KEY-3",
            KeyError::List => "IDEM-KEY-5",
            KeyError::TooLong { .. } => "IDEM-KEY-6",
            KeyError::NotUuid | KeyError::WrongUuidVersion { .. } => "IDEM-KEY-4",
            _ => "IDEM-KEY-1",
        };
        Refusal {
            requirement,
            ..Refusal::new(Problem::for_key_error(e), e.to_string())
        }
    }

    /// A time or counter key that does not parse (`IDEM-TIME-1`, `IDEM-CTR-1`).
    pub fn kind_key(e: &KindKeyError, requirement: &'static str) -> Refusal {
        let problem = match e {
            KindKeyError::Empty => Problem::MISSING_KEY,
            _ => e.problem(),
        };
        Refusal {
            requirement: if problem == Problem::MISSING_KEY {
                "IDEM-KEY-3"
            } else {
                requirement
            },
            ..Refusal::new(problem, e.to_string())
        }
    }

    /// A counter session that cannot be opened: a bad client id or first number
    /// (`IDEM-CTR-1`, 400), or a session that kept changing under the opening (409 with
    /// `Retry-After`, like a key being fought over).
    pub fn session(e: &crate::CounterError) -> Refusal {
        use crate::CounterError;
        match e {
            CounterError::BadClientId | CounterError::SequenceBeyondBits { .. } => Refusal {
                requirement: "IDEM-CTR-1",
                ..Refusal::new(Problem::MALFORMED_KEY, e.to_string())
            },
            CounterError::Contended => Refusal {
                requirement: "IDEM-CTR-12",
                retry_after: Some(RETRY_SOON_SECS),
                ..Refusal::new(Problem::IN_PROGRESS, e.to_string())
            },
            _ => Refusal::new(Problem::STORE_UNAVAILABLE, e.to_string()),
        }
    }

    /// A request that cannot be fingerprinted: too large (`IDEM-LIMIT-1`) or invalid JSON
    /// (`IDEM-FP-6`).
    pub fn fingerprint(e: &FingerprintError) -> Refusal {
        Refusal::new(Problem::for_fingerprint_error(e), e.to_string())
    }

    /// A body larger than `max` bytes, refused before it is read (`IDEM-LIMIT-1`).
    pub fn body_too_large(len: u64, max: usize) -> Refusal {
        Refusal::new(
            Problem::BODY_TOO_LARGE,
            format!("the request body has {len} bytes; at most {max} are accepted"),
        )
    }

    /// The store failed before anything ran: 503 with `Retry-After` (`IDEM-STORE-3`,
    /// `IDEM-STORE-4`), or 500 for a record that cannot be opened (`IDEM-SEAL-3`); or, after
    /// the handler ran, as it committed the handler's writes with the response: 503
    /// (`IDEM-STORE-7`).
    pub fn store(failure: StoreFailure) -> Refusal {
        let refusal = match failure {
            StoreFailure::Sealed => {
                return Refusal::new(
                    Problem::SEALED,
                    "the stored record of this key is sealed under a key this server does not hold, or was moved; nothing was executed",
                )
            }
            StoreFailure::Full => Refusal::new(Problem::STORE_FULL, "the idempotency store is full"),
            StoreFailure::Unavailable => Refusal::new(
                Problem::STORE_UNAVAILABLE,
                "the idempotency store is unavailable; nothing was executed",
            ),
            // The handler ran: not IDEM-STORE-4's "nothing executes".
            StoreFailure::Uncommitted => Refusal {
                requirement: "IDEM-STORE-7",
                ..Refusal::new(
                    Problem::STORE_UNAVAILABLE,
                    "the idempotency store failed as it committed the request's work with its response: whether the work was done is not known; a retry with the same key finds out",
                )
            },
        };
        Refusal {
            retry_after: Some(RETRY_SOON_SECS),
            ..refusal
        }
    }

    /// The refusal for a decision that neither executes nor replays; `None` for those two.
    pub fn of_decision(decision: &Decision) -> Option<Refusal> {
        Some(match decision {
            Decision::Execute { .. } | Decision::Replay(_) => return None,
            Decision::InProgress { retry_after_secs } => Refusal {
                retry_after: Some(*retry_after_secs),
                ..Refusal::new(
                    Problem::IN_PROGRESS,
                    "another request with this key is being processed; retry later",
                )
            },
            Decision::Mismatch { differing, .. } if differing.is_empty() => Refusal::new(
                Problem::MISMATCH,
                "the key was used with a different request",
            ),
            Decision::Mismatch { differing, .. } => Refusal::new(
                Problem::MISMATCH,
                format!(
                    "the key was used with a different request; differing fields: {}",
                    differing.join(", ")
                ),
            ),
            Decision::Rejected(reason) => Refusal::rejected(reason),
        })
    }

    /// The refusal for a rejected request.
    pub fn rejected(reason: &RejectReason) -> Refusal {
        Refusal {
            retry_after: reason.retry_after_secs(),
            ..Refusal::new(reason.problem(), reason.to_string())
        }
    }

    /// The `application/problem+json` body: `type`, `title`, `status`, `detail`, and the
    /// requirement as an extension member.
    pub fn body(&self) -> String {
        self.problem.to_json_with(&self.detail, self.requirement)
    }

    /// The reply that sends this refusal.
    pub fn reply(&self) -> Reply {
        Reply(Inner::Problem {
            status: self.problem.status,
            type_uri: self.problem.type_uri,
            requirement: self.requirement,
            body: self.body(),
            retry_after: self.retry_after.map(|s| s.to_string()),
        })
    }
}

/// An HTTP answer rendered by the engine: a replay of a stored response, a refusal, an
/// operation's document, or a [`Plain`] problem of the HTTP edge. Every host sends exactly
/// these bytes: [`Reply::status`], [`Reply::headers`] in order, [`Reply::body`].
#[must_use = "a Reply is the answer the client is waiting for"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply(Inner);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Inner {
    Replay(Arc<StoredResponse>),
    Problem {
        status: u16,
        type_uri: &'static str,
        requirement: &'static str,
        body: String,
        retry_after: Option<String>,
    },
    /// An answer of an operation, or of the HTTP edge, rendered whole.
    Own {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        type_uri: Option<&'static str>,
    },
}

/// A problem of the HTTP edge that idem has no type of its own for: routing, a body that is
/// not what an endpoint takes, a failure of the host. It is RFC 9457's `about:blank`, titled
/// with the status's reason phrase, so that every host answers these the same way instead of
/// writing problem bodies by hand ([`Reply::plain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Plain {
    /// 400: the request is not one the endpoint takes.
    BadRequest,
    /// 404: no such resource.
    NotFound,
    /// 405: another method (the answer names it in `Allow`: [`Reply::method_not_allowed`]).
    MethodNotAllowed,
    /// 500: the host failed.
    Internal,
    /// 503: the host cannot answer now (it is shutting down).
    Unavailable,
}

impl Plain {
    /// The status code.
    pub fn status(self) -> u16 {
        match self {
            Plain::BadRequest => 400,
            Plain::NotFound => 404,
            Plain::MethodNotAllowed => 405,
            Plain::Internal => 500,
            Plain::Unavailable => 503,
        }
    }

    /// The title: the status's reason phrase.
    pub fn title(self) -> &'static str {
        match self {
            Plain::BadRequest => "Bad Request",
            Plain::NotFound => "Not Found",
            Plain::MethodNotAllowed => "Method Not Allowed",
            Plain::Internal => "Internal Server Error",
            Plain::Unavailable => "Service Unavailable",
        }
    }
}

/// The `type` of an [`Plain`] problem.
pub const ABOUT_BLANK: &str = "about:blank";

/// The media type of every problem idem answers.
pub const PROBLEM_JSON: &str = "application/problem+json";

impl Reply {
    /// The stored response sent again, with `Idempotent-Replayed: true` after its own headers
    /// (`IDEM-REPLAY-1`, `IDEM-REPLAY-2`).
    pub fn replay(response: Arc<StoredResponse>) -> Reply {
        Reply(Inner::Replay(response))
    }

    /// An `about:blank` problem (RFC 9457) with `detail`: for what the edge of a host refuses
    /// that idem has no type for.
    pub fn plain(plain: Plain, detail: &str) -> Reply {
        Reply::plain_with(plain, detail, None)
    }

    /// 405, naming the method the resource takes in `Allow`.
    pub fn method_not_allowed(allow: &str) -> Reply {
        Reply::plain_with(
            Plain::MethodNotAllowed,
            &format!("use {allow}"),
            Some(allow),
        )
    }

    fn plain_with(plain: Plain, detail: &str, allow: Option<&str>) -> Reply {
        let mut body = Vec::with_capacity(96 + detail.len());
        body.extend_from_slice(b"{\"detail\":");
        crate::canon::write_str(&mut body, detail);
        body.extend_from_slice(b",\"status\":");
        crate::canon::write_int(&mut body, u64::from(plain.status()), false);
        body.extend_from_slice(b",\"title\":");
        crate::canon::write_str(&mut body, plain.title());
        body.extend_from_slice(b",\"type\":");
        crate::canon::write_str(&mut body, ABOUT_BLANK);
        body.push(b'}');
        let mut headers = alloc::vec![(String::from("content-type"), String::from(PROBLEM_JSON))];
        if let Some(allow) = allow {
            headers.push((String::from("allow"), String::from(allow)));
        }
        Reply(Inner::Own {
            status: plain.status(),
            headers,
            body,
            type_uri: Some(ABOUT_BLANK),
        })
    }

    /// A JSON document an operation answers with (a token, a session, a delivery's receipt):
    /// `status`, `application/json`, and never cached.
    pub(crate) fn document(status: u16, body: Vec<u8>) -> Reply {
        Reply(Inner::Own {
            status,
            headers: alloc::vec![
                (
                    String::from("content-type"),
                    String::from("application/json")
                ),
                (String::from("cache-control"), String::from("no-store")),
            ],
            body,
            type_uri: None,
        })
    }

    /// A status document (`IDEM-STATUS-1`): 200, [`STATUS_MEDIA_TYPE`], never cached, with
    /// `Retry-After` when the key is in progress.
    pub(crate) fn status_document(body: Vec<u8>, retry_after: Option<u64>) -> Reply {
        let mut headers = alloc::vec![
            (
                String::from("content-type"),
                String::from(STATUS_MEDIA_TYPE)
            ),
            (String::from("cache-control"), String::from("no-store")),
        ];
        if let Some(secs) = retry_after {
            headers.push((String::from("retry-after"), secs.to_string()));
        }
        Reply(Inner::Own {
            status: 200,
            headers,
            body,
            type_uri: None,
        })
    }

    /// The reply for a decision that does not execute (`None` for [`Decision::Execute`]).
    pub fn of_decision(decision: &Decision) -> Option<Reply> {
        match decision {
            Decision::Replay(r) => Some(Reply::replay(Arc::clone(r))),
            other => Refusal::of_decision(other).map(|r| r.reply()),
        }
    }

    /// The status code.
    pub fn status(&self) -> u16 {
        match &self.0 {
            Inner::Replay(r) => r.status,
            Inner::Problem { status, .. } | Inner::Own { status, .. } => *status,
        }
    }

    /// The header fields, in order: a replay's stored headers (less those of the connection
    /// it was first sent on: hop-by-hop fields and `Content-Length`, `IDEM-REPLAY-4`) then
    /// `idempotent-replayed: true`; a refusal's `content-type: application/problem+json` then `retry-after` when
    /// it has one.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        type Extra<'r> = [Option<(&'r str, &'r str)>; 2];
        let (stored, extra): (&[(String, String)], Extra<'_>) = match &self.0 {
            Inner::Replay(r) => (&r.headers, [Some((REPLAYED_HEADER, "true")), None]),
            Inner::Problem { retry_after, .. } => (
                &[],
                [
                    Some(("content-type", PROBLEM_JSON)),
                    retry_after.as_deref().map(|s| ("retry-after", s)),
                ],
            ),
            Inner::Own { headers, .. } => (headers, [None, None]),
        };
        let replay = self.is_replay();
        stored
            .iter()
            .filter(move |(n, _)| !(replay && is_connection_header(n)))
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .chain(extra.into_iter().flatten())
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        match &self.0 {
            Inner::Replay(r) => &r.body,
            Inner::Problem { body, .. } => body.as_bytes(),
            Inner::Own { body, .. } => body,
        }
    }

    /// Whether this is a replay of a stored response.
    pub fn is_replay(&self) -> bool {
        matches!(self.0, Inner::Replay(_))
    }

    /// The requirement a refusal enforces (`None` for a replay, a document or a [`Plain`]
    /// problem).
    pub fn requirement(&self) -> Option<&'static str> {
        match &self.0 {
            Inner::Replay(_) | Inner::Own { .. } => None,
            Inner::Problem { requirement, .. } => Some(requirement),
        }
    }

    /// The problem `type` of a refusal ([`ABOUT_BLANK`] for a [`Plain`] problem; `None` for a
    /// replay or a document).
    pub fn problem_type(&self) -> Option<&'static str> {
        match &self.0 {
            Inner::Replay(_) => None,
            Inner::Problem { type_uri, .. } => Some(type_uri),
            Inner::Own { type_uri, .. } => *type_uri,
        }
    }

    /// The headers as owned pairs (for hosts that build their response from a list).
    pub fn header_pairs(&self) -> Vec<(String, String)> {
        self.headers()
            .map(|(n, v)| (String::from(n), String::from(v)))
            .collect()
    }
}

/// Whether `name` is a field of the connection a response was sent on, not of the response:
/// the hop-by-hop fields (RFC 9110 §7.6.1: `Connection`, `Keep-Alive`, `Proxy-Connection`,
/// `TE`, `Transfer-Encoding`, `Upgrade`) and `Content-Length`, which frames the body the
/// replay sends anew. A replay leaves them out (`IDEM-REPLAY-4`); the host's server writes
/// its own.
fn is_connection_header(name: &str) -> bool {
    const CONNECTION: [&str; 7] = [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "transfer-encoding",
        "upgrade",
        "content-length",
    ];
    CONNECTION.iter().any(|c| c.eq_ignore_ascii_case(name))
}
