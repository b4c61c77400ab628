//! Idempotency-Key semantics for Rust HTTP services: a [`tower_layer::Layer`] over `http`
//! types that drives [idem-core](idem_core)'s request machine, so that every guarded request
//! (POST and PATCH by default) is safe to retry.
//!
//! ```no_run
//! # async fn run() {
//! use axum::{routing::post, Router};
//! use idem_tower::{IdempotencyLayer, MemoryStore};
//!
//! let idempotency = IdempotencyLayer::builder(MemoryStore::default())
//!     .principal(|parts| parts.headers.get("x-account-id")?.to_str().ok().map(str::to_owned))
//!     .build()
//!     .expect("a principal is set");
//! let app: Router = Router::new()
//!     .route("/orders", post(|| async { "created" }))
//!     .layer(idempotency);
//! # let _ = app;
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
//! * collects the handler's response and stores it **before** returning it.
//!
//! Every decision and every reply comes from idem-core: this crate only moves data between
//! the request machine, the store and the inner service. The guarded work runs in a task of
//! its own, so a client that goes away cannot cancel a handler half-way or the write of its
//! outcome.
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
mod service;
#[cfg(feature = "store-tests")]
pub mod store_tests;

pub use body::{read_body, render, BoxError, InnerBody, OuterBody};
pub use context::{IdempotencyContext, LeaseError};
pub use future::ResponseFuture;
pub use idem_core;
pub use layer::{BuildError, Builder, IdempotencyLayer};
pub use memory::MemoryStore;
pub use operation::{answer, deliver, Delivered};
#[cfg(feature = "postgres")]
pub use postgres_store::{PostgresStore, PostgresStoreError, Transaction};
#[cfg(feature = "redis")]
pub use redis_store::{RedisStore, RedisStoreError};
pub use service::Idempotent;
