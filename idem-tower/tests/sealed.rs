//! Sealed records (IDEM-SEAL-1..3) through the layer, in a memory store and on private
//! Redis and Postgres servers: nothing of a response is stored in clear, keys rotate, and a
//! record that cannot be opened (its key dropped, or moved from another key) is answered 500
//! `record-sealed` without running the handler.
#![cfg(feature = "seal")]

#[cfg(all(feature = "redis", feature = "postgres"))]
mod common;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::AsyncStore;
use idem_tower::{IdempotencyLayer, MemoryStore, Seal};
#[cfg(all(feature = "redis", feature = "postgres"))]
use idem_tower::{PostgresStore, RedisStore};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tower::{Layer, ServiceExt};

/// What the handler answers: personal data, as an order's response carries.
const SECRET: &str = "Ada Lovelace, 12 St James's Square";

fn seal(keys: &[(&str, u8)]) -> Seal {
    Seal::new(keys.iter().map(|(id, byte)| (*id, [*byte; 32]))).expect("valid keys")
}

/// Posts an order with `key` through the layer on `store`; the handler counts its runs.
async fn post<St>(store: St, runs: &Arc<AtomicU64>, key: &str) -> (u16, String)
where
    St: AsyncStore + Send + Sync + 'static,
    St::Error: std::fmt::Display,
{
    let layer = IdempotencyLayer::builder(store)
        .single_tenant()
        .build()
        .expect("a layer");
    let runs = Arc::clone(runs);
    let handler = tower::service_fn(move |_request: Request<_>| {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut r = Response::new(Full::new(Bytes::from(format!(
                "{{\"order\":{n},\"ship_to\":\"{SECRET}\"}}"
            ))));
            *r.status_mut() = StatusCode::CREATED;
            r.headers_mut()
                .insert("x-card-last4", http::HeaderValue::from_static("card-4242"));
            Ok::<_, Infallible>(r)
        }
    });
    let request = Request::post("/orders")
        .header("idempotency-key", format!("\"{key}\""))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"sku\":\"pen\"}")))
        .unwrap();
    let r = layer
        .layer(handler)
        .oneshot(request)
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

/// Whether `needle` appears in any of `values`.
fn in_clear(values: &[Vec<u8>], needle: &str) -> bool {
    values
        .iter()
        .any(|v| v.windows(needle.len()).any(|w| w == needle.as_bytes()))
}

/// Every value under every key of a Redis database: a dump, as an operator would take it.
#[cfg(all(feature = "redis", feature = "postgres"))]
async fn redis_dump(url: &str) -> Vec<Vec<u8>> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut values = Vec::new();
    for key in keys {
        let fields: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        for (field, value) in fields {
            values.push(field.into_bytes());
            values.push(value);
        }
        values.push(key.into_bytes());
    }
    values
}

fn problem_type(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).expect("problem+json")["type"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

#[cfg(all(feature = "redis", feature = "postgres"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_only_sealed_records_that_rotate_and_refuse_to_move() {
    let server = common::redis();
    let runs = Arc::new(AtomicU64::new(0));
    let store = |keys: &[(&str, u8)]| {
        let url = server.url.clone();
        let seal = seal(keys);
        async move {
            RedisStore::connect(&url)
                .await
                .expect("redis")
                .with_seal(seal)
        }
    };

    // IDEM-SEAL-1: answered and replayed, with nothing of it in clear in Redis.
    let (status, first) = post(store(&[("2026-05", 1)]).await, &runs, "a").await;
    assert_eq!(status, 201, "{first}");
    assert!(first.contains(SECRET));
    let (status, again) = post(store(&[("2026-05", 1)]).await, &runs, "a").await;
    assert_eq!((status, &again), (201, &first));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let dump = redis_dump(&server.url).await;
    assert!(!dump.is_empty());
    for clear in [SECRET, "card-4242", "x-card-last4", "pen"] {
        assert!(!in_clear(&dump, clear), "{clear:?} is stored in clear");
    }

    // IDEM-SEAL-2: rotated, the old record still replays; new ones are sealed by the new key.
    let rotated = || store(&[("2026-11", 2), ("2026-05", 1)]);
    assert_eq!(post(rotated().await, &runs, "a").await.1, first);
    let (status, b) = post(rotated().await, &runs, "b").await;
    assert_eq!(status, 201);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // IDEM-SEAL-3: the old key dropped, its record is refused, never run again; the new
    // key's record replays.
    let (status, refused) = post(store(&[("2026-11", 2)]).await, &runs, "a").await;
    assert_eq!(status, 500, "{refused}");
    assert_eq!(problem_type(&refused), "urn:idem:problem:record-sealed");
    assert_eq!(post(store(&[("2026-11", 2)]).await, &runs, "b").await.1, b);
    // A store with no keys at all refuses it too.
    let bare = RedisStore::connect(&server.url).await.expect("redis");
    let (status, refused) = post(bare, &runs, "b").await;
    assert_eq!(
        (status, problem_type(&refused).as_str()),
        (500, "urn:idem:problem:record-sealed")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A sealed record copied under another key does not open there: "c" is refused, not
    // answered with "b"'s response, and not run.
    let client = redis::Client::open(server.url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let probe = store(&[("2026-11", 2)]).await;
    let scope = idem_core::Policy::new(idem_core::Engine::default())
        .scope(None, "POST", "/orders")
        .unwrap();
    let [from, _] = probe.redis_keys(&idem_core::RecordKey::new(scope.clone(), "b"));
    let [to, _] = probe.redis_keys(&idem_core::RecordKey::new(scope, "c"));
    let _: () = redis::cmd("COPY")
        .arg(&from)
        .arg(&to)
        .query_async(&mut conn)
        .await
        .unwrap();
    let (status, refused) = post(probe, &runs, "c").await;
    assert_eq!(
        (status, problem_type(&refused).as_str()),
        (500, "urn:idem:problem:record-sealed")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[cfg(all(feature = "redis", feature = "postgres"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_only_sealed_rows_that_rotate_and_refuse_to_move() {
    let server = common::postgres();
    let runs = Arc::new(AtomicU64::new(0));
    let store = |keys: &[(&str, u8)]| {
        PostgresStore::connect(&server.url, 4)
            .expect("a pool")
            .with_seal(seal(keys))
    };
    store(&[("k", 0)]).migrate().await.expect("the migration");

    let (status, first) = post(store(&[("2026-05", 1)]), &runs, "a").await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(post(store(&[("2026-05", 1)]), &runs, "a").await.1, first);
    let raw = PostgresStore::connect(&server.url, 1).expect("a pool");
    let client = raw.pool().get().await.unwrap();
    let rows = client
        .query("SELECT key, version, value FROM idem_records", &[])
        .await
        .unwrap();
    let dump: Vec<Vec<u8>> = rows.iter().map(|r| r.get::<_, Vec<u8>>(2)).collect();
    assert_eq!(dump.len(), 1);
    assert!(dump[0].starts_with(b"iS\x01\x072026-05"));
    for clear in [SECRET, "card-4242", "x-card-last4", "pen"] {
        assert!(!in_clear(&dump, clear), "{clear:?} is stored in clear");
    }

    let rotated = || store(&[("2026-11", 2), ("2026-05", 1)]);
    assert_eq!(post(rotated(), &runs, "a").await.1, first);
    let (status, b) = post(rotated(), &runs, "b").await;
    assert_eq!(status, 201);
    let (status, refused) = post(store(&[("2026-11", 2)]), &runs, "a").await;
    assert_eq!(
        (status, problem_type(&refused).as_str()),
        (500, "urn:idem:problem:record-sealed")
    );
    assert_eq!(post(store(&[("2026-11", 2)]), &runs, "b").await.1, b);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // "b"'s row copied onto a row for "c": refused there, not replayed, not run.
    let scope = idem_core::Policy::new(idem_core::Engine::default())
        .scope(None, "POST", "/orders")
        .unwrap();
    let [from, to] = ["b", "c"].map(|k| idem_core::RecordKey::new(scope.clone(), k).storage_key());
    let copied = client
        .execute(
            "INSERT INTO idem_records (key, version, value, deadline, expires)
             SELECT $2, version, value, deadline, expires FROM idem_records WHERE key = $1",
            &[&from, &to],
        )
        .await
        .unwrap();
    assert_eq!(copied, 1);
    let (status, refused) = post(store(&[("2026-11", 2)]), &runs, "c").await;
    assert_eq!(
        (status, problem_type(&refused).as_str()),
        (500, "urn:idem:problem:record-sealed")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    // A sweep that cannot open a due record defers it to when it need no longer be kept, so
    // that it does not stand in front of the records behind it, and deletes it then.
    let other = PostgresStore::connect(&server.url, 1)
        .expect("a pool")
        .with_seal(seal(&[("other", 9)]));
    let day = 24 * 3600 * 1000;
    let now = idem_core::UnixMillis::now().0;
    let due = |at: u64| {
        let client = &client;
        async move {
            client
                .query_one(
                    "SELECT count(*) FROM idem_records WHERE deadline <= $1",
                    &[&(at as i64)],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    assert_eq!(
        due(now + day + 60_000).await,
        3,
        "the responses' retention has ended"
    );
    let swept = other
        .sweep(idem_core::UnixMillis(now + day + 60_000), 2)
        .await;
    assert_eq!(swept.unwrap(), 0, "nothing it cannot read is changed early");
    assert_eq!(
        due(now + day + 60_000).await,
        1,
        "the two it read are out of the way"
    );
    other
        .sweep(idem_core::UnixMillis(now + day + 60_000), 2)
        .await
        .unwrap();
    assert_eq!(due(now + day + 60_000).await, 0);
    let late = idem_core::UnixMillis(now + 8 * day);
    assert_eq!(
        other.sweep(late, 100).await.unwrap(),
        3,
        "deleted once the keys expired"
    );
    let left: i64 = client
        .query_one("SELECT count(*) FROM idem_records", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
}

/// One memory store behind several layers, as one process's routes share it.
#[derive(Clone)]
struct Shared(Arc<MemoryStore>);

impl AsyncStore for Shared {
    type Error = <MemoryStore as AsyncStore>::Error;

    fn load(
        &self,
        key: &idem_core::RecordKey,
    ) -> impl std::future::Future<Output = Result<Option<idem_core::Record>, Self::Error>> + Send
    {
        self.0.load(key)
    }

    fn apply(
        &self,
        now: idem_core::UnixMillis,
        write: idem_core::Write,
    ) -> impl std::future::Future<Output = Result<idem_core::Applied, Self::Error>> + Send {
        self.0.apply(now, write)
    }

    fn failure(error: &Self::Error) -> idem_core::StoreFailure {
        MemoryStore::failure(error)
    }
}

/// The record key of the Idempotency-Key `key` on `POST /orders`.
fn order_key(key: &str) -> idem_core::RecordKey {
    let scope = idem_core::Policy::new(idem_core::Engine::default())
        .scope(None, "POST", "/orders")
        .unwrap();
    idem_core::RecordKey::new(scope, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_keeps_only_sealed_records_that_rotate() {
    let runs = Arc::new(AtomicU64::new(0));
    let store = Shared(Arc::new(
        MemoryStore::default().with_seal(seal(&[("2026-05", 1)])),
    ));

    // IDEM-SEAL-1: answered and replayed, with nothing of it in clear in the store; the
    // same record in a store without a seal shows all of it.
    let (status, first) = post(store.clone(), &runs, "a").await;
    assert_eq!(status, 201, "{first}");
    assert!(first.contains(SECRET));
    let (status, again) = post(store.clone(), &runs, "a").await;
    assert_eq!((status, &again), (201, &first));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let held = store.0.stored(&order_key("a")).expect("the record");
    assert!(held.starts_with(b"iS\x01\x072026-05"));
    for clear in [SECRET, "card-4242", "x-card-last4", "pen"] {
        assert!(
            !in_clear(std::slice::from_ref(&held), clear),
            "{clear:?} is held in clear"
        );
    }
    let clear = Shared(Arc::new(MemoryStore::default()));
    assert_eq!(post(clear.clone(), &runs, "a").await.0, 201);
    let unsealed = clear.0.stored(&order_key("a")).expect("the record");
    assert!(in_clear(&[unsealed], SECRET) && in_clear(&[held], "2026-05"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // IDEM-SEAL-2: the keys rotated while it runs, the old record still replays; new ones
    // are sealed by the new key.
    assert!(store
        .0
        .replace_seal(seal(&[("2026-11", 2), ("2026-05", 1)])));
    assert_eq!(post(store.clone(), &runs, "a").await.1, first);
    let (status, b) = post(store.clone(), &runs, "b").await;
    assert_eq!(status, 201);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let held = store.0.stored(&order_key("b")).expect("the record");
    assert!(held.starts_with(b"iS\x01\x072026-11"));

    // IDEM-SEAL-3: the old key dropped, its record is refused and never run again; the new
    // key's record replays.
    assert!(store.0.replace_seal(seal(&[("2026-11", 2)])));
    let (status, refused) = post(store.clone(), &runs, "a").await;
    assert_eq!(status, 500, "{refused}");
    assert_eq!(problem_type(&refused), "urn:idem:problem:record-sealed");
    assert_eq!(post(store.clone(), &runs, "b").await.1, b);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    // A store made without a seal has none to replace.
    assert!(!clear.0.replace_seal(seal(&[("k", 3)])));
}

#[tokio::test]
async fn a_sealed_memory_store_expires_and_fills_up_without_opening_records() {
    use idem_core::{
        Applied, Fingerprint, Precondition, Record, RecordState, StoredResponse, UnixMillis, Write,
        WriteOp,
    };
    let completed = |key: &str| Write {
        key: order_key(key),
        precondition: Precondition::Absent,
        op: WriteOp::Put(Record {
            version: 1,
            fence: 1,
            fingerprint: Fingerprint::from_digest([1; 32]),
            created: UnixMillis(1_000),
            key_expires: UnixMillis(9_000),
            state: RecordState::Completed {
                response: Arc::new(StoredResponse {
                    status: 201,
                    headers: vec![],
                    body: SECRET.as_bytes().to_vec(),
                }),
                response_expires: UnixMillis(5_000),
            },
        }),
    };
    let limits = idem_core::MemoryStoreLimits {
        max_entries: 1,
        ..Default::default()
    };
    // The keys it was sealed with are gone: expiry works on the sealed bytes all the same.
    let store = MemoryStore::new(limits).with_seal(seal(&[("old", 1)]));
    let now = UnixMillis(1_000);
    assert_eq!(
        store.apply(now, completed("x")).await.unwrap(),
        Applied::Applied
    );
    let full = store.apply(now, completed("y")).await.unwrap_err();
    assert_eq!(MemoryStore::failure(&full), idem_core::StoreFailure::Full);
    let whole = store.stored(&order_key("x")).unwrap();
    assert!(store.replace_seal(seal(&[("new", 2)])));
    let unopened = store.load(&order_key("x")).await.unwrap_err();
    assert_eq!(
        MemoryStore::failure(&unopened),
        idem_core::StoreFailure::Sealed
    );
    assert_eq!(store.sweep(UnixMillis(4_999)), 0);
    // IDEM-STORE-9: once the response expired, its sealed bytes are gone; the tombstone
    // stays until the key expires.
    assert_eq!(store.sweep(UnixMillis(5_000)), 1);
    let tombstone = store.stored(&order_key("x")).unwrap();
    assert!(tombstone.len() + SECRET.len() <= whole.len());
    assert!(store.replace_seal(seal(&[("old", 1)])));
    let record = store.load(&order_key("x")).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Tombstone);
    assert_eq!(store.sweep(UnixMillis(9_000)), 1);
    assert!(store.is_empty());
    assert_eq!(
        store.apply(now, completed("y")).await.unwrap(),
        Applied::Applied
    );
}
