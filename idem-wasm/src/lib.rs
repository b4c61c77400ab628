//! WASM bindings of idem-core: the engine of the `idem` npm package.
//!
//! This layer has no idempotency logic of its own: each request is idem-core's request
//! machine ([`idem_core::Request`]) in a numbered slot ([`host`]); JavaScript polls it for the
//! next step, performs it, and reports back. Each method converts its JavaScript arguments
//! ([`interop`]), calls idem-core, and converts the answer back. Time and random values come
//! from JavaScript. Errors are real JavaScript errors (`RangeError` for bad input) whose
//! `code` property is the ID of the requirement in `spec/requirements.toml` that the input
//! broke; a refused request is not an error but a reply (`application/problem+json`)
//! rendered by idem-core.
//!
//! The steps, outcomes and heartbeat states cross as `#[wasm_bindgen]` enums, so both sides
//! use the same names; with the in-process store ([`Records`]: idem-core's `MemoryStore`,
//! inside the module) every store step runs inside the module ([`Engine::drive_in`]).

// In the module, std would only add its panic machinery (message formatting, hooks) to the
// binary: the module has no stderr to print to. Native builds (tests) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// A panic is a bug (the layer returns errors for every bad input): stop at once. The
/// module then traps, and the JavaScript side sees a `RuntimeError`.
#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

#[cfg(feature = "client")]
mod client;
#[cfg(feature = "server")]
pub mod headroom;
#[cfg(feature = "server")]
pub mod host;
pub mod interop;
#[cfg(feature = "server")]
mod server;

#[cfg(feature = "client")]
pub use client::*;
#[cfg(feature = "server")]
pub use server::*;

use alloc::string::String;
use interop::ErrorParts;
use js_sys::Reflect;
use wasm_bindgen::prelude::*;

type JsResult<T> = Result<T, JsValue>;

fn js(e: ErrorParts) -> JsValue {
    e.into_js()
}

fn get(object: &JsValue, name: &str) -> JsValue {
    Reflect::get(object, &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED)
}

fn given(v: &JsValue) -> bool {
    !(v.is_undefined() || v.is_null())
}

fn number(object: &JsValue, name: &str) -> Result<Option<f64>, ErrorParts> {
    let v = get(object, name);
    if !given(&v) {
        return Ok(None);
    }
    v.as_f64()
        .map(Some)
        .ok_or_else(|| ErrorParts::options(alloc::format!("{name} must be a number")))
}

/// The request header that carries the key, lowercase (idem-core's
/// [`KEY_HEADER`](idem_core::KEY_HEADER)): a server's default, the header a client sends.
#[wasm_bindgen(js_name = keyHeader)]
pub fn key_header() -> String {
    String::from(idem_core::KEY_HEADER)
}

/// The request header that carries a counter client's low-water mark, lowercase (idem-core's
/// [`LOW_WATER_HEADER`](idem_core::LOW_WATER_HEADER)).
#[wasm_bindgen(js_name = lowWaterHeader)]
pub fn low_water_header() -> String {
    String::from(idem_core::LOW_WATER_HEADER)
}
