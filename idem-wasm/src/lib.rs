//! WASM bindings of idem-core: the engine of the `idem` npm package.
//!
//! This layer has no idempotency logic of its own: each request is idem-core's request
//! machine ([`idem_core::Request`]) in a numbered slot ([`host`]); JavaScript polls it for the
//! next step, performs it, and reports back. Each method converts its JavaScript arguments
//! ([`interop`], and `from_js.rs` for what reads JavaScript values), calls idem-core, and
//! converts the answer back.
//!
//! The bindings, one file per topic: the engine (`engine/`: its slots, what JavaScript
//! reports and reads, the operations), the in-module store (`records.rs`), the HTTP edge's
//! own problems (`edge.rs`), the names JavaScript reads from the module (`names.rs`), and the
//! client's outbox (`outbox.rs`) and counter numbering (`sequence.rs`). The conversions are
//! plain Rust in [`interop`], the slots in [`host`], both tested natively.
//!
//! The client's module (feature `client` alone) has one entry point, [`call`]: an operation
//! number and its arguments as bytes in, its answer as bytes out
//! ([`interop::call`](crate::interop::ClientOp)), so that it carries no binding per method.
//!
//! Time and random values come from JavaScript. Errors are real JavaScript errors
//! (`RangeError` for bad input) whose `code` property is the ID of the requirement in
//! `spec/requirements.toml` that the input broke; a refused request is not an error but a
//! reply (`application/problem+json`) rendered by idem-core.
//!
//! The steps, outcomes and heartbeat states cross as `#[wasm_bindgen]` enums, so both sides
//! use the same names; with the in-process store ([`Records`]: idem-core's `MemoryStore`,
//! inside the module) every store step runs inside the module ([`Engine::drive_in`]).

// In the module, std would only add its panic machinery (message formatting, hooks) to the
// binary: the module has no stderr to print to. Native builds (tests) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]
// The crate's docs above link the server's items, which a build of the client alone leaves out.
#![cfg_attr(not(feature = "server"), allow(rustdoc::broken_intra_doc_links))]

extern crate alloc;

#[cfg(all(target_arch = "wasm32", feature = "server"))]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// The client's module alone: a bump allocator that starts over between calls ([`bump`]).
#[cfg(all(target_arch = "wasm32", not(feature = "server")))]
#[global_allocator]
static ALLOCATOR: bump::Bump = bump::Bump::new();

/// A panic is a bug (the layer returns errors for every bad input): stop at once. The
/// module then traps, and the JavaScript side sees a `RuntimeError`.
#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

#[cfg(feature = "client")]
pub mod bump;
#[cfg(feature = "server")]
mod edge;
#[cfg(feature = "server")]
mod engine;
#[cfg(feature = "client")]
pub mod exports;
#[cfg(feature = "server")]
mod from_js;
#[cfg(feature = "server")]
pub mod headroom;
#[cfg(feature = "server")]
pub mod host;
pub mod interop;
#[cfg(feature = "server")]
mod names;
#[cfg(feature = "client")]
mod outbox;
#[cfg(feature = "server")]
mod records;
#[cfg(feature = "server")]
mod seal;
#[cfg(feature = "client-full")]
mod sequence;

#[cfg(feature = "server")]
pub use edge::*;
#[cfg(feature = "server")]
pub use engine::*;
#[cfg(feature = "server")]
pub use names::*;
#[cfg(feature = "client")]
pub use outbox::*;
#[cfg(feature = "server")]
pub use records::*;
#[cfg(feature = "server")]
pub use seal::*;

#[cfg(feature = "server")]
use interop::ErrorParts;
#[cfg(feature = "server")]
use wasm_bindgen::prelude::*;

#[cfg(feature = "server")]
type JsResult<T> = Result<T, JsValue>;

#[cfg(feature = "server")]
fn js(e: ErrorParts) -> JsValue {
    e.into_js()
}
