//! The suite against the reference server: every case passes on the correct server, and
//! every fault of the registry (`idem_conformance::server::FAULTS`) makes exactly the cases
//! it names fail, with both oracles and without any (graded by idem's own levels, strictly,
//! where every expectation counts), while the others pass; and the profiles grade the
//! faults that are idem's choices, not the draft's, as the spec says.

use idem_conformance::cases;
use idem_conformance::embedded::Embedded;
use idem_conformance::server::{Fault, FaultDef, Server, ServerConfig, Want, FAULTS};
use idem_conformance::suite::{
    self, KeyKind, KeyStyle, Profile, Report, Target, Verdict, EXIT_HARNESS,
};
use idem_conformance::tls::Identity;
use std::net::SocketAddr;
use std::time::Duration;

/// Plain HTTP, or HTTPS with a certificate generated for the run.
#[derive(Clone, Copy, Debug)]
enum Transport {
    Plain,
    Tls,
}

/// Runs the cases whose IDs start with `prefixes` (all when empty) against the reference
/// server's endpoint of `kind`, one after the other.
async fn run_kind(
    mut config: ServerConfig,
    transport: Transport,
    kind: KeyKind,
    prefixes: &[&str],
    tune: impl FnOnce(&mut Target),
) -> Report {
    if let Transport::Tls = transport {
        config.tls = Some(Identity::generate().expect("a certificate"));
    }
    let server = Server::start(SocketAddr::from(([127, 0, 0, 1], 0)), config.clone())
        .await
        .expect("the reference server starts");
    let mut target = Target::for_reference_kind(&server, &config, kind);
    target.timeout = Duration::from_secs(5);
    tune(&mut target);
    let prefixes: Vec<String> = prefixes.iter().map(|p| (*p).to_owned()).collect();
    let selected = suite::select(&prefixes).expect("known cases");
    let report = tokio::time::timeout(
        Duration::from_secs(90),
        suite::run(&target, &selected, Some(config.fault), &mut |_| {}),
    )
    .await
    .expect("a run against the reference server ends in bounded time")
    .expect("the harness starts");
    drop(server);
    report
}

async fn run_against(
    config: ServerConfig,
    transport: Transport,
    tune: impl FnOnce(&mut Target),
) -> Report {
    run_kind(config, transport, KeyKind::Opaque, &[], tune).await
}

/// Runs the cases whose IDs start with `prefixes` against the `/orders` endpoint.
async fn run_cases(
    config: ServerConfig,
    transport: Transport,
    prefixes: &[&str],
    tune: impl FnOnce(&mut Target),
) -> Report {
    run_kind(config, transport, KeyKind::Opaque, prefixes, tune).await
}

/// The whole suite as the embedded run lays it out: every family against the endpoint of
/// its kind, the waiting cases beside the others, each lane with a server of its own.
async fn run_suite(
    mut config: ServerConfig,
    transport: Transport,
    tune: impl Fn(&mut Target),
) -> Report {
    if let Transport::Tls = transport {
        config.tls = Some(Identity::generate().expect("a certificate"));
    }
    let mut embedded = Embedded::start(&config, cases::all())
        .await
        .expect("the reference servers start");
    for lane in &mut embedded.lanes {
        lane.target.timeout = Duration::from_secs(5);
        tune(&mut lane.target);
    }
    let lanes = std::mem::take(&mut embedded.lanes);
    let report = tokio::time::timeout(
        Duration::from_secs(90),
        suite::run_lanes(lanes, Some(config.fault), &mut |_| {}),
    )
    .await
    .expect("a run against the reference servers ends in bounded time")
    .expect("the harness starts");
    drop(embedded);
    report
}

fn describe(report: &Report) -> String {
    report
        .cases
        .iter()
        .map(|c| {
            format!(
                "{} {} {}",
                c.id,
                c.verdict.name(),
                c.observed.as_deref().or(c.reason.as_deref()).unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_server_passes_every_case() {
    passes_every_case(Transport::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_server_passes_every_case_over_tls() {
    passes_every_case(Transport::Tls).await;
}

async fn passes_every_case(transport: Transport) {
    let report = run_suite(ServerConfig::fast(), transport, |t| {
        t.strict = true;
        t.profile = Profile::idem();
    })
    .await;
    assert_eq!(
        report.target.starts_with("https://"),
        matches!(transport, Transport::Tls)
    );
    assert_eq!(report.cases.len(), cases::all().len());
    for c in &report.cases {
        assert_eq!(c.verdict, Verdict::Pass, "{}\n{}", c.id, describe(&report));
        assert!(!c.exchanges.is_empty(), "{} sent nothing", c.id);
    }
    assert_eq!(report.exit_code, 0);
    // With both oracles every pass is certain.
    assert!(report
        .cases
        .iter()
        .all(|c| c.confidence == Some(suite::Confidence::High)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_oracles_passes_say_how_sure_they_are() {
    let report = run_against(ServerConfig::fast(), Transport::Plain, |t| {
        t.count_url = None;
        t.id_pointer = None;
        t.rounds = 2;
    })
    .await;
    assert_eq!(report.exit_code, 0, "{}", describe(&report));
    let confidence = |id: &str| report.case(id).and_then(|c| c.confidence);
    // The replay marker still vouches for a replay; key refusals are trusted not to run.
    assert_eq!(confidence("replay/1"), Some(suite::Confidence::Medium));
    assert_eq!(confidence("keys/1"), Some(suite::Confidence::Medium));
    assert_eq!(
        confidence("lost-response/1"),
        Some(suite::Confidence::Medium)
    );
    // One success per round, the rest refused as in progress.
    assert_eq!(confidence("concurrent/1"), Some(suite::Confidence::Medium));
    for c in &report.cases {
        assert!(
            c.reason.as_deref().is_some_and(|r| !r.is_empty()),
            "{} says why",
            c.id
        );
    }
}

/// Whether `verdict` is what `want` asks for.
fn meets(verdict: Verdict, want: Want) -> bool {
    match want {
        Want::Pass => verdict == Verdict::Pass,
        Want::Fail => matches!(verdict, Verdict::Fail | Verdict::Unsafe | Verdict::Leak),
        Want::Unsafe => verdict == Verdict::Unsafe,
        Want::Leak => verdict == Verdict::Leak,
        Want::Any => verdict != Verdict::Error,
        Want::Broken => true,
    }
}

/// How `report`, of a run against `fault` with (`oracle`) or without oracles, differs from
/// what the registry says.
fn check(fault: &FaultDef, oracle: bool, transport: Transport, report: &Report) -> Vec<String> {
    let how = if oracle {
        "with oracles"
    } else {
        "without oracles"
    };
    let mut problems = Vec::new();
    for c in &report.cases {
        let want = fault.want(&c.id, oracle);
        if !meets(c.verdict, want) {
            problems.push(format!(
                "fault {} {how} over {transport:?}: {} is {}, expected {want:?} ({})",
                fault.name,
                c.id,
                c.verdict.name(),
                c.observed.as_deref().or(c.reason.as_deref()).unwrap_or("")
            ));
        }
    }
    let wants = |w: Want| report.cases.iter().any(|c| fault.want(&c.id, oracle) == w);
    // A fault only an oracle sees passes without one.
    let exit = if wants(Want::Unsafe) || wants(Want::Leak) {
        2
    } else if wants(Want::Fail) {
        1
    } else {
        0
    };
    if report.exit_code < exit || report.exit_code >= 3 {
        problems.push(format!(
            "fault {} {how}: exit code {}, expected at least {exit}",
            fault.name, report.exit_code
        ));
    }
    problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_is_caught_with_and_without_oracles() {
    every_fault_is_caught(Transport::Plain, &[true, false]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_is_caught_over_tls() {
    every_fault_is_caught(Transport::Tls, &[true]).await;
}

/// The embedded run's settings ([`ServerConfig::fast`]) with every time doubled, for the
/// runs side by side: a case that watches the server's clock (a replay at half the
/// response retention, a timestamp just past the skew) must not be failed by a request that
/// waited for a core. Their ratios, which the faults bend, stay as they are.
fn unhurried() -> ServerConfig {
    let fast = ServerConfig::fast();
    ServerConfig {
        response_ttl: fast.response_ttl * 2,
        key_ttl: fast.key_ttl * 2,
        lease: fast.lease * 2,
        time_keys: idem_core::TimeKeyConfig {
            max_ahead: fast.time_keys.max_ahead * 2,
            max_age: fast.time_keys.max_age * 2,
        },
        token_ttl: fast.token_ttl * 2,
        ..fast
    }
}

/// Runs side by side in one test: enough for their waits to overlap, few enough that the
/// cases that watch the server's clock (a 2 s retention, a 1 s skew) are not starved of
/// the machine's two cores.
const RUNS_AT_ONCE: usize = 10;

/// Runs the whole suite against every fault, once per oracle setting, side by side (each
/// run with servers of its own, so their waits overlap).
async fn every_fault_is_caught(transport: Transport, oracles: &[bool]) {
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(RUNS_AT_ONCE));
    let mut runs = tokio::task::JoinSet::new();
    for (i, def) in FAULTS.iter().enumerate() {
        for &oracle in oracles {
            let fault = Fault::named(def.name).expect("a registered fault");
            let slots = std::sync::Arc::clone(&slots);
            runs.spawn(async move {
                let _slot = slots.acquire_owned().await.expect("the semaphore is open");
                let config = ServerConfig {
                    fault: Some(fault),
                    ..unhurried()
                };
                let report = run_suite(config, transport, |t| {
                    t.strict = true;
                    t.profile = Profile::idem();
                    t.concurrency = 8;
                    t.rounds = 2;
                    if !oracle {
                        t.count_url = None;
                        t.id_pointer = None;
                    }
                })
                .await;
                (i, oracle, report)
            });
        }
    }
    let mut problems = Vec::new();
    while let Some(done) = runs.join_next().await {
        let (i, oracle, report) = done.expect("a fault run completes");
        problems.extend(check(&FAULTS[i], oracle, transport, &report));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_case_is_caught_by_some_fault() {
    // No case is a check that cannot fail: each one fails against at least one fault.
    for c in cases::all() {
        assert!(
            FAULTS
                .iter()
                .any(|f| matches!(f.want(c.id, true), Want::Fail | Want::Unsafe | Want::Leak)),
            "no fault makes {} fail",
            c.id
        );
    }
}

#[test]
fn every_fault_names_real_cases_and_is_caught() {
    for f in FAULTS {
        assert!(!f.expect.is_empty(), "{} expects nothing", f.name);
        for e in f.expect {
            assert!(
                cases::all().iter().any(|c| c.id == e.case),
                "{} names {}, which is no case",
                f.name,
                e.case
            );
        }
        assert!(
            f.expect
                .iter()
                .any(|e| matches!(e.oracle, Want::Fail | Want::Unsafe | Want::Leak)),
            "{} makes no case fail",
            f.name
        );
    }
}

fn verdict(report: &Report, id: &str) -> Verdict {
    report
        .case(id)
        .unwrap_or_else(|| panic!("{id} ran"))
        .verdict
}

fn faulty(name: &str) -> ServerConfig {
    ServerConfig {
        fault: Some(Fault::named(name).expect("a registered fault")),
        ..ServerConfig::fast()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_5xx_passes_under_ietf_and_stripe_and_fails_under_idem() {
    for (profile, want) in [
        (Profile::ietf(), Verdict::Pass),
        (Profile::stripe(), Verdict::Pass),
        (Profile::idem(), Verdict::Fail),
    ] {
        let name = profile.name.clone();
        let report = run_cases(faulty("store-5xx"), Transport::Plain, &["errors/2"], |t| {
            t.profile = profile;
            t.strict = true;
        })
        .await;
        let c = report.case("errors/2").expect("ran");
        assert_eq!(c.verdict, want, "{name}: {}", describe(&report));
        if want == Verdict::Pass {
            // The report names the outcome it accepted, and why.
            let reason = c.reason.as_deref().unwrap_or("");
            assert!(
                reason.contains("IDEM-OUT-4 is MAY") && reason.contains("503"),
                "{name}: {reason}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_retry_after_is_a_should_under_ietf_and_a_must_under_idem() {
    let ietf = run_cases(
        faulty("no-retry-after"),
        Transport::Plain,
        &["concurrent"],
        |t| {
            t.rounds = 2;
        },
    )
    .await;
    assert_eq!(verdict(&ietf, "concurrent/1"), Verdict::Pass);
    assert_eq!(verdict(&ietf, "concurrent/2"), Verdict::NonStrict);
    assert_eq!(ietf.exit_code, 0, "a SHOULD miss alone passes the run");
    let idem = run_cases(
        faulty("no-retry-after"),
        Transport::Plain,
        &["concurrent/2"],
        |t| {
            t.profile = Profile::idem();
        },
    )
    .await;
    assert_eq!(verdict(&idem, "concurrent/2"), Verdict::Fail);
    assert_eq!(idem.exit_code, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_without_location_passes_status_and_body_and_misses_headers() {
    let report = run_cases(
        faulty("drop-location"),
        Transport::Plain,
        &["replay"],
        |_| {},
    )
    .await;
    assert_eq!(
        verdict(&report, "replay/1"),
        Verdict::Pass,
        "{}",
        describe(&report)
    );
    assert_eq!(verdict(&report, "replay/2"), Verdict::Pass);
    let headers = report.case("replay/3").expect("ran");
    assert_eq!(headers.verdict, Verdict::NonStrict);
    assert!(
        headers
            .observed
            .as_deref()
            .is_some_and(|o| o.contains("location")),
        "{:?}",
        headers.observed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_answered_with_422_fail_rather_than_error() {
    let report = run_cases(
        faulty("volatile-fingerprint"),
        Transport::Plain,
        &["lost-response/1", "replay/2"],
        |_| {},
    )
    .await;
    for id in ["lost-response/1", "replay/2"] {
        let c = report.case(id).expect("ran");
        assert_eq!(c.verdict, Verdict::Fail, "{}", describe(&report));
        let observed = c.observed.as_deref().unwrap_or("");
        assert!(
            observed.contains("422"),
            "{id} shows what it saw: {observed}"
        );
        // The requirement the wrong answer missed is the stored result's.
        assert!(c.missed.iter().any(|m| m.requirement == "IDEM-REPLAY-1"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_key_that_is_never_released_is_caught() {
    // A 503 leaves the key in flight: the retry is refused as in progress for good.
    let ietf = run_cases(
        faulty("never-release"),
        Transport::Plain,
        &["errors/2"],
        |_| {},
    )
    .await;
    let c = ietf.case("errors/2").expect("ran");
    assert_eq!(c.verdict, Verdict::NonStrict, "{}", describe(&ietf));
    assert!(c.missed.iter().any(|m| m.requirement == "IDEM-OUT-6"));
    let strict = run_cases(
        faulty("never-release"),
        Transport::Plain,
        &["errors/2"],
        |t| {
            t.strict = true;
        },
    )
    .await;
    assert_eq!(verdict(&strict, "errors/2"), Verdict::Fail);
    // A 429 must release the key: keeping it is a miss of IDEM-OUT-2.
    let busy = run_cases(
        faulty("never-release"),
        Transport::Plain,
        &["errors/2"],
        |t| {
            t.profile = Profile::idem();
            t.fail_body = Some(bytes::Bytes::from_static(
                br#"{"amount":4200,"currency":"eur","outcome":"busy"}"#,
            ));
        },
    )
    .await;
    let c = busy.case("errors/2").expect("ran");
    assert_eq!(c.verdict, Verdict::Fail, "{}", describe(&busy));
    assert!(
        c.missed.iter().any(|m| m.requirement == "IDEM-OUT-2"),
        "{:?}",
        c.missed
    );
    // The correct server releases it: the retry runs again.
    let correct = run_cases(ServerConfig::fast(), Transport::Plain, &["errors/2"], |t| {
        t.profile = Profile::idem();
        t.fail_body = Some(bytes::Bytes::from_static(
            br#"{"amount":4200,"currency":"eur","outcome":"busy"}"#,
        ));
    })
    .await;
    assert_eq!(
        verdict(&correct, "errors/2"),
        Verdict::Pass,
        "{}",
        describe(&correct)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uuid_only_server_passes_with_uuid_keys() {
    let uuid_only = || ServerConfig {
        uuid_keys: true,
        ..ServerConfig::fast()
    };
    let report = run_against(uuid_only(), Transport::Plain, |t| {
        assert_eq!(t.key_style, KeyStyle::Uuid);
        t.profile = Profile::idem();
        t.strict = true;
        t.rounds = 2;
    })
    .await;
    for c in &report.cases {
        let want = if c.id == "keys/6" || KeyKind::of_section(&c.section).is_some() {
            Verdict::Skip
        } else {
            Verdict::Pass
        };
        assert_eq!(c.verdict, want, "{}: {}", c.id, describe(&report));
    }
    assert_eq!(report.exit_code, 0);
    // The same server, asked for keys it never promised to take: a bare 255-character key
    // is refused, which keys/6 reports.
    let bare = run_cases(uuid_only(), Transport::Plain, &["keys/6"], |t| {
        t.key_style = KeyStyle::Bare;
    })
    .await;
    assert_eq!(verdict(&bare, "keys/6"), Verdict::NonStrict);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_target_is_a_harness_error() {
    // A port nothing listens on: bind one, learn it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut target =
        Target::new(url::Url::parse(&format!("http://127.0.0.1:{port}/orders")).expect("url"));
    target.timeout = Duration::from_secs(2);
    let selected = suite::select(&["replay/1".to_owned()]).expect("known");
    let report = suite::run(&target, &selected, None, &mut |_| {})
        .await
        .expect("the harness starts");
    assert_eq!(verdict(&report, "replay/1"), Verdict::Error);
    assert_eq!(report.exit_code, EXIT_HARNESS);
}

#[test]
fn the_readme_fault_table_is_the_registry() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&path).expect("conformance/README.md");
    let (begin, end) = ("<!-- faults:begin -->\n", "<!-- faults:end -->");
    let start = readme.find(begin).expect("begin marker") + begin.len();
    let stop = readme.find(end).expect("end marker");
    let table = idem_conformance::server::faults_table();
    if readme[start..stop] != table {
        if std::env::var_os("IDEM_README_BLESS").is_some() {
            std::fs::write(
                &path,
                format!("{}{table}{}", &readme[..start], &readme[stop..]),
            )
            .expect("README written");
        } else {
            panic!("conformance/README.md's fault table is not the registry's: run `IDEM_README_BLESS=1 cargo test -p idem-conformance --test faults the_readme`");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_leak_is_a_leak_under_every_profile() {
    let leaks: Vec<(&FaultDef, &str)> = FAULTS
        .iter()
        .flat_map(|f| {
            f.expect
                .iter()
                .filter(|e| e.oracle == Want::Leak)
                .map(move |e| (f, e.case))
        })
        .collect();
    assert!(
        leaks.iter().filter(|(_, case)| *case == "scope/1").count() >= 3,
        "a fault for each leak scope/1 checks"
    );
    assert!(
        leaks.iter().any(|(_, case)| case.starts_with("status/")),
        "a fault for the status query's leak"
    );
    for (def, case) in leaks {
        for profile in [Profile::ietf(), Profile::stripe(), Profile::idem()] {
            let name = profile.name.clone();
            let report = run_cases(faulty(def.name), Transport::Plain, &[case], |t| {
                t.profile = profile;
            })
            .await;
            let c = report.case(case).expect("ran");
            assert_eq!(
                c.verdict,
                Verdict::Leak,
                "{} under {name}: {}",
                def.name,
                describe(&report)
            );
            assert_eq!(report.exit_code, 2, "{} under {name}", def.name);
            assert_eq!(report.summary.leak, 1);
            // The leak is named with what it disclosed, and the requirement it breaks: the
            // spec's for disclosures, or the status query's scope.
            let broken = if case.starts_with("status/") {
                "IDEM-STATUS-2"
            } else {
                "IDEM-SCOPE-1"
            };
            assert!(
                c.missed
                    .iter()
                    .any(|m| m.requirement == broken && m.verdict == Verdict::Leak),
                "{:?}",
                c.missed
            );
            assert!(
                c.observed
                    .as_deref()
                    .is_some_and(|o| o.contains("disclosed") || o.contains("stored response")),
                "{:?}",
                c.observed
            );
        }
    }
}
