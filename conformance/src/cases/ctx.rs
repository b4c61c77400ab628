//! What a case works with: [`Ctx`] sends requests (every one logged), reads the oracles,
//! takes notes, records misses and announces waits.

use super::{miss, parse_count, Check, Miss};
use crate::http::{HarnessError, Http, Log, Req, Resp};
use crate::suite::{KeyStyle, Target};
use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

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
pub(crate) const POLL: Duration = Duration::from_millis(50);

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
