//! `cargo xtask test`: installs what the tests need (idempotently, quietly when present) and
//! runs every test of the project. `cargo xtask setup` only installs. `cargo xtask interop`
//! runs the conformance suite against third-party Idempotency-Key implementations (not part
//! of `test`: it installs them from their registries and takes minutes). `cargo xtask chaos`
//! runs the long form of the chaos tests (process and store faults under load, and a soak of
//! 10⁶ requests); `test` runs their short form.

use std::process::{Command, ExitCode};

mod browser;
mod harness;
mod interop;
mod tower;
mod util;
mod wasm;
mod worker;

use util::{cargo, run, step};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup(),
        Some("test") => setup().and_then(|()| test()),
        Some("interop") => {
            step("build: idem-conformance (release)");
            interop::build_conformance().and_then(|c| interop::interop(&c))
        }
        Some("chaos") => setup().and_then(|()| wasm::build()).and_then(|()| chaos()),
        _ => {
            eprintln!("usage: cargo xtask <setup|test|interop|chaos>");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The chaos tests (conformance/tests/chaos.rs) in their long form, built with the bench
/// profile (the release profile leaves the conformance crate's own code unoptimised, and its
/// load is part of what is measured), one scenario after another, their figures printed.
fn chaos() -> Result<(), String> {
    step("chaos: process and store faults under load, and the soak (long form)");
    run(cargo()
        .args([
            "test",
            "--profile",
            "bench",
            "-p",
            "idem-conformance",
            "--features",
            "redis,postgres",
            "--test",
            "chaos",
            "--",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("IDEM_CHAOS", "long"))
}

/// Rust targets: x86_64-unknown-none proves idem-core is no_std; wasm32 builds idem-wasm.
fn setup() -> Result<(), String> {
    step("setup: rust targets");
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map_err(|e| format!("rustup: {e}"))?;
    let installed = String::from_utf8_lossy(&installed.stdout).into_owned();
    for target in ["x86_64-unknown-none", "wasm32-unknown-unknown"] {
        if !installed.lines().any(|l| l.trim() == target) {
            run(Command::new("rustup").args(["target", "add", target]))?;
        }
    }
    let components = Command::new("rustup")
        .args(["component", "list", "--installed"])
        .output()
        .map_err(|e| format!("rustup: {e}"))?;
    let components = String::from_utf8_lossy(&components.stdout).into_owned();
    for c in ["rustfmt", "clippy"] {
        if !components.lines().any(|l| l.starts_with(c)) {
            run(Command::new("rustup").args(["component", "add", c]))?;
        }
    }
    // The wasm-bindgen CLI, when it builds from source, keeps the cores busy while the package
    // installs beside it wait on the network and the disk.
    let bindgen = std::thread::spawn(wasm::install_bindgen);
    let installed = wasm::setup()
        .and_then(|()| worker::setup())
        .and_then(|()| browser::setup());
    let built = bindgen
        .join()
        .unwrap_or_else(|_| Err("the wasm-bindgen install stopped".into()));
    installed.and(built)
}

/// The crates published to crates.io, packaged together by the test.
const PUBLISHED: [&str; 4] = ["idem-spec", "idem-core", "idem-tower", "idem-conformance"];

fn test() -> Result<(), String> {
    step("check: formatting");
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    let package_build = wasm::build_beside();
    let checked = checks_and_test_build();
    // Also when a check failed: nothing this command started goes on after it.
    package_build.join()?;
    let (built, conformance, example) = checked?;
    tests(built, conformance, example)
}

/// The checks that need no test build (clippy, `no_std`, docs), then the test build: the
/// test executables, the CLI and the axum example.
fn checks_and_test_build(
) -> Result<(harness::Built, std::path::PathBuf, std::path::PathBuf), String> {
    step("check: clippy");
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--quiet",
        "--",
        "-D",
        "warnings",
    ]))?;
    step("check: idem-core builds without std (x86_64-unknown-none)");
    run(cargo().args([
        "build",
        "--quiet",
        "-p",
        "idem-core",
        "--no-default-features",
        "--target",
        "x86_64-unknown-none",
    ]))?;
    // Every feature, as docs.rs documents the crates.
    step("check: docs");
    run(cargo()
        .args([
            "doc",
            "--workspace",
            "--no-deps",
            "--all-features",
            "--quiet",
        ])
        .env("RUSTDOCFLAGS", "-D warnings"))?;
    // One build for every Rust test, with every feature (each store's tests start a
    // private redis-server or postgres): the CLI that the npm, worker and browser tests
    // drive and the axum example come out of the same build.
    step("build: the rust workspace's tests, every feature");
    let built = harness::build(&["--all-features"])?;
    let conformance = built.executable("idem-conformance")?;
    let example = built.executable("axum-orders")?;
    Ok((built, conformance, example))
}

/// Runs every test, from one build: the Rust workspace's, the package check, and the npm
/// package's, the worker's, the browser's and the axum example's, side by side.
fn tests(
    mut built: harness::Built,
    conformance: std::path::PathBuf,
    example: std::path::PathBuf,
) -> Result<(), String> {
    step("test: the doc tests");
    run(cargo().args(["test", "--workspace", "--doc", "--all-features", "--quiet"]))?;
    util::forget_local_packages(&PUBLISHED)?;
    // Packaged together so that each one's path dependencies resolve to the others'
    // packages; `--allow-dirty` so that the check also runs on a work tree with changes.
    let mut package = cargo();
    package.args(["package", "--quiet", "--allow-dirty"]);
    for name in PUBLISHED {
        package.args(["-p", name]);
    }
    // The package check builds `idem-conformance` again, with its default features, over
    // the `target/debug/idem-conformance` that the conformance tests run (cargo's
    // `CARGO_BIN_EXE_idem-conformance`): it starts once they have ended.
    built.command_after("idem-conformance", harness::PACKAGE_CHECK, package);
    built.command("idem-wasm: node --test", wasm::tests(&conformance));
    built.command(
        "edge worker: node --test under workerd",
        worker::tests(&conformance),
    );
    built.command(
        "browser example: node --test in headless Chromium",
        browser::tests(&conformance),
    );
    built.add("axum example: the conformance suite", move || {
        tower::conformance(&conformance, &example)
    });
    let parallel = harness::parallel();
    step(&format!(
        "test: every test, {parallel} at a time: the rust workspace's (the chaos tests' short form among them), the package check, and the npm package's, the worker's, the browser's and the axum example's"
    ));
    harness::run(built, parallel)?;
    step("done: every check passed");
    Ok(())
}
