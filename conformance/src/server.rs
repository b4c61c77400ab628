//! The reference server: a real HTTP/1.1 server whose guarded endpoints go through
//! idem-tower's layer (the correct server) on a memory, Redis or Postgres store, with one
//! demo endpoint whose side effect can be observed. With a fault it drives idem-core's
//! request machine ([`idem_core::Request`]) itself over the memory store, so that the
//! defect can act from outside the machine.
//!
//! # Endpoints
//!
//! * `POST /orders` creates an order. It requires an `Idempotency-Key` (an sf-string or a
//!   bare key, parsed leniently) and scopes keys by principal, method and route. The test
//!   credentials: `Authorization: Bearer <token>` is the token's owner, any other
//!   `Authorization` value is a principal of its own, and requests without one share the
//!   principal `anonymous`, which no `Authorization` value can equal. Every run of the
//!   handler increments an execution counter, sleeps the configured delay, and answers
//!   `201` with `{"id":"ord_000001","execution":1,"recovered":false}`, a `Location`, a
//!   `Set-Cookie` and an `X-Order-Id` (headers a replay must repeat). The JSON body's
//!   `"outcome"` member selects other results, so the suite can test error replay:
//!   `"decline"` gives a deterministic `402` (stored and replayed), `"unavailable"` gives a
//!   `503` (an unknown outcome: not stored under the default policy), `"busy"` a `429` with
//!   `Retry-After` (retryable: the key is released), and `"crash"` makes a
//!   first attempt die without answering or completing (the connection is closed and the key
//!   stays in flight until its lease ends); a recovering attempt then succeeds.
//! * `GET /count` returns `{"count":N}`, the number of handler runs: the side-effect oracle.
//!
//! Every answer the server gives without running the handler (replays, refusals) is rendered
//! by idem-core, as in every other host: problem+json with the status and type the core
//! assigns. The handler runs in its own task, so a client that disconnects never cancels
//! work in progress, and the final outcome is written to the store before the response is
//! sent (`IDEM-OUT-5`).
//!
//! # Faults
//!
//! [`Fault`] names deliberate defects. Each is a small deviation from the correct server,
//! made from outside the machine (the store it sees, the outcome it is told, the bytes that
//! leave), so that the suite can show that the case aimed at it fails.

use crate::store::RefStore;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use idem_core::{
    parse_opaque_lenient, Applied, AsyncStore, Config, Engine, FingerprintSpec, Intake, KeyError,
    MemoryStore, MemoryStoreError, MemoryStoreLimits, Outcome, Policy, Precondition, Problem,
    Record, RecordKey, RecordState, Refusal, RequestParts, Step, Store, StoreFailure,
    StoredResponse, UnixMillis, Waiters, Write, WriteOp, KEY_HEADER, REPLAYED_HEADER,
};
use idem_core::{
    CounterConfig, Decision, KeyKind, OpenStep, RejectReason, Scope, TimeKeyConfig, TokenSecret,
    LOW_WATER_HEADER, TOKEN_PREFIX,
};
use idem_tower::{IdempotencyContext, IdempotencyLayer, InnerBody};
use std::borrow::Cow;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// The path of the demo endpoint.
pub const ORDERS_PATH: &str = "/orders";
/// The path of the execution counter.
pub const COUNT_PATH: &str = "/count";
/// The endpoint whose keys are client timestamps (`keyKind` unix-time).
pub const PAYMENTS_PATH: &str = "/payments";
/// The endpoint whose keys are wrapping counters.
pub const TRANSFERS_PATH: &str = "/transfers";
/// Opens a counter client's session for [`TRANSFERS_PATH`]: `POST {"client": "…",
/// "firstSeq": n}` → `201 {"client", "epoch", "firstSeq"}` (the epoch as decimal text).
pub const SESSIONS_PATH: &str = "/sessions";
/// The endpoint whose keys are server-issued tokens.
pub const CHECKOUT_PATH: &str = "/checkout";
/// Issues a token for [`CHECKOUT_PATH`]: `POST` → `201 {"token", "expiresAt", "ttl"}`.
pub const TOKENS_PATH: &str = "/idempotency-tokens";

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
    /// Requests without a valid key are executed anyway, without protection: a missing or
    /// malformed key, and a key of another kind that its rules refuse (stale, from the
    /// future, an unknown client or epoch, a gap, a forged, unknown or expired token).
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
    /// The fingerprint covers a value that differs on every request (as a timestamp header
    /// would): every retry is refused as a payload mismatch (422).
    VolatileFingerprint,
    /// Replays leave out the `Location` header; status and body are still replayed.
    DropLocation,
    /// An attempt that fails (5xx, 408, 425, 429) leaves its key in flight for good: every
    /// retry is refused as in progress.
    NeverRelease,
    /// Counter keys: a number in the window with another payload (as after a wrap onto a
    /// retained slot) executes instead of being refused as a collision.
    CounterNoWrapCheck,
    /// Counter keys: a number below the low-water mark executes instead of being refused as
    /// stale.
    CounterAcceptStale,
    /// Time keys: timestamps far in the future are accepted (no clock-skew bound).
    TimeNoSkew,
    /// Tokens: a consumed token is taken as unused again, so it runs again.
    TokenReuse,
}

impl Fault {
    /// Every fault, in a stable order.
    pub const ALL: [Fault; 21] = [
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
        Fault::VolatileFingerprint,
        Fault::DropLocation,
        Fault::NeverRelease,
        Fault::CounterNoWrapCheck,
        Fault::CounterAcceptStale,
        Fault::TimeNoSkew,
        Fault::TokenReuse,
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
            Fault::VolatileFingerprint => "volatile-fingerprint",
            Fault::DropLocation => "drop-location",
            Fault::NeverRelease => "never-release",
            Fault::CounterNoWrapCheck => "counter-no-wrap-check",
            Fault::CounterAcceptStale => "counter-accept-stale",
            Fault::TimeNoSkew => "time-no-skew",
            Fault::TokenReuse => "token-reuse",
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
    /// Serve HTTPS with this certificate instead of plain HTTP.
    pub tls: Option<crate::tls::Identity>,
    /// Accept only UUID keys (as many APIs do) instead of any opaque key.
    pub uuid_keys: bool,
    /// The time keys of [`PAYMENTS_PATH`]: the clock skew and the maximum age
    /// (`max_age + max_ahead` at most the key retention).
    pub time_keys: TimeKeyConfig,
    /// The counters of [`TRANSFERS_PATH`]: bits and window.
    pub counter: CounterConfig,
    /// How long a token issued at [`TOKENS_PATH`] stays valid (at most the key retention).
    pub token_ttl: Duration,
    /// Where the records live: `None` for memory (one process), or `redis://…` or
    /// `postgres://…`, which several server processes can share (with the count of
    /// executions). Faults need the memory store.
    pub store: Option<String>,
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
            tls: None,
            uuid_keys: false,
            time_keys: TimeKeyConfig {
                max_ahead: Duration::from_secs(5 * 60),
                max_age: engine.response_ttl,
            },
            counter: CounterConfig::default(),
            token_ttl: Duration::from_secs(3600),
            store: None,
        }
    }
}

impl ServerConfig {
    /// Bounds of the key kinds that fit the retention times: a clock skew of at most 5
    /// minutes (a quarter of the key retention when that is shorter), time keys accepted for
    /// the response retention (less the skew where the key retention requires it), tokens
    /// valid for an hour at most (the key retention when that is shorter).
    pub fn with_kind_bounds(mut self) -> ServerConfig {
        let skew = Duration::from_secs(5 * 60).min(self.key_ttl / 4);
        self.time_keys = TimeKeyConfig {
            max_ahead: skew,
            max_age: self.response_ttl.min(self.key_ttl.saturating_sub(skew)),
        };
        self.token_ttl = Duration::from_secs(3600).min(self.key_ttl);
        self
    }

    /// Short retention and lease (1 s response, 2 s key, 1 s lease) so that the expiry and
    /// lease cases finish within seconds: the settings of the embedded default run.
    ///
    /// The key kinds get matching bounds: a 0.5 s clock skew and 1 s maximum age for time
    /// keys, 8-bit counters with a window of 4 (so that a run really wraps), 1 s tokens.
    pub fn fast() -> ServerConfig {
        ServerConfig {
            response_ttl: Duration::from_secs(1),
            key_ttl: Duration::from_secs(2),
            lease: Duration::from_secs(1),
            time_keys: TimeKeyConfig {
                max_ahead: Duration::from_millis(500),
                max_age: Duration::from_secs(1),
            },
            counter: CounterConfig { bits: 8, window: 4 },
            token_ttl: Duration::from_secs(1),
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
        // (`LostLease` acts on the store: see `Faulty`.)
        match self.fault {
            Some(Fault::Store5xx) => c.unknown_outcome = idem_core::UnknownOutcomePolicy::Store,
            Some(Fault::ForgetEarly) => {
                c.response_ttl = (self.response_ttl / 10).max(Duration::from_millis(1));
                c.key_ttl = c.response_ttl;
                c.lease = c.lease.min(c.key_ttl);
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
    /// The key kind cannot be configured.
    Keys(idem_core::KindConfigError),
    /// The store cannot be reached.
    Store(String),
    /// Settings that do not go together (a fault on a shared store, an unknown store).
    Settings(String),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "invalid server settings: {e}"),
            StartError::Bind(e) => write!(f, "cannot listen: {e}"),
            StartError::Keys(e) => write!(f, "invalid key kind: {e}"),
            StartError::Store(e) => write!(f, "store: {e}"),
            StartError::Settings(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// The guarded endpoints, each with the policy of its key kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Orders,
    Payments,
    Transfers,
    Checkout,
}

impl Route {
    fn path(self) -> &'static str {
        match self {
            Route::Orders => ORDERS_PATH,
            Route::Payments => PAYMENTS_PATH,
            Route::Transfers => TRANSFERS_PATH,
            Route::Checkout => CHECKOUT_PATH,
        }
    }
}

struct State {
    /// Opaque keys (or UUIDs with `uuid_keys`), for [`ORDERS_PATH`].
    policy: Policy,
    /// Time keys, for [`PAYMENTS_PATH`].
    payments: Policy,
    /// Counter keys, for [`TRANSFERS_PATH`].
    transfers: Policy,
    /// Tokens, for [`CHECKOUT_PATH`].
    checkout: Policy,
    /// The records (and the count of executions).
    store: Arc<RefStore>,
    /// Who waits for a record in flight, for the faulty servers, which drive the machine
    /// themselves over the memory store (the correct server's layer keeps its own).
    waiters: Mutex<Waiters>,
    /// The correct server: idem-tower's layer per guarded route. `None` with a fault.
    layers: Option<[IdempotencyLayer<Arc<RefStore>>; 4]>,
    config: ServerConfig,
}

impl State {
    fn waiters(&self) -> MutexGuard<'_, Waiters> {
        // The waiters hold no invariant a panic could break. Keep serving.
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fault(&self, f: Fault) -> bool {
        self.config.fault == Some(f)
    }

    fn layer(&self, route: Route) -> Option<&IdempotencyLayer<Arc<RefStore>>> {
        let layers = self.layers.as_ref()?;
        Some(&layers[route as usize])
    }

    fn policy(&self, route: Route) -> &Policy {
        match route {
            Route::Orders => &self.policy,
            Route::Payments => &self.payments,
            Route::Transfers => &self.transfers,
            Route::Checkout => &self.checkout,
        }
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
        let base = Policy::new(engine.clone())
            .with_fingerprint(FingerprintSpec {
                max_body: config.max_body,
                ..FingerprintSpec::default()
            })
            .with_methods(["POST"]);
        let kind = |kind: KeyKind| base.clone().with_keys(kind).map_err(StartError::Keys);
        let policy = if config.uuid_keys {
            kind(KeyKind::Uuid(None))?
        } else {
            base.clone()
        };
        // Faults that shorten the key retention shorten the kinds' bounds with it.
        let key_ttl = engine.config().key_ttl;
        let mut time_keys = config.time_keys.clone();
        time_keys.max_ahead = time_keys.max_ahead.min(key_ttl / 4);
        time_keys.max_age = time_keys
            .max_age
            .min(key_ttl.saturating_sub(time_keys.max_ahead))
            .max(Duration::from_millis(1));
        if config.fault == Some(Fault::TimeNoSkew) {
            // As far ahead as the retention allows: no bound a client clock could hit.
            time_keys.max_ahead = engine.config().key_ttl.saturating_sub(time_keys.max_age);
        }
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| StartError::Bind(std::io::Error::other(e)))?;
        let payments = kind(KeyKind::Time(time_keys))?;
        let transfers = kind(KeyKind::Counter(config.counter))?;
        let checkout = kind(KeyKind::Token {
            secret: TokenSecret(secret),
            ttl: config.token_ttl.min(key_ttl),
        })?;
        if let Some(url) = &config.store {
            RefStore::check(url).map_err(StartError::Settings)?;
            if config.fault.is_some() && url != "memory" {
                return Err(StartError::Settings(
                    "the faults act on the memory store: leave --store out with --fault".into(),
                ));
            }
        }
        let store = RefStore::open(
            config.store.as_deref(),
            idem_tower::MemoryStore::new(config.limits),
        )
        .await
        .map_err(StartError::Store)?;
        let store = Arc::new(store);
        let layers = match config.fault {
            Some(_) => None,
            None => {
                crash_quietly();
                let layer = |policy: &Policy, route: Route| {
                    IdempotencyLayer::builder(Arc::clone(&store))
                        .policy(policy.clone())
                        .principal(|parts| Some(principal_of(&parts.headers)))
                        .route(move |_| route.path().to_owned())
                        .build()
                        .map_err(|e| StartError::Store(e.to_string()))
                };
                Some([
                    layer(&policy, Route::Orders)?,
                    layer(&payments, Route::Payments)?,
                    layer(&transfers, Route::Transfers)?,
                    layer(&checkout, Route::Checkout)?,
                ])
            }
        };
        let listener = TcpListener::bind(addr).await.map_err(StartError::Bind)?;
        let addr = listener.local_addr().map_err(StartError::Bind)?;
        let state = Arc::new(State {
            policy,
            payments,
            transfers,
            checkout,
            store,
            waiters: Mutex::new(Waiters::default()),
            layers,
            config,
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&state)));
        Ok(Server { addr, task, state })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR` (or `https://ADDR`), without a trailing slash.
    pub fn base_url(&self) -> String {
        let scheme = if self.state.config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// The certificate it serves HTTPS with, if it does.
    pub fn tls(&self) -> Option<&crate::tls::Identity> {
        self.state.config.tls.as_ref()
    }

    /// How many times the handler has run (in every process that shares the store); 0 when
    /// the shared store cannot be read.
    pub async fn executions(&self) -> u64 {
        self.state.store.executions().await.unwrap_or(0)
    }

    /// Records held by the memory store (0 for a shared store).
    pub fn stored_records(&self) -> usize {
        self.state
            .store
            .memory()
            .map_or(0, idem_tower::MemoryStore::len)
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

/// How long a connection may take to send a request's headers (and finish its TLS
/// handshake).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

async fn serve_connection<S>(state: Arc<State>, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| handle(Arc::clone(&state), req));
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let acceptor = state
        .config
        .tls
        .as_ref()
        .map(|identity| tokio_rustls::TlsAcceptor::from(identity.server_config()));
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
                let acceptor = acceptor.clone();
                connections.spawn(async move {
                    match acceptor {
                        None => serve_connection(state, stream).await,
                        Some(acceptor) => {
                            // A client that never finishes its handshake costs one task for
                            // as long as a client that never sends its headers.
                            let handshake = tokio::time::timeout(
                                HEADER_READ_TIMEOUT,
                                acceptor.accept(stream),
                            );
                            if let Ok(Ok(tls)) = handshake.await {
                                serve_connection(state, tls).await;
                            }
                        }
                    }
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
        (&Method::POST, ORDERS_PATH) => guarded(state, req, Route::Orders).await,
        (&Method::POST, PAYMENTS_PATH) => guarded(state, req, Route::Payments).await,
        (&Method::POST, TRANSFERS_PATH) => guarded(state, req, Route::Transfers).await,
        (&Method::POST, CHECKOUT_PATH) => guarded(state, req, Route::Checkout).await,
        (&Method::POST, SESSIONS_PATH) => Ok(open_session(&state, req).await),
        (&Method::POST, TOKENS_PATH) => Ok(issue_token(&state, &req).await),
        (&Method::GET, COUNT_PATH) => Ok(match state.store.executions().await {
            Ok(n) => json_response(
                StatusCode::OK,
                serde_json::json!({ "count": n }).to_string(),
            ),
            Err(e) => plain_problem(503, "Service Unavailable", &e.to_string(), ""),
        }),
        (
            _,
            ORDERS_PATH | PAYMENTS_PATH | TRANSFERS_PATH | CHECKOUT_PATH | SESSIONS_PATH
            | TOKENS_PATH,
        ) => Ok(plain_problem(405, "Method Not Allowed", "use POST", "POST")),
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

/// The request as the handler task needs it.
struct Order {
    route: Route,
    principal: String,
    low_water: Option<String>,
    keys: Vec<Bytes>,
    target: String,
    content_type: Option<String>,
    body: Bytes,
}

/// The test credentials: `Authorization: Bearer <token>` names the token's owner; any other
/// Authorization value is a principal of its own, and no header is "anonymous", which no
/// Authorization value can equal.
fn principal_of(headers: &hyper::HeaderMap) -> String {
    match headers.get(hyper::header::AUTHORIZATION) {
        None => "anonymous".to_owned(),
        Some(v) => {
            let v = String::from_utf8_lossy(v.as_bytes());
            match v.strip_prefix("Bearer ") {
                Some(token) => format!("bearer {}", token.trim()),
                None => format!("authorization {v}"),
            }
        }
    }
}

async fn guarded(state: Arc<State>, req: Request<Incoming>, route: Route) -> Reply {
    if let Some(layer) = state.layer(route) {
        return layered(layer, Arc::clone(&state), req).await;
    }
    let (parts, body) = req.into_parts();
    let keys: Vec<Bytes> = parts
        .headers
        .get_all(KEY_HEADER)
        .iter()
        .map(|v| Bytes::copy_from_slice(v.as_bytes()))
        .collect();
    let principal = principal_of(&parts.headers);
    let low_water = parts
        .headers
        .get(LOW_WATER_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let body = match Limited::new(body, state.config.max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            let refusal = Refusal::new(
                Problem::BODY_TOO_LARGE,
                format!("the request body exceeds {} bytes", state.config.max_body),
            );
            return Ok(to_http(&refusal.reply(), &state));
        }
        // The client went away while sending: there is nobody to answer.
        Err(_) => return Err(Crashed),
    };
    let order = Order {
        route,
        principal,
        low_water,
        keys,
        target: parts
            .uri
            .path_and_query()
            .map_or_else(|| route.path().to_owned(), |p| p.as_str().to_owned()),
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

/// One request, driven through idem-core's request machine: the server reads and writes its
/// store, runs the handler and sends what the machine renders. Faults act from outside, on
/// what the machine is given (the store it sees, the outcome it is told) and on the bytes
/// that leave.
async fn process(state: Arc<State>, order: Order) -> Reply {
    let keys: Vec<&[u8]> = order.keys.iter().map(|k| k.as_ref()).collect();
    let short_keys = state.fault(Fault::ShortKeys)
        && keys
            .iter()
            .filter_map(|k| parse_opaque_lenient(k).ok())
            .any(|k| k.len() > 64);
    if short_keys {
        let e = KeyError::TooLong { len: 65 };
        return Ok(to_http(&Refusal::key(&e).reply(), &state));
    }
    let fingerprinted = if state.fault(Fault::NoFingerprint) {
        // The body is still checked, but it no longer tells requests apart.
        let parts = RequestParts {
            method: "POST",
            target: &order.target,
            content_type: order.content_type.as_deref(),
            headers: &[],
            body: &order.body,
        };
        if let Err(e) = state
            .policy(order.route)
            .fingerprint_spec()
            .fingerprint(&parts)
        {
            return Ok(to_http(&Refusal::fingerprint(&e).reply(), &state));
        }
        &[][..]
    } else {
        &order.body[..]
    };
    // A volatile fingerprint: the target carries a value no two requests share.
    let target = if state.fault(Fault::VolatileFingerprint) {
        format!("{}#{}", order.target, nonce())
    } else {
        order.target.clone()
    };
    let intake = Intake {
        principal: if state.fault(Fault::ReplayAcrossPrincipals) {
            None
        } else {
            Some(&order.principal)
        },
        method: "POST",
        route: order.route.path(),
        target: &target,
        keys: &keys,
        low_water: order.low_water.as_deref(),
        content_type: if state.fault(Fault::NoFingerprint) {
            None
        } else {
            order.content_type.as_deref()
        },
        headers: &[],
        body: fingerprinted,
    };
    let mut req = state.policy(order.route).request(&intake, nonce());
    if state.fault(Fault::NoKeyCheck)
        && req
            .refusal()
            .is_some_and(|r| r.problem.slug.ends_with("-key"))
    {
        return match run_handler(&state, &order.body, false).await {
            Handled::Response(r) => Ok(handler_response(&r, &state)),
            Handled::Crash => Err(Crashed),
        };
    }
    loop {
        match drive(&state, &mut req) {
            // A store failure is recorded by the machine; polling again answers it.
            Err(_) => continue,
            Ok(Step::Run(context)) => {
                let response = match run_handler(&state, &order.body, context.recovered).await {
                    Handled::Response(r) => r,
                    // The process "died": nothing is completed, the lease is left to expire.
                    Handled::Crash => return Err(Crashed),
                };
                if state.fault(Fault::NeverRelease) && retryable(response.status) {
                    // The failure is answered, but the claim is never settled.
                    return Ok(handler_response(&response, &state));
                }
                let outcome = if state.fault(Fault::NoStore)
                    || (state.fault(Fault::ForgetErrors) && (400..500).contains(&response.status))
                {
                    Outcome::Retryable
                } else {
                    Outcome::classify(response.clone())
                };
                req.handle_outcome(outcome);
                // The outcome is written before the response is sent (IDEM-OUT-5); the
                // response is sent whatever the write came to.
                let _finished = drive(&state, &mut req);
                return Ok(handler_response(&response, &state));
            }
            Ok(Step::Reply) => {
                // Counter faults: a refusal the correct server makes, ignored.
                let ignored = match req.decision() {
                    Some(Decision::Rejected(
                        RejectReason::Stale
                        | RejectReason::FromFuture { .. }
                        | RejectReason::UnknownClient
                        | RejectReason::StaleEpoch
                        | RejectReason::UnknownEpoch
                        | RejectReason::SequenceGap { .. }
                        | RejectReason::TokenForged
                        | RejectReason::TokenUnknown
                        | RejectReason::TokenExpired,
                    )) if state.fault(Fault::NoKeyCheck) => true,
                    Some(Decision::Rejected(RejectReason::Collision)) => {
                        state.fault(Fault::CounterNoWrapCheck) && order.route == Route::Transfers
                    }
                    Some(Decision::Rejected(RejectReason::Stale)) => {
                        state.fault(Fault::CounterAcceptStale) && order.route == Route::Transfers
                    }
                    _ => false,
                };
                if ignored {
                    return match run_handler(&state, &order.body, false).await {
                        Handled::Response(r) => Ok(handler_response(&r, &state)),
                        Handled::Crash => Err(Crashed),
                    };
                }
                let Some(reply) = req.reply() else {
                    return Ok(plain_problem(500, "Internal Server Error", "no reply", ""));
                };
                return Ok(to_http(&reply, &state));
            }
            Ok(Step::WaitUntil(t)) => {
                tokio::time::sleep(Duration::from_millis(UnixMillis::now().until(t))).await;
            }
            Ok(other) => {
                let detail = format!("unexpected step {other:?}");
                return Ok(plain_problem(500, "Internal Server Error", &detail, ""));
            }
        }
    }
}

/// Answers after which a correct server lets the key be used again (or, for 5xx, holds or
/// re-runs it): what [`Fault::NeverRelease`] leaves in flight.
fn retryable(status: u16) -> bool {
    matches!(status, 408 | 425 | 429) || status >= 500
}

/// Runs the request's store steps under the store's lock, held only for this synchronous
/// stretch (never across the handler).
fn drive(state: &State, req: &mut idem_core::Request<'_>) -> Result<Step, MemoryStoreError> {
    let Some(memory) = state.store.memory() else {
        // Faults run on the memory store only (checked at start).
        return Err(MemoryStoreError::Full {
            entries: 0,
            bytes: 0,
        });
    };
    memory.with_locked(|store| {
        let mut store = Faulty {
            store,
            fault: state.config.fault,
        };
        req.drive(&mut store, UnixMillis::now(), &mut state.waiters())
    })
}

/// The store as a faulty server would use it; the correct server sees the MemoryStore as it
/// is.
struct Faulty<'a> {
    store: &'a mut MemoryStore,
    fault: Option<Fault>,
}

impl Store for Faulty<'_> {
    type Error = MemoryStoreError;

    fn load(&self, key: &RecordKey) -> Result<Option<Record>, MemoryStoreError> {
        Ok(self.read(key)?.map(|r| r.into_owned()))
    }

    fn read(&self, key: &RecordKey) -> Result<Option<Cow<'_, Record>>, MemoryStoreError> {
        let record = self.store.get(key);
        Ok(match (self.fault, record) {
            // No lock: a key in flight is not seen, so duplicates run.
            (Some(Fault::NoLock), Some(r)) if matches!(r.state, RecordState::InFlight { .. }) => {
                None
            }
            // Lost lease (or never released): a lease, once taken, never ends.
            (Some(Fault::LostLease | Fault::NeverRelease), Some(r))
                if matches!(r.state, RecordState::InFlight { .. }) =>
            {
                let mut r = r.clone();
                r.state = RecordState::InFlight {
                    lease_expires: UnixMillis(u64::MAX / 2),
                };
                Some(Cow::Owned(r))
            }
            // Token reuse: a consumed token looks unused again.
            (Some(Fault::TokenReuse), Some(r))
                if key.key.starts_with(TOKEN_PREFIX)
                    && matches!(r.state, RecordState::Completed { .. }) =>
            {
                let mut r = r.clone();
                r.state = RecordState::Issued {
                    expires: r.key_expires,
                };
                Some(Cow::Owned(r))
            }
            (_, r) => r.map(Cow::Borrowed),
        })
    }

    fn apply(&mut self, now: UnixMillis, mut write: Write) -> Result<Applied, MemoryStoreError> {
        if self.fault == Some(Fault::NoLock) {
            if let WriteOp::Put(r) = &write.op {
                // No lock: the claim is never written...
                if matches!(r.state, RecordState::InFlight { .. }) {
                    return Ok(Applied::Applied);
                }
            }
            // ...and the result is written whatever is stored now (last one wins).
            write.precondition = match self.store.get(&write.key) {
                Some(r) => Precondition::Version(r.version),
                None => Precondition::Absent,
            };
        }
        self.store.apply(now, write)
    }

    fn failure(error: &MemoryStoreError) -> StoreFailure {
        MemoryStore::failure(error)
    }
}

/// `POST /sessions {"client": "…", "firstSeq": n}`: opens (or moves to its next epoch) the
/// caller's counter session for [`TRANSFERS_PATH`] through idem-core's session opening.
async fn open_session(state: &State, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let principal = principal_of(req.headers());
    let body = match Limited::new(req.into_body(), 4096).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return plain_problem(
                400,
                "Bad Request",
                "the body must be a small JSON object",
                "",
            )
        }
    };
    let input: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    let Some(client) = input.get("client").and_then(|c| c.as_str()) else {
        return plain_problem(
            400,
            "Bad Request",
            "send {\"client\": \"…\", \"firstSeq\": n}",
            "",
        );
    };
    let first = match input.get("firstSeq") {
        None => 0,
        Some(n) => match n.as_u64() {
            Some(n) => n,
            None => {
                let refusal = Refusal {
                    requirement: "IDEM-CTR-1",
                    ..Refusal::new(Problem::MALFORMED_KEY, "firstSeq must be a whole number")
                };
                return to_http(&refusal.reply(), state);
            }
        },
    };
    let policy = &state.transfers;
    let scope = match policy.scope(Some(&principal), "POST", TRANSFERS_PATH) {
        Ok(s) => s,
        Err(r) => return to_http(&r.reply(), state),
    };
    let Some(mut opening) = policy.open_session(&scope, client, first, nonce()) else {
        return plain_problem(500, "Internal Server Error", "no counter keys", "");
    };
    loop {
        let now = UnixMillis::now();
        match opening.poll() {
            OpenStep::Load(key) => match state.store.load(&key).await {
                Ok(stored) => opening.handle_record(now, stored.as_ref()),
                Err(_) => {
                    return to_http(&Refusal::store(StoreFailure::Unavailable).reply(), state)
                }
            },
            OpenStep::Apply(write) => {
                let applied = state.store.apply(now, write).await;
                opening.handle_applied(applied.unwrap_or(Applied::Conflict));
            }
            OpenStep::Opened(epoch) => {
                let body = serde_json::json!({
                    "client": client, "epoch": epoch.to_string(), "firstSeq": first,
                });
                let mut r = json_response(StatusCode::CREATED, body.to_string());
                r.headers_mut().insert(
                    hyper::header::CACHE_CONTROL,
                    HeaderValue::from_static("no-store"),
                );
                return r;
            }
            OpenStep::Failed(e) => return to_http(&Refusal::session(&e).reply(), state),
        }
    }
}

/// `POST /idempotency-tokens`: issues a token for the caller's requests to
/// [`CHECKOUT_PATH`] and stores it.
async fn issue_token(state: &State, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let principal = principal_of(req.headers());
    let policy = &state.checkout;
    let scope: Scope = match policy.scope(Some(&principal), "POST", CHECKOUT_PATH) {
        Ok(s) => s,
        Err(r) => return to_http(&r.reply(), state),
    };
    let now = UnixMillis::now();
    let Some(issued) = policy.issue_token(now, &scope, [nonce(), nonce()]) else {
        return plain_problem(500, "Internal Server Error", "no token keys", "");
    };
    match state.store.apply(now, issued.write).await {
        Ok(Applied::Applied) => {}
        Ok(Applied::Conflict) => {
            return to_http(&Refusal::store(StoreFailure::Full).reply(), state)
        }
        Err(e) => return to_http(&Refusal::store(RefStore::failure(&e)).reply(), state),
    }
    let body = serde_json::json!({
        "token": issued.token,
        "expiresAt": issued.expires.0,
        "ttl": issued.expires.0.saturating_sub(now.0),
    });
    let mut r = json_response(StatusCode::CREATED, body.to_string());
    r.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    r
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
    // A count the store cannot keep leaves the oracle short, never the answer.
    let n = state.store.count_execution().await.unwrap_or(0);
    if !state.config.delay.is_zero() {
        tokio::time::sleep(state.config.delay).await;
    }
    let outcome = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("outcome").and_then(|o| o.as_str()).map(str::to_owned));
    let json = |status: u16, body: serde_json::Value, extra: Vec<(String, String)>| {
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
            Vec::new(),
        ),
        Some("unavailable") => json(
            503,
            serde_json::json!({ "error": "unavailable", "execution": n }),
            Vec::new(),
        ),
        Some("busy") => json(
            429,
            serde_json::json!({ "error": "busy", "execution": n }),
            vec![("retry-after".to_owned(), "1".to_owned())],
        ),
        Some("crash") if !recovered => Handled::Crash,
        _ => {
            let id = format!("ord_{n:06}");
            json(
                201,
                serde_json::json!({ "id": id, "execution": n, "recovered": recovered }),
                vec![
                    ("location".to_owned(), format!("{ORDERS_PATH}/{id}")),
                    (
                        "set-cookie".to_owned(),
                        format!("last_order={id}; Path=/; HttpOnly"),
                    ),
                    ("x-order-id".to_owned(), id.clone()),
                ],
            )
        }
    }
}

/// The HTTP response for a reply rendered by the machine, with the faults that change what
/// leaves the server.
fn to_http(reply: &idem_core::Reply, state: &State) -> Response<Full<Bytes>> {
    build(reply.status(), reply.headers(), reply.body(), state)
}

/// The handler's own response.
fn handler_response(r: &StoredResponse, state: &State) -> Response<Full<Bytes>> {
    let headers = r.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
    build(r.status, headers, &r.body, state)
}

fn build<'h>(
    status: u16,
    headers: impl Iterator<Item = (&'h str, &'h str)>,
    body: &[u8],
    state: &State,
) -> Response<Full<Bytes>> {
    let headers: Vec<(&str, &str)> = headers.collect();
    let replay = headers.iter().any(|(n, _)| *n == REPLAYED_HEADER);
    let mut builder = Response::builder().status(status);
    for (name, value) in headers {
        let dropped = (state.fault(Fault::NoMarker) && name == REPLAYED_HEADER)
            || (state.fault(Fault::NoRetryAfter) && status == 409 && name == "retry-after")
            || (state.fault(Fault::DropLocation) && replay && name == "location");
        if !dropped {
            builder = builder.header(name, value);
        }
    }
    builder
        .body(Full::new(Bytes::copy_from_slice(body)))
        .unwrap_or_else(|_| {
            plain_problem(500, "Internal Server Error", "unrepresentable response", "")
        })
}

/// The correct server: the request goes through idem-tower's layer, with the demo handler as
/// the service it wraps.
async fn layered(
    layer: &IdempotencyLayer<Arc<RefStore>>,
    state: Arc<State>,
    req: Request<Incoming>,
) -> Reply {
    use tower_layer::Layer as _;
    use tower_service::Service as _;
    let mut service = layer.layer(Handler { state });
    let response = match service.call(req).await {
        Ok(r) => r,
        Err(e) => match e {},
    };
    // Both sides of the body are already whole (the layer stores what it answers).
    Ok(response.map(|body| match body {
        http_body_util::Either::Left(full) | http_body_util::Either::Right(full) => full,
    }))
}

/// The demo handler as a service for the layer.
#[derive(Clone)]
struct Handler {
    state: Arc<State>,
}

/// What a handler that "crashes" panics with: the process died mid-request, so nothing is
/// completed, the connection closes without an answer, and the key stays in flight until
/// its lease ends.
struct SimulatedCrash;

/// Keeps the simulated crashes out of the panic output; every other panic is reported as
/// before.
fn crash_quietly() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<SimulatedCrash>() {
                previous(info);
            }
        }));
    });
}

impl tower_service::Service<Request<InnerBody<Incoming>>> for Handler {
    type Response = Response<Full<Bytes>>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<Response<Full<Bytes>>, std::convert::Infallible>,
                > + Send,
        >,
    >;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), std::convert::Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<InnerBody<Incoming>>) -> Self::Future {
        let state = Arc::clone(&self.state);
        Box::pin(async move {
            let recovered = req
                .extensions()
                .get::<IdempotencyContext>()
                .is_some_and(IdempotencyContext::recovered);
            // A guarded request's body is already buffered (the left side).
            let body = match req.into_body() {
                http_body_util::Either::Left(full) => full
                    .collect()
                    .await
                    .map(|c| c.to_bytes())
                    .unwrap_or_default(),
                http_body_util::Either::Right(_) => Bytes::new(),
            };
            match run_handler(&state, &body, recovered).await {
                Handled::Response(r) => Ok(handler_response(&r, &state)),
                Handled::Crash => std::panic::panic_any(SimulatedCrash),
            }
        })
    }
}
