//! `js/client-codes/`, the numbers JavaScript names the client's module's operations, tags,
//! states and outcomes by, and the names the client sends and reads, is written from the Rust
//! that defines them: this test fails when a file is not what they give, and
//! `IDEM_CODES_BLESS=1 cargo test -p idem-wasm --test client_codes` writes it.

use idem_core::KeyStatus;
use idem_wasm::interop::{ClientOp, FetchOutcome, NextKind, OutboxState, Wire};
use std::fmt::{Debug, Write};
use std::path::Path;

/// The file of one enum: a constant per member, in number order (`ALL`, whose numbering the
/// crate checks as it compiles), so that a bundler inlines each number where JavaScript names
/// it (`import * as ClientOp from ...`, `ClientOp.Send`).
fn file<T: Debug>(rust: &str, all: &[T]) -> String {
    let mut out = format!(
        "// Written by idem-wasm/tests/client_codes.rs from `{rust}` (src/interop/), which defines\n\
         // these numbers: do not edit. `IDEM_CODES_BLESS=1 cargo test -p idem-wasm --test\n\
         // client_codes` writes it again.\n"
    );
    for (i, member) in all.iter().enumerate() {
        writeln!(out, "export const {member:?} = {i};").unwrap();
    }
    out
}

/// The names: the headers and media types idem-core defines, the members a status document
/// is read at (each a list of member names) and the outcomes' names, by `FetchOutcome`.
fn names() -> String {
    // JSON text is JavaScript.
    let json = |v: serde_json::Value| v.to_string();
    let constants = [
        ("key", json(idem_core::KEY_HEADER.into())),
        ("lowWater", json(idem_core::LOW_WATER_HEADER.into())),
        ("replayed", json(idem_core::REPLAYED_HEADER.into())),
        ("status", json(idem_core::STATUS_HEADER.into())),
        ("statusMediaType", json(idem_core::STATUS_MEDIA_TYPE.into())),
        ("problemMediaType", json(idem_core::PROBLEM_JSON.into())),
        (
            "statusMembers",
            json(serde_json::json!(KeyStatus::DOCUMENT_MEMBERS)),
        ),
        (
            "outcomes",
            json(serde_json::json!(FetchOutcome::ALL.map(FetchOutcome::name))),
        ),
    ];
    let mut out = String::from(
        "// Written by idem-wasm/tests/client_codes.rs from idem-core's names and `FetchOutcome`\n\
         // (src/interop/): do not edit. `IDEM_CODES_BLESS=1 cargo test -p idem-wasm --test\n\
         // client_codes` writes it again.\n",
    );
    for (name, value) in constants {
        writeln!(out, "export const {name} = {value};").unwrap();
    }
    out
}

/// Each file of js/client-codes/ and what it should hold.
fn files() -> Vec<(&'static str, String)> {
    vec![
        ("op.js", file("ClientOp", &ClientOp::ALL)),
        ("wire.js", file("Wire", &Wire::ALL)),
        ("fetch-outcome.js", file("FetchOutcome", &FetchOutcome::ALL)),
        ("next-kind.js", file("NextKind", &NextKind::ALL)),
        ("outbox-state.js", file("OutboxState", &OutboxState::ALL)),
        ("names.js", names()),
    ]
}

#[test]
fn the_client_codes_files_are_what_the_rust_gives() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("js/client-codes");
    let bless = std::env::var_os("IDEM_CODES_BLESS").is_some();
    let files = files();
    if bless {
        std::fs::create_dir_all(&dir).unwrap();
    }
    for (name, expected) in &files {
        let path = dir.join(name);
        if bless {
            std::fs::write(&path, expected).unwrap();
        }
        let found = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            &found == expected,
            "js/client-codes/{name} is not what the Rust gives: run `IDEM_CODES_BLESS=1 cargo test -p idem-wasm --test client_codes`"
        );
    }
    // No file the Rust does not give.
    let mut listed: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    listed.sort();
    let mut names: Vec<String> = files.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    assert_eq!(
        listed, names,
        "js/client-codes/ holds only the files the Rust gives"
    );
}
