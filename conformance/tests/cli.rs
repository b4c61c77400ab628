//! The command line, as a user runs it: exit codes, reports on disk, usage errors.

use quick_xml::events::Event;
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_idem-conformance"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("the binary runs")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited normally")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// (testcase, failure, error, skipped) element counts, and failure types.
fn junit_counts(xml: &str) -> (usize, usize, usize, usize, Vec<String>) {
    let mut reader = quick_xml::Reader::from_str(xml);
    let (mut cases, mut failures, mut errors, mut skipped) = (0, 0, 0, 0);
    let mut types = Vec::new();
    loop {
        match reader.read_event().expect("well-formed JUnit XML") {
            Event::Eof => break,
            Event::Start(e) | Event::Empty(e) => match e.name().into_inner() {
                "testcase" => cases += 1,
                "failure" => {
                    failures += 1;
                    if let Some(t) = e.try_get_attribute("type").expect("attribute") {
                        types.push(t.value.to_string());
                    }
                }
                "error" => errors += 1,
                "skipped" => skipped += 1,
                _ => {}
            },
            _ => {}
        }
    }
    (cases, failures, errors, skipped, types)
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-conformance-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

#[test]
fn list_names_every_case_with_level_and_requirement() {
    let o = run(&["run", "--list"]);
    assert_eq!(code(&o), 0);
    let out = text(&o.stdout);
    for c in idem_conformance::cases::all() {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{} ", c.id)))
            .unwrap_or_else(|| panic!("{} missing from --list", c.id));
        assert!(
            line.contains(c.requirement) && line.contains(c.level().as_str()),
            "{line}"
        );
    }
}

#[test]
fn usage_errors_exit_3() {
    for args in [
        &["run", "--no-such-option"][..],
        &["run", "--case", "no-such-case"],
        &["run", "--concurrency", "1"],
        &["run", "--timeout", "0"],
        &["run", "--profile", "400/409"],
        &["run", "-H", "no colon"],
        &["run", "ftp://127.0.0.1/orders"],
        &["run", "http://127.0.0.1:9/orders", "--fault", "no-lock"],
        &["frobnicate"],
        &[],
    ] {
        let o = run(args);
        assert_eq!(code(&o), 3, "{args:?}: {}", text(&o.stderr));
        assert!(!o.stderr.is_empty(), "{args:?} explains itself");
    }
    assert_eq!(code(&run(&["--help"])), 0);
    assert_eq!(code(&run(&["--version"])), 0);
}

#[test]
fn an_unreachable_server_exits_3_with_error_elements() {
    // A port that was just free: connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let junit = temp("unreachable.xml");
    let started = Instant::now();
    let o = run(&[
        "run",
        &format!("http://127.0.0.1:{port}/orders"),
        "--timeout",
        "1",
        "--junit",
        junit.to_str().expect("utf-8 path"),
        "--quiet",
    ]);
    assert_eq!(code(&o), 3, "{}", text(&o.stdout));
    assert!(started.elapsed() < Duration::from_secs(30));
    let (cases, failures, errors, skipped, _) =
        junit_counts(&std::fs::read_to_string(&junit).expect("JUnit written"));
    assert_eq!(cases, idem_conformance::cases::all().len());
    assert_eq!(failures, 0, "an unreachable server is not a failing server");
    assert!(errors > 0 && errors + skipped == cases);
}

#[test]
fn an_unsafe_server_exits_2_and_both_reports_say_why() {
    let json = temp("unsafe.json");
    let junit = temp("unsafe.xml");
    let o = run(&[
        "run",
        "--fault",
        "no-lock",
        "--case",
        "concurrent/1",
        "--case",
        "keys/1",
        "--rounds",
        "2",
        "--json",
        json.to_str().expect("utf-8 path"),
        "--junit",
        junit.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(code(&o), 2, "{}", text(&o.stdout));
    let stdout = text(&o.stdout);
    assert!(
        stdout.contains("UNSAFE") && stdout.contains("IDEM-CONC-1"),
        "{stdout}"
    );
    assert!(
        stdout.contains("expected:") && stdout.contains("observed:"),
        "{stdout}"
    );
    assert!(
        stdout.contains("> POST http://127.0.0.1:"),
        "the exchange is shown: {stdout}"
    );
    assert!(
        text(&o.stderr).contains("concurrent/1"),
        "progress is shown"
    );

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written"))
            .expect("valid JSON");
    assert_eq!(report["exit_code"], 2);
    assert_eq!(report["summary"]["unsafe"], 1);
    assert_eq!(report["fault"], "no-lock");
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 2);
    let conc = &cases[0];
    assert_eq!(conc["id"], "concurrent/1");
    assert_eq!(conc["verdict"], "unsafe");
    assert_eq!(
        conc["requirement_text"].as_str(),
        idem_spec::get("IDEM-CONC-1").map(|r| r.text.as_str())
    );
    assert!(conc["exchanges"].as_array().is_some_and(|e| e.len() >= 16));
    assert_eq!(cases[1]["verdict"], "pass");

    let (tests, failures, errors, _, types) =
        junit_counts(&std::fs::read_to_string(&junit).expect("JUnit written"));
    assert_eq!((tests, failures, errors), (2, 1, 0));
    assert_eq!(types, ["unsafe"]);
}

#[test]
fn a_failing_server_exits_1_and_a_passing_selection_exits_0() {
    let o = run(&[
        "run",
        "--fault",
        "no-fingerprint",
        "--case",
        "mismatch",
        "--quiet",
    ]);
    assert_eq!(code(&o), 1, "{}", text(&o.stdout));
    let o = run(&[
        "run",
        "--case",
        "keys",
        "--key-style",
        "sf-string",
        "--quiet",
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o.stdout));
    let o = run(&[
        "run",
        "--case",
        "replay",
        "--case",
        "keys/6",
        "--key-style",
        "bare",
        "--quiet",
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o.stdout));
    // The stripe profile does not require keys and expects 400 for a changed payload; the
    // reference server answers 422.
    let o = run(&[
        "run",
        "--profile",
        "stripe",
        "--case",
        "keys/1",
        "--case",
        "mismatch",
        "--quiet",
    ]);
    assert_eq!(code(&o), 1, "{}", text(&o.stdout));
    let out = text(&o.stdout);
    assert!(
        out.contains("SKIP") && out.contains("refused with 400"),
        "{out}"
    );
    // A missed SHOULD is non-strict (exit 0) unless --strict makes it count.
    let o = run(&[
        "run",
        "--fault",
        "no-marker",
        "--case",
        "replay/2",
        "--quiet",
    ]);
    assert_eq!(code(&o), 0, "{}", text(&o.stdout));
    assert!(text(&o.stdout).contains("NON-STRICT"));
    let o = run(&[
        "run",
        "--fault",
        "no-marker",
        "--case",
        "replay/2",
        "--strict",
        "--quiet",
    ]);
    assert_eq!(code(&o), 1, "{}", text(&o.stdout));
}

#[test]
fn run_against_a_separately_served_reference_server() {
    let mut child = bin()
        .args(["serve", "--listen", "127.0.0.1:0", "--delay-ms", "50"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the banner");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("the banner names the URL")
        .to_owned();
    let o = run(&[
        "run",
        &format!("{url}/orders"),
        "-H",
        "Authorization: Bearer ci-a",
        "--second-credential",
        "Authorization: Bearer ci-b",
        "--count-url",
        "/count",
        "--id-pointer",
        "/id",
        "--case",
        "replay",
        "--case",
        "scope",
        "--case",
        "expiry",
        "--rounds",
        "1",
        "--quiet",
    ]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(code(&o), 0, "{}", text(&o.stdout));
    let out = text(&o.stdout);
    assert!(out.contains("confidence high"), "{out}");
    assert!(
        out.contains("opt-in"),
        "expiry cases are skipped without TTLs: {out}"
    );
}

#[test]
fn bench_prints_requests_per_second() {
    let o = run(&["bench", "--seconds", "0.3", "--connections", "2"]);
    assert_eq!(code(&o), 0, "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for phase in ["fresh keys", "replays"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(phase))
            .unwrap_or_else(|| panic!("no {phase} line in {out}"));
        assert!(
            line.contains("req/s") && line.contains(", 0 unexpected"),
            "{line}"
        );
    }
}
