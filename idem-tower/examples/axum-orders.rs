//! An orders API on axum with Idempotency-Key semantics: `POST /orders` is protected.
//!
//! ```sh
//! cargo run -p idem-tower --example axum-orders          # listens on 127.0.0.1:3000
//! curl -i -X POST localhost:3000/orders -H 'x-account-id: acct_1' \
//!      -H 'idempotency-key: "order-1"' -H 'content-type: application/json' -d '{"amount":4200}'
//! ```
//!
//! Send the same request twice: the second answer is the first one replayed, with
//! `Idempotent-Replayed: true`, and the order is created once. Change the body under the
//! same key: 422. Leave the key out: 400. All refusals are `application/problem+json`.
//! Ask what became of a key with a `GET` and `Idempotency-Status: POST` (add `; settle` to
//! settle a key the server never saw, so that it never runs). `GET /count` says how many
//! orders were created, so that the conformance suite can count executions:
//!
//! ```sh
//! idem-conformance run http://127.0.0.1:3000/orders --count-url /count \
//!     -H 'x-account-id: acct_1' --second-credential 'x-account-id: acct_2'
//! ```

use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use idem_tower::{IdempotencyContext, IdempotencyLayer, MemoryStore};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[tokio::main]
async fn main() {
    let next_id = Arc::new(AtomicU64::new(1));
    let created = Arc::clone(&next_id);
    // The lines a service adds: the layer, with a store and who sends each request.
    let idempotency = IdempotencyLayer::builder(MemoryStore::default())
        .principal(|parts| {
            parts
                .headers
                .get("x-account-id")?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .build()
        .expect("a principal is set");
    let app = Router::new()
        .route(
            "/orders",
            post(move |Extension(ctx): Extension<IdempotencyContext>, Json(order): Json<serde_json::Value>| {
                let next_id = Arc::clone(&next_id);
                async move {
                    let id = next_id.fetch_add(1, Ordering::SeqCst);
                    // ctx.recovered() says whether an earlier attempt may have done part of
                    // this; ctx.fence() orders attempts for resources that check it.
                    let body = serde_json::json!({ "id": id, "order": order, "recovered": ctx.recovered() });
                    (axum::http::StatusCode::CREATED, Json(body))
                }
            }),
        )
        .layer(idempotency)
        .route(
            "/count",
            get(move || async move { (created.load(Ordering::SeqCst) - 1).to_string() }),
        );
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .expect("the address is free");
    let addr = listener.local_addr().expect("a bound address");
    println!("orders API on http://{addr}");
    axum::serve(listener, app).await.expect("the server runs");
}
