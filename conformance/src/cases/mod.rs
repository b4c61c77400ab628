//! The cases, one file per section. Each case is defined in one place in its section's
//! file: a stable ID (`section/n`, never a list position), the requirement it checks (an ID
//! in `spec/requirements.toml`, whose sentence and per-profile level are read from there),
//! a one-line description of what it sends, and the code that runs it.
//!
//! A case ends in a check: a pass (with how sure it is and the outcome it saw), a miss
//! of a requirement, unsafe behaviour (a double execution), or a skip. Along the way it may
//! record further misses that do not stop it. The runner grades every miss
//! by the level its requirement has under the profile: a MUST is a failure, a SHOULD is
//! non-strict unless `--strict`, and a MAY is an accepted outcome. A [`HarnessError`] is an
//! error verdict: the harness could not judge.

mod concurrent;
mod counter;
mod errors;
mod expiry;
mod keys;
mod lease;
mod lost;
mod mismatch;
mod replay;
mod scope;
mod time;
mod token;

use crate::http::{HarnessError, Http, Log, Req, Resp};
use crate::suite::{Confidence, KeyStyle, Target};
use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// What running a case yields.
type Running<'c> = Pin<Box<dyn Future<Output = Result<Check, HarnessError>> + Send + 'c>>;

/// A conformance case.
pub struct Case {
    /// Stable ID: `section/n`.
    pub id: &'static str,
    /// The requirement it checks.
    pub requirement: &'static str,
    /// What it sends and expects, in one line.
    pub title: &'static str,
    run: for<'c> fn(&'c Ctx<'c>) -> Running<'c>,
    /// Whether it spends most of its time waiting for the server's clock (a lease, a
    /// retention, a token's life): against a server of its own, it can run beside the
    /// others.
    pub waits: bool,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("id", &self.id)
            .field("requirement", &self.requirement)
            .finish_non_exhaustive()
    }
}

/// A section of the suite: its cases, under a heading.
#[derive(Debug)]
pub struct Section {
    /// The ID prefix of its cases.
    pub name: &'static str,
    /// The heading in reports.
    pub title: &'static str,
    /// Its cases, in order.
    pub cases: &'static [Case],
}

/// Every section, in suite order.
pub const SECTIONS: &[Section] = &[
    Section {
        name: "lost-response",
        title: "Lost responses",
        cases: lost::CASES,
    },
    Section {
        name: "replay",
        title: "Replay of a completed request",
        cases: replay::CASES,
    },
    Section {
        name: "concurrent",
        title: "Concurrent duplicates",
        cases: concurrent::CASES,
    },
    Section {
        name: "mismatch",
        title: "Payload mismatch",
        cases: mismatch::CASES,
    },
    Section {
        name: "keys",
        title: "Key validation",
        cases: keys::CASES,
    },
    Section {
        name: "errors",
        title: "Error responses",
        cases: errors::CASES,
    },
    Section {
        name: "scope",
        title: "Cross-principal isolation",
        cases: scope::CASES,
    },
    Section {
        name: "lease",
        title: "Orphaned in-flight keys (opt-in)",
        cases: lease::CASES,
    },
    Section {
        name: "expiry",
        title: "Expiry (opt-in)",
        cases: expiry::CASES,
    },
    Section {
        name: "time",
        title: "Unix-time keys (--key-kind time)",
        cases: time::CASES,
    },
    Section {
        name: "counter",
        title: "Wrapping counter keys (--key-kind counter)",
        cases: counter::CASES,
    },
    Section {
        name: "token",
        title: "Server-issued tokens (--key-kind token)",
        cases: token::CASES,
    },
];

/// Every case, in suite order.
pub fn all() -> &'static [&'static Case] {
    static ALL: OnceLock<Vec<&'static Case>> = OnceLock::new();
    ALL.get_or_init(|| SECTIONS.iter().flat_map(|s| s.cases.iter()).collect())
}

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
        spec(self.requirement)
    }

    /// The requirement's level under `profile`.
    pub fn level(&self, profile: idem_spec::Profile) -> idem_spec::Level {
        level(self.requirement, profile)
    }

    /// The requirement sentence.
    pub fn requirement_text(&self) -> &'static str {
        &self.spec().text
    }

    pub(crate) fn run<'c>(&self, ctx: &'c Ctx<'c>) -> Running<'c> {
        (self.run)(ctx)
    }
}

/// Requirement `id`.
///
/// # Panics
///
/// If it does not exist: every ID a case cites is checked by a test.
pub(crate) fn spec(id: &str) -> &'static idem_spec::Requirement {
    idem_spec::get(id).unwrap_or_else(|| panic!("no requirement {id}"))
}

/// The level of requirement `id` under `profile` (idem's own where the spec grades no
/// profiles for it; a test checks that every cited requirement has them).
pub(crate) fn level(id: &str, profile: idem_spec::Profile) -> idem_spec::Level {
    let r = spec(id);
    r.level_in(profile).unwrap_or(r.level)
}

/// A requirement that was not met.
#[derive(Clone, Debug)]
pub(crate) struct Miss {
    /// The requirement; `None` is the case's own.
    pub(crate) requirement: Option<&'static str>,
    pub(crate) expected: String,
    pub(crate) observed: String,
}

/// What a case concluded.
#[derive(Debug)]
pub(crate) enum Check {
    /// The requirement holds: how sure the harness is, and the outcome it saw.
    Pass(Confidence, String),
    /// A requirement was missed; the profile's level for it decides the verdict.
    Miss(Miss),
    /// A request executed more often than once, whatever the profile.
    Unsafe { expected: String, observed: String },
    /// Not run, and why.
    Skip(String),
}

/// A miss of the case's own requirement.
pub(crate) fn fail(expected: impl Into<String>, observed: impl Into<String>) -> Check {
    Check::Miss(Miss {
        requirement: None,
        expected: expected.into(),
        observed: observed.into(),
    })
}

/// A miss of requirement `requirement`.
pub(crate) fn miss(
    requirement: &'static str,
    expected: impl Into<String>,
    observed: impl Into<String>,
) -> Check {
    Check::Miss(Miss {
        requirement: Some(requirement),
        expected: expected.into(),
        observed: observed.into(),
    })
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

/// Waits shorter than this are not announced.
const ANNOUNCE_AFTER: Duration = Duration::from_secs(1);
/// How often a long wait says how long is left.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(5);

/// A wait the harness announces: what it waits for, and how long is left at most.
#[derive(Clone, Debug)]
pub struct Waiting {
    /// What the case waits for.
    pub what: String,
    /// Time left until the wait ends (at the latest).
    pub left: Duration,
}

/// A wait in progress: announces itself once it has lasted a second, and then every few
/// seconds. Once ticked (the case waited at least once), it is logged when it ends.
pub(crate) struct Wait<'c> {
    ctx: &'c Ctx<'c>,
    what: String,
    started: Instant,
    until: Instant,
    announced: Option<Instant>,
    ticked: bool,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if self.ticked {
            self.ctx.log.record_wait(&self.what, self.started);
        }
    }
}

impl Wait<'_> {
    /// Announces the wait if it is due.
    pub(crate) fn tick(&mut self) {
        self.ticked = true;
        let now = Instant::now();
        let due = match self.announced {
            None => now.duration_since(self.started) >= ANNOUNCE_AFTER,
            Some(at) => now.duration_since(at) >= ANNOUNCE_EVERY,
        };
        if due && now < self.until {
            self.announced = Some(now);
            self.ctx.announce(Waiting {
                what: self.what.clone(),
                left: self.until - now,
            });
        }
    }
}

/// What a case can do: send requests (all logged), read the oracles, take notes, record
/// misses, announce waits.
pub(crate) struct Ctx<'a> {
    pub(crate) t: &'a Target,
    pub(crate) http: &'a Http,
    pub(crate) log: Log,
    notes: Mutex<Vec<String>>,
    misses: Mutex<Vec<Miss>>,
    waits: Option<UnboundedSender<Waiting>>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(
        t: &'a Target,
        http: &'a Http,
        log: Log,
        waits: Option<UnboundedSender<Waiting>>,
    ) -> Ctx<'a> {
        Ctx {
            t,
            http,
            log,
            notes: Mutex::new(Vec::new()),
            misses: Mutex::new(Vec::new()),
            waits,
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

    /// Records a miss of `requirement` and lets the case go on checking the rest: the
    /// verdict is the worst of every miss and the case's end.
    pub(crate) fn miss(
        &self,
        requirement: &'static str,
        expected: impl Into<String>,
        observed: impl Into<String>,
    ) {
        self.misses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Miss {
                requirement: Some(requirement),
                expected: expected.into(),
                observed: observed.into(),
            });
    }

    pub(crate) fn take_misses(&self) -> Vec<Miss> {
        std::mem::take(&mut *self.misses.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn announce(&self, w: Waiting) {
        if let Some(tx) = &self.waits {
            let _ = tx.send(w);
        }
    }

    /// A wait of at most `max` for `what`, to be ticked by a polling loop.
    pub(crate) fn waiting(&'a self, what: impl Into<String>, max: Duration) -> Wait<'a> {
        let now = Instant::now();
        Wait {
            ctx: self,
            what: what.into(),
            started: now,
            until: now + max,
            announced: None,
            ticked: false,
        }
    }

    /// Sleeps `d`, announcing what for when it is longer than a second.
    pub(crate) async fn sleep(&self, what: &str, d: Duration) {
        let started = Instant::now();
        self.sleep_announced(what, d).await;
        self.log.record_wait(what, started);
    }

    async fn sleep_announced(&self, what: &str, d: Duration) {
        let until = Instant::now() + d;
        if d > ANNOUNCE_AFTER {
            loop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                self.announce(Waiting {
                    what: what.to_owned(),
                    left,
                });
                tokio::time::sleep(left.min(ANNOUNCE_EVERY)).await;
            }
        } else {
            tokio::time::sleep(d).await;
        }
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
        &'a self,
        label: &str,
        key: &KeyHeader,
        body: &Bytes,
    ) -> Result<Resp, HarnessError> {
        let window = settle_window(self.t);
        let deadline = Instant::now() + window;
        let mut wait = self.waiting(format!("{label}: the key to leave in-progress"), window);
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
            wait.tick();
            tokio::time::sleep(POLL).await;
        }
    }

    /// A retry was answered with an error where the stored result was expected. Whether
    /// that is the server's fault or the harness's setup: a control request with a fresh
    /// key shows whether the endpoint accepts this request at all. If it does, the answer
    /// is a miss of `requirement`; if it does not, the harness cannot judge.
    pub(crate) async fn wrong_answer(
        &self,
        requirement: &'static str,
        expected: impl Into<String>,
        observed: impl Into<String>,
        who: Who,
        body: &Bytes,
    ) -> Result<Check, HarnessError> {
        let observed = observed.into();
        let control = self
            .send(
                "control: the same request with a fresh key",
                &self.request(&self.fresh(), body, who),
            )
            .await?;
        if control.is_success() {
            Ok(miss(
                requirement,
                expected,
                format!(
                    "{observed}; a control request with a fresh key succeeded ({}), so the endpoint accepts the request and the key is what it refused",
                    control.status
                ),
            ))
        } else {
            Err(HarnessError::Protocol(format!(
                "{observed}, and a control request with a fresh key failed too ({}): the endpoint refuses this request whatever its key; check the method, body and credential options",
                control.summary()
            )))
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

    /// Whether a count oracle watches the side effects.
    pub(crate) fn has_count(&self) -> bool {
        self.t.count_url.is_some()
    }

    /// Checks that a refusal used the profile's status code (`IDEM-HTTP-1`), recording a
    /// miss if not.
    pub(crate) fn expect_code(&self, r: &Resp, want: u16, what: &str) {
        if r.status != want {
            self.miss(
                "IDEM-HTTP-1",
                format!("{what} is refused with {want}"),
                format!("refused with {}", r.summary()),
            );
        }
    }
}

impl Ctx<'_> {
    /// A request with the raw key `key` (a time, counter or token key: never quoted) and
    /// `extra` headers, as the first principal.
    pub(crate) fn kind_request(
        &self,
        key: &str,
        body: &Bytes,
        extra: &[(&'static str, String)],
    ) -> Req {
        let value = HeaderValue::from_str(key).unwrap_or(HeaderValue::from_static("invalid"));
        let mut req = self.request(&KeyHeader::One(value), body, Who::A);
        for (name, v) in extra {
            if let Ok(v) = HeaderValue::from_str(v) {
                req.headers
                    .push((hyper::header::HeaderName::from_static(name), v));
            }
        }
        req
    }

    /// POSTs `body` as JSON to `url` with the first principal's headers: a session or
    /// token endpoint. Its JSON answer, which must be a success.
    async fn post_json(
        &self,
        label: &str,
        url: &url::Url,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, HarnessError> {
        let mut headers = self.t.headers.clone();
        headers.push((CONTENT_TYPE, HeaderValue::from_static("application/json")));
        let req = Req {
            method: hyper::Method::POST,
            url: url.clone(),
            headers,
            body: Bytes::from(body.to_string()),
        };
        let r = self.send(label, &req).await?;
        require_success(&r, label)?;
        serde_json::from_slice(&r.body).map_err(|_| {
            HarnessError::Protocol(format!("{label}: {url} answered {}, not JSON", r.summary()))
        })
    }

    /// Opens the session of `client` at the session endpoint; its epoch.
    pub(crate) async fn open_session(
        &self,
        client: &str,
        first_seq: u64,
    ) -> Result<String, HarnessError> {
        let url = self
            .t
            .session_url
            .as_ref()
            .ok_or_else(|| HarnessError::Usage("counter keys need --session-url".into()))?;
        let v = self
            .post_json(
                "open the client's session",
                url,
                serde_json::json!({ "client": client, "firstSeq": first_seq }),
            )
            .await?;
        match &v["epoch"] {
            serde_json::Value::String(e) => Ok(e.clone()),
            serde_json::Value::Number(n) => Ok(n.to_string()),
            _ => Err(HarnessError::Protocol(format!(
                "the session endpoint answered {v}, without an \"epoch\""
            ))),
        }
    }

    /// A token from the token endpoint.
    pub(crate) async fn issue_token(&self) -> Result<String, HarnessError> {
        let url = self
            .t
            .token_url
            .as_ref()
            .ok_or_else(|| HarnessError::Usage("tokens need --token-url".into()))?;
        let v = self
            .post_json("issue a token", url, serde_json::json!({}))
            .await?;
        v["token"].as_str().map(str::to_owned).ok_or_else(|| {
            HarnessError::Protocol(format!(
                "the token endpoint answered {v}, without a \"token\""
            ))
        })
    }

    /// Sends `req` and expects a refusal with the status of `requirement` (from the spec)
    /// that executes nothing: a success or an execution is a miss of `requirement`; another
    /// 4xx holds it and misses `IDEM-HTTP-1`.
    pub(crate) async fn expect_refusal(
        &self,
        label: &str,
        req: &Req,
        requirement: &'static str,
    ) -> Result<Check, HarnessError> {
        let want = spec(requirement).status.unwrap_or(400);
        let before = self.count().await?;
        let r = self.send(label, req).await?;
        let after = self.count().await?;
        if let Some(n) = runs(before, after).filter(|n| *n > 0) {
            return Ok(miss(
                requirement,
                format!("{label}: refused with {want}, nothing executes"),
                format!(
                    "answered {}; the count oracle saw {n} execution(s)",
                    r.summary()
                ),
            ));
        }
        if !(400..500).contains(&r.status) {
            return Ok(miss(
                requirement,
                format!("{label}: refused with {want}"),
                r.summary(),
            ));
        }
        if r.status != want {
            self.miss(
                "IDEM-HTTP-1",
                format!("{label}: refused with {want}"),
                r.summary(),
            );
        }
        Ok(pass_counted(
            self,
            &format!(
                "{label}: refused with {}, nothing executed (count oracle)",
                r.status
            ),
            (
                Confidence::Medium,
                &format!("{label}: refused with {}", r.status),
            ),
        ))
    }
}

/// Milliseconds since the Unix epoch, by this machine's clock.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A client id no earlier run used.
pub(crate) fn client_id() -> String {
    format!("idem-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// A body that differs from the target's, for collisions.
pub(crate) fn other_body(t: &Target) -> Bytes {
    t.mismatch_body
        .clone()
        .unwrap_or_else(|| crate::cases::mismatch::changed(&t.body))
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
/// harness cannot judge the requirement without one. (For a first request only: a retry
/// that fails is judged with [`Ctx::wrong_answer`].)
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

/// The `type` of a problem+json body, if it has one.
pub(crate) fn problem_type(r: &Resp) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
    v.get("type")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_sectioned_and_cite_graded_requirements() {
        let mut seen = std::collections::HashSet::new();
        for s in SECTIONS {
            assert!(!s.cases.is_empty(), "section {} is empty", s.name);
            for c in s.cases {
                assert_eq!(c.section(), s.name, "{} is filed under {}", c.id, s.name);
                assert!(seen.insert(c.id), "duplicate case id {}", c.id);
                let r = idem_spec::get(c.requirement).expect(c.requirement);
                assert!(
                    r.profiles.is_some(),
                    "{} cites {}, which grades no profiles",
                    c.id,
                    c.requirement
                );
                assert!(!c.requirement_text().is_empty());
            }
        }
        assert_eq!(all().len(), seen.len());
    }

    #[test]
    fn every_requirement_a_case_may_miss_grades_the_profiles() {
        // The requirements cases cite by name when they miss something other than their own.
        let src = [
            include_str!("mod.rs"),
            include_str!("concurrent.rs"),
            include_str!("errors.rs"),
            include_str!("expiry.rs"),
            include_str!("keys.rs"),
            include_str!("lease.rs"),
            include_str!("lost.rs"),
            include_str!("mismatch.rs"),
            include_str!("replay.rs"),
            include_str!("scope.rs"),
            include_str!("time.rs"),
            include_str!("counter.rs"),
            include_str!("token.rs"),
        ];
        for text in src {
            for part in text.split("\"IDEM-").skip(1) {
                let tail: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '-')
                    .collect();
                if !tail.ends_with(|c: char| c.is_ascii_digit())
                    || !part[tail.len()..].starts_with('"')
                {
                    continue;
                }
                let id = format!("IDEM-{tail}");
                let r = idem_spec::get(&id).unwrap_or_else(|| panic!("{id} is not in the spec"));
                assert!(r.profiles.is_some(), "{id} grades no profiles");
            }
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
