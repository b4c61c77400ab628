//! Inbox deliveries through idem-tower's `deliver`, on the in-process store and on a private
//! Redis: processed once, redeliveries acknowledged with the core's receipt, also after the
//! response retention (IDEM-INBOX-1), busy ones refused with Retry-After (IDEM-INBOX-2), and
//! a processing that fails delivered again as a recovery.

mod common;

use http_body_util::BodyExt;
use idem_core::{AsyncStore, Config, Delivery, Engine, Inbox, Message};
use idem_tower::{deliver, MemoryStore};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const EVENT: &str = r#"{"id":"evt_1","type":"payment.succeeded","amount":4200}"#;

fn message(id: &str) -> Message<'_> {
    Message {
        source: "payments",
        id,
        content_type: Some("application/json"),
        body: EVENT.as_bytes(),
    }
}

/// A 300 ms response retention and a key remembered for a minute.
fn inbox() -> Inbox {
    Inbox::new(
        Engine::new(Config {
            response_ttl: Duration::from_millis(300),
            key_ttl: Duration::from_secs(60),
            lease: Duration::from_millis(500),
            ..Config::default()
        })
        .expect("valid times"),
    )
}

async fn receipt(r: http::Response<http_body_util::Full<bytes::Bytes>>) -> (u16, String) {
    let status = r.status().as_u16();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

async fn deliveries<St>(store: St)
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    let inbox = inbox();
    let runs = AtomicUsize::new(0);
    let process = |_ctx: idem_core::Context| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<(), ()>(())
    };
    let first = deliver(&store, &inbox, &message("evt_1"), process)
        .await
        .unwrap();
    assert_eq!(first.delivery, Delivery::Processed { recovered: false });
    assert_eq!(
        receipt(first.receipt).await,
        (200, r#"{"outcome":"processed","received":true}"#.into())
    );
    // At once, and after the response retention while the id is remembered.
    for wait in [0, 600] {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let again = deliver(&store, &inbox, &message("evt_1"), process)
            .await
            .unwrap();
        assert_eq!(again.delivery, Delivery::Duplicate, "{wait} ms later");
        assert_eq!(receipt(again.receipt).await.0, 200);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A processing that fails: its error comes back, nothing is acknowledged, and the next
    // delivery runs it as a recovery.
    let failed = deliver(&store, &inbox, &message("evt_2"), |_| async {
        Err("ledger down")
    })
    .await;
    assert_eq!(failed.unwrap_err(), "ledger down");
    let recovered = deliver(&store, &inbox, &message("evt_2"), |ctx| async move {
        assert!(ctx.recovered);
        Ok::<(), ()>(())
    })
    .await
    .unwrap();
    assert_eq!(recovered.delivery, Delivery::Processed { recovered: true });

    // A delivery while another is processed is refused, so that the sender delivers it again.
    let (started, release) = (tokio::sync::Notify::new(), tokio::sync::Notify::new());
    let evt_3 = message("evt_3");
    let slow = deliver(&store, &inbox, &evt_3, |_| async {
        started.notify_one();
        release.notified().await;
        Ok::<(), ()>(())
    });
    let busy = async {
        started.notified().await;
        let busy = deliver(&store, &inbox, &message("evt_3"), process)
            .await
            .unwrap();
        release.notify_one();
        busy
    };
    let (slow, busy) = tokio::join!(slow, busy);
    assert_eq!(
        slow.unwrap().delivery,
        Delivery::Processed { recovered: false }
    );
    assert!(matches!(busy.delivery, Delivery::InProgress { .. }));
    assert!(busy.receipt.headers().contains_key("retry-after"));
    let (status, body) = receipt(busy.receipt).await;
    assert_eq!(status, 409);
    assert!(body.contains("urn:idem:problem:in-progress"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_on_the_memory_store() {
    deliveries(Arc::new(MemoryStore::default())).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_on_redis() {
    let server = common::redis();
    let store = idem_tower::RedisStore::connect(&server.url)
        .await
        .expect("redis");
    deliveries(store).await;
}
