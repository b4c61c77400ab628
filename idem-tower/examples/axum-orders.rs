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

use axum::http::{request::Parts, StatusCode};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use idem_tower::{IdempotencyContext, IdempotencyLayer, MemoryStore};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

static ORDERS: AtomicU64 = AtomicU64::new(0);

async fn create_order(
    Extension(ctx): Extension<IdempotencyContext>,
    Json(order): Json<Value>,
) -> (StatusCode, Json<Value>) {
    // Runs once per key. recovered: an earlier attempt's lease ended, and it may have done part.
    let id = ORDERS.fetch_add(1, SeqCst) + 1;
    let body = json!({ "id": id, "order": order, "recovered": ctx.recovered() });
    (StatusCode::CREATED, Json(body))
}

/// Who sends the request: each caller's keys are its own.
fn account(parts: &Parts) -> Option<String> {
    parts
        .headers
        .get("x-account-id")?
        .to_str()
        .ok()
        .map(str::to_owned)
}

#[tokio::main]
async fn main() {
    let idempotency = IdempotencyLayer::builder(MemoryStore::default())
        .principal(account)
        .build()
        .expect("a principal is set");
    let app = Router::new()
        .route("/orders", post(create_order))
        .layer(idempotency)
        // How many orders ran: the conformance suite's count oracle.
        .route("/count", get(|| async { ORDERS.load(SeqCst).to_string() }));
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("a free address");
    let addr = listener.local_addr().expect("a bound address");
    println!("orders API on http://{addr}");
    axum::serve(listener, app).await.expect("the server runs");
}
