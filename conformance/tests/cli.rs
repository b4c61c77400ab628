//! The command line, as a user runs it: exit codes, reports on disk, usage errors, TLS,
//! credentials kept out of reports, progress on long waits.

mod served;

use quick_xml::events::Event;
use served::{serve, word_after};
use std::process::{Command, Output};
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
        let levels: Vec<&str> = idem_spec::Profile::ALL
            .iter()
            .map(|p| c.level(*p).as_str())
            .collect();
        let columns: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(columns[1], c.requirement, "{line}");
        // IETF, IDEM, STRIPE: the header's order.
        assert_eq!(columns[2..5], [levels[0], levels[1], levels[2]], "{line}");
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
        &["run", "--profile", "nope"],
        &[
            "run",
            "--header-env",
            "X-Api-Key=IDEM_CONFORMANCE_TEST_UNSET_VARIABLE",
        ],
        &["run", "--header-env", "no-equals-sign"],
        &[
            "run",
            "--header-file",
            "/nonexistent/idem-conformance-headers",
        ],
        &[
            "run",
            "--cacert",
            "/nonexistent/ca.pem",
            "https://127.0.0.1:9/orders",
        ],
        &[
            "run",
            "--cacert",
            "/dev/null",
            "--insecure",
            "https://127.0.0.1:9/orders",
        ],
        &["run", "ftp://127.0.0.1/orders"],
        &["run", "http://127.0.0.1:9/orders", "--fault", "no-lock"],
        &["serve", "--key-ttl", "1", "--response-ttl", "2"],
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            "mysql://127.0.0.1/x",
        ],
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
fn an_unreachable_server_exits_4_with_error_elements() {
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
    assert_eq!(code(&o), 4, "{}", text(&o.stdout));
    assert!(text(&o.stdout).contains("exit code 4: the harness could not judge"));
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
    // reference server answers 422: the refusal holds (mismatch/1 is a MUST), its status is
    // a SHOULD (IDEM-HTTP-1).
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
    assert_eq!(code(&o), 0, "{}", text(&o.stdout));
    let out = text(&o.stdout);
    assert!(
        out.contains("SKIP")
            && out.contains("NON-STRICT")
            && out.contains("IDEM-HTTP-1")
            && out.contains("refused with 400"),
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
    let (_served, lines) = serve(&["--delay-ms", "50"], 1);
    let url = word_after(&lines[0], "http://").to_owned();
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
    for phase in [
        "no idempotency (baseline)",
        "memory: fresh keys",
        "memory: replays",
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(phase))
            .unwrap_or_else(|| panic!("no {phase} line in {out}"));
        assert!(
            line.contains("req/s") && line.contains(", 0 unexpected"),
            "{line}"
        );
    }
    // An unknown store is a usage error.
    let o = run(&["bench", "--seconds", "0.1", "--store", "mysql://x"]);
    assert_eq!(code(&o), 3, "{}", text(&o.stderr));
}

#[test]
fn a_tls_server_passes_with_its_ca_and_is_refused_without_it() {
    let dir = temp("tls");
    let (_served, lines) = serve(
        &[
            "--tls",
            "--tls-dir",
            dir.to_str().expect("utf-8"),
            "--delay-ms",
            "20",
        ],
        2,
    );
    let url = format!("{}/orders", word_after(&lines[0], "https://"));
    let ca = dir.join("ca.pem");
    assert!(
        lines[1].contains(ca.to_str().expect("utf-8")),
        "{}",
        lines[1]
    );
    let common = [
        "-H",
        "Authorization: Bearer tls-a",
        "--count-url",
        "/count",
        "--case",
        "lost-response",
        "--case",
        "replay",
        "--case",
        "concurrent",
        "--rounds",
        "2",
        "--quiet",
    ];
    let o = run(&[
        &["run", &url, "--cacert", ca.to_str().expect("utf-8")][..],
        &common,
    ]
    .concat());
    assert_eq!(code(&o), 0, "{}", text(&o.stdout));
    assert!(text(&o.stdout).contains("TLS: --cacert"));
    // Without the CA the system roots do not know the server: every case is an error the
    // harness explains, and the exit code says the target could not be judged.
    let o = run(&[&["run", &url, "--timeout", "2"][..], &common].concat());
    assert_eq!(code(&o), 4, "{}", text(&o.stdout));
    assert!(text(&o.stdout).contains("--cacert"), "{}", text(&o.stdout));
    // --insecure reaches it, and says so in the header.
    let o = run(&[&["run", &url, "--insecure"][..], &common].concat());
    assert_eq!(code(&o), 0, "{}", text(&o.stdout));
    assert!(text(&o.stdout).contains("TLS: INSECURE"));
}

#[test]
fn credentials_never_reach_a_report() {
    let secrets = [
        "sk_live_51H8cKeyThatMustNotLeak",
        "sess-9f8e7d6c5b4a-cookie-value",
        "env-only-token-0451",
        "file-only-token-0452",
    ];
    let file = temp("headers.txt");
    std::fs::write(
        &file,
        format!("# credentials\n\nX-File-Token: {}\n", secrets[3]),
    )
    .expect("written");
    let json = temp("secrets.json");
    let junit = temp("secrets.xml");
    // replay/2 fails under --strict without the marker, so the terminal shows the
    // exchanges with every header.
    let args = |show: bool| {
        let mut a = vec![
            "run".to_owned(),
            "--fault".into(),
            "no-marker".into(),
            "--strict".into(),
            "--case".into(),
            "replay/2".into(),
            "--case".into(),
            "keys/1".into(),
            "-H".into(),
            format!("X-Api-Key: {}", secrets[0]),
            "-H".into(),
            format!("Cookie: session={}; theme=dark", secrets[1]),
            "--header-env".into(),
            "X-Env-Token=IDEM_TEST_ENV_TOKEN".into(),
            "--header-file".into(),
            file.to_str().expect("utf-8").into(),
            "--json".into(),
            json.to_str().expect("utf-8").into(),
            "--junit".into(),
            junit.to_str().expect("utf-8").into(),
        ];
        if show {
            a.push("--show-secrets".into());
        }
        a
    };
    let o = bin()
        .args(args(false))
        .env("IDEM_TEST_ENV_TOKEN", secrets[2])
        .output()
        .expect("runs");
    assert_eq!(code(&o), 1, "{}", text(&o.stdout));
    let outputs = [
        ("terminal", text(&o.stdout)),
        ("stderr", text(&o.stderr)),
        (
            "JSON",
            std::fs::read_to_string(&json).expect("JSON written"),
        ),
        (
            "JUnit",
            std::fs::read_to_string(&junit).expect("JUnit written"),
        ),
    ];
    for (name, out) in &outputs {
        for s in secrets {
            assert!(!out.contains(s), "{name} leaks {s}:\n{out}");
        }
    }
    for (name, out) in &outputs[..1] {
        assert!(
            out.contains("x-api-key: <31 bytes redacted>"),
            "{name}: {out}"
        );
        assert!(
            out.contains("x-env-token: <19 bytes redacted>"),
            "{name}: {out}"
        );
    }
    // The headers were sent: the same run with --show-secrets shows them.
    let o = bin()
        .args(args(true))
        .env("IDEM_TEST_ENV_TOKEN", secrets[2])
        .output()
        .expect("runs");
    let shown = std::fs::read_to_string(&json).expect("JSON written");
    for s in secrets {
        assert!(shown.contains(s), "--show-secrets shows {s}");
    }
    assert!(text(&o.stdout).contains(secrets[0]));
}

#[test]
fn long_waits_say_what_they_wait_for() {
    let (_served, lines) = serve(
        &[
            "--response-ttl",
            "3",
            "--key-ttl",
            "6",
            "--lease",
            "1",
            "--delay-ms",
            "10",
        ],
        1,
    );
    let url = format!("{}/orders", word_after(&lines[0], "http://"));
    let o = run(&["run", &url, "--case", "expiry/1", "--response-ttl", "3"]);
    assert_eq!(code(&o), 0, "{}", text(&o.stdout));
    let err = text(&o.stderr);
    let wait = err
        .lines()
        .find(|l| l.contains("expiry/1") && l.contains("waiting for half the response retention"))
        .unwrap_or_else(|| panic!("no wait announced: {err}"));
    assert!(wait.contains("s left"), "{wait}");
}

/// The embedded default run: the cases that wait for the server's clock run beside the
/// others, each against a server of its own, and still catch the faults aimed at them; the
/// report keeps suite order.
#[test]
fn waiting_cases_run_beside_the_others_and_still_fail() {
    let json = temp("lanes.json");
    let started = Instant::now();
    let o = run(&["run", "--quiet", "--json", json.to_str().expect("utf-8")]);
    let took = started.elapsed();
    assert_eq!(code(&o), 0, "{}", text(&o.stdout));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the report")).expect("JSON");
    let _ = std::fs::remove_file(&json);
    let ids: Vec<&str> = report["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    let listed = text(&run(&["run", "--list"]).stdout);
    let in_list: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.contains('/'))
        .collect();
    assert_eq!(ids, in_list, "suite order");
    // The waits overlap: the key retention (2 s), the response retention twice over and
    // the lease, one after the other, would take more than 5 s on their own.
    let waited: f64 = ["lease/1", "expiry/1", "expiry/2", "expiry/3"]
        .iter()
        .filter_map(|id| {
            report["cases"]
                .as_array()
                .and_then(|cases| cases.iter().find(|c| c["id"] == *id))
                .and_then(|c| c["duration_ms"].as_f64())
        })
        .sum();
    assert!(
        took.as_secs_f64() * 1000.0 < waited,
        "the run took {took:?}, its waiting cases {waited} ms in all"
    );
    for (fault, case) in [("never-expire", "expiry/3"), ("lost-lease", "lease/1")] {
        let o = run(&["run", "--fault", fault, "--strict", "--quiet"]);
        assert_eq!(code(&o), 1, "{fault}: {}", text(&o.stdout));
        let out = text(&o.stdout);
        assert!(
            out.lines().any(|l| l.contains("FAIL") && l.contains(case)),
            "{fault} is caught by {case}: {out}"
        );
    }
}

/// A reader that stops early (`| head`) ends the output without a panic.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    use std::io::Read as _;
    let mut child = bin()
        .args(["run", "--list"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    drop(child.stdout.take());
    let status = child.wait().expect("it ends");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(status.code(), Some(0), "{err}");
}
