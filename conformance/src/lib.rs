//! idem-conformance: a conformance suite for `Idempotency-Key` servers, and the reference
//! server it is proven against.
//!
//! * [`suite`] runs the [`cases`] against a [`suite::Target`] and produces a
//!   [`suite::Report`]; [`report`] renders it for a terminal, as JSON and as JUnit XML,
//!   and [`html`] as a static site, after [`secrets`] has taken every credential out of it.
//! * [`server`] is the reference server: an axum app with idem-tower's layer on a memory,
//!   Redis or Postgres store, behind a real HTTP/1.1 server, with deliberate
//!   [`server::Fault`]s, made around the layer, that the suite must catch.
//! * [`embedded`] starts the reference servers of a run without a URL and lays the cases
//!   out in lanes, one per key kind and one per case that waits for the server's clock.
//! * [`http`] is the harness's bounded HTTP layer; [`mod@bench`] measures the reference server.
//! * [`openapi`] turns the operations of an OpenAPI document into targets.
//! * [`cli`] is the command line (`run`, `openapi`, `serve`, `bench`).
//!
//! Every case cites a requirement of `spec/requirements.toml` and takes its level and
//! sentence from there.

pub mod bench;
pub mod cases;
pub mod cli;
pub mod embedded;
pub mod html;
pub mod http;
pub mod openapi;
pub mod report;
pub mod secrets;
pub mod server;
pub mod store;
pub mod suite;
pub mod tls;
