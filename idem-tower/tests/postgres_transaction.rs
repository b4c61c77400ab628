//! PostgresStore::transaction (IDEM-STORE-7) through the layer on a private Postgres: the
//! order row and the stored response commit together; a handler that fails commits
//! neither; an attempt whose lease was taken over commits nothing.
#![cfg(feature = "postgres")]

mod common;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use idem_core::{Config, Engine, Policy, UnknownOutcomePolicy};
use idem_tower::{IdempotencyContext, IdempotencyLayer, PostgresStore};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, Service, ServiceExt};

/// What the handler does after its insert.
#[derive(Clone, Copy, PartialEq, Eq)]
enum After {
    Answer,
    Fail,
    /// Hands its transaction to the completion, then answers 500.
    FailAfterHandingOver,
    Stall(u64),
    /// Hands its transaction to the completion, then stalls before answering.
    HandOverThenStall(u64),
}

type Body = Either<Full<Bytes>, Full<Bytes>>;

/// The context the layer gave the request's handler.
fn context(request: &Request<Body>) -> IdempotencyContext {
    request
        .extensions()
        .get::<IdempotencyContext>()
        .cloned()
        .expect("a context")
}

fn orders(
    store: Arc<PostgresStore>,
    after: After,
) -> impl Service<
    Request<Body>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send {
    tower::service_fn(move |request: Request<Body>| {
        let store = Arc::clone(&store);
        async move {
            let ctx = context(&request);
            let tx = store.transaction(&ctx).await.expect("a transaction");
            let row = tx
                .client()
                .query_one(
                    "INSERT INTO orders (idem_key) VALUES ($1) RETURNING id",
                    &[&ctx.key()],
                )
                .await
                .expect("the insert");
            let id: i64 = row.get(0);
            match after {
                After::Fail => {
                    drop(tx);
                    let mut r = Response::new(Full::new(Bytes::from_static(b"failed")));
                    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    return Ok(r);
                }
                After::FailAfterHandingOver => {
                    tx.commit_with_completion();
                    let mut r = Response::new(Full::new(Bytes::from_static(b"failed")));
                    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    return Ok(r);
                }
                After::Stall(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                After::HandOverThenStall(ms) => {
                    tx.commit_with_completion();
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    let mut r = Response::new(Full::new(Bytes::from(id.to_string())));
                    *r.status_mut() = StatusCode::CREATED;
                    return Ok(r);
                }
                After::Answer => {}
            }
            tx.commit_with_completion();
            let mut r = Response::new(Full::new(Bytes::from(id.to_string())));
            *r.status_mut() = StatusCode::CREATED;
            Ok(r)
        }
    })
}

fn post(key: &str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

async fn send<S>(service: S, key: &str) -> (u16, String)
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
    let body = r
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A private Postgres with the store migrated and an `orders` table: the server (stopped
/// when dropped), the store, and a connection for the test's own queries.
async fn orders_db() -> (
    common::Server,
    Arc<PostgresStore>,
    deadpool_postgres::Object,
) {
    let server = common::postgres();
    let store = Arc::new(PostgresStore::connect(&server.url, 8).expect("a pool"));
    store.migrate().await.expect("the migration");
    let client = store.pool().get().await.expect("a connection");
    client
        .batch_execute("CREATE TABLE orders (id bigserial PRIMARY KEY, idem_key text NOT NULL)")
        .await
        .unwrap();
    (server, store, client)
}

/// How many orders were committed under `key`.
async fn orders_of(client: &deadpool_postgres::Object, key: &str) -> i64 {
    client
        .query_one("SELECT count(*) FROM orders WHERE idem_key = $1", &[&key])
        .await
        .unwrap()
        .get(0)
}

/// The sessions left idle in a transaction. A transaction whose connection was closed (as a
/// dropped `Transaction` closes it) is rolled back by the server once it sees the socket
/// close, a moment later: this counts them once that has had at most 5 s to happen.
async fn left_in_transaction(client: &deadpool_postgres::Object) -> i64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n == 0 || tokio::time::Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_order_and_its_record_commit_together_or_not_at_all() {
    let (_server, store, client) = orders_db().await;
    let count = |key: &'static str| orders_of(&client, key);
    let policy = || {
        Policy::new(
            Engine::new(Config {
                lease: Duration::from_millis(300),
                ..Config::default()
            })
            .expect("valid times"),
        )
    };
    let layer = IdempotencyLayer::builder(Arc::clone(&store))
        .policy(policy())
        .single_tenant()
        .build()
        .unwrap();

    // Answered: one order, committed with its record; the retry replays it.
    let service = layer.layer(orders(Arc::clone(&store), After::Answer));
    let (status, id) = send(service.clone(), "a").await;
    assert_eq!(status, 201);
    assert_eq!(count("a").await, 1);
    assert_eq!(send(service.clone(), "a").await, (201, id));
    assert_eq!(count("a").await, 1);

    // Failed (5xx, the transaction dropped): no order; the retry runs and commits one.
    let failing = layer.layer(orders(Arc::clone(&store), After::Fail));
    assert_eq!(send(failing, "b").await.0, 500);
    assert_eq!(count("b").await, 0);
    assert_eq!(send(service.clone(), "b").await.0, 201);
    assert_eq!(count("b").await, 1);

    // Failed after handing its transaction to the completion (5xx: an unknown outcome, run
    // again by a retry): its order rolls back, and the retry commits one.
    let handing = layer.layer(orders(Arc::clone(&store), After::FailAfterHandingOver));
    assert_eq!(send(handing, "d").await.0, 500);
    assert_eq!(count("d").await, 0);
    assert_eq!(send(service.clone(), "d").await.0, 201);
    assert_eq!(count("d").await, 1);
    // No connection was left holding the failed attempt's transaction.
    let open: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 0, "a transaction was left open");

    // Under the hold policy the 500 is an outcome held as unknown: the key stays held, and
    // the handler's order rolls back with it (only a stored response commits its rows).
    let holding = IdempotencyLayer::builder(Arc::clone(&store))
        .policy(Policy::new(
            Engine::new(Config {
                unknown_outcome: UnknownOutcomePolicy::Hold,
                ..Config::default()
            })
            .expect("valid times"),
        ))
        .single_tenant()
        .build()
        .unwrap();
    let held = holding.layer(orders(Arc::clone(&store), After::FailAfterHandingOver));
    assert_eq!(send(held, "e").await.0, 500);
    assert_eq!(
        count("e").await,
        0,
        "a held unknown outcome committed its order"
    );
    let retry = holding.layer(orders(Arc::clone(&store), After::Answer));
    assert_eq!(send(retry, "e").await.0, 409, "the key is held");
    assert_eq!(count("e").await, 0);

    // A stalled attempt loses its lease to a retry: only the retry's order commits.
    let stalled = layer.layer(orders(Arc::clone(&store), After::Stall(700)));
    let zombie = tokio::spawn(send(stalled, "c"));
    tokio::time::sleep(Duration::from_millis(450)).await;
    let (status, winner) = send(service.clone(), "c").await;
    assert_eq!(status, 201);
    let _ = zombie.await.unwrap();
    assert_eq!(
        count("c").await,
        1,
        "the attempt that lost its lease committed nothing"
    );
    let only: i64 = client
        .query_one("SELECT id FROM orders WHERE idem_key = 'c'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(only.to_string(), winner);
    assert_eq!(send(service.clone(), "c").await, (201, winner));

    // Both attempts hand their transactions over, and the displaced one completes (fenced
    // out) while the one that took over still runs: each completion finds its own attempt's
    // transaction, so the displaced one rolls back only its own order.
    let zombie = tokio::spawn(send(
        layer.layer(orders(Arc::clone(&store), After::HandOverThenStall(700))),
        "f",
    ));
    tokio::time::sleep(Duration::from_millis(450)).await;
    let (status, winner) = send(
        layer.layer(orders(Arc::clone(&store), After::HandOverThenStall(600))),
        "f",
    )
    .await;
    assert_eq!(status, 201);
    let _ = zombie.await.unwrap();
    assert_eq!(
        count("f").await,
        1,
        "the order of the attempt that took over"
    );
    let only: i64 = client
        .query_one("SELECT id FROM orders WHERE idem_key = 'f'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(only.to_string(), winner);
    assert_eq!(send(service, "f").await, (201, winner));
}

/// The Postgres store, with the answer to the first heartbeat lost after Postgres committed
/// it (the connection dropped after the commit), as the layer sees it: an error.
/// With `then_unreadable`, every read after that heartbeat fails too.
struct LostHeartbeatAnswer {
    inner: Arc<PostgresStore>,
    in_flight_writes: std::sync::atomic::AtomicUsize,
    then_unreadable: bool,
}

impl idem_core::AsyncStore for LostHeartbeatAnswer {
    type Error = String;

    fn load(
        &self,
        key: &idem_core::RecordKey,
    ) -> impl std::future::Future<Output = Result<Option<idem_core::Record>, String>> + Send {
        let unreadable = self.then_unreadable
            && self
                .in_flight_writes
                .load(std::sync::atomic::Ordering::SeqCst)
                >= 2;
        let load = self.inner.load(key);
        async move {
            if unreadable {
                return Err("the store stopped answering".to_owned());
            }
            load.await.map_err(|e| e.to_string())
        }
    }

    fn apply(
        &self,
        now: idem_core::UnixMillis,
        write: idem_core::Write,
    ) -> impl std::future::Future<Output = Result<idem_core::Applied, String>> + Send {
        use idem_core::{RecordState, WriteOp};
        let in_flight = matches!(
            &write.op,
            WriteOp::Put(r) if matches!(r.state, RecordState::InFlight { .. })
        );
        // The first write of a record in flight is the claim, the second the heartbeat.
        let lose = in_flight
            && self
                .in_flight_writes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                == 1;
        let apply = self.inner.apply(now, write);
        async move {
            let applied = apply.await.map_err(|e| e.to_string())?;
            if lose {
                assert_eq!(applied, idem_core::Applied::Applied);
                return Err("the connection dropped after the commit".to_owned());
            }
            Ok(applied)
        }
    }

    fn apply_completion(
        &self,
        now: idem_core::UnixMillis,
        write: idem_core::Write,
        completion: idem_core::Completing,
    ) -> impl std::future::Future<Output = Result<idem_core::Applied, String>> + Send {
        let apply = self.inner.apply_completion(now, write, completion);
        async move { apply.await.map_err(|e| e.to_string()) }
    }

    fn end_attempt(&self, key: &idem_core::RecordKey, attempt: u64) -> bool {
        self.inner.end_attempt(key, attempt)
    }
}

/// A handler that inserts an order in its transaction, sends a heartbeat (whose answer the
/// test's store loses), hands the transaction over and answers 201 with the order's id.
fn handing_over(
    store: Arc<PostgresStore>,
) -> impl Service<
    Request<Body>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send {
    tower::service_fn(move |request: Request<Body>| {
        let store = Arc::clone(&store);
        async move {
            let ctx = context(&request);
            let tx = store.transaction(&ctx).await.expect("a transaction");
            let row = tx
                .client()
                .query_one(
                    "INSERT INTO orders (idem_key) VALUES ($1) RETURNING id",
                    &[&ctx.key()],
                )
                .await
                .expect("the insert");
            let id: i64 = row.get(0);
            assert_eq!(ctx.extend().await, Err(idem_tower::LeaseError::StoreFailed));
            tx.commit_with_completion();
            let mut r = Response::new(Full::new(Bytes::from(id.to_string())));
            *r.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(r)
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_response_is_never_stored_without_its_rows() {
    // IDEM-STORE-7: a heartbeat committed whose answer was lost moves the record on under
    // the completion; the completion, made again from the record as it reads, still commits
    // the handler's rows with it. And a handler that panics after handing its transaction
    // over leaves no connection idle in transaction: the retry runs and commits.
    let (_server, store, client) = orders_db().await;
    let count = |key: &'static str| orders_of(&client, key);
    let left_open = || left_in_transaction(&client);

    let losing = Arc::new(LostHeartbeatAnswer {
        inner: Arc::clone(&store),
        in_flight_writes: std::sync::atomic::AtomicUsize::new(0),
        then_unreadable: false,
    });
    let layer = IdempotencyLayer::builder(Arc::clone(&losing))
        .single_tenant()
        .build()
        .unwrap();
    let service = layer.layer(handing_over(Arc::clone(&store)));
    let (status, id) = send(service.clone(), "lost").await;
    assert_eq!(status, 201);
    assert_eq!(
        count("lost").await,
        1,
        "the response was stored without the order it describes"
    );
    assert_eq!(send(service, "lost").await, (201, id));
    assert_eq!(left_open().await, 0);

    // The same, and the record cannot be read again after the completion lost its race: the
    // handler's writes are rolled back as the attempt ends, so its 201 does not go out.
    let unreadable = Arc::new(LostHeartbeatAnswer {
        inner: Arc::clone(&store),
        in_flight_writes: std::sync::atomic::AtomicUsize::new(0),
        then_unreadable: true,
    });
    let layer = IdempotencyLayer::builder(Arc::clone(&unreadable))
        .single_tenant()
        .build()
        .unwrap();
    let (status, body) = send(layer.layer(handing_over(Arc::clone(&store))), "unread").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("IDEM-STORE-7"), "{body}");
    assert_eq!(count("unread").await, 0);
    assert_eq!(left_open().await, 0);

    let layer = IdempotencyLayer::builder(Arc::clone(&store))
        .policy(Policy::new(
            Engine::new(Config {
                lease: Duration::from_millis(300),
                ..Config::default()
            })
            .expect("valid times"),
        ))
        .single_tenant()
        .build()
        .unwrap();
    let pg = Arc::clone(&store);
    let panicking = layer.layer(tower::service_fn(move |request: Request<Body>| {
        let store = Arc::clone(&pg);
        async move {
            let ctx = context(&request);
            let tx = store.transaction(&ctx).await.expect("a transaction");
            tx.client()
                .execute("INSERT INTO orders (idem_key) VALUES ($1)", &[&ctx.key()])
                .await
                .expect("the insert");
            tx.commit_with_completion();
            if ctx.fence() > 0 {
                panic!("the handler failed after handing its transaction over");
            }
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }
    }));
    let outcome = tokio::spawn(panicking.oneshot(post("panic"))).await;
    assert!(outcome.is_err_and(|e| e.is_panic()));
    assert_eq!(left_open().await, 0, "a transaction was left open");
    assert_eq!(count("panic").await, 0);
    // Nothing was recorded for the crash: after its lease the retry takes over, without
    // waiting behind the panicked attempt's row locks.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let retry = tokio::time::timeout(
        Duration::from_secs(5),
        send(
            layer.layer(orders(Arc::clone(&store), After::Answer)),
            "panic",
        ),
    )
    .await
    .expect("the retry did not hang");
    assert_eq!(retry.0, 201);
    assert_eq!(count("panic").await, 1);
}

/// The Postgres store, with every completion's call given up after 300 ms (a caller that gave
/// up on it, a runtime shutting down): its future is then dropped, half-way.
struct CancelledCompletion(Arc<PostgresStore>);

impl idem_core::AsyncStore for CancelledCompletion {
    type Error = String;

    fn load(
        &self,
        key: &idem_core::RecordKey,
    ) -> impl std::future::Future<Output = Result<Option<idem_core::Record>, String>> + Send {
        let load = self.0.load(key);
        async move { load.await.map_err(|e| e.to_string()) }
    }

    fn apply(
        &self,
        now: idem_core::UnixMillis,
        write: idem_core::Write,
    ) -> impl std::future::Future<Output = Result<idem_core::Applied, String>> + Send {
        let apply = self.0.apply(now, write);
        async move { apply.await.map_err(|e| e.to_string()) }
    }

    fn apply_completion(
        &self,
        now: idem_core::UnixMillis,
        write: idem_core::Write,
        completion: idem_core::Completing,
    ) -> impl std::future::Future<Output = Result<idem_core::Applied, String>> + Send {
        let apply = self.0.apply_completion(now, write, completion);
        async move {
            match tokio::time::timeout(Duration::from_millis(300), apply).await {
                Ok(applied) => applied.map_err(|e| e.to_string()),
                Err(_) => Err("the completion was dropped half-way".to_owned()),
            }
        }
    }

    fn end_attempt(&self, key: &idem_core::RecordKey, attempt: u64) -> bool {
        self.0.end_attempt(key, attempt)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_transaction_per_request_and_none_pooled_half_way() {
    // IDEM-STORE-7: a request has one transaction: a second, while the first runs or once it
    // is handed over, is refused. A completion whose call is dropped half-way never puts
    // its connection back in the pool inside the transaction: nothing is left open.
    let (_server, store, client) = orders_db().await;
    let count = |key: &'static str| orders_of(&client, key);
    let left_open = || left_in_transaction(&client);
    // With `locker`, the handler locks the records' table from another connection once its
    // transaction is handed over, so that its completion's write waits there.
    let handler = |store: Arc<PostgresStore>, locker: Option<Arc<deadpool_postgres::Object>>| {
        tower::service_fn(move |request: Request<Body>| {
            let store = Arc::clone(&store);
            let locker = locker.clone();
            async move {
                let ctx = context(&request);
                let tx = store.transaction(&ctx).await.expect("a transaction");
                let second = store.transaction(&ctx).await;
                assert!(
                    matches!(second, Err(idem_tower::PostgresStoreError::TransactionOpen)),
                    "a second transaction while the first runs"
                );
                drop(second);
                tx.client()
                    .execute("INSERT INTO orders (idem_key) VALUES ($1)", &[&ctx.key()])
                    .await
                    .expect("the insert");
                tx.commit_with_completion();
                let third = store.transaction(&ctx).await;
                assert!(
                    matches!(third, Err(idem_tower::PostgresStoreError::TransactionOpen)),
                    "a second transaction once the first is handed over"
                );
                drop(third);
                if let Some(locker) = locker {
                    locker
                        .batch_execute("BEGIN; LOCK TABLE idem_records IN EXCLUSIVE MODE")
                        .await
                        .expect("the lock");
                }
                let mut r = Response::new(Full::new(Bytes::from("ordered")));
                *r.status_mut() = StatusCode::CREATED;
                Ok::<_, Infallible>(r)
            }
        })
    };
    let layer = IdempotencyLayer::builder(Arc::clone(&store))
        .single_tenant()
        .build()
        .unwrap();
    let (status, _) = send(layer.layer(handler(Arc::clone(&store), None)), "one").await;
    assert_eq!(status, 201);
    assert_eq!(count("one").await, 1);
    assert_eq!(left_open().await, 0);

    let cancelling = IdempotencyLayer::builder(Arc::new(CancelledCompletion(Arc::clone(&store))))
        .single_tenant()
        .build()
        .unwrap();
    let locker = Arc::new(store.pool().get().await.expect("a connection"));
    let _ = send(
        cancelling.layer(handler(Arc::clone(&store), Some(Arc::clone(&locker)))),
        "dropped",
    )
    .await;
    // The completion was given up waiting; its write goes through once the lock is gone.
    locker.batch_execute("ROLLBACK").await.expect("the unlock");
    assert_eq!(
        left_open().await,
        0,
        "a connection went back to the pool in its transaction"
    );
    assert_eq!(count("dropped").await, 0);

    // A transaction asked for once the request is over (from a task the handler left
    // behind) is refused: no completion would ever commit or end it.
    let (tell, told) = tokio::sync::oneshot::channel();
    let tell = Arc::new(std::sync::Mutex::new(Some(tell)));
    let pg = Arc::clone(&store);
    let late = layer.layer(tower::service_fn(move |request: Request<Body>| {
        let (store, tell) = (Arc::clone(&pg), Arc::clone(&tell));
        async move {
            let ctx = context(&request);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let refused = store.transaction(&ctx).await;
                let over = matches!(refused, Err(idem_tower::PostgresStoreError::RequestOver));
                if let Some(tell) = tell.lock().unwrap().take() {
                    let _ = tell.send(over);
                }
            });
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("answered"))))
        }
    }));
    assert_eq!(send(late, "late").await.0, 200);
    assert!(
        told.await.expect("the task's answer"),
        "a transaction after the request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_that_fails_to_commit_answers_503_not_the_handlers_response() {
    // IDEM-STORE-7 IDEM-OUT-5: the handler's rows are checked at COMMIT (a deferred foreign
    // key) and refused there: its 201 describes an order that does not exist, so it does not
    // go out.
    let server = common::postgres();
    let store = Arc::new(PostgresStore::connect(&server.url, 8).expect("a pool"));
    store.migrate().await.expect("the migration");
    let client = store.pool().get().await.expect("a connection");
    client
        .batch_execute(
            "CREATE TABLE customers (id bigint PRIMARY KEY);
             CREATE TABLE orders (id bigserial PRIMARY KEY, customer bigint NOT NULL
                 REFERENCES customers DEFERRABLE INITIALLY DEFERRED)",
        )
        .await
        .unwrap();
    let pg = Arc::clone(&store);
    let layer = IdempotencyLayer::builder(Arc::clone(&store))
        .single_tenant()
        .build()
        .unwrap();
    let service = layer.layer(tower::service_fn(move |request: Request<Body>| {
        let store = Arc::clone(&pg);
        async move {
            let ctx = context(&request);
            let tx = store.transaction(&ctx).await.expect("a transaction");
            // A customer that does not exist: accepted now, refused at COMMIT.
            tx.client()
                .execute("INSERT INTO orders (customer) VALUES (42)", &[])
                .await
                .expect("the insert");
            tx.commit_with_completion();
            let mut r = Response::new(Full::new(Bytes::from("order for customer 42")));
            *r.status_mut() = StatusCode::CREATED;
            Ok::<_, Infallible>(r)
        }
    }));
    let (status, body) = send(service, "ghost").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("urn:idem:problem:store-unavailable"),
        "{body}"
    );
    let orders: i64 = client
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orders, 0);
}
