//! The faults, made from outside idem-tower's layer: a store wrapper that changes what the
//! layer reads and writes, a middleware around the layer that changes what goes in and what
//! comes out, and configuration mistakes (the engine's times, the fingerprint, the
//! principal). The layer itself has no fault hooks.

use super::{render, run_handler, App, Fault, Route};
use axum::body::Body;
use axum::extract::State;
use axum::middleware::Next;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use hyper::{Request, Response};
use idem_core::{
    parse_opaque_lenient, Applied, AsyncStore, Completing, FingerprintSpec, KeyError, Precondition,
    Problem, Record, RecordKey, RecordState, Refusal, SlotState, StoreFailure, UnixMillis, Write,
    WriteOp, KEY_HEADER, REPLAYED_HEADER, TOKEN_PREFIX,
};
use std::sync::Arc;

/// The header whose value changes on every request, for [`Fault::VolatileFingerprint`].
const VOLATILE_HEADER: &str = "x-request-nonce";

/// The fingerprint a fault configures: the body left out ([`Fault::NoFingerprint`]: every
/// top-level member excluded, so the body is still checked but no longer tells requests
/// apart), or a header that differs on every request included
/// ([`Fault::VolatileFingerprint`]).
pub(super) fn fingerprint(fault: Option<Fault>, mut spec: FingerprintSpec) -> FingerprintSpec {
    match fault {
        Some(Fault::NoFingerprint) => spec.exclude = vec!["/*".to_owned()],
        Some(Fault::VolatileFingerprint) => spec.headers = vec![VOLATILE_HEADER.to_owned()],
        _ => {}
    }
    spec
}

/// The store as a faulty server's layer sees it.
#[derive(Clone)]
pub(super) struct FaultyStore<S> {
    inner: S,
    fault: Fault,
    /// The response retention the server advertises.
    response_ttl: std::time::Duration,
}

/// How often a write of a fault that ignores the stored version tries again when the record
/// changed between its read and its write (a sweep, a racing request).
const LAST_WRITE_ROUNDS: usize = 8;

impl<S> FaultyStore<S> {
    pub(super) fn new(inner: S, fault: Fault, response_ttl: std::time::Duration) -> Self {
        FaultyStore {
            inner,
            fault,
            response_ttl,
        }
    }

    /// Whether the layer is shown no record where `record` is stored.
    fn hidden(&self, record: &Record) -> bool {
        match (self.fault, &record.state) {
            // No lock: a key in flight is not seen, so duplicates run.
            (Fault::NoLock, RecordState::InFlight { .. }) => true,
            // Forgotten early: a response, and its key with it, are gone after a tenth of the
            // advertised retention.
            (
                Fault::ForgetEarly,
                RecordState::Completed {
                    response_expires, ..
                },
            ) => {
                let completed = response_expires
                    .0
                    .saturating_sub(self.response_ttl.as_millis() as u64);
                let forgotten = completed + (self.response_ttl.as_millis() as u64 / 10).max(1);
                UnixMillis::now().0 >= forgotten
            }
            (Fault::ForgetEarly, RecordState::Tombstone) => true,
            _ => false,
        }
    }

    /// A record as the layer reads it.
    fn seen(&self, key: &RecordKey, mut record: Record) -> Option<Record> {
        if self.hidden(&record) {
            return None;
        }
        let in_flight = matches!(record.state, RecordState::InFlight { .. });
        match self.fault {
            // Lost lease (or never released): a lease, once taken, never ends.
            Fault::LostLease | Fault::NeverRelease if in_flight => {
                record.state = RecordState::InFlight {
                    lease_expires: UnixMillis(u64::MAX / 2),
                };
            }
            // Token reuse: a consumed token looks unused again.
            Fault::TokenReuse
                if key.key.starts_with(TOKEN_PREFIX)
                    && matches!(record.state, RecordState::Completed { .. }) =>
            {
                record.state = RecordState::Issued {
                    expires: record.key_expires,
                };
            }
            _ => {}
        }
        Some(record)
    }

    /// Whether a final response with `status` is dropped instead of stored.
    fn forgets(&self, status: u16) -> bool {
        self.fault == Fault::NoStore
            || (self.fault == Fault::ForgetErrors && (400..500).contains(&status))
    }
}

impl<S> AsyncStore for FaultyStore<S>
where
    S: AsyncStore + Send + Sync,
    S::Error: Send,
{
    type Error = S::Error;

    async fn load(&self, key: &RecordKey) -> Result<Option<Record>, S::Error> {
        Ok(self.inner.load(key).await?.and_then(|r| self.seen(key, r)))
    }

    async fn apply(&self, now: UnixMillis, write: Write) -> Result<Applied, S::Error> {
        for _ in 0..LAST_WRITE_ROUNDS {
            let Some(faulted) = self.faulted(write.clone()).await? else {
                return Ok(Applied::Applied);
            };
            let retry = faulted.precondition != write.precondition;
            match self.inner.apply(now, faulted).await? {
                Applied::Conflict if retry => continue,
                applied => return Ok(applied),
            }
        }
        Ok(Applied::Conflict)
    }

    async fn apply_completion(
        &self,
        now: UnixMillis,
        write: Write,
        completion: Completing,
    ) -> Result<Applied, S::Error> {
        for _ in 0..LAST_WRITE_ROUNDS {
            let Some(faulted) = self.faulted(write.clone()).await? else {
                return Ok(Applied::Applied);
            };
            let retry = faulted.precondition != write.precondition;
            match self
                .inner
                .apply_completion(now, faulted, completion.clone())
                .await?
            {
                Applied::Conflict if retry => continue,
                applied => return Ok(applied),
            }
        }
        Ok(Applied::Conflict)
    }

    fn end_attempt(&self, key: &RecordKey, attempt: u64) {
        self.inner.end_attempt(key, attempt);
    }

    fn failure(error: &S::Error) -> StoreFailure {
        S::failure(error)
    }
}

impl<S> FaultyStore<S>
where
    S: AsyncStore + Send + Sync,
    S::Error: Send,
{
    /// `write` as the fault changes it, or `None` when the fault drops it (and reports it
    /// applied).
    async fn faulted(&self, mut write: Write) -> Result<Option<Write>, S::Error> {
        let stored = || self.inner.load(&write.key);
        match (self.fault, &mut write.op) {
            // No lock: the claim is never written, and the result is written whatever is
            // stored now (last one wins).
            (Fault::NoLock, WriteOp::Put(r)) if matches!(r.state, RecordState::InFlight { .. }) => {
                return Ok(None);
            }
            (Fault::NoLock, _) => {
                write.precondition = match stored().await? {
                    Some(r) => Precondition::Version(r.version),
                    None => Precondition::Absent,
                };
            }
            // Forgotten early: a write over a record the layer was not shown replaces it.
            (Fault::ForgetEarly, _) if write.precondition == Precondition::Absent => {
                if let Some(r) = stored().await?.filter(|r| self.hidden(r)) {
                    write.precondition = Precondition::Version(r.version);
                }
            }
            // Never released: a failed attempt's release is dropped.
            (Fault::NeverRelease, WriteOp::Delete) => {
                if let Some(r) = stored().await? {
                    if matches!(r.state, RecordState::InFlight { .. }) {
                        return Ok(None);
                    }
                }
            }
            // Not stored: a final response is deleted instead, so the key is new again.
            (Fault::NoStore | Fault::ForgetErrors, WriteOp::Put(r)) => match &mut r.state {
                RecordState::Completed { response, .. } if self.forgets(response.status) => {
                    write.op = WriteOp::Delete;
                }
                RecordState::Counter { session } => {
                    let forgotten = |s: &SlotState| match s {
                        SlotState::Completed { response } => self.forgets(response.status),
                        _ => false,
                    };
                    if session.slots.iter().any(|s| forgotten(&s.state)) {
                        Arc::make_mut(session)
                            .slots
                            .retain(|s| !forgotten(&s.state));
                    }
                }
                _ => {}
            },
            _ => {}
        }
        Ok(Some(write))
    }
}

/// The refusals a faulty server ignores on `route`: it runs the handler without
/// protection instead.
fn ignored(fault: Fault, route: Route) -> &'static [Problem] {
    match (fault, route) {
        (Fault::NoKeyCheck, _) => &[
            Problem::MISSING_KEY,
            Problem::MALFORMED_KEY,
            Problem::KEY_STALE,
            Problem::KEY_FROM_FUTURE,
            Problem::UNKNOWN_CLIENT,
            Problem::STALE_EPOCH,
            Problem::UNKNOWN_EPOCH,
            Problem::COUNTER_GAP,
            Problem::TOKEN_FORGED,
            Problem::TOKEN_UNKNOWN,
            Problem::TOKEN_EXPIRED,
        ],
        (Fault::CounterNoWrapCheck, Route::Transfers) => &[Problem::KEY_COLLISION],
        (Fault::CounterAcceptStale, Route::Transfers) => &[Problem::KEY_STALE],
        _ => &[],
    }
}

/// The middleware around a faulty server's layer.
pub(super) async fn misbehave(
    State((app, route, fault)): State<(Arc<App>, Route, Fault)>,
    mut req: Request<Body>,
    next: Next,
) -> Response<Body> {
    if fault == Fault::ShortKeys {
        let long = req
            .headers()
            .get_all(KEY_HEADER)
            .iter()
            .filter_map(|v| parse_opaque_lenient(v.as_bytes()).ok())
            .map(|k| k.len())
            .find(|&len| len > 64);
        if let Some(len) = long {
            return render(&Refusal::key(&KeyError::TooLong { len }).reply()).map(Body::new);
        }
    }
    if fault == Fault::VolatileFingerprint {
        let value = HeaderValue::from(super::nonce());
        req.headers_mut()
            .insert(HeaderName::from_static(VOLATILE_HEADER), value);
    }
    let ignored = ignored(fault, route);
    let mut response = if ignored.is_empty() {
        next.run(req).await
    } else {
        // The body is kept for a run without protection.
        let (parts, body) = req.into_parts();
        let max = app.config.max_body;
        let Ok(body) = Limited::new(body, max).collect().await else {
            // As the layer refuses it.
            let refusal = Refusal::body_too_large(max as u64 + 1, max);
            return render(&refusal.reply()).map(Body::new);
        };
        let body = body.to_bytes();
        let req = Request::from_parts(parts, Body::from(body.clone()));
        let response = next.run(req).await;
        let (head, answer) = response.into_parts();
        let answer = answer
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        if ignored
            .iter()
            .any(|p| problem_type(&head, &answer) == Some(p.type_uri))
        {
            run_handler(&app, &body, false).await.map(Body::new)
        } else {
            Response::from_parts(head, Body::new(Full::new(answer)))
        }
    };
    let replay = response.headers().contains_key(REPLAYED_HEADER);
    let status = response.status().as_u16();
    let headers = response.headers_mut();
    match fault {
        Fault::NoMarker => {
            headers.remove(REPLAYED_HEADER);
        }
        Fault::NoRetryAfter if status == 409 => {
            headers.remove(RETRY_AFTER);
        }
        Fault::DropLocation if replay => {
            headers.remove(LOCATION);
        }
        _ => {}
    }
    response
}

/// The `type` of a problem+json answer.
fn problem_type<'a>(head: &hyper::http::response::Parts, body: &'a [u8]) -> Option<&'a str> {
    let problem = head
        .headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/problem+json");
    if !problem {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow)]
        type_: &'a str,
    }
    serde_json::from_slice::<Typed<'a>>(body)
        .ok()
        .map(|t| t.type_)
}
