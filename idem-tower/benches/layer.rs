//! The layer's own cost per request: a no-op handler (it answers 201 with a small JSON body)
//! called directly, and through the layer on the memory store, in one run. Fresh keys grow
//! the store with every iteration; replays repeat one completed key. No HTTP: the numbers
//! are the layer's (buffering, fingerprint, claim, completion, replay rendering) and the
//! task it runs a guarded request in.
//!
//! `cargo bench -p idem-tower --bench layer`

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use idem_tower::{IdempotencyLayer, InnerBody, MemoryStore};
use std::convert::Infallible;
use std::hint::black_box;
use std::time::Instant;
use tower::{Layer, Service, ServiceExt};

const BODY: &[u8] = br#"{"amount":4200,"currency":"eur","customer":{"id":"cus_1","tier":"gold"},"items":[{"sku":"a","qty":2},{"sku":"b","qty":1}]}"#;

fn request(key: &str) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .header("x-account-id", "acct_1")
        .body(Full::new(Bytes::from_static(BODY)))
        .expect("a request")
}

async fn noop<B>(_request: Request<B>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut r = Response::new(Full::new(Bytes::from_static(br#"{"id":"ord_1"}"#)));
    *r.status_mut() = http::StatusCode::CREATED;
    Ok(r)
}

fn bench(c: &mut Criterion) {
    // One thread: the task the layer spawns runs on the thread that awaits it, so the rows
    // measure work, not wake-ups across threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let layer = IdempotencyLayer::builder(MemoryStore::default())
        .principal(|parts| {
            parts
                .headers
                .get("x-account-id")?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .build()
        .expect("a principal");
    let plain = tower::service_fn(noop::<Full<Bytes>>);
    let guarded = layer.layer(tower::service_fn(noop::<InnerBody<Full<Bytes>>>));
    let mut group = c.benchmark_group("layer");
    group.bench_function("no-op handler alone", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let r = plain
                        .oneshot(request("\"k\""))
                        .await
                        .unwrap_or_else(|e| match e {});
                    black_box(r.into_body().collect().await.map(|c| c.to_bytes()).ok());
                }
                start.elapsed()
            })
        })
    });
    let mut n = 0u64;
    group.bench_function("no-op handler through the layer, fresh key", |b| {
        b.iter_custom(|iters| {
            let keys: Vec<String> = (0..iters)
                .map(|_| {
                    n += 1;
                    format!("\"fresh-{n}\"")
                })
                .collect();
            runtime.block_on(async {
                let start = Instant::now();
                for key in &keys {
                    let mut service = guarded.clone();
                    let r = service
                        .call(request(key))
                        .await
                        .unwrap_or_else(|e| match e {});
                    black_box(r.into_body().collect().await.map(|c| c.to_bytes()).ok());
                }
                start.elapsed()
            })
        })
    });
    runtime.block_on(async {
        let mut service = guarded.clone();
        let _ = service.call(request("\"replayed\"")).await;
    });
    group.bench_function("no-op handler through the layer, replay", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let mut service = guarded.clone();
                    let r = service
                        .call(request("\"replayed\""))
                        .await
                        .unwrap_or_else(|e| match e {});
                    black_box(r.into_body().collect().await.map(|c| c.to_bytes()).ok());
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
