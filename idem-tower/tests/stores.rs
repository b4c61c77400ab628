//! The store test kit (`store_tests`: IDEM-STORE-1, IDEM-STORE-3, IDEM-STORE-4, IDEM-STORE-5,
//! IDEM-STORE-6, IDEM-TTL-1..4, IDEM-LEASE-4) against every store of this crate: the
//! MemoryStore, and RedisStore and PostgresStore on private servers, each also sealed.
#![cfg(all(feature = "redis", feature = "postgres", feature = "store-tests"))]

mod common;

use idem_tower::store_tests::{run_all, Options};
use idem_tower::{MemoryStore, PostgresStore, RedisStore, Seal};

/// The seal of the sealed runs (IDEM-SEAL-1): every rule holds on sealed records too.
fn seal() -> Seal {
    Seal::new([("kit", [5u8; 32])]).expect("a key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_keeps_the_rules() {
    // One process: two stores share nothing.
    run_all(
        || async { MemoryStore::default() },
        Options {
            shared: false,
            ..Options::default()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sealed_memory_store_keeps_the_rules() {
    run_all(
        || async { MemoryStore::default().with_seal(seal()) },
        Options {
            shared: false,
            ..Options::default()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_store_keeps_the_rules() {
    let server = common::redis();
    let url = server.url.clone();
    run_all(
        // Each store has its own connection: the racing writes interleave in the server.
        || {
            let url = url.clone();
            async move { RedisStore::connect(&url).await.expect("redis") }
        },
        Options {
            self_expiring: true,
            ..Options::default()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sealed_redis_store_keeps_the_rules() {
    let server = common::redis();
    let url = server.url.clone();
    run_all(
        || {
            let url = url.clone();
            async move {
                RedisStore::connect(&url)
                    .await
                    .expect("redis")
                    .with_seal(seal())
            }
        },
        Options {
            self_expiring: true,
            ..Options::default()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sealed_postgres_store_keeps_the_rules() {
    let server = common::postgres();
    PostgresStore::connect(&server.url, 2)
        .expect("a pool")
        .migrate()
        .await
        .expect("the migration");
    let url = server.url.clone();
    run_all(
        || {
            let url = url.clone();
            async move {
                PostgresStore::connect(&url, 16)
                    .expect("a pool")
                    .with_seal(seal())
            }
        },
        Options::default(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_keeps_the_rules() {
    let server = common::postgres();
    PostgresStore::connect(&server.url, 2)
        .expect("a pool")
        .migrate()
        .await
        .expect("the migration");
    let url = server.url.clone();
    run_all(
        // Each store has its own pool: the racing writes come over separate connections.
        || {
            let url = url.clone();
            async move { PostgresStore::connect(&url, 16).expect("a pool") }
        },
        Options::default(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_records_are_hash_tagged_hashes_with_the_keys_retention_as_ttl() {
    // IDEM-STORE-6: the time-to-live is the record's retention, not its response's expiry.
    use idem_core::{AsyncStore, Engine, Policy, RecordKey};
    let server = common::redis();
    let store = RedisStore::connect(&server.url)
        .await
        .expect("redis")
        .with_prefix("app:");
    let scope = Policy::new(Engine::default())
        .scope(None, "POST", "/orders")
        .expect("a scope");
    let key = RecordKey::new(scope, "k1");
    let [record, response] = store.redis_keys(&key);
    assert_eq!(record, format!("app:{{{}}}", key.storage_key()));
    assert_eq!(response, format!("app:{{{}}}:response", key.storage_key()));
    let write = idem_tower::store_tests::claims("k1", 1).remove(0);
    assert_eq!(write.key, key);
    assert_eq!(
        store
            .apply(idem_core::UnixMillis::now(), write)
            .await
            .expect("apply"),
        idem_core::Applied::Applied
    );
    let client = redis::Client::open(server.url.as_str()).expect("a client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&record)
        .query_async(&mut conn)
        .await
        .expect("pttl");
    // The claim's retention is the key's: 7 days by default, far beyond a lease or a response.
    assert!(ttl > 6 * 86_400_000, "pttl {ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holds_no_response_bytes_once_the_response_expired() {
    // IDEM-STORE-9: after the response retention, the response's bytes are gone from Redis
    // (not kept until the key's retention ends), while the key still answers 410.
    use bytes::Bytes;
    use http::Request;
    use http_body_util::{BodyExt, Full};
    use idem_core::{Config, Engine, Policy};
    use idem_tower::IdempotencyLayer;
    use std::time::Duration;
    use tower::{Layer, ServiceExt};
    let server = common::redis();
    let store = RedisStore::connect(&server.url).await.expect("redis");
    let engine = Engine::new(Config {
        response_ttl: Duration::from_millis(400),
        key_ttl: Duration::from_secs(3600),
        ..Config::default()
    })
    .expect("valid times");
    let layer = IdempotencyLayer::builder(store)
        .policy(Policy::new(engine))
        .single_tenant()
        .build()
        .unwrap();
    const SECRET: &str = "card ending 4242, Jane Doe, 1 Main St";
    let service = layer.layer(tower::service_fn(|_: Request<_>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from_static(
            SECRET.as_bytes(),
        ))))
    }));
    let post = || {
        Request::post("/orders")
            .header("idempotency-key", "\"k\"")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    let client = redis::Client::open(server.url.as_str()).expect("a client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let dump = |conn: &mut redis::aio::MultiplexedConnection| {
        let mut conn = conn.clone();
        async move {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*")
                .query_async(&mut conn)
                .await
                .unwrap();
            let mut all = Vec::new();
            for key in &keys {
                let fields: Vec<Vec<u8>> = redis::cmd("HGETALL")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                all.extend(fields.into_iter().flatten());
            }
            (keys.len(), String::from_utf8_lossy(&all).into_owned())
        }
    };
    let first = service.clone().oneshot(post()).await.unwrap();
    assert_eq!(first.status(), 200);
    let replay = service.clone().oneshot(post()).await.unwrap();
    assert_eq!(
        replay.into_body().collect().await.unwrap().to_bytes(),
        SECRET
    );
    assert!(
        dump(&mut conn).await.1.contains(SECRET),
        "kept while it is replayed"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (keys, contents) = dump(&mut conn).await;
    assert!(
        !contents.contains(SECRET),
        "the response's bytes are still in Redis after its retention ended"
    );
    assert_eq!(keys, 1, "the key's record stays");
    let late = service.oneshot(post()).await.unwrap();
    assert_eq!(late.status(), 410, "a late retry is refused, not run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_store_bounds_each_call_whatever_its_connection_allows() {
    // IDEM-STORE-10: on a connection made without a response timeout, a Redis that stops
    // answering still fails the call within the store's own bound.
    use idem_core::{AsyncStore, Engine, Policy, RecordKey};
    use std::time::{Duration, Instant};
    let server = common::redis();
    let client = redis::Client::open(server.url.as_str()).expect("a client");
    let conn = redis::aio::ConnectionManager::new(client)
        .await
        .expect("a connection");
    let store = RedisStore::new(conn).with_timeout(Duration::from_millis(300));
    let scope = Policy::new(Engine::default())
        .scope(None, "POST", "/orders")
        .expect("a scope");
    let key = RecordKey::new(scope, "k1");
    assert!(store.load(&key).await.expect("a load").is_none());
    server.pause();
    let since = Instant::now();
    let stalled = store.load(&key).await;
    let waited = since.elapsed();
    server.resume();
    assert!(
        matches!(stalled, Err(idem_tower::RedisStoreError::Timeout(_))),
        "{stalled:?}"
    );
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    // Redis answers again: so does the store.
    assert!(store.load(&key).await.expect("a load").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_at_maxmemory_is_a_full_store() {
    // IDEM-STORE-3: Redis at `maxmemory` under `noeviction` refuses writes; a new key is
    // refused 503 store-full (not store-unavailable), nothing runs, and a stored key replays.
    // A handler that was running meanwhile is recorded: a write to a record Redis holds
    // goes through.
    use bytes::Bytes;
    use http::Request;
    use http_body_util::{BodyExt, Full};
    use idem_tower::IdempotencyLayer;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tower::{Layer, ServiceExt};
    let server = common::redis();
    let store = RedisStore::connect(&server.url).await.expect("redis");
    let layer = IdempotencyLayer::builder(store)
        .single_tenant()
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    // The handler of /slow runs until the gate opens.
    let started = Arc::new(tokio::sync::Notify::new());
    let gate = Arc::new(tokio::sync::Notify::new());
    let (on_start, on_gate) = (Arc::clone(&started), Arc::clone(&gate));
    let service = layer.layer(tower::service_fn(move |request: Request<_>| {
        let id = counted.fetch_add(1, Ordering::SeqCst) + 1;
        let slow = request.uri().path() == "/slow";
        let (on_start, on_gate) = (Arc::clone(&on_start), Arc::clone(&on_gate));
        async move {
            if slow {
                on_start.notify_one();
                on_gate.notified().await;
            }
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(format!(
                "order {id}"
            )))))
        }
    }));
    let post_to = |path: &str, key: &str| {
        Request::post(path)
            .header("idempotency-key", format!("\"{key}\""))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    let post = |key: &str| {
        Request::post("/orders")
            .header("idempotency-key", format!("\"{key}\""))
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    assert_eq!(
        service
            .clone()
            .oneshot(post("before"))
            .await
            .unwrap()
            .status(),
        200
    );
    let during = tokio::spawn(service.clone().oneshot(post_to("/slow", "during")));
    started.notified().await;
    let client = redis::Client::open(server.url.as_str()).expect("a client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .unwrap();
    let used = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .expect("used_memory")
        .trim()
        .to_owned();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(&used)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: Result<(), _> = redis::cmd("SET")
        .arg("ballast")
        .arg(vec![b'x'; 64 * 1024])
        .query_async(&mut conn)
        .await;
    let refused = service.clone().oneshot(post("after")).await.unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:store-full");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let replay = service.clone().oneshot(post("before")).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    // The running handler's completion is taken, and its answer replays.
    gate.notify_one();
    let done = during.await.unwrap().unwrap();
    assert_eq!(done.status(), 200);
    let body = done.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"order 2");
    let again = service.oneshot(post_to("/slow", "during")).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let body = again.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"order 2");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_sweep_goes_past_a_record_it_cannot_read() {
    // IDEM-REC-1, IDEM-STORE-9: a due row that is not a record this version reads (damaged,
    // or a newer writer's format) is deferred as a sealed one is; the records due behind it
    // still expire.
    use bytes::Bytes;
    use http::Request;
    use http_body_util::Full;
    use idem_core::{Config, Engine, Policy, UnixMillis};
    use idem_tower::IdempotencyLayer;
    use std::time::Duration;
    use tower::{Layer, ServiceExt};
    let server = common::postgres();
    let store = std::sync::Arc::new(PostgresStore::connect(&server.url, 2).expect("a pool"));
    store.migrate().await.expect("the migration");
    let engine = Engine::new(Config {
        response_ttl: Duration::from_millis(1),
        key_ttl: Duration::from_secs(3600),
        ..Config::default()
    })
    .expect("valid times");
    let layer = IdempotencyLayer::builder(std::sync::Arc::clone(&store))
        .policy(Policy::new(engine))
        .single_tenant()
        .build()
        .unwrap();
    let service = layer.layer(tower::service_fn(|_: Request<_>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from_static(
            b"made",
        ))))
    }));
    for key in ["\"a\"", "\"b\""] {
        let post = Request::post("/orders")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        assert_eq!(service.clone().oneshot(post).await.unwrap().status(), 200);
    }
    let client = store.pool().get().await.expect("a connection");
    let now = UnixMillis::now().0 as i64;
    client
        .execute(
            "INSERT INTO idem_records (key, version, value, deadline, expires) VALUES ('damaged', '1', $1, 0, $2)",
            &[&vec![9u8, 9, 9], &(now + 3_600_000)],
        )
        .await
        .unwrap();
    let at = now + 60_000;
    let due = || async {
        client
            .query_one(
                "SELECT count(*) FROM idem_records WHERE deadline <= $1",
                &[&at],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    assert_eq!(due().await, 3);
    store
        .sweep(UnixMillis(at as u64), 100)
        .await
        .expect("the sweep goes on");
    assert_eq!(
        due().await,
        0,
        "the records behind it expired, and it waits for its own expiry"
    );
}

/// A PostgresStore whose first write finds its key inserted by another transaction, which
/// rolls back after `hold`: the write waits for it in Postgres, longer than a call may take,
/// and is applied when it ends.
struct HeldOnce {
    inner: PostgresStore,
    locker: std::sync::Arc<tokio_postgres::Client>,
    hold: std::time::Duration,
    held: std::sync::atomic::AtomicBool,
    released: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl idem_core::AsyncStore for HeldOnce {
    type Error = idem_tower::PostgresStoreError;

    fn load(
        &self,
        key: &idem_core::RecordKey,
    ) -> impl std::future::Future<Output = Result<Option<idem_core::Record>, Self::Error>> + Send
    {
        self.inner.load(key)
    }

    fn apply(
        &self,
        now: idem_core::UnixMillis,
        write: idem_core::Write,
    ) -> impl std::future::Future<Output = Result<idem_core::Applied, Self::Error>> + Send {
        let first = !self.held.swap(true, std::sync::atomic::Ordering::SeqCst);
        let locker = std::sync::Arc::clone(&self.locker);
        let hold = self.hold;
        let key = write.key.storage_key();
        async move {
            if first {
                locker.batch_execute("BEGIN").await.unwrap();
                locker
                    .execute(
                        "INSERT INTO idem_records (key, version, value, deadline, expires) VALUES ($1, 'other', ''::bytea, 0, 0)",
                        &[&key],
                    )
                    .await
                    .unwrap();
                let released = tokio::spawn(async move {
                    tokio::time::sleep(hold).await;
                    locker.batch_execute("ROLLBACK").await.unwrap();
                });
                *self.released.lock().unwrap() = Some(released);
            }
            self.inner.apply(now, write).await
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_claim_written_after_its_call_ran_out_of_time_is_withdrawn() {
    // IDEM-STORE-12: the claim's call runs out of time while its insert waits in Postgres;
    // the 503 goes out after the withdrawal, which is sent once Postgres has answered the
    // claim, and the retry then runs at once, as a first attempt, once.
    use bytes::Bytes;
    use http::Request;
    use http_body_util::{BodyExt, Full};
    use idem_tower::IdempotencyLayer;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use tower::{Layer, ServiceExt};
    let server = common::postgres();
    let inner = PostgresStore::connect(&server.url, 4)
        .expect("a pool")
        .with_timeout(Duration::from_millis(600));
    inner.migrate().await.expect("the migration");
    let (locker, connection) = tokio_postgres::connect(&server.url, tokio_postgres::NoTls)
        .await
        .expect("a connection");
    tokio::spawn(connection);
    let store = Arc::new(HeldOnce {
        inner,
        locker: Arc::new(locker),
        hold: Duration::from_millis(900),
        held: Default::default(),
        released: std::sync::Mutex::new(None),
    });
    let layer = IdempotencyLayer::builder(Arc::clone(&store))
        .single_tenant()
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let service = layer.layer(tower::service_fn(move |_: Request<_>| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(format!(
                "order {n}"
            )))))
        }
    }));
    let post = || {
        Request::post("/orders")
            .header("idempotency-key", "\"late\"")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    let refused = service.clone().oneshot(post()).await.unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let released = store.released.lock().unwrap().take().expect("held");
    released.await.unwrap();
    let retry = service.oneshot(post()).await.unwrap();
    assert_eq!(retry.status(), 200, "the late claim holds the key");
    let body = retry.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"order 1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
