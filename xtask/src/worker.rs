//! The edge worker example (idem-wasm/examples/worker): its npm packages (miniflare and
//! wrangler, which ship workerd), and its tests under a local workerd, which include a run of
//! the release-built conformance suite against the worker.

use crate::util::{cargo, npm_ci_if_stale, npm_in, run, step, workspace_dir};
use std::path::PathBuf;
use std::process::{Command, Stdio};

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

/// Builds idem-conformance in release mode and returns the path of its executable, read
/// from cargo's own build messages (so any `CARGO_TARGET_DIR` is honoured).
pub(crate) fn build_conformance() -> Result<PathBuf, String> {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--release",
        "--quiet",
        "-p",
        "idem-conformance",
        "--bin",
        "idem-conformance",
        "--message-format=json-render-diagnostics",
    ])
    .stderr(Stdio::inherit());
    let output = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!("{cmd:?} failed with {}", output.status));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .filter(|line| {
            line.contains(r#""reason":"compiler-artifact""#)
                && line.contains(r#""name":"idem-conformance""#)
        })
        .find_map(executable)
        .ok_or_else(|| format!("{cmd:?} named no idem-conformance executable"))
}

/// The `"executable"` path of one cargo `compiler-artifact` message.
fn executable(line: &str) -> Option<PathBuf> {
    const FIELD: &str = r#""executable":""#;
    let start = line.find(FIELD)? + FIELD.len();
    let mut path = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(PathBuf::from(path)),
            '\\' => match chars.next()? {
                'n' => path.push('\n'),
                't' => path.push('\t'),
                other => path.push(other),
            },
            c => path.push(c),
        }
    }
    None
}

/// Starts the worker under workerd (Miniflare and `wrangler dev`, both on 127.0.0.1 with an
/// OS-chosen port) and runs its tests: the conformance suite with the count oracle, restarts
/// with persisted state, alarms, bad input, the in-flight policies and wrangler's bundle.
/// Needs the idem-wasm package built (`wasm::test` builds it first).
pub(crate) fn test(conformance: &std::path::Path) -> Result<(), String> {
    step("test: edge worker under workerd (node --test)");
    run(npm()
        .args(["test", "--silent"])
        .env("IDEM_CONFORMANCE", conformance))
}

#[cfg(test)]
mod tests {
    use super::executable;
    use std::path::PathBuf;

    #[test]
    fn reads_the_executable_of_a_cargo_message() {
        let line = r#"{"reason":"compiler-artifact","target":{"name":"idem-conformance"},"executable":"/t/release/idem-conformance","fresh":true}"#;
        assert_eq!(
            executable(line),
            Some(PathBuf::from("/t/release/idem-conformance"))
        );
        let escaped = r#"{"executable":"C:\\t\\idem \"x\".exe"}"#;
        assert_eq!(
            executable(escaped),
            Some(PathBuf::from(r#"C:\t\idem "x".exe"#))
        );
        assert_eq!(executable(r#"{"executable":null}"#), None);
        assert_eq!(executable(r#"{"executable":"/unterminated"#), None);
    }
}
