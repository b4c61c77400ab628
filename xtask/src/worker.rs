//! The edge worker example (idem-wasm/examples/worker): its npm packages, and its tests under
//! a local workerd. Empty until the example exists.

/// Installs what the worker tests need.
pub(crate) fn setup() -> Result<(), String> {
    Ok(())
}

/// Runs the worker under workerd and tests it.
pub(crate) fn test() -> Result<(), String> {
    Ok(())
}
