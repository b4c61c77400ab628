//! Criterion benchmarks for idem-core (filled in below).
fn main() {}
