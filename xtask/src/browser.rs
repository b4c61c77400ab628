//! The browser example (idem-wasm/examples/browser): Debian's Chromium and puppeteer-core,
//! and its tests in headless Chromium: the order page across a lost response, a reload and
//! a killed browser, and the conformance suite's HTML report.

use crate::util::{apt_install, npm_ci_if_stale, npm_in, workspace_dir};

fn example_dir() -> std::path::PathBuf {
    workspace_dir("idem-wasm/examples/browser")
}

/// Installs Chromium (a Debian package, only when missing) and the example's npm packages
/// (`npm ci`, only when node_modules is missing or stale). puppeteer-core downloads no
/// browser: the tests drive the installed one.
pub(crate) fn setup() -> Result<(), String> {
    apt_install(&["chromium"])?;
    npm_ci_if_stale(&example_dir(), "browser example: puppeteer-core")
}

/// What runs the example's tests: its own server and Chromium per test, stopped at the
/// end. Needs the idem-wasm package built (`wasm::build`) and the built idem-conformance
/// (for the HTML report).
pub(crate) fn tests(conformance: &std::path::Path) -> std::process::Command {
    let mut cmd = npm_in(&example_dir());
    cmd.args(["test", "--silent"])
        .env("IDEM_CONFORMANCE", conformance);
    cmd
}
