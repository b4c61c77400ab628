//! The rules checked through the layer, request by request: concurrent duplicates, expiry,
//! a live lease, a store that fails, the response size limit.

use super::{load, unique, Options};
use crate::{IdempotencyContext, IdempotencyLayer, OuterBody};
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use idem_core::{
    Applied, AsyncStore, Config, Engine, Policy, Problem, Record, RecordKey, StoreFailure,
    UnixMillis, Write, KEY_HEADER, REPLAYED_HEADER,
};
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// The handler of the layer checks: counts its executions and answers 201 with `body`
/// after `delay`; `?fail=1` never answers (it waits to be released).
#[derive(Clone)]
struct Orders {
    runs: Arc<AtomicUsize>,
    delay: Duration,
    body: Bytes,
    hold: Option<Arc<tokio::sync::Notify>>,
    heartbeat_after: Option<Duration>,
}

impl Orders {
    fn new(body: Bytes, delay: Duration) -> Orders {
        Orders {
            runs: Arc::new(AtomicUsize::new(0)),
            delay,
            body,
            hold: None,
            heartbeat_after: None,
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Service<Request<Either<Full<Bytes>, Full<Bytes>>>> for Orders {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Either<Full<Bytes>, Full<Bytes>>>) -> Self::Future {
        let this = self.clone();
        let context = request.extensions().get::<IdempotencyContext>().cloned();
        Box::pin(async move {
            this.runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(this.delay).await;
            if let (Some(after), Some(context)) = (this.heartbeat_after, &context) {
                tokio::time::sleep(after).await;
                context
                    .extend()
                    .await
                    .expect("the heartbeat extends the lease");
            }
            if let Some(hold) = &this.hold {
                hold.notified().await;
            }
            let mut response = Response::new(Full::new(this.body.clone()));
            *response.status_mut() = StatusCode::CREATED;
            Ok(response)
        })
    }
}

fn post(key: &str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header(KEY_HEADER, format!("\"{key}\""))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(b"{\"amount\":100}")))
        .expect("a request")
}

type Layered<St> = crate::Idempotent<Orders, St>;

fn layered<St>(store: St, policy: Policy, orders: &Orders) -> Layered<St> {
    IdempotencyLayer::builder(store)
        .policy(policy)
        .single_tenant()
        .build()
        .expect("single tenant")
        .layer(orders.clone())
}

async fn send<St>(service: &Layered<St>, key: &str) -> (u16, Option<String>, Bytes)
where
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
{
    let mut service = service.clone();
    let response: Response<OuterBody<Full<Bytes>>> = match service.call(post(key)).await {
        Ok(r) => r,
        Err(e) => match e {},
    };
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get(REPLAYED_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = match response.into_body().collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => Bytes::new(),
    };
    (status, replayed, bytes)
}

fn policy(response_ttl: u64, key_ttl: u64, lease: u64) -> Policy {
    let engine = Engine::new(Config {
        response_ttl: Duration::from_millis(response_ttl),
        key_ttl: Duration::from_millis(key_ttl),
        lease: Duration::from_millis(lease),
        ..Config::default()
    })
    .expect("valid times");
    Policy::new(engine)
}

/// 32 concurrent duplicates through the layer run the handler once; the retries replay.
pub async fn concurrent_duplicates<St, F, Fut>(open: &F, options: &Options)
where
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
    F: Fn() -> Fut,
    Fut: Future<Output = St>,
{
    let orders = Orders::new(Bytes::from_static(b"{\"id\":1}"), Duration::from_millis(30));
    let mut services = vec![layered(
        open().await,
        Policy::new(Engine::default()),
        &orders,
    )];
    if options.shared {
        services.push(layered(
            open().await,
            Policy::new(Engine::default()),
            &orders,
        ));
    }
    for round in 0..3 {
        let key = unique("dup");
        let before = orders.runs();
        let barrier = Arc::new(tokio::sync::Barrier::new(32));
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let service = services[i % services.len()].clone();
                let (key, barrier) = (key.clone(), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    send(&service, &key).await.0
                })
            })
            .collect();
        for t in tasks {
            let status = t.await.expect("a request panicked");
            assert!(
                status == 201 || status == 409,
                "round {round}: status {status}"
            );
        }
        assert_eq!(orders.runs() - before, 1, "round {round}: executions");
        let (status, replayed, _) = send(&services[0], &key).await;
        assert_eq!((status, replayed.as_deref()), (201, Some("true")));
        assert_eq!(orders.runs() - before, 1);
    }
}

/// The response replays until it expires, then 410 while the key lives, then the key is new;
/// the record is kept until its key expires, and a store with a time-to-live of its own has
/// dropped the response by then (`IDEM-TTL-1`..`4`, `IDEM-STORE-6`, `IDEM-STORE-9`).
pub async fn expiry<St, F, Fut>(open: &F, options: &Options)
where
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
    F: Fn() -> Fut,
    Fut: Future<Output = St>,
{
    let (response_ttl, key_ttl) = (700, 1800);
    let observer = Arc::new(open().await);
    let orders = Orders::new(Bytes::from(vec![b'x'; 16 * 1024]), Duration::ZERO);
    let service = layered(open().await, policy(response_ttl, key_ttl, 500), &orders);
    let key = unique("ttl");
    let start = std::time::Instant::now();
    assert_eq!(send(&service, &key).await.0, 201);
    let record_key = RecordKey::new(
        Policy::new(Engine::default())
            .scope(None, "POST", "/orders")
            .expect("a scope"),
        key.clone(),
    );
    let stored = load(&*observer, &record_key).await;
    if options.shared {
        let record = stored.expect("the completed record");
        assert!(
            record.retained_until().0 >= record.key_expires.0,
            "a store's time-to-live comes from the key's retention"
        );
    }
    assert_eq!(send(&service, &key).await.1.as_deref(), Some("true"));
    tokio::time::sleep(Duration::from_millis(response_ttl + 150).saturating_sub(start.elapsed()))
        .await;
    assert_eq!(
        send(&service, &key).await.0,
        410,
        "a retry after the response expired must get 410"
    );
    if options.shared {
        let record = load(&*observer, &record_key)
            .await
            .expect("the record outlives its response");
        if options.self_expiring {
            assert!(
                !matches!(record.state, idem_core::RecordState::Completed { .. }),
                "IDEM-STORE-9: a store that deletes on a time-to-live of its own drops the response when it expires, not with the key"
            );
        }
    }
    assert_eq!(orders.runs(), 1);
    tokio::time::sleep(Duration::from_millis(key_ttl + 300).saturating_sub(start.elapsed())).await;
    if options.shared && options.self_expiring {
        assert!(
            load(&*observer, &record_key).await.is_none(),
            "deleted once the key expired"
        );
    }
    let (status, replayed, _) = send(&service, &key).await;
    assert_eq!(
        (status, replayed),
        (201, None),
        "after the key expired it is new again"
    );
    assert_eq!(orders.runs(), 2);
}

/// A record in flight is kept past its key's first retention while a heartbeat keeps its
/// lease (`IDEM-STORE-3`, `IDEM-LEASE-4`).
pub async fn live_lease<St, F, Fut>(open: &F)
where
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
    F: Fn() -> Fut,
    Fut: Future<Output = St>,
{
    let mut orders = Orders::new(Bytes::from_static(b"done"), Duration::from_millis(500));
    orders.heartbeat_after = Some(Duration::ZERO);
    let hold = Arc::new(tokio::sync::Notify::new());
    orders.hold = Some(Arc::clone(&hold));
    let service = layered(open().await, policy(800, 800, 800), &orders);
    let key = unique("lease");
    let first = {
        let (service, key) = (service.clone(), key.clone());
        tokio::spawn(async move { send(&service, &key).await })
    };
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let (status, _, _) = send(&service, &key).await;
    assert_eq!(
        status, 409,
        "a duplicate while the lease lives is refused, past the key's first retention"
    );
    assert_eq!(orders.runs(), 1);
    hold.notify_one();
    assert_eq!(first.await.expect("the first request").0, 201);
    assert_eq!(send(&service, &key).await.1.as_deref(), Some("true"));
    assert_eq!(orders.runs(), 1);
}

/// A store whose every call fails.
struct Failing;

/// The failure of [`Failing`].
#[derive(Debug)]
struct Down;

impl fmt::Display for Down {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("store unavailable (injected by the store tests)")
    }
}

impl AsyncStore for Failing {
    type Error = Down;

    async fn load(&self, _key: &RecordKey) -> Result<Option<Record>, Down> {
        Err(Down)
    }

    async fn apply(&self, _now: UnixMillis, _write: Write) -> Result<Applied, Down> {
        Err(Down)
    }

    fn failure(_error: &Down) -> StoreFailure {
        StoreFailure::Unavailable
    }
}

/// A store that fails answers 503 problem+json and runs nothing (`IDEM-STORE-4`).
pub async fn failures<St, F, Fut>(_open: &F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = St>,
{
    let orders = Orders::new(Bytes::from_static(b"ran"), Duration::ZERO);
    let service = layered(Failing, Policy::new(Engine::default()), &orders);
    let (status, _, body) = send(&service, &unique("down")).await;
    assert_eq!(status, Problem::STORE_UNAVAILABLE.status);
    assert!(
        String::from_utf8_lossy(&body).contains(Problem::STORE_UNAVAILABLE.type_uri),
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(orders.runs(), 0);
}

/// A response at the size limit replays byte for byte; a larger one is kept as
/// response-not-stored (`IDEM-STORE-5`).
pub async fn size_limit<St, F, Fut>(open: &F, options: &Options)
where
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
    F: Fn() -> Fut,
    Fut: Future<Output = St>,
{
    let limit = options.max_response_bytes;
    // The limit counts the response's headers with its body.
    let body: Vec<u8> = (0..limit - 256).map(|i| (i * 31 % 251) as u8).collect();
    let orders = Orders::new(Bytes::from(body.clone()), Duration::ZERO);
    let service = layered(
        open().await,
        Policy::new(Engine::default()).with_max_response_bytes(limit),
        &orders,
    );
    let key = unique("big");
    let (status, _, first) = send(&service, &key).await;
    assert_eq!((status, first.len()), (201, body.len()));
    let (_, replayed, again) = send(&service, &key).await;
    assert_eq!(replayed.as_deref(), Some("true"));
    assert!(again[..] == body[..], "the replayed body differs");
    let over = Orders::new(Bytes::from(vec![7u8; limit + 1]), Duration::ZERO);
    let service = layered(
        open().await,
        Policy::new(Engine::default()).with_max_response_bytes(limit),
        &over,
    );
    let key = unique("over");
    assert_eq!(send(&service, &key).await.0, 201);
    let (status, _, problem) = send(&service, &key).await;
    assert_eq!(status, Problem::RESPONSE_NOT_STORED.status);
    assert!(String::from_utf8_lossy(&problem).contains(Problem::RESPONSE_NOT_STORED.type_uri));
    assert_eq!(over.runs(), 1);
}
