//! The Rust tests, run from one build: cargo builds every test executable once, and they run
//! side by side, one more at a time than the machine has cores, instead of one after another
//! (most of the long ones wait on servers they started, processes they killed or leases
//! running out, not on a core), with the package check compiling beside them. Each prints a
//! line with its time when it ends, its whole output when it fails.

use crate::util::cargo;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Instant;

/// One test executable cargo built, or another check run beside them.
struct Job {
    /// `package/target`, as the lines name it.
    name: String,
    command: Command,
    /// Jobs start heaviest first: checks added with [`Built::first`], then the tests known
    /// to take longest ([`LONG`]), then the bigger executables (the ones with servers,
    /// clients and runtimes linked in).
    weight: u64,
}

/// The test executables that take longest (the lines of this command's output say how
/// long each took), started first so that none is left running alone at the end.
const LONG: [&str; 4] = [
    "idem-conformance/chaos",
    "idem-conformance/faults",
    "idem-conformance/cli",
    "idem-conformance/shared_store",
];

/// What `cargo test --no-run` built: the test executables, and the binaries and examples
/// that came out of the same build.
pub(crate) struct Built {
    jobs: Vec<Job>,
    executables: Vec<(String, PathBuf)>,
}

impl Built {
    /// The executable of the binary or example `name` (not its test harness), copied to a
    /// folder of its own: a later build of the same target with other features (the
    /// package check's, say) writes over the one cargo built here.
    pub(crate) fn executable(&self, name: &str) -> Result<PathBuf, String> {
        let built = self
            .executables
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p)
            .ok_or_else(|| format!("the test build made no executable {name}"))?;
        let dir = crate::util::target_dir().join("xtask-bin");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let kept = dir.join(built.file_name().unwrap_or(name.as_ref()));
        std::fs::copy(built, &kept)
            .map_err(|e| format!("copying {} to {}: {e}", built.display(), kept.display()))?;
        Ok(kept)
    }
}

impl Built {
    /// Runs `command` beside the tests, started before any of them.
    pub(crate) fn first(&mut self, name: &str, command: Command) {
        self.jobs.push(Job {
            name: name.to_owned(),
            command,
            weight: u64::MAX,
        });
    }
}

/// Builds every test of the workspace with `args` (features) and returns what was built.
pub(crate) fn build(args: &[&str]) -> Result<Built, String> {
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--no-run", "--quiet"])
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit());
    let output = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!("{cmd:?} failed with {}", output.status));
    }
    let mut built = Built {
        jobs: Vec::new(),
        executables: Vec::new(),
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Some(artifact) = Artifact::of(line) else {
            continue;
        };
        if artifact.test {
            built.jobs.push(artifact.job());
        } else {
            built
                .executables
                .push((artifact.target, artifact.executable));
        }
    }
    Ok(built)
}

/// How many jobs run at a time: one per core and one more, as the longest tests mostly
/// wait (on servers they started, processes they killed, leases running out).
pub(crate) fn parallel() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()) + 1
}

/// Runs every test executable and the doc tests, `parallel` at a time, the heaviest first.
pub(crate) fn run(built: Built, parallel: usize) -> Result<(), String> {
    let mut jobs = built.jobs;
    jobs.sort_by_key(|j| std::cmp::Reverse(j.weight));
    let total = jobs.len();
    let queue = Mutex::new(jobs.into_iter().collect::<VecDeque<Job>>());
    let failed = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..parallel.max(1) {
            s.spawn(|| loop {
                let Some(mut job) = lock(&queue).pop_front() else {
                    return;
                };
                let began = Instant::now();
                let output = job.command.output();
                let seconds = began.elapsed().as_secs_f64();
                let at = start.elapsed().as_secs();
                let ok = matches!(&output, Ok(o) if o.status.success());
                // One line per job, written whole, so that two jobs' lines never mix.
                let line = format!(
                    "    [+{:02}:{:02}] {} {} ({seconds:.1} s)\n",
                    at / 60,
                    at % 60,
                    if ok { "ok    " } else { "FAILED" },
                    job.name
                );
                let mut out = std::io::stdout().lock();
                let _ = std::io::Write::write_all(&mut out, line.as_bytes());
                if !ok {
                    let _ = std::io::Write::write_all(&mut out, shown(&output).as_bytes());
                    lock(&failed).push(job.name);
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap_or_else(|e| e.into_inner());
    if failed.is_empty() {
        println!("    {total} jobs passed");
        Ok(())
    } else {
        Err(format!("tests failed: {}", failed.join(", ")))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A failed job's output, or why it could not start.
fn shown(output: &std::io::Result<Output>) -> String {
    match output {
        Ok(o) => format!(
            "{}{}\n",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => format!("could not start: {e}\n"),
    }
}

/// The package's name in a cargo package id: `path+file:///w/conformance#idem-conformance@0.1.0`,
/// `path+file:///w/idem-tower#0.1.0` (the name is the folder's), or the older
/// `idem-tower 0.1.0 (path+file:///w/idem-tower)`.
fn package_name(id: &str) -> Option<&str> {
    match id.rsplit_once('#') {
        Some((_, name_version)) if name_version.contains('@') => name_version.split('@').next(),
        Some((url, _)) => url.rsplit('/').next(),
        None => id.split(' ').next(),
    }
}

/// A `compiler-artifact` message of cargo's with an executable.
#[derive(Debug, PartialEq)]
struct Artifact {
    package: String,
    target: String,
    test: bool,
    executable: PathBuf,
    manifest_dir: PathBuf,
}

impl Artifact {
    fn of(line: &str) -> Option<Artifact> {
        let m: serde_json::Value = serde_json::from_str(line).ok()?;
        if m["reason"] != "compiler-artifact" {
            return None;
        }
        let manifest = Path::new(m["manifest_path"].as_str()?);
        let package = package_name(m["package_id"].as_str()?)?;
        Some(Artifact {
            package: package.to_owned(),
            target: m["target"]["name"].as_str()?.to_owned(),
            test: m["profile"]["test"] == true,
            executable: PathBuf::from(m["executable"].as_str()?),
            manifest_dir: manifest.parent()?.to_owned(),
        })
    }

    /// The executable run as `cargo test` runs it: quiet, from its package's directory,
    /// with the package's variables set.
    fn job(self) -> Job {
        let name = format!("{}/{}", self.package, self.target);
        let weight = match LONG.iter().position(|l| *l == name) {
            Some(i) => u64::MAX - 1 - i as u64,
            None => std::fs::metadata(&self.executable).map_or(0, |m| m.len()),
        };
        let mut command = Command::new(&self.executable);
        command
            .arg("--quiet")
            .current_dir(&self.manifest_dir)
            .env("CARGO_MANIFEST_DIR", &self.manifest_dir)
            .env("CARGO_PKG_NAME", &self.package);
        Job {
            name,
            command,
            weight,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{package_name, Artifact};
    use std::path::PathBuf;

    #[test]
    fn reads_the_package_name_of_each_form_of_package_id() {
        let ids = [
            "path+file:///w/conformance#idem-conformance@0.1.0",
            "path+file:///w/idem-tower#0.1.0",
            "idem-tower 0.1.0 (path+file:///w/idem-tower)",
        ];
        let names: Vec<_> = ids.iter().map(|id| package_name(id)).collect();
        assert_eq!(
            names,
            [
                Some("idem-conformance"),
                Some("idem-tower"),
                Some("idem-tower")
            ]
        );
    }

    #[test]
    fn reads_test_executables_and_binaries_from_cargo_messages() {
        let harness = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/conformance#idem-conformance@0.1.0","manifest_path":"/w/conformance/Cargo.toml","target":{"name":"chaos"},"profile":{"test":true},"executable":"/t/debug/deps/chaos-0123"}"#;
        assert_eq!(
            Artifact::of(harness),
            Some(Artifact {
                package: "idem-conformance".into(),
                target: "chaos".into(),
                test: true,
                executable: PathBuf::from("/t/debug/deps/chaos-0123"),
                manifest_dir: PathBuf::from("/w/conformance"),
            })
        );
        let bin = r#"{"reason":"compiler-artifact","package_id":"idem-tower 0.1.0 (path+file:///w/idem-tower)","manifest_path":"/w/idem-tower/Cargo.toml","target":{"name":"axum-orders"},"profile":{"test":false},"executable":"/t/debug/examples/axum-orders"}"#;
        let bin = Artifact::of(bin).unwrap();
        assert_eq!((bin.package.as_str(), bin.test), ("idem-tower", false));
        let library = r#"{"reason":"compiler-artifact","package_id":"x","manifest_path":"/w/x/Cargo.toml","target":{"name":"x"},"profile":{"test":false},"executable":null}"#;
        assert_eq!(Artifact::of(library), None);
        assert_eq!(Artifact::of(r#"{"reason":"build-finished"}"#), None);
    }
}
