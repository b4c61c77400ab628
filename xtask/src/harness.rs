//! The tests, run from one build: cargo builds every Rust test executable once, and they run
//! side by side, one more at a time than the machine has cores, instead of one after another
//! (most of the long ones wait on servers they started, processes they killed or leases
//! running out, not on a core), with the package check compiling and the JavaScript suites
//! running beside them. Each job prints a line with its time when it ends, its whole output
//! when it fails.

use crate::util::cargo;
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// One test executable cargo built, or another check run beside them.
struct Job {
    /// `package/target` for a test executable, as the lines name it.
    name: String,
    /// The package whose test executable this is (none for the other checks).
    package: Option<String>,
    /// Starts only once no test executable of this package is queued or running.
    after: Option<&'static str>,
    /// Runs the job to its end: `Err` holds what to show of a failure.
    work: Box<dyn FnOnce() -> Result<(), String> + Send>,
}

impl Job {
    /// Jobs start in this order: those named in [`FIRST`], in its order; then the test
    /// executables of a package that another job waits for, the bigger first; then those
    /// named in [`NEXT`]; then the rest, the bigger executables (the ones with servers,
    /// clients and runtimes linked in) first.
    fn order(&self, size: u64, awaited: &[&str]) -> (usize, usize, std::cmp::Reverse<u64>) {
        let named = |list: &[&str]| list.iter().position(|n| *n == self.name);
        let waited_for = self
            .package
            .as_deref()
            .is_some_and(|p| awaited.contains(&p));
        let rank = match (named(&FIRST), waited_for, named(&NEXT)) {
            (Some(i), _, _) => (0, i),
            (None, true, _) => (1, 0),
            (None, false, Some(i)) => (2, i),
            (None, false, None) => (3, 0),
        };
        (rank.0, rank.1, std::cmp::Reverse(size))
    }
}

/// The jobs that take longest (the lines of this command's output say how long each took),
/// started first so that none is left running alone at the end. The package check is
/// first, but it waits for the conformance tests (see `main.rs`), so it starts once they are
/// done; the rest of them come next, so that it starts early.
pub(crate) const FIRST: [&str; 6] = [
    PACKAGE_CHECK,
    "idem-conformance/chaos",
    "idem-conformance/faults",
    "idem-wasm: node --test",
    "idem-conformance/cli",
    "idem-conformance/shared_store",
];

/// Long jobs that start once the tests the package check waits for have started.
const NEXT: [&str; 2] = [
    "edge worker: node --test under workerd",
    "browser example: node --test in headless Chromium",
];

/// The name of the check that the published crates package and build from their packages.
pub(crate) const PACKAGE_CHECK: &str =
    "check: the published crates package and build from their packages";

/// What `cargo test --no-run` built: the test executables, and the binaries and examples
/// that came out of the same build.
pub(crate) struct Built {
    /// Each with the size of its executable (0 for the other checks).
    jobs: Vec<(u64, Job)>,
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

    /// Runs `check` beside the tests, its output shown only when it fails.
    pub(crate) fn add(
        &mut self,
        name: &str,
        check: impl FnOnce() -> Result<(), String> + Send + 'static,
    ) {
        self.push(
            Job {
                name: name.to_owned(),
                package: None,
                after: None,
                work: Box::new(check),
            },
            0,
        );
    }

    /// Runs `command` beside the tests, its output shown only when it fails.
    pub(crate) fn command(&mut self, name: &str, command: Command) {
        self.add(name, move || finished(command));
    }

    /// Runs `command` as [`Built::command`] does, once every test executable of `package`
    /// has ended.
    pub(crate) fn command_after(&mut self, package: &'static str, name: &str, command: Command) {
        self.command(name, command);
        if let Some((_, job)) = self.jobs.last_mut() {
            job.after = Some(package);
        }
    }

    fn push(&mut self, job: Job, size: u64) {
        self.jobs.push((size, job));
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
            let size = std::fs::metadata(&artifact.executable).map_or(0, |m| m.len());
            built.push(artifact.job(), size);
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

/// The jobs not yet started, heaviest first, and the packages of those running.
struct Queue {
    waiting: VecDeque<Job>,
    running: Vec<Option<String>>,
}

impl Queue {
    /// The first waiting job that may start: one that waits for no package, or for one
    /// none of whose tests is waiting or running.
    fn next(&mut self) -> Option<Job> {
        let busy = |p: &str| {
            self.waiting.iter().any(|j| j.package.as_deref() == Some(p))
                || self.running.iter().any(|r| r.as_deref() == Some(p))
        };
        let i = self
            .waiting
            .iter()
            .position(|j| j.after.is_none_or(|p| !busy(p)))?;
        let job = self.waiting.remove(i)?;
        self.running.push(job.package.clone());
        Some(job)
    }

    fn ended(&mut self, package: &Option<String>) {
        if let Some(i) = self.running.iter().position(|r| r == package) {
            self.running.swap_remove(i);
        }
    }
}

/// Runs every job, `parallel` at a time, the heaviest first.
pub(crate) fn run(built: Built, parallel: usize) -> Result<(), String> {
    let mut jobs = built.jobs;
    let awaited: Vec<&str> = jobs.iter().filter_map(|(_, j)| j.after).collect();
    jobs.sort_by_key(|(size, job)| job.order(*size, &awaited));
    let total = jobs.len();
    let queue = Mutex::new(Queue {
        waiting: jobs.into_iter().map(|(_, j)| j).collect(),
        running: Vec::new(),
    });
    let changed = Condvar::new();
    let failed = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..parallel.max(1) {
            s.spawn(|| loop {
                let job = {
                    let mut queue = lock(&queue);
                    loop {
                        if queue.waiting.is_empty() {
                            return;
                        }
                        match queue.next() {
                            Some(job) => break job,
                            None => queue = changed.wait(queue).unwrap_or_else(|e| e.into_inner()),
                        }
                    }
                };
                let began = Instant::now();
                let outcome = (job.work)();
                let seconds = began.elapsed().as_secs_f64();
                let at = start.elapsed().as_secs();
                lock(&queue).ended(&job.package);
                changed.notify_all();
                // One line per job, written whole, so that two jobs' lines never mix.
                let line = format!(
                    "    [+{:02}:{:02}] {} {} ({seconds:.1} s)\n",
                    at / 60,
                    at % 60,
                    if outcome.is_ok() { "ok    " } else { "FAILED" },
                    job.name
                );
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(line.as_bytes());
                if let Err(shown) = outcome {
                    let _ = writeln!(out, "{}", shown.trim_end());
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

/// Runs `command` to its end; a failure's `Err` holds its output.
fn finished(mut command: Command) -> Result<(), String> {
    let output = command.output();
    match &output {
        Ok(o) if o.status.success() => Ok(()),
        _ => Err(shown(&output)),
    }
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
        let mut command = Command::new(&self.executable);
        command
            .arg("--quiet")
            .current_dir(&self.manifest_dir)
            .env("CARGO_MANIFEST_DIR", &self.manifest_dir)
            .env("CARGO_PKG_NAME", &self.package);
        Job {
            name,
            package: Some(self.package),
            after: None,
            work: Box::new(move || finished(command)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{package_name, Artifact, Job, Queue};
    use std::path::PathBuf;

    fn job(name: &str, package: Option<&str>, after: Option<&'static str>) -> Job {
        Job {
            name: name.into(),
            package: package.map(Into::into),
            after,
            work: Box::new(|| Ok(())),
        }
    }

    #[test]
    fn the_tests_a_job_waits_for_start_before_bigger_ones() {
        let first = job(super::FIRST[1], Some("idem-conformance"), None);
        let awaited = job("p/small", Some("p"), None);
        let next = job(super::NEXT[0], None, None);
        let big = job("q/big", Some("q"), None);
        let mut jobs = [(10, big), (0, next), (1, awaited), (5, first)];
        jobs.sort_by_key(|(size, job)| job.order(*size, &["p"]));
        let names: Vec<_> = jobs.iter().map(|(_, j)| j.name.as_str()).collect();
        assert_eq!(names, [super::FIRST[1], "p/small", super::NEXT[0], "q/big"]);
    }

    #[test]
    fn a_job_after_a_package_waits_until_its_tests_have_ended() {
        let mut queue = Queue {
            waiting: [
                job("check", None, Some("p")),
                job("p/a", Some("p"), None),
                job("q/b", Some("q"), None),
                job("p/c", Some("p"), None),
            ]
            .into(),
            running: Vec::new(),
        };
        let mut next = || queue.next().map(|j| (j.name, j.package));
        let started: Vec<_> = (0..3).map(|_| next().map(|(n, _)| n)).collect();
        assert_eq!(
            started,
            [Some("p/a".into()), Some("q/b".into()), Some("p/c".into())]
        );
        assert!(queue.next().is_none(), "p's tests are still running");
        queue.ended(&Some("p".into()));
        queue.ended(&Some("q".into()));
        assert!(queue.next().is_none(), "one of p's tests is still running");
        queue.ended(&Some("p".into()));
        assert_eq!(queue.next().map(|j| j.name), Some("check".into()));
        assert!(queue.waiting.is_empty());
    }

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
