//! The reference server: a real HTTP/1.1 server built on [`idem_core::Engine`] and
//! [`idem_core::MemoryStore`], with one demo endpoint whose side effect can be observed.
//!
//! # Endpoints
//!
//! * `POST /orders` creates an order. It requires an `Idempotency-Key` (an sf-string or a
//!   bare key, parsed leniently), takes the principal from `Authorization: Bearer <token>`
//!   (`anonymous` without one) and scopes keys by principal, method and route. Every run of
//!   the handler increments an execution counter, sleeps the configured delay, and answers
//!   `201` with `{"id":"ord_000001","execution":1,"recovered":false}`. The JSON body's
//!   `"outcome"` member selects other results, so the suite can test error replay:
//!   `"decline"` gives a deterministic `402` (stored and replayed), `"unavailable"` gives a
//!   `503` (an unknown outcome: not stored under the default policy), and `"crash"` makes a
//!   first attempt die without answering or completing (the connection is closed and the key
//!   stays in flight until its lease ends); a recovering attempt then succeeds.
//! * `GET /count` returns `{"count":N}`, the number of handler runs: the side-effect oracle.
//!
//! Refusals are `application/problem+json` with the status and type idem-core assigns:
//! missing or malformed key 400, key in flight 409 with `Retry-After`, payload mismatch 422,
//! expired key 410, full store 503 with `Retry-After`, body too large 413, invalid JSON 400.
//! Replays carry `Idempotent-Replayed: true`. The handler runs in its own task, so a client
//! that disconnects never cancels work in progress, and the final outcome is written to the
//! store before the response is sent (`IDEM-OUT-5`).
//!
//! # Faults
//!
//! [`Fault`] names deliberate defects. Each is a small deviation from the correct server,
//! so that the suite can show that the case aimed at it fails.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use idem_core::{
    parse_opaque_lenient, Attempt, Claim, Config, Decision, Engine, FingerprintSpec, KeyError,
    Lease, MemoryStore, MemoryStoreError, MemoryStoreLimits, Outcome, Problem, RecordKey,
    RequestParts, Scope, Store, StoredResponse, UnixMillis, Write,
};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// The path of the demo endpoint.
pub const ORDERS_PATH: &str = "/orders";
/// The path of the execution counter.
pub const COUNT_PATH: &str = "/count";
/// The header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// One deliberate defect of the reference server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// No claim before the handler runs: concurrent duplicates (and a retry while the first
    /// attempt is still running) all execute; results are stored afterwards, last one wins.
    NoLock,
    /// The payload is not part of the fingerprint: a changed request replays the old answer.
    NoFingerprint,
    /// Final responses are never stored: every retry executes again.
    NoStore,
    /// Keys are not scoped by principal: one tenant's key replays another tenant's response.
    ReplayAcrossPrincipals,
    /// 5xx responses are stored and replayed instead of letting the retry run.
    #[value(name = "store-5xx")]
    #[serde(rename = "store-5xx")]
    Store5xx,
    /// In-flight keys never expire: a key whose handler died blocks every retry forever.
    LostLease,
    /// Responses are dropped after a tenth of the advertised retention, and the key with them.
    ForgetEarly,
    /// Requests without a valid key are executed anyway, without protection.
    NoKeyCheck,
    /// Keys longer than 64 characters are refused although up to 255 are valid.
    ShortKeys,
    /// Replays do not carry `Idempotent-Replayed: true`.
    NoMarker,
    /// In-progress answers (409) carry no `Retry-After`.
    NoRetryAfter,
    /// Deterministic 4xx answers are not stored: a retry of a declined request runs again.
    ForgetErrors,
    /// No tombstone: once its response expires the key is new again at once, although the
    /// advertised key retention has not passed.
    NoTombstone,
    /// Keys are never forgotten: after the key retention the key is still refused.
    NeverExpire,
}

impl Fault {
    /// Every fault, in a stable order.
    pub const ALL: [Fault; 14] = [
        Fault::NoLock,
        Fault::NoFingerprint,
        Fault::NoStore,
        Fault::ReplayAcrossPrincipals,
        Fault::Store5xx,
        Fault::LostLease,
        Fault::ForgetEarly,
        Fault::NoKeyCheck,
        Fault::ShortKeys,
        Fault::NoMarker,
        Fault::NoRetryAfter,
        Fault::ForgetErrors,
        Fault::NoTombstone,
        Fault::NeverExpire,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::NoLock => "no-lock",
            Fault::NoFingerprint => "no-fingerprint",
            Fault::NoStore => "no-store",
            Fault::ReplayAcrossPrincipals => "replay-across-principals",
            Fault::Store5xx => "store-5xx",
            Fault::LostLease => "lost-lease",
            Fault::ForgetEarly => "forget-early",
            Fault::NoKeyCheck => "no-key-check",
            Fault::ShortKeys => "short-keys",
            Fault::NoMarker => "no-marker",
            Fault::NoRetryAfter => "no-retry-after",
            Fault::ForgetErrors => "forget-errors",
            Fault::NoTombstone => "no-tombstone",
            Fault::NeverExpire => "never-expire",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Settings of the reference server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// How long a completed response is replayed (advertised; see [`Fault::ForgetEarly`]).
    pub response_ttl: Duration,
    /// How long a key is remembered.
    pub key_ttl: Duration,
    /// How long an in-flight claim lasts before a retry may take over.
    pub lease: Duration,
    /// How long each handler run takes.
    pub delay: Duration,
    /// The largest request body accepted (413 beyond).
    pub max_body: usize,
    /// Store capacity (503 when full).
    pub limits: MemoryStoreLimits,
    /// The deliberate defect, if any.
    pub fault: Option<Fault>,
}

impl Default for ServerConfig {
    /// idem-core's default retention and lease, a 100 ms handler, 1 MiB bodies.
    fn default() -> Self {
        let engine = Config::default();
        ServerConfig {
            response_ttl: engine.response_ttl,
            key_ttl: engine.key_ttl,
            lease: engine.lease,
            delay: Duration::from_millis(100),
            max_body: 1 << 20,
            limits: MemoryStoreLimits::default(),
            fault: None,
        }
    }
}

impl ServerConfig {
    /// Short retention and lease (1 s response, 2 s key, 1 s lease) so that the expiry and
    /// lease cases finish within seconds: the settings of the embedded default run.
    pub fn fast() -> ServerConfig {
        ServerConfig {
            response_ttl: Duration::from_secs(1),
            key_ttl: Duration::from_secs(2),
            lease: Duration::from_secs(1),
            ..ServerConfig::default()
        }
    }

    /// The engine configuration actually used, faults included.
    fn engine_config(&self) -> Config {
        let mut c = Config {
            response_ttl: self.response_ttl,
            key_ttl: self.key_ttl,
            lease: self.lease,
            ..Config::default()
        };
        // A hundred years stands in for "never".
        let forever = Duration::from_secs(100 * 365 * 24 * 3600);
        match self.fault {
            Some(Fault::Store5xx) => c.unknown_outcome = idem_core::UnknownOutcomePolicy::Store,
            Some(Fault::LostLease) => c.lease = forever,
            Some(Fault::ForgetEarly) => {
                c.response_ttl = (self.response_ttl / 10).max(Duration::from_millis(1));
                c.key_ttl = c.response_ttl;
            }
            Some(Fault::NoTombstone) => c.key_ttl = c.response_ttl,
            Some(Fault::NeverExpire) => c.key_ttl = forever,
            _ => {}
        }
        c
    }
}

/// Why the server could not start.
#[derive(Debug)]
pub enum StartError {
    /// The settings are inconsistent (for example a key retention shorter than the response
    /// retention).
    Config(idem_core::ConfigError),
    /// The address could not be bound.
    Bind(std::io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "invalid server settings: {e}"),
            StartError::Bind(e) => write!(f, "cannot listen: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

struct State {
    engine: Engine,
    store: Mutex<MemoryStore>,
    spec: FingerprintSpec,
    config: ServerConfig,
    executions: AtomicU64,
}

impl State {
    fn store(&self) -> MutexGuard<'_, MemoryStore> {
        // A panic while holding the lock cannot leave the map half-written: MemoryStore
        // applies each write in one step. Keep serving.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fault(&self, f: Fault) -> bool {
        self.config.fault == Some(f)
    }
}

/// A running reference server. Dropping it stops the server and closes its connections.
pub struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
    state: Arc<State>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("fault", &self.state.config.fault)
            .finish()
    }
}

impl Server {
    /// Binds `addr` (use port 0 for an OS-chosen port) and starts serving on the current
    /// tokio runtime.
    pub async fn start(addr: SocketAddr, config: ServerConfig) -> Result<Server, StartError> {
        let engine = Engine::new(config.engine_config()).map_err(StartError::Config)?;
        let listener = TcpListener::bind(addr).await.map_err(StartError::Bind)?;
        let addr = listener.local_addr().map_err(StartError::Bind)?;
        let state = Arc::new(State {
            engine,
            store: Mutex::new(MemoryStore::new(config.limits)),
            spec: FingerprintSpec {
                max_body: config.max_body,
                ..FingerprintSpec::default()
            },
            config,
            executions: AtomicU64::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&state)));
        Ok(Server { addr, task, state })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many times the handler has run.
    pub fn executions(&self) -> u64 {
        self.state.executions.load(Ordering::SeqCst)
    }

    /// Records held by the store.
    pub fn stored_records(&self) -> usize {
        self.state.store().stats().entries
    }

    /// The fault it runs with.
    pub fn fault(&self) -> Option<Fault> {
        self.state.config.fault
    }

    /// Waits until the server stops (it stops only when dropped or on an accept loop panic).
    pub async fn wait(&mut self) {
        let _ = (&mut self.task).await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    // Connections live in this set: when the server is dropped the accept task is aborted,
    // the set is dropped with it, and every connection task ends.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        // Out of file descriptors or similar: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let state = Arc::clone(&state);
                connections.spawn(async move {
                    let service = service_fn(move |req| handle(Arc::clone(&state), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(Duration::from_secs(30))
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// The handler died without answering: the connection is closed without a response.
#[derive(Debug)]
struct Crashed;

impl fmt::Display for Crashed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the handler crashed")
    }
}

impl std::error::Error for Crashed {}

type Reply = Result<Response<Full<Bytes>>, Crashed>;

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Reply {
    match (req.method(), req.uri().path()) {
        (&Method::POST, ORDERS_PATH) => orders(state, req).await,
        (&Method::GET, COUNT_PATH) => {
            let body = serde_json::json!({ "count": state.executions.load(Ordering::SeqCst) });
            Ok(json_response(StatusCode::OK, body.to_string()))
        }
        (_, ORDERS_PATH) => Ok(plain_problem(405, "Method Not Allowed", "use POST", "POST")),
        (_, COUNT_PATH) => Ok(plain_problem(405, "Method Not Allowed", "use GET", "GET")),
        _ => Ok(plain_problem(404, "Not Found", "no such resource", "")),
    }
}

fn json_response(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// An `about:blank` problem for routing errors, which idem-core has no type for.
fn plain_problem(status: u16, title: &str, detail: &str, allow: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "type": "about:blank", "title": title, "status": status, "detail": detail,
    });
    let mut r = problem_response(status, body.to_string());
    if let Ok(v) = HeaderValue::from_str(allow) {
        if !allow.is_empty() {
            r.headers_mut().insert(hyper::header::ALLOW, v);
        }
    }
    r
}

fn problem_response(status: u16, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    r
}

fn problem(p: Problem, detail: &str) -> Response<Full<Bytes>> {
    let mut r = problem_response(p.status, p.to_json(detail));
    if p.status == 503 {
        r.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// The request as the handler task needs it.
struct Order {
    principal: String,
    key: Result<String, KeyError>,
    target: String,
    content_type: Option<String>,
    body: Bytes,
}

async fn orders(state: Arc<State>, req: Request<Incoming>) -> Reply {
    let (parts, body) = req.into_parts();
    let values: Vec<&HeaderValue> = parts.headers.get_all("idempotency-key").iter().collect();
    let mut key = match values.as_slice() {
        [] => Err(KeyError::Empty),
        [one] => parse_opaque_lenient(one.as_bytes()),
        _ => Err(KeyError::List),
    };
    if state.fault(Fault::ShortKeys) {
        if let Ok(k) = &key {
            if k.len() > 64 {
                key = Err(KeyError::TooLong { len: k.len() });
            }
        }
    }
    let principal = parts
        .headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map_or_else(|| "anonymous".to_owned(), |t| t.trim().to_owned());
    let body = match Limited::new(body, state.config.max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            let p = Problem::BODY_TOO_LARGE;
            let detail = format!("the request body exceeds {} bytes", state.config.max_body);
            return Ok(problem(p, &detail));
        }
        // The client went away while sending: there is nobody to answer.
        Err(_) => return Err(Crashed),
    };
    let order = Order {
        principal,
        key,
        target: parts
            .uri
            .path_and_query()
            .map_or_else(|| ORDERS_PATH.to_owned(), |p| p.as_str().to_owned()),
        content_type: parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body,
    };
    // The work runs in its own task: a client that disconnects (a lost response) must not
    // cancel a handler half-way, nor the write of its outcome.
    match tokio::spawn(process(state, order)).await {
        Ok(reply) => reply,
        Err(_) => Err(Crashed),
    }
}

async fn process(state: Arc<State>, order: Order) -> Reply {
    let key = match order.key {
        Ok(k) => k,
        Err(_) if state.fault(Fault::NoKeyCheck) => {
            return match run_handler(&state, &order.body, false).await {
                Handled::Response(r) => Ok(to_response(&r, false, &state)),
                Handled::Crash => Err(Crashed),
            };
        }
        Err(e) => return Ok(problem(Problem::for_key_error(&e), &e.to_string())),
    };
    let principal = if state.fault(Fault::ReplayAcrossPrincipals) {
        ""
    } else {
        order.principal.as_str()
    };
    let record_key = RecordKey::new(Scope::new(principal, "POST", ORDERS_PATH), key);
    let parts = RequestParts {
        method: "POST",
        target: &order.target,
        content_type: order.content_type.as_deref(),
        headers: &[],
        body: &order.body,
    };
    let mut fingerprint = match state.spec.fingerprint(&parts) {
        Ok(f) => f,
        Err(e) => return Ok(problem(Problem::for_fingerprint_error(&e), &e.to_string())),
    };
    if state.fault(Fault::NoFingerprint) {
        // The body was validated above, but it no longer tells requests apart.
        fingerprint = idem_core::Fingerprint::from_digest([0; 32]);
    }
    let attempt = Attempt {
        key: &record_key,
        fingerprint: &fingerprint,
        nonce: nonce(),
    };
    let now = UnixMillis::now();
    let claim = {
        let mut store = state.store();
        if state.fault(Fault::NoLock) {
            Ok(claim_without_lock(&state.engine, &store, now, &attempt))
        } else {
            store.claim(&state.engine, now, &attempt)
        }
    };
    let (lease, recovered) = match claim {
        Err(e @ MemoryStoreError::Full { .. }) => {
            return Ok(problem(Problem::STORE_FULL, &e.to_string()))
        }
        Err(e) => return Ok(problem(Problem::STORE_UNAVAILABLE, &e.to_string())),
        Ok(Claim::Execute { lease, recovered }) => (lease, recovered),
        Ok(Claim::Done(Decision::Replay(stored))) => return Ok(to_response(&stored, true, &state)),
        Ok(Claim::Done(decision)) => return Ok(refusal(&state, &decision)),
    };
    let response = match run_handler(&state, &order.body, recovered).await {
        Handled::Response(r) => r,
        // The process "died": nothing is completed, the lease is left to expire.
        Handled::Crash => return Err(Crashed),
    };
    let outcome = if state.fault(Fault::NoStore)
        || (state.fault(Fault::ForgetErrors) && (400..500).contains(&response.status))
    {
        Outcome::Retryable
    } else {
        Outcome::classify(response.clone())
    };
    let now = UnixMillis::now();
    {
        let mut store = state.store();
        if state.fault(Fault::NoLock) {
            finish_without_lock(&state.engine, &mut store, now, &lease, outcome);
        } else {
            // A fenced-out or refused completion leaves the record to the attempt that took
            // over; the response is still sent (IDEM-OUT-5). MemoryStore never fails on
            // writes to existing records.
            let _ = store.finish(&state.engine, now, &lease, outcome);
        }
    }
    Ok(to_response(&response, false, &state))
}

/// The refusal for a decision that neither executes nor replays.
fn refusal(state: &State, decision: &Decision) -> Response<Full<Bytes>> {
    let Some(p) = decision.problem() else {
        return plain_problem(500, "Internal Server Error", "unexpected decision", "");
    };
    let detail = match decision {
        Decision::InProgress { .. } => "another request with this key is being processed".into(),
        Decision::Mismatch { differing } if !differing.is_empty() => {
            format!("the request differs in: {}", differing.join(", "))
        }
        Decision::Mismatch { .. } => "the key was used with a different request".into(),
        _ => p.title.to_owned(),
    };
    let mut r = problem(p, &detail);
    if let Decision::InProgress { retry_after_secs } = decision {
        if !state.fault(Fault::NoRetryAfter) {
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(*retry_after_secs));
        }
    }
    r
}

/// The [`Fault::NoLock`] claim: read and decide, but never write the in-flight record, and
/// run even when another attempt is running.
fn claim_without_lock(
    engine: &Engine,
    store: &MemoryStore,
    now: UnixMillis,
    attempt: &Attempt<'_>,
) -> Claim {
    let current = store.get(attempt.key);
    match engine.decide(now, attempt, current) {
        Decision::Execute { lease, .. } => Claim::Execute {
            lease,
            recovered: false,
        },
        Decision::InProgress { .. } => match engine.decide(now, attempt, None) {
            Decision::Execute { lease, .. } => Claim::Execute {
                lease,
                recovered: false,
            },
            other => Claim::Done(other),
        },
        other => Claim::Done(other),
    }
}

/// The [`Fault::NoLock`] completion: an unconditional write, whatever is stored now.
fn finish_without_lock(
    engine: &Engine,
    store: &mut MemoryStore,
    now: UnixMillis,
    lease: &Lease,
    outcome: Outcome,
) {
    let Ok(mut write): Result<Write, _> = engine.complete(now, lease, outcome) else {
        return;
    };
    write.precondition = match store.get(&write.key) {
        Some(r) => idem_core::Precondition::Version(r.version),
        None => idem_core::Precondition::Absent,
    };
    let _ = store.apply(now, write);
}

fn nonce() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        // No OS randomness: the clock still makes versions differ between incarnations.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    })
}

enum Handled {
    Response(StoredResponse),
    Crash,
}

/// The demo handler: one observable side effect (the execution counter) per run.
async fn run_handler(state: &State, body: &[u8], recovered: bool) -> Handled {
    let n = state.executions.fetch_add(1, Ordering::SeqCst) + 1;
    if !state.config.delay.is_zero() {
        tokio::time::sleep(state.config.delay).await;
    }
    let outcome = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("outcome").and_then(|o| o.as_str()).map(str::to_owned));
    let json = |status: u16, body: serde_json::Value, extra: Option<(String, String)>| {
        let mut headers = vec![("content-type".to_owned(), "application/json".to_owned())];
        headers.extend(extra);
        Handled::Response(StoredResponse {
            status,
            headers,
            body: body.to_string().into_bytes(),
        })
    };
    match outcome.as_deref() {
        Some("decline") => json(
            402,
            serde_json::json!({ "error": "card_declined", "execution": n }),
            None,
        ),
        Some("unavailable") => json(
            503,
            serde_json::json!({ "error": "unavailable", "execution": n }),
            None,
        ),
        Some("crash") if !recovered => Handled::Crash,
        _ => {
            let id = format!("ord_{n:06}");
            json(
                201,
                serde_json::json!({ "id": id, "execution": n, "recovered": recovered }),
                Some(("location".to_owned(), format!("{ORDERS_PATH}/{id}"))),
            )
        }
    }
}

fn to_response(stored: &StoredResponse, replayed: bool, state: &State) -> Response<Full<Bytes>> {
    let mut builder = Response::builder().status(stored.status);
    for (name, value) in &stored.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    if replayed && !state.fault(Fault::NoMarker) {
        builder = builder.header(REPLAYED_HEADER, "true");
    }
    builder
        .body(Full::new(Bytes::from(stored.body.clone())))
        .unwrap_or_else(|_| {
            plain_problem(500, "Internal Server Error", "unrepresentable response", "")
        })
}
