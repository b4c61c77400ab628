//! The idem-wasm steps: installing the pinned wasm-bindgen CLI and the npm dev dependencies,
//! building the npm package (which prints the module size) and running its tests.

use crate::util::{run, step};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Must equal the exact `wasm-bindgen` version pinned in idem-wasm/Cargo.toml: the CLI
/// refuses modules built by another version of the crate.
const WASM_BINDGEN_VERSION: &str = "0.2.129";

fn package_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(|root| root.join("idem-wasm"))
        .unwrap_or_else(|| PathBuf::from("idem-wasm"))
}

fn npm() -> Command {
    let mut cmd = Command::new("npm");
    cmd.current_dir(package_dir())
        .env("npm_config_update_notifier", "false")
        .env("npm_config_fund", "false")
        .env("npm_config_audit", "false");
    cmd
}

/// Installs what the wasm build needs: the wasm-bindgen CLI of the pinned version (only when
/// `wasm-bindgen --version` does not already print it), and the npm dev dependencies (only
/// when node_modules is missing or older than package-lock.json). Quiet when all is there.
pub(crate) fn setup() -> Result<(), String> {
    let current = Command::new("wasm-bindgen")
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if current.split_whitespace().nth(1) != Some(WASM_BINDGEN_VERSION) {
        step("setup: wasm-bindgen-cli (builds from source, about 10 minutes)");
        run(crate::util::cargo().args([
            "install",
            "--locked",
            "--quiet",
            "wasm-bindgen-cli",
            "--version",
            WASM_BINDGEN_VERSION,
        ]))?;
    }
    let dir = package_dir();
    let lock = modified(&dir.join("package-lock.json"));
    let installed = modified(&dir.join("node_modules").join(".package-lock.json"));
    let stale = match (lock, installed) {
        (Some(lock), Some(installed)) => installed < lock,
        _ => true,
    };
    if stale {
        step("setup: npm ci (idem-wasm dev dependencies)");
        run(npm().args(["ci", "--loglevel=error"]))?;
    }
    Ok(())
}

fn modified(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Builds the package (printing the module size raw, gzip and brotli), checks the
/// hand-written TypeScript types, and runs the Node tests against the built package.
pub(crate) fn test() -> Result<(), String> {
    step("build: idem-wasm npm package");
    run(npm().args(["run", "--silent", "build", "--", "--quiet"]))?;
    step("check: idem-wasm TypeScript types");
    run(npm().args(["run", "--silent", "typecheck"]))?;
    step("test: idem-wasm (node --test against the built package)");
    run(npm().args(["test", "--silent"]))
}
