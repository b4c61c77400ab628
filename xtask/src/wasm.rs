//! The idem-wasm steps: installing the pinned wasm-bindgen CLI and the npm dev dependencies,
//! building the npm package (which prints the module size) and running its tests.

use crate::util::{npm_ci_if_stale, npm_in, run, step, workspace_dir};
use std::path::PathBuf;
use std::process::Command;

/// Must equal the exact `wasm-bindgen` version pinned in idem-wasm/Cargo.toml: the CLI
/// refuses modules built by another version of the crate.
const WASM_BINDGEN_VERSION: &str = "0.2.129";

fn package_dir() -> PathBuf {
    workspace_dir("idem-wasm")
}

/// Where `cargo install` puts the wasm-bindgen CLI: `$CARGO_INSTALL_ROOT/bin`, else
/// `$CARGO_HOME/bin`, else `~/.cargo/bin`. The build is given this path, so it does not
/// depend on that directory being on `PATH`.
fn wasm_bindgen() -> PathBuf {
    let env = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let root = env("CARGO_INSTALL_ROOT")
        .or_else(|| env("CARGO_HOME"))
        .or_else(|| env("HOME").map(|home| home.join(".cargo")))
        .unwrap_or_else(|| PathBuf::from(".cargo"));
    root.join("bin").join("wasm-bindgen")
}

fn npm() -> Command {
    let mut cmd = npm_in(&package_dir());
    cmd.env("WASM_BINDGEN", wasm_bindgen());
    cmd
}

/// Installs what the wasm build and its tests need: the wasm-bindgen CLI of the pinned
/// version (only when `wasm-bindgen --version` does not already print it), the npm dev
/// dependencies (only when node_modules is missing or older than package-lock.json), and
/// redis-server and postgresql (only when missing). Quiet when all is there.
/// Installs the pinned wasm-bindgen CLI when it is missing: a build from source, which
/// [`crate::setup`] runs beside the package installs. It is built unoptimised: on two cores
/// that took 60 s against 3 min 36 s at opt-level 3 (92 s of CPU against 6.5 min), and the
/// package build, which runs the CLI once on the server's module, took as long with either
/// (40 s) and wrote the same files.
pub(crate) fn install_bindgen() -> Result<(), String> {
    let current = Command::new(wasm_bindgen())
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if current.split_whitespace().nth(1) != Some(WASM_BINDGEN_VERSION) {
        step("setup: wasm-bindgen-cli (builds from source, about a minute)");
        // `--force`: cargo's own record of installed packages may still list the pinned
        // version after its binary was deleted, and would then install nothing.
        run(crate::util::cargo()
            .args([
                "install",
                "--locked",
                "--quiet",
                "--force",
                "wasm-bindgen-cli",
                "--version",
                WASM_BINDGEN_VERSION,
            ])
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0"))?;
    }
    Ok(())
}

/// The package's dev dependencies, Deno, NestJS 10 and the servers the store tests start.
pub(crate) fn setup() -> Result<(), String> {
    npm_ci_if_stale(&package_dir(), "idem-wasm dev dependencies")?;
    // The Deno binary for the runtime tests, by its platform package (see its package.json).
    npm_ci_if_stale(
        &package_dir().join("test").join("deno"),
        "Deno for the runtime tests",
    )?;
    // NestJS 10, for the adapter's tests under the previous major of Nest.
    npm_ci_if_stale(
        &package_dir().join("test").join("nestjs10"),
        "NestJS 10 for the NestJS adapter's tests",
    )?;
    // The Redis and Postgres stores are tested against real servers, which the tests start
    // privately (127.0.0.1, ports chosen by the OS, data in a temporary directory).
    crate::util::apt_install(&SERVERS)
}

/// The Debian packages of the servers the store tests start.
pub(crate) const SERVERS: [&str; 2] = ["redis-server", "postgresql"];

/// Builds the package (printing the module size raw, gzip and brotli) and checks the
/// hand-written TypeScript types. Before the Rust tests: the chaos tests run Node servers on
/// the built package beside the Rust ones.
pub(crate) fn build() -> Result<(), String> {
    step("build: idem-wasm npm package");
    run(npm().args(["run", "--silent", "build", "--", "--quiet"]))?;
    step("check: idem-wasm TypeScript types");
    run(npm().args(["run", "--silent", "typecheck"]))
}

/// [`build`], started beside the steps that follow it: the two WebAssembly builds are
/// mostly one core's work (fat LTO into one codegen unit), and the checks and the test
/// build beside them keep the other core busy. Cargo allows one build at a time in a target
/// directory, so these get one of their own. [`Beside::join`] waits for them and prints
/// what they printed.
pub(crate) fn build_beside() -> Beside {
    let target = package_target();
    Beside(std::thread::spawn(move || {
        let mut shown = String::new();
        for args in [
            &["run", "--silent", "build", "--", "--quiet"][..],
            &["run", "--silent", "typecheck"],
        ] {
            let mut cmd = npm();
            cmd.args(args).env("CARGO_TARGET_DIR", &target);
            let output = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            shown.push_str(&String::from_utf8_lossy(&output.stdout));
            shown.push_str(&String::from_utf8_lossy(&output.stderr));
            if !output.status.success() {
                return Err(format!("{cmd:?} failed with {}:\n{shown}", output.status));
            }
        }
        Ok(shown)
    }))
}

/// The target directory of [`build_beside`]'s builds. The package's tests read the glue that
/// wasm-bindgen wrote there (before the bundler), so [`tests`] are given it too.
fn package_target() -> PathBuf {
    crate::util::target_dir().join("npm-package")
}

/// The npm package's build, running beside the other steps.
pub(crate) struct Beside(std::thread::JoinHandle<Result<String, String>>);

impl Beside {
    /// Waits for the build and the type check, and prints their output.
    pub(crate) fn join(self) -> Result<(), String> {
        step(
            "build: idem-wasm npm package and its TypeScript types (built beside the steps above)",
        );
        let shown = self
            .0
            .join()
            .map_err(|_| "the npm package's build panicked".to_owned())??;
        print!("{shown}");
        Ok(())
    }
}

/// What runs the Node tests against the built package ([`build`] first); the two-process
/// test runs `conformance` (a build of idem-conformance with every feature).
pub(crate) fn tests(conformance: &std::path::Path) -> Command {
    let mut cmd = npm();
    cmd.args(["test", "--silent"])
        .env("IDEM_CONFORMANCE", conformance)
        .env("CARGO_TARGET_DIR", package_target());
    cmd
}
