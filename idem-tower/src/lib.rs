//! Idempotency-Key semantics for Rust HTTP services: a [`tower_layer::Layer`] over `http`
//! types that drives [idem-core](idem_core)'s request machine, so that every guarded request
//! (POST and PATCH by default) is safe to retry.
//!
//! ```no_run
//! # async fn run() {
//! use axum::{routing::post, Router};
//! use idem_tower::{IdempotencyLayer, MemoryStore};
//!
//! let idempotency = IdempotencyLayer::builder(MemoryStore::default())
//!     .principal(|parts| parts.headers.get("x-account-id")?.to_str().ok().map(str::to_owned))
//!     .build()
//!     .expect("a principal is set");
//! let app: Router = Router::new()
//!     .route("/orders", post(|| async { "created" }))
//!     .layer(idempotency);
//! # let _ = app;
//! # }
//! ```
//!
//! What the layer does for a guarded request:
//!
//! * reads the body up to the fingerprint's cap (413 `body-too-large` beyond), and takes the
//!   fingerprint from the method, target, chosen headers and body;
//! * claims the key in the store before the handler runs; a duplicate in flight gets 409
//!   with `Retry-After` (or waits, as the policy says), a changed payload 422, a retry of a
//!   completed request the stored response with `Idempotent-Replayed: true`;
//! * runs the handler with an [`IdempotencyContext`] in the request's extensions (the key,
//!   whether this attempt takes over from one whose lease ended, the fencing number, and a
//!   heartbeat);
//! * collects the handler's response and stores it **before** returning it.
//!
//! Every decision and every reply comes from idem-core: this crate only moves data between
//! the request machine, the store and the inner service. The guarded work runs in a task of
//! its own, so a client that goes away cannot cancel a handler half-way or the write of its
//! outcome.
#![forbid(unsafe_code)]

mod drive;
mod memory;
#[cfg(feature = "postgres")]
mod postgres_store;
#[cfg(feature = "redis")]
mod redis_store;
#[cfg(feature = "store-tests")]
pub mod store_tests;

use bytes::Bytes;
use drive::{advance, nonce, Running, Shared};
use http::request::Parts;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Either, Full};
use idem_core::{
    AsyncStore, Delivery, Engine, Event, Inbox, Intake, Message, Outcome, Plain, Policy, RecordKey,
    Reply, Step, StoredResponse, UnixMillis, KEY_HEADER, LOW_WATER_HEADER,
};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

pub use idem_core;
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres_store::{PostgresStore, PostgresStoreError, Transaction};
#[cfg(feature = "redis")]
pub use redis_store::{RedisStore, RedisStoreError};

/// The error type the bodies may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of a request the inner service gets: the buffered body of a guarded request,
/// or the body as it came for a request that passes through.
pub type InnerBody<B> = Either<Full<Bytes>, B>;

/// The body of a response of the layer: a stored, replayed or refused response, or the inner
/// service's body for a request that passes through.
pub type OuterBody<B> = Either<Full<Bytes>, B>;

type PrincipalFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type RouteFn = dyn Fn(&Parts) -> String + Send + Sync;
type FilterFn = dyn Fn(&Parts) -> bool + Send + Sync;
type EventFn = dyn Fn(&Event, &RecordKey) + Send + Sync;

/// Who sent a request.
#[derive(Clone)]
enum Principal {
    /// One tenant, said so explicitly.
    Single,
    /// The host's extractor; `None` from it is an empty principal, refused (`IDEM-SCOPE-3`).
    Extract(Arc<PrincipalFn>),
}

/// What a handler learns about the execution it runs: in the request's extensions as
/// `IdempotencyContext` (with axum, `Extension<IdempotencyContext>`).
#[derive(Clone)]
pub struct IdempotencyContext {
    key: String,
    record: RecordKey,
    recovered: bool,
    fence: u64,
    lease_expires: UnixMillis,
    attempt: u64,
    heartbeat: Arc<dyn drive::Beat>,
}

impl fmt::Debug for IdempotencyContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyContext")
            .field("key", &self.key)
            .field("recovered", &self.recovered)
            .field("fence", &self.fence)
            .field("lease_expires", &self.lease_expires)
            .finish_non_exhaustive()
    }
}

impl IdempotencyContext {
    /// The idempotency key, as parsed.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The record's key in the store: the scope (principal, method, route) and the key
    /// (for `PostgresStore::transaction`).
    pub fn record_key(&self) -> &RecordKey {
        &self.record
    }

    /// Whether this execution takes over from an attempt whose lease ended: reconcile with
    /// whatever that attempt may have done before acting (`IDEM-LEASE-1`).
    pub fn recovered(&self) -> bool {
        self.recovered
    }

    /// The fencing number (`IDEM-LEASE-2`): hand it to resources that can check it.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// When the lease ends unless a heartbeat extends it.
    pub fn lease_expires(&self) -> UnixMillis {
        self.lease_expires
    }

    /// This attempt's identity, unique across every attempt at every key (for a store that
    /// keeps something for the attempt, such as `PostgresStore::transaction`).
    pub fn attempt(&self) -> u64 {
        self.attempt
    }

    /// A heartbeat (`IDEM-LEASE-3`): extends the lease by one lease period, and the key's
    /// retention with it. Resolves to the new end of the lease.
    pub async fn extend(&self) -> Result<UnixMillis, LeaseError> {
        self.heartbeat.extend().await
    }
}

/// Why a heartbeat did not extend the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseError {
    /// Another attempt took the lease over: stop; nothing this attempt writes will be kept
    /// (`IDEM-LEASE-2`).
    FencedOut,
    /// The lease had ended before the heartbeat (`IDEM-LEASE-3`).
    Expired,
    /// The store failed; the lease may or may not have been extended (`IDEM-STORE-4`).
    StoreFailed,
    /// The request is over.
    Finished,
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LeaseError::FencedOut => "the lease was taken over by another attempt",
            LeaseError::Expired => "the lease had ended before the heartbeat",
            LeaseError::StoreFailed => "the store failed; the lease may not have been extended",
            LeaseError::Finished => "the request is over",
        })
    }
}

impl std::error::Error for LeaseError {}

/// Why [`Builder::build`] refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildError {
    /// No principal extractor and no [`Builder::single_tenant`]: there is no silent default
    /// (a credential that rotates would split one user into two scopes; a missing one would
    /// put every caller in one).
    NoPrincipal,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoPrincipal => f.write_str(
                "IDEM-SCOPE-3: say who sends each request with .principal(|parts| …) (an account or user id, never a bearer token that rotates), or .single_tenant()",
            ),
        }
    }
}

impl std::error::Error for BuildError {}

/// Builds an [`IdempotencyLayer`].
pub struct Builder<St> {
    store: St,
    policy: Policy,
    principal: Option<Principal>,
    route: Option<Arc<RouteFn>>,
    filter: Option<Arc<FilterFn>>,
    on_event: Option<Arc<EventFn>>,
}

impl<St> Builder<St> {
    /// The policy: the engine's times (`response_ttl`, `key_ttl`, lease), key kind, methods,
    /// fingerprint, in-flight policy and response size limit. The default is idem-core's.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Who sent a request: an account or user id, never a credential that rotates. `None`
    /// is an empty principal, which is refused (`IDEM-SCOPE-3`).
    pub fn principal<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.principal = Some(Principal::Extract(Arc::new(f)));
        self
    }

    /// The service has one tenant: keys are not scoped by caller.
    pub fn single_tenant(mut self) -> Self {
        self.principal = Some(Principal::Single);
        self
    }

    /// The route of a request, for its scope (default: its path). With axum, the route
    /// template from `MatchedPath`.
    pub fn route<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> String + Send + Sync + 'static,
    {
        self.route = Some(Arc::new(f));
        self
    }

    /// Which requests the layer guards, besides the policy's methods (default: all).
    pub fn only<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.filter = Some(Arc::new(f));
        self
    }

    /// Called with every event (`IDEM-EVT-1`) and the record's key. The default logs them
    /// with `tracing` (security-relevant ones at `warn`).
    pub fn on_event<F>(mut self, f: F) -> Self
    where
        F: Fn(&Event, &RecordKey) + Send + Sync + 'static,
    {
        self.on_event = Some(Arc::new(f));
        self
    }

    /// The layer, or [`BuildError::NoPrincipal`] when no principal was said.
    pub fn build(self) -> Result<IdempotencyLayer<St>, BuildError> {
        let principal = self.principal.ok_or(BuildError::NoPrincipal)?;
        Ok(IdempotencyLayer {
            shared: Arc::new(Shared {
                store: self.store,
                policy: self.policy,
                principal,
                route: self.route,
                filter: self.filter,
                on_event: self.on_event,
                waiters: Default::default(),
            }),
        })
    }
}

/// The idempotency layer: wraps a service with Idempotency-Key semantics on store `St`.
pub struct IdempotencyLayer<St> {
    shared: Arc<Shared<St>>,
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St> IdempotencyLayer<St> {
    /// A builder with idem-core's default policy. A principal is required
    /// ([`Builder::principal`] or [`Builder::single_tenant`]).
    pub fn builder(store: St) -> Builder<St> {
        Builder {
            store,
            policy: Policy::new(Engine::default()),
            principal: None,
            route: None,
            filter: None,
            on_event: None,
        }
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.shared.store
    }
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = Idempotent<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotent {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// A service with Idempotency-Key semantics (see the crate docs).
pub struct Idempotent<S, St> {
    inner: S,
    shared: Arc<Shared<St>>,
}

impl<S: Clone, St> Clone for Idempotent<S, St> {
    fn clone(&self) -> Self {
        Idempotent {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for Idempotent<S, St>
where
    S: Service<Request<InnerBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
{
    type Response = Response<OuterBody<ResB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The service that was polled ready handles this request; a clone takes its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(serve(shared, inner, request))
    }
}

/// A response with `body` and `status`, and `headers`.
fn response<'h>(
    status: u16,
    headers: impl Iterator<Item = (&'h str, &'h str)>,
    body: Bytes,
) -> Response<Full<Bytes>> {
    let mut out = Response::new(Full::new(body));
    *out.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let map = out.headers_mut();
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            map.append(name, value);
        }
    }
    out
}

/// The engine's reply (a replay or a refusal) as a response.
fn reply_response<B>(reply: &idem_core::Reply) -> Response<OuterBody<B>> {
    render(reply).map(Either::Left)
}

/// An engine reply as the layer sends it: its status, headers and body. For endpoints a
/// service writes itself beside the layer (a counter session, a token issuer), so that their
/// refusals are the same `application/problem+json` as the layer's.
pub fn render(reply: &idem_core::Reply) -> Response<Full<Bytes>> {
    response(
        reply.status(),
        reply.headers(),
        Bytes::copy_from_slice(reply.body()),
    )
}

/// Drives an operation's machine ([`Policy::open_session`], [`Policy::open_session_from`],
/// [`Policy::issue_token`]) over `store` to its answer, rendered as the layer renders its own:
/// for the endpoints a service serves beside the layer (a session endpoint, a token
/// endpoint), on the layer's store. An operation that runs a handler (a delivery) is
/// answered 500 here: use [`deliver`].
pub async fn answer<St>(store: &St, mut request: idem_core::Request) -> Response<Full<Bytes>>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    let waiters = std::sync::Mutex::default();
    loop {
        match drive::drive_steps(store, &waiters, &log_events, &mut request).await {
            Step::WaitUntil(t) => {
                tokio::time::sleep(std::time::Duration::from_millis(UnixMillis::now().until(t)))
                    .await;
            }
            Step::Reply | Step::Done(_) => {
                return match request.reply() {
                    Some(reply) => render(&reply),
                    None => render(&Reply::plain(
                        Plain::Internal,
                        "the operation has no answer",
                    )),
                }
            }
            _ => {
                return render(&Reply::plain(
                    Plain::Internal,
                    "this operation runs a handler",
                ))
            }
        }
    }
}

/// What became of one delivery to an inbox ([`deliver`]), and the receipt to answer its
/// sender with.
#[derive(Debug)]
pub struct Delivered {
    /// What became of it.
    pub delivery: Delivery,
    /// The engine's receipt: 200 for what the sender may stop delivering, the core's problem
    /// with `Retry-After` for what it must deliver again.
    pub receipt: Response<Full<Bytes>>,
}

/// One delivery of `message` to `inbox`, on `store`: the first delivery of a message runs
/// `process` (with the handler's [`idem_core::Context`]: whether it recovers from an
/// interrupted delivery), later ones are acknowledged without it (`IDEM-INBOX-1` to
/// `IDEM-INBOX-3`). If `process` fails, its error is returned once the failure is recorded:
/// the sender should deliver the message again, and the next delivery recovers.
pub async fn deliver<St, F, Fut, E>(
    store: &St,
    inbox: &Inbox,
    message: &Message<'_>,
    process: F,
) -> Result<Delivered, E>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
    F: FnOnce(idem_core::Context) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let waiters = std::sync::Mutex::default();
    let mut request = inbox.deliver(message, drive::nonce());
    let mut failure = None;
    let mut process = Some(process);
    loop {
        match drive::drive_steps(store, &waiters, &log_events, &mut request).await {
            Step::WaitUntil(t) => {
                tokio::time::sleep(std::time::Duration::from_millis(UnixMillis::now().until(t)))
                    .await;
            }
            Step::Run(context) => {
                let outcome = match process.take() {
                    Some(process) => process(context).await,
                    None => Ok(()),
                };
                request.handle_outcome(match outcome {
                    Ok(()) => Inbox::processed(),
                    Err(e) => {
                        failure = Some(e);
                        Outcome::Unknown(None)
                    }
                });
            }
            _ => break,
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let delivery = request.delivery().unwrap_or(Delivery::Failed);
    let receipt = request.reply().map_or_else(
        || {
            render(&Reply::plain(
                Plain::Internal,
                "the delivery has no receipt",
            ))
        },
        |r| render(&r),
    );
    Ok(Delivered { delivery, receipt })
}

/// The events of an operation, as the default hook logs them.
fn log_events(request: &mut idem_core::Request) {
    while let Some(event) = request.poll_event() {
        drive::log(&event, request.key());
    }
}

async fn serve<S, St, ReqB, ResB>(
    shared: Arc<Shared<St>>,
    inner: S,
    request: Request<ReqB>,
) -> Result<Response<OuterBody<ResB>>, S::Error>
where
    S: Service<Request<InnerBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
{
    let (parts, body) = request.into_parts();
    let has_key = parts.headers.contains_key(KEY_HEADER);
    let guarded = shared.policy.protects(parts.method.as_str(), has_key)
        && shared.filter.as_ref().is_none_or(|f| f(&parts));
    if !guarded {
        let mut inner = inner;
        let request = Request::from_parts(parts, Either::Right(body));
        return Ok(inner.call(request).await?.map(Either::Right));
    }
    // The body is read chunk by chunk through the core's intake: a declared length past the
    // limit is refused before anything is read, and an undeclared one once it goes past it,
    // so that an endless upload cannot fill the memory (IDEM-LIMIT-1).
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body = match read_body(&shared.policy, declared, body).await {
        Ok(body) => body,
        Err(reply) => return Ok(reply_response(&reply)),
    };
    // The rest runs in a task of its own: a client that goes away must not cancel a handler
    // half-way, nor the write of its outcome.
    match tokio::spawn(guard(shared, inner, parts, body)).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => Ok(reply_response(&Reply::plain(
            Plain::Unavailable,
            "the server is shutting down",
        ))),
    }
}

/// Reads `body` through the core's intake ([`Policy::read_body`]): its bytes, or the reply
/// that refuses it (413 `body-too-large`, or 400 when the client stopped sending). The layer
/// reads guarded bodies with it; an endpoint served beside the layer (a session endpoint)
/// can too.
pub async fn read_body<B>(policy: &Policy, declared: Option<u64>, body: B) -> Result<Bytes, Reply>
where
    B: Body<Data = Bytes>,
{
    let mut reader = policy.read_body(declared)?;
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Err(Reply::plain(
                Plain::BadRequest,
                "the request body could not be read",
            ));
        };
        if let Ok(data) = frame.into_data() {
            reader.push(&data)?;
        }
    }
    Ok(Bytes::from(reader.finish()))
}

/// Claims, runs and completes one guarded request.
async fn guard<S, St, ReqB, ResB>(
    shared: Arc<Shared<St>>,
    mut inner: S,
    parts: Parts,
    body: Bytes,
) -> Result<Response<OuterBody<ResB>>, S::Error>
where
    S: Service<Request<InnerBody<ReqB>>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes>,
    ResB::Error: Into<BoxError>,
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
{
    let keys: Vec<&[u8]> = parts
        .headers
        .get_all(KEY_HEADER)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    let principal = match &shared.principal {
        Principal::Single => None,
        Principal::Extract(f) => Some(f(&parts).unwrap_or_default()),
    };
    let route = match &shared.route {
        Some(f) => f(&parts),
        None => parts.uri.path().to_owned(),
    };
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |p| p.as_str());
    let spec = shared.policy.fingerprint_spec();
    let selected: Vec<(&str, &[u8])> = spec
        .headers
        .iter()
        .flat_map(|name| {
            parts
                .headers
                .get_all(name.as_str())
                .iter()
                .map(move |v| (name.as_str(), v.as_bytes()))
        })
        .collect();
    let text = |name| {
        parts
            .headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let intake = Intake {
        principal: principal.as_deref(),
        method: parts.method.as_str(),
        route: &route,
        target,
        keys: &keys,
        low_water: text(LOW_WATER_HEADER),
        content_type: text(http::header::CONTENT_TYPE.as_str()),
        headers: &selected,
        body: &body,
    };
    let mut machine = shared.policy.request(&intake, nonce());
    drop(keys);
    let context = loop {
        match advance(&shared, &mut machine).await {
            Step::WaitUntil(t) => {
                tokio::time::sleep(std::time::Duration::from_millis(UnixMillis::now().until(t)))
                    .await;
            }
            Step::Run(context) => break context,
            Step::Reply => {
                return Ok(match machine.reply() {
                    Some(reply) => reply_response(&reply),
                    None => internal("the request machine has no reply"),
                })
            }
            other => {
                // The step's text stays in the log: `plain` bodies carry fixed text only.
                tracing::error!(step = ?other, "idempotency: unexpected step before the handler ran");
                return Ok(internal("the request machine asked for an unexpected step"));
            }
        }
    };
    let record = machine.key().clone();
    let running = Arc::new(Running::new(Arc::clone(&shared), machine, context.attempt));
    let mut request = Request::from_parts(parts, Either::Left(Full::new(body)));
    request.extensions_mut().insert(IdempotencyContext {
        key: record.key.clone(),
        record,
        recovered: context.recovered,
        fence: context.fence,
        lease_expires: context.lease_expires,
        attempt: context.attempt,
        heartbeat: Arc::clone(&running) as Arc<dyn drive::Beat>,
    });
    // A handler that panics is a crash: nothing is recorded and its lease is left to end, as
    // after a process that died; whatever the store holds for the attempt (a transaction)
    // is let go when the request is dropped (`Running`'s destructor).
    let answered = match inner.call(request).await {
        Ok(answered) => answered,
        Err(e) => {
            // A handler that failed: its outcome is unknown (IDEM-OUT-3). Its error goes on.
            let _ = running.finish(Outcome::Unknown(None)).await;
            return Err(e);
        }
    };
    let (head, body) = answered.into_parts();
    // `ok()`: the body's error is not kept across the awaits below (it need not be Send).
    let collected = body.collect().await.ok();
    let bytes = match collected {
        Some(collected) => collected.to_bytes(),
        None => {
            // The response failed half-way: what the client would have seen is unknown.
            return Ok(match running.finish(Outcome::Unknown(None)).await {
                Some(reply) => reply_response(&reply),
                None => internal("the response body failed"),
            });
        }
    };
    let stored = StoredResponse {
        status: head.status.as_u16(),
        headers: head
            .headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: bytes.to_vec(),
    };
    // The outcome is written before the response leaves (IDEM-OUT-5); the response is sent
    // whatever the write came to, unless another attempt took the lease over: then its
    // caller gets the key's outcome instead (IDEM-LEASE-5).
    if let Some(reply) = running.finish(Outcome::classify(stored)).await {
        return Ok(reply_response(&reply));
    }
    Ok(Response::from_parts(head, Either::Left(Full::new(bytes))))
}

/// A 500 problem for a state the request machine should never be in.
fn internal<B>(detail: &'static str) -> Response<OuterBody<B>> {
    reply_response(&Reply::plain(Plain::Internal, detail))
}
