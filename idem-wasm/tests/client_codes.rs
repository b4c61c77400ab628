//! `js/client-codes.js`, the numbers JavaScript names the client's module's operations, tags,
//! states and outcomes by, is written from the Rust enums that define them: this test fails
//! when the file is not what they give, and `IDEM_CODES_BLESS=1 cargo test -p idem-wasm
//! --test client_codes` writes it.

use idem_wasm::interop::{ClientOp, FetchOutcome, NextKind, OutboxState, Wire};
use std::fmt::{Debug, Write};
use std::path::Path;

/// One frozen object of names and numbers, in number order.
fn object<T: Copy + Debug>(
    out: &mut String,
    name: &str,
    doc: &str,
    all: &[T],
    number: fn(T) -> u32,
) {
    writeln!(out, "/** {doc} */").unwrap();
    writeln!(out, "export const {name} = Object.freeze({{").unwrap();
    for (i, member) in all.iter().enumerate() {
        assert_eq!(
            number(*member) as usize,
            i,
            "{name} is numbered in order from 0"
        );
        writeln!(out, "  {member:?}: {i},").unwrap();
    }
    writeln!(out, "}});").unwrap();
}

fn codes() -> String {
    let mut out = String::from(
        "// Written by idem-wasm/tests/client_codes.rs from the enums of src/interop/ (call.rs and\n\
         // client.rs), which define these numbers: do not edit. `IDEM_CODES_BLESS=1 cargo test -p\n\
         // idem-wasm --test client_codes` writes it again.\n",
    );
    object(
        &mut out,
        "ClientOp",
        "The client module's operations (`ClientOp`).",
        &ClientOp::ALL,
        |o| o as u32,
    );
    object(
        &mut out,
        "Wire",
        "The tags of a call's values (`Wire`).",
        &Wire::ALL,
        |w| w as u32,
    );
    object(
        &mut out,
        "FetchOutcome",
        "What `idempotentFetch` resolves to (`FetchOutcome`).",
        &FetchOutcome::ALL,
        |o| o as u32,
    );
    object(
        &mut out,
        "NextKind",
        "What the outbox says to do next (`NextKind`).",
        &NextKind::ALL,
        |k| k as u32,
    );
    object(
        &mut out,
        "OutboxState",
        "Where an outbox entry stands (`OutboxState`).",
        &OutboxState::ALL,
        |s| s as u32,
    );
    out
}

#[test]
fn the_client_codes_file_is_the_enums() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("js/client-codes.js");
    let expected = codes();
    if std::env::var_os("IDEM_CODES_BLESS").is_some() {
        std::fs::write(&path, &expected).unwrap();
    }
    let found = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        found == expected,
        "js/client-codes.js is not what the enums give: run `IDEM_CODES_BLESS=1 cargo test -p idem-wasm --test client_codes`"
    );
}
