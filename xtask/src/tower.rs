//! idem-tower's axum example (idem-tower/examples/axum-orders.rs) under the conformance
//! suite: the example as a user runs it, on an OS-chosen port, graded with the
//! count oracle it serves at `/count` and two principals.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The cases the example must pass, not skip: the status query's family among them (its
/// handler answers at once, so no duplicate finds it in flight: `concurrent/2` and
/// `status/2` skip, as do the cases that need options it has no endpoint for).
const MUST_PASS: [&str; 11] = [
    "lost-response/1",
    "replay/1",
    "concurrent/1",
    "mismatch/1",
    "keys/1",
    "scope/1",
    "status/1",
    "status/4",
    "status/5",
    "status/6",
    "status/7",
];

/// Starts the built example, runs the whole suite against it, and checks the report.
pub(crate) fn conformance(conformance: &Path, example: &Path) -> Result<(), String> {
    let mut server = Stopped(
        Command::new(example)
            .env("ADDR", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", example.display()))?,
    );
    let mut banner = String::new();
    let stdout = server.0.stdout.take().ok_or("the example's stdout")?;
    BufReader::new(stdout)
        .read_line(&mut banner)
        .map_err(|e| format!("the example's banner: {e}"))?;
    let base = banner
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .ok_or_else(|| format!("no address in the example's banner {banner:?}"))?;
    let dir = std::env::temp_dir().join(format!("idem-tower-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = dir.join("conformance.json");
    let output = Command::new(conformance)
        .args(["run", &format!("{base}/orders"), "--count-url", "/count"])
        .args(["-H", "x-account-id: acct_1"])
        .args(["--second-credential", "x-account-id: acct_2"])
        .arg("--json")
        .arg(&json)
        .arg("--quiet")
        .output()
        .map_err(|e| format!("{}: {e}", conformance.display()))?;
    drop(server);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let report = std::fs::read(&json).map_err(|e| format!("the report: {e}\n{text}"));
    let _ = std::fs::remove_dir_all(&dir);
    let report: serde_json::Value =
        serde_json::from_slice(&report?).map_err(|e| format!("the report: {e}"))?;
    if output.status.code() != Some(0) {
        return Err(format!(
            "idem-conformance exited with {}:\n{text}",
            output.status
        ));
    }
    check(&report).map_err(|e| format!("{e}\n{text}"))
}

/// Every case in [`MUST_PASS`] passed, and none failed, was unsafe or leaked.
fn check(report: &serde_json::Value) -> Result<(), String> {
    let cases = report["cases"].as_array().ok_or("a report without cases")?;
    for id in MUST_PASS {
        let case = cases
            .iter()
            .find(|c| c["id"] == id)
            .ok_or_else(|| format!("{id} is missing from the report"))?;
        if case["verdict"] != "pass" {
            return Err(format!("{id}: {} ({})", case["verdict"], case["reason"]));
        }
    }
    let summary = &report["summary"];
    for bad in ["fail", "unsafe", "leak", "error"] {
        if summary[bad].as_u64() != Some(0) {
            return Err(format!("{bad}: {} in {summary}", summary[bad]));
        }
    }
    Ok(())
}

/// A child process killed and reaped when dropped, also when a step fails.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
