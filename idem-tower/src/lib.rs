//! Idempotency-Key semantics for Rust HTTP services: a [`tower_layer::Layer`] over `http`
//! types that drives [idem-core](idem_core)'s request machine, so that every guarded request
//! (POST and PATCH by default) is safe to retry.
//!
//! ```
//! use axum::body::{to_bytes, Body};
//! use axum::http::Request;
//! use axum::{routing::post, Router};
//! use idem_tower::{IdempotencyLayer, MemoryStore};
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let idempotency = IdempotencyLayer::builder(MemoryStore::default())
//!     .principal(|parts| parts.headers.get("x-account-id")?.to_str().ok().map(str::to_owned))
//!     .build()
//!     .expect("a principal is set");
//!
//! let orders = Arc::new(AtomicUsize::new(0));
//! let counter = Arc::clone(&orders);
//! let create_order = move || async move {
//!     format!("order {}", counter.fetch_add(1, Ordering::SeqCst) + 1)
//! };
//! let app = Router::new()
//!     .route("/orders", post(create_order))
//!     .layer(idempotency);
//!
//! let order = || {
//!     Request::post("/orders")
//!         .header("idempotency-key", "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"")
//!         .header("x-account-id", "acct_1")
//!         .header("content-type", "application/json")
//!         .body(Body::from(r#"{"amount": 100}"#))
//!         .unwrap()
//! };
//! let first = app.clone().oneshot(order()).await.unwrap();
//! // The response is lost on the way back; the client sends the same request again.
//! let retry = app.clone().oneshot(order()).await.unwrap();
//!
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! let first = to_bytes(first.into_body(), usize::MAX).await.unwrap();
//! let retry = to_bytes(retry.into_body(), usize::MAX).await.unwrap();
//! assert_eq!(first, "order 1");
//! assert_eq!(retry, first);
//! assert_eq!(orders.load(Ordering::SeqCst), 1); // the handler ran once
//! # }
//! ```
//!
//! What the layer does for a guarded request:
//!
//! * reads the body up to the fingerprint's cap (413 `body-too-large` beyond), and takes the
//!   fingerprint from the method, target, chosen headers and body;
//! * claims the key in the store before the handler runs; a duplicate in flight gets 409
//!   with `Retry-After` (or waits, as the policy says), a changed payload 422, a retry of a
//!   completed request the stored response with `Idempotent-Replayed: true`;
//! * runs the handler with an [`IdempotencyContext`] in the request's extensions (the key,
//!   whether this attempt takes over from one whose lease ended, the fencing number, and a
//!   heartbeat);
//! * collects the handler's response and stores it **before** returning it; a body longer
//!   than the store keeps ([`Policy::with_max_response_bytes`](idem_core::Policy)) is held
//!   no further than that, recorded as `response-not-stored`, and then sent on as the
//!   handler produces it ([`PassOn`], `IDEM-STORE-5`).
//!
//! A `GET` with an `Idempotency-Status` field is a status query: the layer answers it from the
//! store with what became of the key (`IDEM-STATUS-1`), unless [`Builder::status_queries`]
//! turns that off.
//!
//! Every decision and every reply comes from idem-core: this crate only moves data between
//! the request machine, the store and the inner service. The guarded work runs in a task of
//! its own, so a client that goes away cannot cancel a handler half-way or the write of its
//! outcome.
//!
//! The layer ([`IdempotencyLayer`], made by a [`Builder`]) wraps a service in [`Idempotent`],
//! whose future is a [`ResponseFuture`]; the inner service gets an [`InnerBody`] and the layer
//! answers with an [`OuterBody`]. Endpoints a service serves beside the layer, on its store,
//! answer as the layer does with [`answer`], [`deliver`], [`read_body`] and [`render`].
#![forbid(unsafe_code)]

mod body;
mod context;
mod drive;
mod future;
mod layer;
mod memory;
mod operation;
#[cfg(feature = "postgres")]
mod postgres_store;
#[cfg(feature = "redis")]
mod redis_store;
#[cfg(feature = "seal")]
mod seal;
mod service;
mod status;
#[cfg(feature = "store-tests")]
pub mod store_tests;
mod telemetry;

pub use body::{read_body, render, BoxError, InnerBody, OuterBody, PassOn};
pub use context::{IdempotencyContext, LeaseError};
pub use future::ResponseFuture;
pub use idem_core;
pub use layer::{BuildError, Builder, IdempotencyLayer};
pub use memory::{MemoryStore, MemoryStoreError};
pub use operation::{answer, deliver, Delivered};
#[cfg(feature = "postgres")]
pub use postgres_store::{PostgresStore, PostgresStoreError, Transaction};
#[cfg(feature = "redis")]
pub use redis_store::{RedisStore, RedisStoreError};
#[cfg(feature = "seal")]
pub use seal::{Seal, Unreadable};
pub use service::Idempotent;
