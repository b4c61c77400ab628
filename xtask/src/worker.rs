//! The edge worker example (idem-wasm/examples/worker): its npm packages (miniflare and
//! wrangler, which ship workerd), and its tests under a local workerd, which include a run of
//! the conformance suite against the worker.

use crate::util::{npm_ci_if_stale, npm_in, workspace_dir};
use std::path::PathBuf;
use std::process::Command;

fn example_dir() -> PathBuf {
    workspace_dir("idem-wasm/examples/worker")
}

fn npm() -> Command {
    let mut cmd = npm_in(&example_dir());
    cmd.env("WRANGLER_SEND_METRICS", "false")
        .env("WRANGLER_HIDE_BANNER", "true")
        .env("CLOUDFLARE_CF_FETCH_ENABLED", "false");
    cmd
}

/// Installs the example's npm packages with `npm ci`, only when node_modules is missing or
/// older than package-lock.json. Quiet when all is there.
pub(crate) fn setup() -> Result<(), String> {
    npm_ci_if_stale(
        &example_dir(),
        "edge worker example: miniflare, wrangler, autocannon",
    )
}

/// Starts the worker under workerd (Miniflare and `wrangler dev`, both on 127.0.0.1 with an
/// OS-chosen port) and runs its tests: the conformance suite with the count oracle, restarts
/// with persisted state, alarms, bad input, the in-flight policies and wrangler's bundle.
/// Needs the idem-wasm package built (`wasm::build`).
pub(crate) fn tests(conformance: &std::path::Path) -> Command {
    let mut cmd = npm();
    cmd.args(["test", "--silent"])
        .env("IDEM_CONFORMANCE", conformance);
    cmd
}
