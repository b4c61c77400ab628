//! Every conversion between JavaScript values and idem-core types, in one place.
//!
//! This module is plain Rust, one file per topic, so it is tested natively by `cargo test -p
//! idem-wasm` (`tests/interop.rs`): [`errors`] (core errors → [`ErrorParts`]), [`codes`]
//! (steps, outcomes, heartbeat states, deliveries and events), [`options`] (engine options →
//! a [`Policy`](idem_core::Policy)), [`layout`] (list texts, reply, write and context bytes),
//! [`wire`] (the Durable Object wire format), [`client`] (the client's options, states and
//! outcomes) and `call` (the client module's one entry point: its operations and the format
//! of their arguments and answers). What reads JavaScript values is in `from_js.rs`; the
//! bindings themselves are in the modules beside it.
//!
//! # What crosses the boundary
//!
//! Every code that crosses is defined here or in idem-core, once: the steps of the request
//! machine, the handler's outcome, the heartbeat states and the delivery outcomes are
//! `#[wasm_bindgen]` enums the JavaScript side imports by name from the server's glue; the
//! client's operations, the tags of its values, its states and its outcomes are enums that
//! `js/client-codes/` names (written from them and checked by `tests/client_codes.rs`, as
//! the client's module has no generated glue); the engine options are read from the options
//! object by the names in [`ENGINE_OPTIONS`]; event names come from [`Event::ALL`](idem_core::Event::ALL); header
//! names and the problem type prefix are idem-core's, exported by the module. Five byte
//! layouts remain, for speed and size, and `test/boundary.test.mjs` checks both sides against
//! each other:
//!
//! * **Client calls**: the client's module takes and answers lists of tagged values (see
//!   `call.rs`), which `js/outbox.js` encodes and decodes.
//!
//! * **List text**: a list of strings as one string, each item written as its length in
//!   UTF-16 code units (a JavaScript string's `length`), a colon, and the item:
//!   `["ab", "c"]` is `2:ab1:c`. Header lists are flat `[name, value, …]` lists.
//! * **Reply bytes**: a `u8` of [`ReplyFlag`]s (what the engine says of the reply, so that
//!   JavaScript never infers it from the headers), `u32` status, `u32` byte length of the
//!   head, the head (the header list as list text, UTF-8), then the body. Integers are
//!   little-endian.
//! * **Write bytes** (a store write, [`StoreWrite`]): a `u8` of [`WriteFlag`]s, `f64`
//!   deadline, `f64` expiry, `u32` byte length of the head, the head (list text: the version,
//!   then the expected version when [`WriteFlag::Expect`] is set), then the record bytes when
//!   [`WriteFlag::Value`] is set. Numbers are little-endian.
//! * **Context bytes** (what a running handler is told): `f64` fencing number, `f64` end of
//!   the lease (milliseconds since the epoch), `u64` the attempt's identity
//!   ([`idem_core::Context::attempt`]), a `u8` that is 1 when the handler takes over from an
//!   attempt whose lease expired, then the key (UTF-8). Numbers are little-endian.

/// An enum whose values cross to JavaScript by number, each variant numbered in the order
/// written from 0, with `ALL`: every variant, by number. The list is written by the macro
/// from the enum itself, so that it cannot miss a variant, and the numbering is checked when
/// the crate compiles (`tests/client_codes.rs` writes JavaScript's names from `ALL`).
macro_rules! numbered {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $number:literal,)*
        }
    ) => {
        $(#[$meta])*
        pub enum $name {
            $($(#[$variant_meta])* $variant = $number,)*
        }

        impl $name {
            /// Every variant, by number.
            pub const ALL: [$name; [$($number),*].len()] = [$($name::$variant),*];
        }

        const _: () = {
            let mut i = 0;
            while i < $name::ALL.len() {
                assert!(
                    $name::ALL[i] as usize == i,
                    concat!(stringify!($name), " is numbered in order from 0")
                );
                i += 1;
            }
        };
    };
}

#[cfg(feature = "client")]
pub mod call;
pub mod client;
pub mod codes;
pub mod errors;
pub mod layout;
pub mod options;
pub mod wire;

#[cfg(feature = "client")]
pub use call::*;
pub use client::*;
pub use codes::*;
pub use errors::*;
pub use layout::*;
pub use options::*;
pub use wire::*;
