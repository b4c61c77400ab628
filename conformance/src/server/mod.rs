//! The reference server: a real HTTP/1.1 server, an axum app whose guarded endpoints go
//! through idem-tower's layer on a memory, Redis or Postgres store, with one demo endpoint
//! whose side effect can be observed.
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
//! made from outside the layer: a wrapper around the store it is given (what it reads, what
//! is written), a middleware around it (what goes in, what comes out), or a configuration
//! mistake (the engine's times, the fingerprint, the principal). The layer itself has no
//! fault hooks, so the suite shows that the case aimed at each defect fails.

mod config;
mod faults;
mod listen;

pub use config::{ServerConfig, StartError};
pub use faults::{markdown_table as faults_table, Expect, Fault, FaultDef, Want, FAULTS};

use listen::accept_loop;

use crate::store::RefStore;
use axum::body::Body;
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{HeaderMap, Request, Response, StatusCode};
use idem_core::{
    AsyncStore, Engine, FingerprintSpec, KeyKind, Plain, Policy, Reply, StatusQuery, Target,
    TokenSecret, UnixMillis, KEY_HEADER, STATUS_HEADER,
};
use idem_tower::{render, IdempotencyContext, IdempotencyLayer};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

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

/// The guarded endpoints, each with the policy of its key kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Route {
    Orders,
    Payments,
    Transfers,
    Checkout,
}

impl Route {
    const ALL: [Route; 4] = [
        Route::Orders,
        Route::Payments,
        Route::Transfers,
        Route::Checkout,
    ];

    fn path(self) -> &'static str {
        match self {
            Route::Orders => ORDERS_PATH,
            Route::Payments => PAYMENTS_PATH,
            Route::Transfers => TRANSFERS_PATH,
            Route::Checkout => CHECKOUT_PATH,
        }
    }
}

/// What the handlers share.
struct App {
    /// Counter keys, for opening sessions at [`SESSIONS_PATH`].
    transfers: Policy,
    /// Tokens, for issuing them at [`TOKENS_PATH`].
    checkout: Policy,
    /// The records (and the count of executions).
    store: Arc<RefStore>,
    config: ServerConfig,
    /// What a stateful fault remembers.
    faults: faults::Memory,
    /// Where every handler run is logged ([`ServerConfig::execution_log`]).
    log: Option<std::fs::File>,
}

/// A running reference server. Dropping it stops the server and closes its connections.
pub struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
    app: Arc<App>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .field("fault", &self.app.config.fault)
            .finish()
    }
}

impl Server {
    /// Binds `addr` (use port 0 for an OS-chosen port) and starts serving on the current
    /// tokio runtime.
    pub async fn start(addr: SocketAddr, config: ServerConfig) -> Result<Server, StartError> {
        let engine = Engine::new(config.engine_config()).map_err(StartError::Config)?;
        let base = Policy::new(engine.clone())
            .with_fingerprint({
                let mut spec = FingerprintSpec {
                    max_body: config.max_body,
                    ..FingerprintSpec::default()
                };
                if let Some(f) = config.fault.and_then(|f| f.apply().fingerprint) {
                    f(&mut spec);
                }
                spec
            })
            .with_methods(["POST"]);
        let kind = |kind: KeyKind| base.clone().with_keys(kind).map_err(StartError::Keys);
        let orders = if config.uuid_keys {
            kind(KeyKind::Uuid(None))?
        } else {
            base.clone()
        };
        // Faults that shorten the key retention shorten the kinds' bounds with it.
        let key_ttl = engine.config().key_ttl;
        let mut time_keys = config.time_keys.clone().fit(key_ttl);
        if let Some(f) = config.fault.and_then(|f| f.apply().time_keys) {
            f(&mut time_keys, key_ttl);
        }
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(StartError::Random)?;
        let policies = [
            orders,
            kind(KeyKind::Time(time_keys))?,
            kind(KeyKind::Counter(config.counter))?,
            kind(
                KeyKind::Token {
                    secret: TokenSecret(secret),
                    ttl: config.token_ttl,
                }
                .fit(key_ttl),
            )?,
        ];
        if let Some(url) = &config.store {
            RefStore::check(url).map_err(StartError::Settings)?;
        }
        let store = RefStore::open(
            config.store.as_deref(),
            config.seal.clone(),
            idem_tower::MemoryStore::new(config.limits),
        )
        .await
        .map_err(StartError::Store)?;
        let log = match &config.execution_log {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(StartError::Log)?,
            ),
            None => None,
        };
        let app = Arc::new(App {
            transfers: policies[Route::Transfers as usize].clone(),
            checkout: policies[Route::Checkout as usize].clone(),
            store: Arc::new(store),
            config,
            faults: faults::Memory::default(),
            log,
        });
        crash_quietly();
        let router = match app.config.fault {
            None => router(&app, &policies, &Arc::clone(&app.store)),
            Some(fault) => {
                let store = faults::FaultyStore::new(Arc::clone(&app.store), fault);
                router(&app, &policies, &store)
            }
        };
        let listener = TcpListener::bind(addr).await.map_err(StartError::Bind)?;
        let addr = listener.local_addr().map_err(StartError::Bind)?;
        let tls = app
            .config
            .tls
            .as_ref()
            .map(|identity| tokio_rustls::TlsAcceptor::from(identity.server_config()));
        let task = tokio::spawn(accept_loop(listener, tls, router, app.config.body_timeout));
        Ok(Server { addr, task, app })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR` (or `https://ADDR`), without a trailing slash.
    pub fn base_url(&self) -> String {
        let scheme = if self.app.config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// The certificate it serves HTTPS with, if it does.
    pub fn tls(&self) -> Option<&crate::tls::Identity> {
        self.app.config.tls.as_ref()
    }

    /// How many times the handler has run (in every process that shares the store); 0 when
    /// the shared store cannot be read.
    pub async fn executions(&self) -> u64 {
        self.app.store.executions().await.unwrap_or(0)
    }

    /// Records held by the memory store (0 for a shared store).
    pub fn stored_records(&self) -> usize {
        self.app
            .store
            .memory()
            .map_or(0, idem_tower::MemoryStore::len)
    }

    /// The fault it runs with.
    pub fn fault(&self) -> Option<Fault> {
        self.app.config.fault
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

/// The axum app: each guarded route with idem-tower's layer on `store`, and with a fault,
/// the fault's middleware around the layer.
fn router<St>(app: &Arc<App>, policies: &[Policy; 4], store: &St) -> Router
where
    St: AsyncStore + Clone + Send + Sync + 'static,
    St::Error: fmt::Display,
{
    let mut router = Router::new();
    for route in Route::ALL {
        let builder =
            IdempotencyLayer::builder(store.clone()).policy(policies[route as usize].clone());
        let builder = if app.config.fault.is_some_and(|f| f.apply().unscoped) {
            // A configuration mistake: keys not scoped by caller.
            builder.single_tenant()
        } else {
            builder.principal(|parts| Some(principal_of(&parts.headers)))
        };
        let Ok(layer) = builder.build() else {
            unreachable!("a principal is set on every branch")
        };
        let mut endpoint = post(place).route_layer(layer);
        if let Some(fault) = app.config.fault.filter(|f| f.apply().middleware()) {
            endpoint = endpoint.route_layer(axum::middleware::from_fn_with_state(
                (Arc::clone(app), route, fault),
                faults::misbehave,
            ));
        }
        // The status query: a GET on the route with Idempotency-Status, on the same store.
        let status = StatusRoute {
            policy: policies[route as usize].clone(),
            store: store.clone(),
            route,
            scoped: !app.config.fault.is_some_and(|f| f.apply().unscoped),
        };
        let mut query = get(move |req: Request<Body>| async move { status.answer(req).await });
        if let Some(fault) = app.config.fault.filter(|f| f.apply().queries()) {
            query = query.route_layer(axum::middleware::from_fn_with_state(
                (Arc::clone(app), route, fault),
                faults::misask,
            ));
        }
        endpoint = endpoint.merge(query);
        router = router.route(route.path(), endpoint.fallback(use_post));
    }
    router
        .route(SESSIONS_PATH, post(open_session).fallback(use_post))
        .route(TOKENS_PATH, post(issue_token).fallback(use_post))
        .route(COUNT_PATH, get(count).fallback(use_get))
        .fallback(not_found)
        // The layer caps guarded bodies at `max_body`; axum's own 2 MiB default must not
        // refuse what the server accepts.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(Arc::clone(app))
}

/// The status query of a guarded route (`IDEM-STATUS-4`): idem-core's status operation,
/// driven on the route's store, for the principal the layer would see.
#[derive(Clone)]
struct StatusRoute<St> {
    policy: Policy,
    store: St,
    route: Route,
    scoped: bool,
}

impl<St> StatusRoute<St>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    async fn answer(&self, req: Request<Body>) -> Response<Full<Bytes>> {
        let headers = req.headers();
        let Some(field) = headers.get(STATUS_HEADER) else {
            return render(&Reply::method_not_allowed("POST"));
        };
        let keys: Vec<&[u8]> = headers
            .get_all(KEY_HEADER)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        let principal = self.scoped.then(|| principal_of(headers));
        let query = StatusQuery {
            principal: principal.as_deref(),
            route: self.route.path(),
            keys: &keys,
            status: field.as_bytes(),
            client: None,
        };
        let machine = self.policy.status(&query, nonce());
        idem_tower::answer(&self.store, machine).await
    }
}

fn json_response(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

async fn not_found() -> Response<Full<Bytes>> {
    render(&Reply::plain(Plain::NotFound, "no such resource"))
}

async fn use_post() -> Response<Full<Bytes>> {
    render(&Reply::method_not_allowed("POST"))
}

async fn use_get() -> Response<Full<Bytes>> {
    render(&Reply::method_not_allowed("GET"))
}

/// `GET /count`: the execution counter.
async fn count(State(app): State<Arc<App>>) -> Response<Full<Bytes>> {
    match app.store.executions().await {
        Ok(n) => json_response(
            StatusCode::OK,
            serde_json::json!({ "count": n }).to_string(),
        ),
        Err(e) => render(&Reply::plain(Plain::Unavailable, &e.to_string())),
    }
}

/// The test credentials: `Authorization: Bearer <token>` names the token's owner; any other
/// Authorization value is a principal of its own, and no header is "anonymous", which no
/// Authorization value can equal. A value that is not text names nobody: empty, which the
/// engine refuses (500 no-principal); read lossily, two such credentials would be one
/// principal, each replayed the other's answers.
fn principal_of(headers: &hyper::HeaderMap) -> String {
    match headers.get(hyper::header::AUTHORIZATION) {
        None => "anonymous".to_owned(),
        Some(v) => {
            let Ok(v) = v.to_str() else {
                return String::new();
            };
            match v.strip_prefix("Bearer ") {
                Some(token) => format!("bearer {}", token.trim()),
                None => format!("authorization {v}"),
            }
        }
    }
}

/// A guarded route's handler, behind the layer: the demo side effect.
async fn place(
    State(app): State<Arc<App>>,
    context: Option<Extension<IdempotencyContext>>,
    body: Bytes,
) -> Response<Full<Bytes>> {
    let recovered = context.as_ref().is_some_and(|Extension(c)| c.recovered());
    if let (Some(log), Some(Extension(c))) = (&app.log, &context) {
        log_execution(log, c);
    }
    run_handler(&app, &body, recovered).await
}

/// `POST /sessions {"client": "…", "firstSeq": n}`: opens (or moves to its next epoch) the
/// caller's counter session for [`TRANSFERS_PATH`]: idem-core's session operation, driven on
/// the server's store.
async fn open_session(State(app): State<Arc<App>>, req: Request<Body>) -> Response<Full<Bytes>> {
    let principal = principal_of(req.headers());
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let body = match idem_tower::read_body(&app.transfers, declared, req.into_body()).await {
        Ok(body) => body,
        Err(reply) => return render(&reply),
    };
    let target = Target {
        principal: Some(&principal),
        method: "POST",
        route: TRANSFERS_PATH,
    };
    let opening = app.transfers.open_session_from(&target, &body, nonce());
    idem_tower::answer(&*app.store, opening).await
}

/// `POST /idempotency-tokens`: issues a token for the caller's requests to
/// [`CHECKOUT_PATH`]: idem-core's token operation, driven on the server's store.
async fn issue_token(State(app): State<Arc<App>>, headers: HeaderMap) -> Response<Full<Bytes>> {
    let principal = principal_of(&headers);
    let target = Target {
        principal: Some(&principal),
        method: "POST",
        route: CHECKOUT_PATH,
    };
    let issuing = app
        .checkout
        .issue_token(&target, UnixMillis::now(), [nonce(), nonce()]);
    idem_tower::answer(&*app.store, issuing).await
}

fn nonce() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        // No OS randomness: the clock still makes versions differ between incarnations.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    })
}

/// Appends the line of one handler run to the execution log, in one write. A log that
/// cannot be written is left short (the chaos tests then see an answer without its
/// execution), never the answer.
fn log_execution(mut log: &std::fs::File, c: &IdempotencyContext) {
    use std::io::Write;
    let line = format!(
        "{}\t{}\t{}\t{}\n",
        c.key(),
        c.fence(),
        c.recovered(),
        std::process::id()
    );
    let _ = log.write_all(line.as_bytes());
}

/// The demo handler: one observable side effect (the execution counter) per run. A
/// `"crash"` outcome on a first attempt panics with [`SimulatedCrash`].
async fn run_handler(app: &App, body: &[u8], recovered: bool) -> Response<Full<Bytes>> {
    // A count the store cannot keep leaves the oracle short, never the answer.
    let n = app.store.count_execution().await.unwrap_or(0);
    if !app.config.delay.is_zero() {
        tokio::time::sleep(app.config.delay).await;
    }
    let outcome = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("outcome").and_then(|o| o.as_str()).map(str::to_owned));
    let problem = |status: u16, error: &str| {
        json_response(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            serde_json::json!({ "error": error, "execution": n }).to_string(),
        )
    };
    match outcome.as_deref() {
        Some("decline") => problem(402, "card_declined"),
        Some("unavailable") => problem(503, "unavailable"),
        Some("busy") => {
            let mut r = problem(429, "busy");
            r.headers_mut()
                .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
        Some("crash") if !recovered => std::panic::panic_any(SimulatedCrash),
        _ => {
            let id = format!("ord_{n:06}");
            let mut r = json_response(
                StatusCode::CREATED,
                serde_json::json!({ "id": id, "execution": n, "recovered": recovered }).to_string(),
            );
            let headers = r.headers_mut();
            for (name, value) in [
                (hyper::header::LOCATION, format!("{ORDERS_PATH}/{id}")),
                (
                    hyper::header::SET_COOKIE,
                    format!("last_order={id}; Path=/; HttpOnly"),
                ),
                (HeaderName::from_static("x-order-id"), id.clone()),
            ] {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    headers.insert(name, value);
                }
            }
            r
        }
    }
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
