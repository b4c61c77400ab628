//! idem-conformance: fires idempotency scenarios at any HTTP server.
fn main() {}
