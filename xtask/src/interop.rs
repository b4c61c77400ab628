//! `cargo xtask interop`: the conformance suite against independent open-source
//! Idempotency-Key implementations, each installed from its package registry into its own
//! folder under `interop/` and started on 127.0.0.1 with a small app whose handler counts
//! its runs, once under each profile (ietf, idem, stripe). The verdicts are compared with
//! the profile's table in conformance/README.md, which was established by reading each
//! library's code and probing it by hand: a verdict that differs is either a change in the
//! library or a bug of the suite. `IDEM_INTEROP_BLESS=1` writes the observed verdicts into
//! the README's tables instead, for a reviewer to read in the diff.
//!
//! Not part of `cargo xtask test`: it needs the registries and takes minutes.

use crate::util::{built_executable, cargo, npm_ci_if_stale, run, step, workspace_dir};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How an implementation's app is installed and started.
enum Runtime {
    /// `npm ci`, then `node <main>`.
    Node { main: &'static str },
    /// A virtual environment with `requirements.txt`, then `python <main>`.
    Python { main: &'static str },
}

/// One implementation under test.
struct Library {
    /// Its folder under `interop/`.
    dir: &'static str,
    /// The package and version, as the README's table names its column.
    label: &'static str,
    runtime: Runtime,
    /// The app's environment: its library's retention set to [`TTL_SECONDS`], where the
    /// library has one.
    env: &'static [(&'static str, &'static str)],
}

/// The retention the apps are given and the suite is told (`--ttl`), in seconds.
const TTL_SECONDS: &str = "3";

const LIBRARIES: &[Library] = &[
    Library {
        dir: "express-idempotency",
        label: "express-idempotency 1.0.6",
        runtime: Runtime::Node { main: "app.js" },
        // Records never expire: there is no retention to set.
        env: &[],
    },
    Library {
        dir: "node-idempotency",
        label: "@node-idempotency/nestjs 1.0.4",
        runtime: Runtime::Node { main: "app.js" },
        env: &[("IDEMPOTENCY_TTL_MS", "3000")],
    },
    Library {
        dir: "asgi-idempotency-header",
        label: "asgi-idempotency-header 0.2.0",
        runtime: Runtime::Python { main: "app.py" },
        env: &[("IDEMPOTENCY_EXPIRY_S", TTL_SECONDS)],
    },
];

/// The options every run gets: both oracles, the bodies of the demo handler's declined,
/// failing and crashing outcomes, two principals, a lease for `lease/1` (none of the
/// libraries has one: how long a retry waits before calling a key orphaned) and the
/// retention for the expiry cases.
const COMMON: &[&str] = &[
    "--count-url",
    "/count",
    "--id-pointer",
    "/id",
    "--decline-body",
    r#"{"amount":4200,"currency":"eur","outcome":"decline"}"#,
    "--fail-body",
    r#"{"amount":4200,"currency":"eur","outcome":"unavailable"}"#,
    "-H",
    "Authorization: Bearer interop-a",
    "--second-credential",
    "Authorization: Bearer interop-b",
    "--crash-body",
    r#"{"amount":4200,"currency":"eur","outcome":"crash"}"#,
    "--lease",
    "2",
    "--ttl",
    TTL_SECONDS,
    "--rounds",
    "3",
    "--quiet",
];

/// How long an app may take to say where it listens.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The profiles every library is graded under, each with its table in the README.
const PROFILES: &[&str] = &["ietf", "idem", "stripe"];

/// The markers around `profile`'s expected table in conformance/README.md.
fn markers(profile: &str) -> (String, String) {
    (
        format!("<!-- interop:{profile}:begin -->"),
        format!("<!-- interop:{profile}:end -->"),
    )
}

pub(crate) fn interop(conformance: &Path) -> Result<(), String> {
    let readme_path = workspace_dir("conformance/README.md");
    let mut readme = std::fs::read_to_string(&readme_path)
        .map_err(|e| format!("{}: {e}", readme_path.display()))?;
    let bless = std::env::var_os("IDEM_INTEROP_BLESS").is_some();
    let out = workspace_dir("target/interop");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    for lib in LIBRARIES {
        install(lib, &workspace_dir("interop").join(lib.dir))?;
    }
    let mut differences = Vec::new();
    for profile in PROFILES {
        let mut observed: BTreeMap<&str, Ordered> = BTreeMap::new();
        for lib in LIBRARIES {
            let dir = workspace_dir("interop").join(lib.dir);
            step(&format!("interop: {} under --profile {profile}", lib.label));
            let app = App::start(lib, &dir)?;
            let json = out.join(format!("{}-{profile}.json", lib.dir));
            let status = Command::new(conformance)
                .arg("run")
                .arg(format!("{}/orders", app.base))
                .args(COMMON)
                .args(["--profile", profile])
                .arg("--json")
                .arg(&json)
                .status()
                .map_err(|e| format!("{}: {e}", conformance.display()))?;
            drop(app);
            // 0, 1 and 2 are verdicts; 3 and 4 mean the run itself went wrong.
            if !matches!(status.code(), Some(0..=2)) {
                return Err(format!(
                    "the run against {} under {profile} ended with {status}",
                    lib.label
                ));
            }
            observed.insert(lib.label, verdicts(&json)?);
        }
        if bless {
            readme = with_table(&readme, profile, &render_table(&observed))?;
        } else {
            let expected = expected_table(&readme, profile)?;
            differences.extend(compare(profile, &expected, &observed)?);
        }
    }
    if bless {
        return std::fs::write(&readme_path, readme)
            .map_err(|e| format!("{}: {e}", readme_path.display()));
    }
    if differences.is_empty() {
        println!("\nevery verdict under every profile matches conformance/README.md");
        Ok(())
    } else {
        Err(format!(
            "{} verdict(s) differ from conformance/README.md:\n{}",
            differences.len(),
            differences.join("\n")
        ))
    }
}

/// The observed verdicts as the README's table: a row per case, a column per library.
fn render_table(observed: &BTreeMap<&str, Ordered>) -> String {
    let labels: Vec<&str> = LIBRARIES.iter().map(|l| l.label).collect();
    let mut out = format!(
        "| Case | {} |\n|---|{}\n",
        labels.join(" | "),
        "---|".repeat(labels.len())
    );
    let Some(first) = observed.get(labels[0]) else {
        return out;
    };
    // Suite order, as the JSON report lists the cases.
    for id in first.keys_in_order() {
        let cells: Vec<&str> = labels
            .iter()
            .map(|l| {
                observed
                    .get(l)
                    .and_then(|c| c.get(id))
                    .map_or("", String::as_str)
            })
            .collect();
        out.push_str(&format!("| `{id}` | {} |\n", cells.join(" | ")));
    }
    out
}

/// `readme` with `table` between `profile`'s markers.
fn with_table(readme: &str, profile: &str, table: &str) -> Result<String, String> {
    let (begin, end) = markers(profile);
    let start = readme
        .find(&begin)
        .ok_or_else(|| format!("conformance/README.md has no {begin}"))?
        + begin.len();
    let stop = readme[start..]
        .find(&end)
        .ok_or_else(|| format!("conformance/README.md has no {end}"))?
        + start;
    Ok(format!("{}\n{table}{}", &readme[..start], &readme[stop..]))
}

fn install(lib: &Library, dir: &Path) -> Result<(), String> {
    match lib.runtime {
        Runtime::Node { .. } => npm_ci_if_stale(dir, lib.label),
        Runtime::Python { .. } => {
            let venv = dir.join(".venv");
            let stamp = venv.join("installed");
            let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            let fresh = match (modified(&stamp), modified(&dir.join("requirements.txt"))) {
                (Some(s), Some(r)) => s >= r,
                _ => false,
            };
            if fresh {
                return Ok(());
            }
            step(&format!("setup: python venv ({})", lib.label));
            if !Command::new("python3")
                .args(["-m", "venv", "--help"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                crate::util::apt_install(&["python3", "python3-venv"])?;
            }
            run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
            run(Command::new(venv.join("bin/pip"))
                .args([
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--require-virtualenv",
                    "-r",
                ])
                .arg(dir.join("requirements.txt")))?;
            std::fs::write(&stamp, b"").map_err(|e| format!("{}: {e}", stamp.display()))
        }
    }
}

/// A started app, stopped when dropped (also when the run fails).
struct App {
    child: Child,
    base: String,
}

impl App {
    fn start(lib: &Library, dir: &Path) -> Result<App, String> {
        let mut cmd = match lib.runtime {
            Runtime::Node { main } => {
                let mut c = Command::new("node");
                c.arg(main);
                c
            }
            Runtime::Python { main } => {
                let mut c = Command::new(dir.join(".venv/bin/python"));
                c.arg(main);
                c
            }
        };
        let mut child = cmd
            .current_dir(dir)
            .envs(lib.env.iter().copied())
            .env("PORT", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{cmd:?}: {e}"))?;
        let stdout = child.stdout.take();
        let mut app = App {
            child,
            base: String::new(),
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let Some(stdout) = stdout else { return };
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next().and_then(Result::ok);
            let _ = tx.send(first);
            // Keep draining, so that the app never blocks on a full pipe.
            for _ in lines {}
        });
        let line = rx
            .recv_timeout(START_TIMEOUT)
            .ok()
            .flatten()
            .ok_or_else(|| format!("{} did not say where it listens", lib.label))?;
        app.base = line
            .strip_prefix("listening on ")
            .filter(|u| u.starts_with("http://127.0.0.1:"))
            .ok_or_else(|| format!("{}: unexpected first line {line:?}", lib.label))?
            .trim()
            .to_owned();
        Ok(app)
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The case verdicts of a JSON report, upper-case as the README writes them, in the
/// report's (suite) order.
fn verdicts(json: &PathBuf) -> Result<Ordered, String> {
    let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
    let report: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json.display()))?;
    let cases = report["cases"]
        .as_array()
        .ok_or_else(|| format!("{}: no cases", json.display()))?;
    let mut out = Ordered::default();
    for c in cases {
        match (c["id"].as_str(), c["verdict"].as_str()) {
            (Some(id), Some(v)) => out.insert(id.to_owned(), v.to_uppercase()),
            _ => return Err(format!("{}: a case without id or verdict", json.display())),
        }
    }
    Ok(out)
}

/// Verdicts by case, remembering the order the cases came in.
#[derive(Default)]
struct Ordered {
    order: Vec<String>,
    map: BTreeMap<String, String>,
}

impl Ordered {
    fn insert(&mut self, id: String, verdict: String) {
        self.order.push(id.clone());
        self.map.insert(id, verdict);
    }

    fn get(&self, id: &str) -> Option<&String> {
        self.map.get(id)
    }

    fn keys_in_order(&self) -> impl Iterator<Item = &String> {
        self.order.iter()
    }
}

/// `profile`'s table in the README: column label → case → verdict (the cell's first word).
fn expected_table(
    readme: &str,
    profile: &str,
) -> Result<BTreeMap<String, BTreeMap<String, String>>, String> {
    let (begin, end) = markers(profile);
    let start = readme
        .find(&begin)
        .ok_or_else(|| format!("conformance/README.md has no {begin}"))?;
    let end = readme[start..]
        .find(&end)
        .ok_or_else(|| format!("conformance/README.md has no {end}"))?;
    let mut rows = readme[start + begin.len()..start + end]
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_owned())
                .collect::<Vec<_>>()
        });
    let header = rows.next().ok_or("the interop table has no header")?;
    let mut table: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for row in rows.filter(|r| !r.iter().all(|c| c.chars().all(|ch| ch == '-' || ch == ':'))) {
        for (label, cell) in header.iter().zip(&row).skip(1) {
            let verdict = cell
                .split(|c: char| c.is_whitespace() || c == '(')
                .next()
                .unwrap_or("")
                .trim_end_matches(|c: char| !c.is_ascii_alphabetic())
                .to_owned();
            table
                .entry(label.clone())
                .or_default()
                .insert(row[0].clone(), verdict);
        }
    }
    Ok(table)
}

/// The differences between `profile`'s expected table and what was observed, printed as
/// they are found.
fn compare(
    profile: &str,
    expected: &BTreeMap<String, BTreeMap<String, String>>,
    observed: &BTreeMap<&str, Ordered>,
) -> Result<Vec<String>, String> {
    let mut differences = Vec::new();
    step(&format!(
        "interop: verdicts under {profile} (expected → observed where they differ)"
    ));
    for (label, cases) in observed {
        let want = expected.get(*label).ok_or_else(|| {
            format!("the README's {profile} interop table has no column {label:?}")
        })?;
        println!("{label}");
        for id in cases.keys_in_order() {
            let verdict = &cases.map[id];
            let expected = want.get(id).map_or("(missing)", String::as_str);
            if expected == verdict {
                println!("  {id:<16} {verdict}");
            } else {
                println!("  {id:<16} {expected} → {verdict}   DIFFERS");
                differences.push(format!(
                    "{profile}: {label} {id}: expected {expected}, observed {verdict}"
                ));
            }
        }
    }
    Ok(differences)
}

/// Builds idem-conformance in release mode and returns the path of its executable.
pub(crate) fn build_conformance() -> Result<PathBuf, String> {
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--release",
        "-p",
        "idem-conformance",
        "--bin",
        "idem-conformance",
    ]);
    built_executable(&mut cmd, "idem-conformance")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expected_table_is_read_from_between_the_markers() {
        let (begin, end) = markers("ietf");
        let readme = format!(
            "intro\n{begin}\n| Case | lib-a 1.0 | lib-b 2.0 |\n|---|:--:|---|\n| `replay/1` | PASS | FAIL¹ |\n| keys/1 | NON-STRICT (400 expected) | UNSAFE |\n{end}\n| other | table |\n"
        );
        let t = expected_table(&readme, "ietf").expect("parsed");
        assert_eq!(t["lib-a 1.0"]["replay/1"], "PASS");
        assert_eq!(t["lib-b 2.0"]["replay/1"], "FAIL");
        assert_eq!(t["lib-a 1.0"]["keys/1"], "NON-STRICT");
        assert_eq!(t["lib-b 2.0"]["keys/1"], "UNSAFE");
        assert!(!t.contains_key("table"));
        assert!(expected_table("no markers", "ietf").is_err());
        assert!(expected_table(&readme, "stripe").is_err());
    }

    #[test]
    fn the_readme_has_a_column_for_every_library_and_a_row_for_every_case() {
        let readme = std::fs::read_to_string(workspace_dir("conformance/README.md"))
            .expect("conformance/README.md");
        for profile in PROFILES {
            let table = expected_table(&readme, profile).expect("the interop table parses");
            for lib in LIBRARIES {
                let column = table
                    .get(lib.label)
                    .unwrap_or_else(|| panic!("{profile}: no column {}", lib.label));
                assert!(column.len() >= 20, "{}: {} rows", lib.label, column.len());
                for v in column.values() {
                    assert!(
                        [
                            "PASS",
                            "NON-STRICT",
                            "FAIL",
                            "UNSAFE",
                            "LEAK",
                            "SKIP",
                            "ERROR"
                        ]
                        .contains(&v.as_str()),
                        "{profile} {}: {v}",
                        lib.label
                    );
                }
            }
        }
    }
}
