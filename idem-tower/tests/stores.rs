//! The store test kit (`store_tests`: IDEM-STORE-1, IDEM-STORE-3, IDEM-STORE-4, IDEM-STORE-5,
//! IDEM-STORE-6, IDEM-TTL-1..4, IDEM-LEASE-4) against every store of this crate: the
//! MemoryStore, and RedisStore and PostgresStore on private servers.
#![cfg(all(feature = "redis", feature = "postgres", feature = "store-tests"))]

mod common;

use idem_tower::store_tests::{run_all, Options};
use idem_tower::{MemoryStore, PostgresStore, RedisStore};

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
    assert_eq!(
        store.redis_key(&key),
        format!("app:{{{}}}", key.storage_key())
    );
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
        .arg(store.redis_key(&key))
        .query_async(&mut conn)
        .await
        .expect("pttl");
    // The claim's retention is the key's: 7 days by default, far beyond a lease or a response.
    assert!(ttl > 6 * 86_400_000, "pttl {ttl}");
}
