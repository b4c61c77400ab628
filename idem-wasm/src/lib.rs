//! WASM bindings of idem-core.
