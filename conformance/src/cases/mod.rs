//! The cases. Each has a stable ID (`section/n`, never a list position), the requirement it
//! checks (an ID in `spec/requirements.toml`, whose level and sentence are read from there),
//! and a one-line description of what it sends.
//!
//! One file per section. A case returns a check (pass with a confidence, fail, unsafe or
//! skip); the runner turns a failed SHOULD into a non-strict verdict unless `--strict` is
//! given, and a [`HarnessError`] into an error.

mod concurrent;
mod errors;
mod expiry;
mod keys;
mod lease;
mod lost;
mod mismatch;
mod replay;
mod scope;

use crate::http::{HarnessError, Http, Log, Req, Resp};
use crate::suite::{Confidence, KeyStyle, Target};
use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A conformance case.
#[derive(Debug)]
pub struct Case {
    /// Stable ID: `section/n`.
    pub id: &'static str,
    /// The requirement it checks.
    pub requirement: &'static str,
    /// What it sends and expects, in one line.
    pub title: &'static str,
    kind: Kind,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    LostResponse,
    Replay,
    ReplayMarker,
    Concurrent,
    RetryAfter,
    Mismatch,
    MissingKey,
    EmptyKey,
    OversizedKey,
    NonAsciiKey,
    TwoKeys,
    LongestKey,
    DeclineReplayed,
    FailureNotStored,
    CrossPrincipal,
    OrphanRecovers,
    BeforeResponseTtl,
    AfterResponseTtl,
    AfterKeyTtl,
}

const CASES: &[Case] = &[
    Case {
        id: "lost-response/1",
        requirement: "IDEM-EXEC-1",
        title: "send, close the connection before the response, retry twice with the same key: one execution, the retries agree",
        kind: Kind::LostResponse,
    },
    Case {
        id: "replay/1",
        requirement: "IDEM-REPLAY-1",
        title: "repeat a completed request: the same status and body, no second execution",
        kind: Kind::Replay,
    },
    Case {
        id: "replay/2",
        requirement: "IDEM-REPLAY-2",
        title: "the replay carries the profile's replay marker, the first response does not",
        kind: Kind::ReplayMarker,
    },
    Case {
        id: "concurrent/1",
        requirement: "IDEM-CONC-1",
        title: "N identical requests on separate connections released together, several rounds: one execution per round, the rest conflict or replay",
        kind: Kind::Concurrent,
    },
    Case {
        id: "concurrent/2",
        requirement: "IDEM-CONC-1",
        title: "an in-progress conflict answer carries Retry-After",
        kind: Kind::RetryAfter,
    },
    Case {
        id: "mismatch/1",
        requirement: "IDEM-FP-1",
        title: "reuse a key with a changed body: refused, nothing executes, the original still replays unchanged",
        kind: Kind::Mismatch,
    },
    Case {
        id: "keys/1",
        requirement: "IDEM-KEY-3",
        title: "no key header: refused, nothing executes",
        kind: Kind::MissingKey,
    },
    Case {
        id: "keys/2",
        requirement: "IDEM-KEY-3",
        title: "an empty key: refused, nothing executes",
        kind: Kind::EmptyKey,
    },
    Case {
        id: "keys/3",
        requirement: "IDEM-KEY-1",
        title: "a key of 256 characters: refused, nothing executes",
        kind: Kind::OversizedKey,
    },
    Case {
        id: "keys/4",
        requirement: "IDEM-KEY-1",
        title: "a key with non-ASCII bytes: refused, nothing executes",
        kind: Kind::NonAsciiKey,
    },
    Case {
        id: "keys/5",
        requirement: "IDEM-KEY-5",
        title: "two key header lines: refused, nothing executes",
        kind: Kind::TwoKeys,
    },
    Case {
        id: "keys/6",
        requirement: "IDEM-KEY-1",
        title: "a key of exactly 255 characters: accepted and executed",
        kind: Kind::LongestKey,
    },
    Case {
        id: "errors/1",
        requirement: "IDEM-REPLAY-3",
        title: "a deterministic 4xx (--decline-body) is stored: the retry replays it without executing",
        kind: Kind::DeclineReplayed,
    },
    Case {
        id: "errors/2",
        requirement: "IDEM-OUT-4",
        title: "a retryable failure (--fail-body, 5xx/408/425/429) is not stored: the retry executes again",
        kind: Kind::FailureNotStored,
    },
    Case {
        id: "scope/1",
        requirement: "IDEM-SCOPE-1",
        title: "key K under credential A, then K under credential B: B never gets A's response",
        kind: Kind::CrossPrincipal,
    },
    Case {
        id: "lease/1",
        requirement: "IDEM-LEASE-1",
        title: "(opt-in: --lease, --crash-body) a key whose handler died is taken over after the lease, not blocked forever",
        kind: Kind::OrphanRecovers,
    },
    Case {
        id: "expiry/1",
        requirement: "IDEM-TTL-1",
        title: "(opt-in: --response-ttl) halfway through the response retention the response still replays",
        kind: Kind::BeforeResponseTtl,
    },
    Case {
        id: "expiry/2",
        requirement: "IDEM-TTL-3",
        title: "(opt-in: --response-ttl, --key-ttl) after the response retention, before the key retention: refused, not executed",
        kind: Kind::AfterResponseTtl,
    },
    Case {
        id: "expiry/3",
        requirement: "IDEM-TTL-2",
        title: "(opt-in: --key-ttl) after the key retention the key is new again: it executes",
        kind: Kind::AfterKeyTtl,
    },
];

/// Every case, in suite order.
pub fn all() -> &'static [Case] {
    CASES
}

/// A heading for each section, in suite order.
pub const SECTIONS: &[(&str, &str)] = &[
    ("lost-response", "Lost responses"),
    ("replay", "Replay of a completed request"),
    ("concurrent", "Concurrent duplicates"),
    ("mismatch", "Payload mismatch"),
    ("keys", "Key validation"),
    ("errors", "Error responses"),
    ("scope", "Cross-principal isolation"),
    ("lease", "Orphaned in-flight keys (opt-in)"),
    ("expiry", "Expiry (opt-in)"),
];

impl Case {
    /// The section: the ID up to the slash.
    pub fn section(&self) -> &'static str {
        self.id.split('/').next().unwrap_or(self.id)
    }

    /// The requirement as written in `spec/requirements.toml`.
    ///
    /// # Panics
    ///
    /// If the case cites an ID that does not exist; a test checks every case.
    pub fn spec(&self) -> &'static idem_spec::Requirement {
        idem_spec::get(self.requirement)
            .unwrap_or_else(|| panic!("case {} cites unknown {}", self.id, self.requirement))
    }

    /// MUST or SHOULD, from the requirement.
    pub fn level(&self) -> idem_spec::Level {
        self.spec().level
    }

    /// The requirement sentence.
    pub fn requirement_text(&self) -> &'static str {
        &self.spec().text
    }

    pub(crate) async fn run(&self, ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
        match self.kind {
            Kind::LostResponse => lost::lost_response(ctx).await,
            Kind::Replay => replay::replay(ctx).await,
            Kind::ReplayMarker => replay::marker(ctx).await,
            Kind::Concurrent => concurrent::duplicates(ctx).await,
            Kind::RetryAfter => concurrent::retry_after(ctx).await,
            Kind::Mismatch => mismatch::mismatch(ctx).await,
            Kind::MissingKey => keys::missing(ctx).await,
            Kind::EmptyKey => keys::empty(ctx).await,
            Kind::OversizedKey => keys::oversized(ctx).await,
            Kind::NonAsciiKey => keys::non_ascii(ctx).await,
            Kind::TwoKeys => keys::two_keys(ctx).await,
            Kind::LongestKey => keys::longest(ctx).await,
            Kind::DeclineReplayed => errors::decline_replayed(ctx).await,
            Kind::FailureNotStored => errors::failure_not_stored(ctx).await,
            Kind::CrossPrincipal => scope::cross_principal(ctx).await,
            Kind::OrphanRecovers => lease::orphan_recovers(ctx).await,
            Kind::BeforeResponseTtl => expiry::before_response_ttl(ctx).await,
            Kind::AfterResponseTtl => expiry::after_response_ttl(ctx).await,
            Kind::AfterKeyTtl => expiry::after_key_ttl(ctx).await,
        }
    }
}

/// What a case concluded.
#[derive(Debug)]
pub(crate) enum Check {
    Pass(Confidence, String),
    Fail { expected: String, observed: String },
    Unsafe { expected: String, observed: String },
    Skip(String),
}

pub(crate) fn fail(expected: impl Into<String>, observed: impl Into<String>) -> Check {
    Check::Fail {
        expected: expected.into(),
        observed: observed.into(),
    }
}

pub(crate) fn unsafe_(expected: impl Into<String>, observed: impl Into<String>) -> Check {
    Check::Unsafe {
        expected: expected.into(),
        observed: observed.into(),
    }
}

/// The key header(s) of a request.
#[derive(Clone, Debug)]
pub(crate) enum KeyHeader {
    None,
    One(HeaderValue),
    Many(Vec<HeaderValue>),
}

/// Which credential a request carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Who {
    A,
    B,
}

/// How long a case waits for an in-flight request to finish before it calls the server
/// stuck.
fn settle_window(t: &Target) -> Duration {
    t.timeout.max(Duration::from_secs(5)) + t.lease.unwrap_or_default()
}

/// Time between polls of a key that is in progress.
const POLL: Duration = Duration::from_millis(50);

/// What a case can do: send requests (all logged), read the oracles, take notes.
pub(crate) struct Ctx<'a> {
    pub(crate) t: &'a Target,
    pub(crate) http: &'a Http,
    pub(crate) log: Log,
    notes: Mutex<Vec<String>>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(t: &'a Target, http: &'a Http, log: Log) -> Ctx<'a> {
        Ctx {
            t,
            http,
            log,
            notes: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn note(&self, note: impl Into<String>) {
        self.notes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(note.into());
    }

    pub(crate) fn take_notes(&self) -> Vec<String> {
        std::mem::take(&mut *self.notes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A fresh key in the configured style, before quoting.
    pub(crate) fn new_key(&self) -> String {
        let id = uuid::Uuid::new_v4();
        match self.t.key_style {
            KeyStyle::Uuid | KeyStyle::SfString => id.hyphenated().to_string(),
            KeyStyle::Bare => format!("idem-{}", id.simple()),
        }
    }

    /// `raw` as a header value in the configured style (quoted for sf-string).
    pub(crate) fn key_value(&self, raw: &[u8]) -> HeaderValue {
        let bytes = match self.t.key_style {
            KeyStyle::SfString => {
                let mut q = Vec::with_capacity(raw.len() + 2);
                q.push(b'"');
                q.extend_from_slice(raw);
                q.push(b'"');
                q
            }
            KeyStyle::Uuid | KeyStyle::Bare => raw.to_vec(),
        };
        // Every caller passes printable or high bytes; an invalid value cannot be built.
        HeaderValue::from_bytes(&bytes).unwrap_or(HeaderValue::from_static("invalid"))
    }

    /// A fresh key header.
    pub(crate) fn fresh(&self) -> KeyHeader {
        KeyHeader::One(self.key_value(self.new_key().as_bytes()))
    }

    pub(crate) fn request(&self, key: &KeyHeader, body: &Bytes, who: Who) -> Req {
        let mut headers = Vec::new();
        if let Some(ct) = &self.t.content_type {
            headers.push((CONTENT_TYPE, ct.clone()));
        }
        for (n, v) in &self.t.headers {
            let replaced = who == Who::B && self.t.second_credential.iter().any(|(m, _)| m == n);
            if !replaced {
                headers.push((n.clone(), v.clone()));
            }
        }
        if who == Who::B {
            headers.extend(self.t.second_credential.iter().cloned());
        }
        match key {
            KeyHeader::None => {}
            KeyHeader::One(v) => headers.push((self.t.key_header.clone(), v.clone())),
            KeyHeader::Many(vs) => {
                for v in vs {
                    headers.push((self.t.key_header.clone(), v.clone()));
                }
            }
        }
        Req {
            method: self.t.method.clone(),
            url: self.t.url.clone(),
            headers,
            body: body.clone(),
        }
    }

    pub(crate) async fn send(&self, label: &str, req: &Req) -> Result<Resp, HarnessError> {
        let sent = Instant::now();
        let result = self.http.send(req).await;
        self.log.record(label, req, sent, &result);
        result
    }

    /// Sends the target request with `key` and `body` as the first principal.
    pub(crate) async fn post(
        &self,
        label: &str,
        key: &KeyHeader,
        body: &Bytes,
    ) -> Result<Resp, HarnessError> {
        self.send(label, &self.request(key, body, Who::A)).await
    }

    /// Sends until the answer is no longer the profile's conflict status, for at most the
    /// settle window. Returns the last answer.
    pub(crate) async fn settle(
        &self,
        label: &str,
        key: &KeyHeader,
        body: &Bytes,
    ) -> Result<Resp, HarnessError> {
        let deadline = Instant::now() + settle_window(self.t);
        let mut polls = 0u32;
        loop {
            let r = self.post(label, key, body).await?;
            if r.status != self.t.profile.conflict || Instant::now() >= deadline {
                if polls > 0 {
                    self.note(format!(
                        "{label}: answered {} after {polls} in-progress answer(s)",
                        r.status
                    ));
                }
                return Ok(r);
            }
            polls += 1;
            tokio::time::sleep(POLL).await;
        }
    }

    /// The execution count from the count oracle, if there is one.
    pub(crate) async fn count(&self) -> Result<Option<u64>, HarnessError> {
        let Some(url) = &self.t.count_url else {
            return Ok(None);
        };
        let req = Req {
            method: hyper::Method::GET,
            url: url.clone(),
            headers: self.t.headers.clone(),
            body: Bytes::new(),
        };
        let r = self.send("count oracle", &req).await?;
        if !r.is_success() {
            return Err(HarnessError::Protocol(format!(
                "the count oracle {url} answered {}",
                r.status
            )));
        }
        parse_count(&r.body).map(Some).ok_or_else(|| {
            HarnessError::Protocol(format!(
                "the count oracle {url} answered {:?}, not a number or {{\"count\": N}}",
                String::from_utf8_lossy(&r.body[..r.body.len().min(80)])
            ))
        })
    }

    /// The created resource's id, by the JSON pointer oracle.
    pub(crate) fn resource_id(&self, r: &Resp) -> Option<String> {
        self.t.id_pointer.as_deref().and_then(|p| r.json_pointer(p))
    }

    /// Whether `r` carries the profile's replay marker.
    pub(crate) fn marked(&self, r: &Resp) -> bool {
        self.t.profile.replay_marker.as_ref().is_some_and(|(n, v)| {
            r.header(n)
                .is_some_and(|x| x.trim().eq_ignore_ascii_case(v))
        })
    }

    /// For two success answers that differ: the evidence that two executions happened
    /// (distinct resource ids), if the id oracle gives it.
    pub(crate) fn distinct_ids(&self, a: &Resp, b: &Resp) -> Option<(String, String)> {
        match (self.resource_id(a), self.resource_id(b)) {
            (Some(x), Some(y)) if x != y => Some((x, y)),
            _ => None,
        }
    }

    /// The pass confidence when no count oracle is available.
    pub(crate) fn has_count(&self) -> bool {
        self.t.count_url.is_some()
    }
}

/// Executions between two readings of the count oracle.
pub(crate) fn runs(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before?))
}

fn parse_count(body: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(body).ok()?.trim();
    if let Ok(n) = text.parse::<u64>() {
        return Some(n);
    }
    match serde_json::from_str::<serde_json::Value>(text).ok()? {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::Object(map) => map.get("count")?.as_u64(),
        _ => None,
    }
}

/// Fails with an error verdict when an answer the case builds on is not a success: the
/// harness cannot judge the requirement without one.
pub(crate) fn require_success(r: &Resp, what: &str) -> Result<(), HarnessError> {
    if r.is_success() {
        Ok(())
    } else {
        Err(HarnessError::Protocol(format!(
            "{what} must succeed for this case, but got {}; check the method, body and credential options",
            r.summary()
        )))
    }
}

/// A `Check::Pass` whose confidence depends on whether a count oracle watched.
pub(crate) fn pass_counted(ctx: &Ctx<'_>, counted: &str, uncounted: (Confidence, &str)) -> Check {
    if ctx.has_count() {
        Check::Pass(Confidence::High, counted.to_owned())
    } else {
        Check::Pass(uncounted.0, uncounted.1.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_sectioned_and_cite_known_requirements() {
        let mut seen = std::collections::HashSet::new();
        for c in all() {
            assert!(seen.insert(c.id), "duplicate case id {}", c.id);
            assert!(
                SECTIONS.iter().any(|(s, _)| *s == c.section()),
                "case {} has no section heading",
                c.id
            );
            assert!(idem_spec::get(c.requirement).is_some(), "{}", c.requirement);
            assert!(!c.requirement_text().is_empty());
        }
    }

    #[test]
    fn counts_parse_as_numbers_or_objects() {
        assert_eq!(parse_count(b"17\n"), Some(17));
        assert_eq!(parse_count(br#"{"count": 3}"#), Some(3));
        assert_eq!(parse_count(b"3.5"), None);
        assert_eq!(parse_count(br#"{"n": 3}"#), None);
        assert_eq!(parse_count(b"\xff"), None);
    }
}
