//! The lease under faults, through the layer: a heartbeat whose future is dropped half-way
//! (a timeout, `select!`, an aborted task) leaves nothing waiting and the outcome recorded
//! (IDEM-LEASE-3, IDEM-OUT-5); an attempt whose lease was taken over answers its caller with
//! the key's outcome, never with its own handler's answer (IDEM-LEASE-5); a handler that
//! panics is a crash, its key taken over after the lease (IDEM-LEASE-1).

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use idem_core::{
    Applied, AsyncStore, Config, Engine, Policy, Record, RecordKey, RecordState, UnixMillis, Write,
    WriteOp,
};
use idem_tower::{IdempotencyContext, IdempotencyLayer, MemoryStore, MemoryStoreError};
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};

type Body = Either<Full<Bytes>, Full<Bytes>>;

/// Where a slow heartbeat write is slow: before the store applies it (the write never
/// happens if it is abandoned) or after (it happened, and its answer is lost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slow {
    Before,
    After,
}

/// The in-process store, with every heartbeat write (a write of a record in flight over one
/// that was already in flight) taking 300 ms, on one side of the write or the other.
struct SlowHeartbeats {
    inner: MemoryStore,
    slow: Slow,
    heartbeats: AtomicUsize,
}

fn is_heartbeat(write: &Write) -> bool {
    matches!(
        &write.op,
        WriteOp::Put(Record {
            state: RecordState::InFlight { .. },
            ..
        })
    ) && matches!(write.precondition, idem_core::Precondition::Version(_))
}

impl AsyncStore for SlowHeartbeats {
    type Error = MemoryStoreError;

    fn load(
        &self,
        key: &RecordKey,
    ) -> impl Future<Output = Result<Option<Record>, MemoryStoreError>> + Send {
        self.inner.load(key)
    }

    fn apply(
        &self,
        now: UnixMillis,
        write: Write,
    ) -> impl Future<Output = Result<Applied, MemoryStoreError>> + Send {
        let heartbeat = is_heartbeat(&write);
        if heartbeat {
            self.heartbeats.fetch_add(1, Ordering::SeqCst);
        }
        async move {
            let pause = || tokio::time::sleep(Duration::from_millis(300));
            if heartbeat && self.slow == Slow::Before {
                pause().await;
            }
            let applied = self.inner.apply(now, write).await;
            if heartbeat && self.slow == Slow::After {
                pause().await;
            }
            applied
        }
    }
}

fn post(key: &str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

struct Answer {
    status: u16,
    replayed: bool,
    body: String,
}

async fn send<S>(service: S, key: &str) -> Answer
where
    S: Service<
        Request<Full<Bytes>>,
        Response = Response<idem_tower::OuterBody<Full<Bytes>>>,
        Error = Infallible,
    >,
{
    let r = service
        .oneshot(post(key))
        .await
        .unwrap_or_else(|e| match e {});
    let status = r.status().as_u16();
    let replayed = r.headers().contains_key("idempotent-replayed");
    let body = r.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        replayed,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn created(body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::CREATED;
    r
}

/// How the handler gives up on its heartbeat.
#[derive(Clone, Copy, Debug)]
enum Abandon {
    Timeout,
    Select,
    AbortedTask,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abandoned_heartbeat_leaves_the_outcome_recorded_and_runs_once() {
    // IDEM-LEASE-3 IDEM-OUT-5: each way of dropping a heartbeat's future half-way, with the
    // write abandoned before the store applied it and after (its answer lost).
    for slow in [Slow::Before, Slow::After] {
        for abandon in [Abandon::Timeout, Abandon::Select, Abandon::AbortedTask] {
            let store = Arc::new(SlowHeartbeats {
                inner: MemoryStore::default(),
                slow,
                heartbeats: AtomicUsize::new(0),
            });
            let layer = IdempotencyLayer::builder(Arc::clone(&store))
                .single_tenant()
                .build()
                .unwrap();
            let runs = Arc::new(AtomicUsize::new(0));
            let counter = Arc::clone(&runs);
            let service = layer.layer(tower::service_fn(move |request: Request<Body>| {
                let counter = Arc::clone(&counter);
                async move {
                    let ctx = request
                        .extensions()
                        .get::<IdempotencyContext>()
                        .cloned()
                        .expect("a context");
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    let wait = Duration::from_millis(50);
                    match abandon {
                        Abandon::Timeout => {
                            assert!(tokio::time::timeout(wait, ctx.extend()).await.is_err());
                        }
                        Abandon::Select => {
                            tokio::select! {
                                _ = ctx.extend() => panic!("the heartbeat was not slow"),
                                () = tokio::time::sleep(wait) => {}
                            }
                        }
                        Abandon::AbortedTask => {
                            let beat = ctx.clone();
                            let task = tokio::spawn(async move { beat.extend().await });
                            tokio::time::sleep(wait).await;
                            task.abort();
                            assert!(task.await.is_err_and(|e| e.is_cancelled()));
                        }
                    }
                    Ok::<_, Infallible>(created(format!("order {n}")))
                }
            }));
            let first = send(service.clone(), "k").await;
            assert_eq!((first.status, first.body.as_str()), (201, "order 1"));
            assert_eq!(
                store.heartbeats.load(Ordering::SeqCst),
                1,
                "{slow:?} {abandon:?}"
            );
            // Let an abandoned write that went on in the background land, if it does.
            tokio::time::sleep(Duration::from_millis(400)).await;
            let retry = send(service.clone(), "k").await;
            assert_eq!(
                (retry.status, retry.replayed, retry.body.as_str()),
                (201, true, "order 1"),
                "{slow:?} {abandon:?}: the retry was not answered from the stored outcome"
            );
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{slow:?} {abandon:?}");
        }
    }
}

/// A layer on the in-process store with a short `lease`.
fn short_lease(store: Arc<MemoryStore>, lease: Duration) -> IdempotencyLayer<Arc<MemoryStore>> {
    let engine = Engine::new(Config {
        lease,
        ..Config::default()
    })
    .expect("valid times");
    IdempotencyLayer::builder(store)
        .policy(Policy::new(engine))
        .single_tenant()
        .build()
        .unwrap()
}

/// A handler that stalls for `stall` ms, then answers 201 or (with `status`) another status.
fn stalling(
    layer: &IdempotencyLayer<Arc<MemoryStore>>,
    name: &'static str,
    stall: u64,
    status: StatusCode,
) -> impl Service<
    Request<Full<Bytes>>,
    Response = Response<idem_tower::OuterBody<Full<Bytes>>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    layer.layer(tower::service_fn(move |_: Request<Body>| async move {
        tokio::time::sleep(Duration::from_millis(stall)).await;
        let mut r = created(format!("answered by {name}"));
        *r.status_mut() = status;
        Ok::<_, Infallible>(r)
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attempt_whose_lease_was_taken_over_answers_with_the_keys_outcome() {
    // IDEM-LEASE-5: the winner completed first: its stored response, replayed.
    let layer = short_lease(Arc::new(MemoryStore::default()), Duration::from_millis(300));
    let zombie = tokio::spawn(send(
        stalling(&layer, "zombie", 700, StatusCode::CREATED),
        "a",
    ));
    tokio::time::sleep(Duration::from_millis(450)).await;
    let winner = send(stalling(&layer, "winner", 0, StatusCode::CREATED), "a").await;
    assert_eq!(
        (winner.status, winner.body.as_str()),
        (201, "answered by winner")
    );
    let zombie = zombie.await.unwrap();
    assert_eq!(
        (zombie.status, zombie.replayed, zombie.body.as_str()),
        (201, true, "answered by winner"),
        "the attempt that lost its lease answered with its own response"
    );

    // The winner still runs: 409 in-progress, as a retry would be told.
    let zombie = tokio::spawn(send(
        stalling(&layer, "zombie", 700, StatusCode::CREATED),
        "b",
    ));
    tokio::time::sleep(Duration::from_millis(450)).await;
    let winner = tokio::spawn(send(
        stalling(&layer, "winner", 800, StatusCode::CREATED),
        "b",
    ));
    let zombie = zombie.await.unwrap();
    assert_eq!(zombie.status, 409, "{}", zombie.body);
    assert!(
        zombie.body.contains("urn:idem:problem:in-progress"),
        "{}",
        zombie.body
    );
    assert_eq!(winner.await.unwrap().status, 201);

    // The winner's outcome released the key (429: nothing happened): nothing is recorded,
    // and the zombie says it was superseded.
    let zombie = tokio::spawn(send(
        stalling(&layer, "zombie", 700, StatusCode::CREATED),
        "c",
    ));
    tokio::time::sleep(Duration::from_millis(450)).await;
    let winner = send(
        stalling(&layer, "winner", 0, StatusCode::TOO_MANY_REQUESTS),
        "c",
    )
    .await;
    assert_eq!(winner.status, 429);
    let zombie = zombie.await.unwrap();
    assert_eq!(zombie.status, 409, "{}", zombie.body);
    assert!(
        zombie.body.contains("urn:idem:problem:superseded"),
        "{}",
        zombie.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_that_panics_is_a_crash_its_key_taken_over_after_the_lease() {
    // IDEM-LEASE-1: nothing is recorded for a handler that panics, as for a process that
    // died: its key stays in flight until the lease ends, then a retry takes over as a
    // recovery. The panic goes on.
    let store = Arc::new(MemoryStore::default());
    // Long enough that the check "still in flight" comes before the lease ends on a loaded
    // machine too.
    let lease = Duration::from_secs(2);
    let layer = short_lease(Arc::clone(&store), lease);
    let panicking = layer.layer(tower::service_fn(|_: Request<Body>| async {
        if true {
            panic!("the handler failed");
        }
        Ok::<_, Infallible>(created(String::new()))
    }));
    let outcome = tokio::spawn(panicking.oneshot(post("p"))).await;
    assert!(outcome.is_err_and(|e| e.is_panic()), "the panic goes on");
    let recovering = layer.layer(tower::service_fn(|request: Request<Body>| async move {
        let ctx = request
            .extensions()
            .get::<IdempotencyContext>()
            .cloned()
            .expect("a context");
        Ok::<_, Infallible>(created(format!("recovered: {}", ctx.recovered())))
    }));
    assert_eq!(
        send(recovering.clone(), "p").await.status,
        409,
        "in flight until the lease ends"
    );
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    let retry = send(recovering, "p").await;
    assert_eq!(
        (retry.status, retry.body.as_str()),
        (201, "recovered: true")
    );
}
