//! The suite against the reference server: every case passes on the correct server, and
//! every fault is caught by the case aimed at it while the unrelated cases still pass
//! (graded by idem's own levels, strictly, where every expectation counts); and the
//! profiles grade the faults that are idem's choices, not the draft's, as the spec says.

use idem_conformance::cases;
use idem_conformance::server::{Fault, Server, ServerConfig};
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

async fn run_against(
    config: ServerConfig,
    transport: Transport,
    tune: impl FnOnce(&mut Target),
) -> Report {
    run_kind(config, transport, KeyKind::Opaque, &[], tune).await
}

/// Runs the cases whose IDs start with `prefixes` (all when empty).
async fn run_cases(
    config: ServerConfig,
    transport: Transport,
    prefixes: &[&str],
    tune: impl FnOnce(&mut Target),
) -> Report {
    run_kind(config, transport, KeyKind::Opaque, prefixes, tune).await
}

/// Runs the cases whose IDs start with `prefixes` (all when empty) against the reference
/// server's endpoint of `kind`.
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
    for kind in [KeyKind::Time, KeyKind::Counter, KeyKind::Token] {
        let report = run_kind(ServerConfig::fast(), transport, kind, &[], |t| {
            t.strict = true;
            t.profile = Profile::idem();
        })
        .await;
        let family: Vec<_> = report
            .cases
            .iter()
            .filter(|c| Some(c.section.as_str()) == kind.section())
            .collect();
        assert!(family.len() >= 3, "{kind:?}");
        for c in &report.cases {
            let want = if family.iter().any(|f| f.id == c.id) {
                Verdict::Pass
            } else {
                Verdict::Skip
            };
            assert_eq!(c.verdict, want, "{kind:?} {}\n{}", c.id, describe(&report));
        }
        assert_eq!(report.exit_code, 0);
    }
    let report = run_against(ServerConfig::fast(), transport, |t| {
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
        if KeyKind::of_section(c.section.as_str()).is_some() {
            assert_eq!(c.verdict, Verdict::Skip, "{}", c.id);
            continue;
        }
        assert_eq!(c.verdict, Verdict::Pass, "{}\n{}", c.id, describe(&report));
        assert!(!c.exchanges.is_empty(), "{} sent nothing", c.id);
    }
    assert_eq!(report.exit_code, 0);
    // With both oracles every pass is certain.
    assert!(report
        .cases
        .iter()
        .filter(|c| c.verdict == Verdict::Pass)
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

/// What a fault must do to the verdicts.
struct Expect {
    fault: Fault,
    /// The endpoint it is run against.
    kind: KeyKind,
    /// Cases that must fail (or be unsafe).
    caught_by: &'static [&'static str],
    /// Of those, the ones that must be unsafe: a double execution is observable.
    unsafe_: &'static [&'static str],
    /// Plausibly related cases that may fail, be unsafe or skip as well.
    related: &'static [&'static str],
}

const EXPECT: &[Expect] = &[
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::NoLock,
        caught_by: &["concurrent/1", "lost-response/1"],
        unsafe_: &["concurrent/1", "lost-response/1"],
        related: &["concurrent/2", "lease/1"],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::NoFingerprint,
        caught_by: &["mismatch/1"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::NoStore,
        caught_by: &[
            "lost-response/1",
            "replay/1",
            "replay/2",
            "errors/1",
            "expiry/1",
        ],
        unsafe_: &["lost-response/1", "replay/1"],
        related: &[
            "replay/3",
            "mismatch/1",
            "lease/1",
            "expiry/2",
            "concurrent/1",
            "concurrent/2",
        ],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::ReplayAcrossPrincipals,
        caught_by: &["scope/1"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::Store5xx,
        caught_by: &["errors/2"],
        unsafe_: &[],
        // A handler that dies has an unknown outcome with no response, which this policy
        // holds instead of leaving it to the lease.
        related: &["lease/1"],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::LostLease,
        caught_by: &["lease/1"],
        unsafe_: &[],
        // A 503 leaves its key to the lease under the default policy: it never ends.
        related: &["errors/2"],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::ForgetEarly,
        caught_by: &["expiry/1", "expiry/2"],
        unsafe_: &["expiry/1"],
        related: &[
            "lost-response/1",
            "replay/1",
            "replay/2",
            "replay/3",
            "mismatch/1",
            "errors/1",
            "lease/1",
            "concurrent/1",
            "concurrent/2",
        ],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::NoKeyCheck,
        caught_by: &["keys/1", "keys/2", "keys/3", "keys/4", "keys/5"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::ShortKeys,
        caught_by: &["keys/6"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::NoMarker,
        caught_by: &["replay/2"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::NoRetryAfter,
        caught_by: &["concurrent/2"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::ForgetErrors,
        caught_by: &["errors/1"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::NoTombstone,
        caught_by: &["expiry/2"],
        unsafe_: &[],
        related: &["lease/1"],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::NeverExpire,
        caught_by: &["expiry/3"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::VolatileFingerprint,
        caught_by: &[
            "lost-response/1",
            "replay/1",
            "replay/2",
            "replay/3",
            "concurrent/1",
            "mismatch/1",
            "errors/1",
            "errors/2",
            "lease/1",
            "expiry/1",
            "expiry/2",
        ],
        unsafe_: &[],
        related: &["concurrent/2"],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::DropLocation,
        caught_by: &["replay/3"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Opaque,
        fault: Fault::NeverRelease,
        caught_by: &["errors/2", "lease/1"],
        unsafe_: &[],
        related: &[],
    },
    // The generic faults, against the endpoints of the key kinds.
    Expect {
        kind: KeyKind::Time,
        fault: Fault::NoKeyCheck,
        caught_by: &["time/2", "time/3"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Counter,
        fault: Fault::NoKeyCheck,
        caught_by: &["counter/1", "counter/4", "counter/5", "counter/7"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Token,
        fault: Fault::NoKeyCheck,
        caught_by: &["token/2", "token/3"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Time,
        fault: Fault::NoFingerprint,
        caught_by: &["time/1"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Counter,
        fault: Fault::NoFingerprint,
        caught_by: &["counter/3", "counter/6"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Counter,
        fault: Fault::NoStore,
        caught_by: &["counter/2"],
        unsafe_: &["counter/2"],
        related: &["counter/3", "counter/4", "counter/6", "counter/7"],
    },
    Expect {
        kind: KeyKind::Counter,
        fault: Fault::CounterNoWrapCheck,
        caught_by: &["counter/3", "counter/6"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Counter,
        fault: Fault::CounterAcceptStale,
        caught_by: &["counter/4"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Time,
        fault: Fault::TimeNoSkew,
        caught_by: &["time/2"],
        unsafe_: &[],
        related: &[],
    },
    Expect {
        kind: KeyKind::Token,
        fault: Fault::TokenReuse,
        caught_by: &["token/1"],
        unsafe_: &["token/1"],
        related: &[],
    },
];

fn check(e: &Expect, transport: Transport, report: &Report) -> Vec<String> {
    let mut problems = Vec::new();
    for c in &report.cases {
        let id = c.id.as_str();
        let ok = if e.unsafe_.contains(&id) {
            c.verdict == Verdict::Unsafe
        } else if e.caught_by.contains(&id) {
            matches!(c.verdict, Verdict::Fail | Verdict::Unsafe)
        } else if e.related.contains(&id) {
            c.verdict != Verdict::Error
        } else if KeyKind::of_section(&c.section) != (e.kind != KeyKind::Opaque).then_some(e.kind) {
            // Another kind's family, or the generic cases against a kind's endpoint.
            c.verdict == Verdict::Skip
        } else {
            c.verdict == Verdict::Pass
        };
        if !ok {
            problems.push(format!(
                "fault {} ({:?}) over {transport:?}: {id} is {} ({})",
                e.fault,
                e.kind,
                c.verdict.name(),
                c.observed.as_deref().or(c.reason.as_deref()).unwrap_or("")
            ));
        }
    }
    let want = if e.caught_by.iter().any(|id| e.unsafe_.contains(id)) {
        2
    } else {
        1
    };
    if report.exit_code < want || report.exit_code >= 3 {
        problems.push(format!(
            "fault {} ({:?}): exit code {}, expected at least {want}",
            e.fault, e.kind, report.exit_code
        ));
    }
    problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_is_caught_by_the_case_aimed_at_it() {
    every_fault_is_caught(Transport::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_is_caught_over_tls() {
    every_fault_is_caught(Transport::Tls).await;
}

async fn every_fault_is_caught(transport: Transport) {
    for f in Fault::ALL {
        assert!(
            EXPECT.iter().any(|e| e.fault == f),
            "fault {f} has no expectation"
        );
    }
    // The runs go side by side, each against its own server: their waits overlap. The
    // kinds' cases only run against their endpoints, so a fault that matters to several
    // kinds has an expectation for each.
    let mut runs = tokio::task::JoinSet::new();
    for (i, e) in EXPECT.iter().enumerate() {
        let (fault, kind) = (e.fault, e.kind);
        runs.spawn(async move {
            let config = ServerConfig {
                fault: Some(fault),
                ..ServerConfig::fast()
            };
            let report = run_kind(config, transport, kind, &[], |t| {
                t.strict = true;
                t.profile = Profile::idem();
                t.concurrency = 8;
                t.rounds = 2;
            })
            .await;
            (i, report)
        });
    }
    let mut problems = Vec::new();
    while let Some(done) = runs.join_next().await {
        let (i, report) = done.expect("a fault run completes");
        problems.extend(check(&EXPECT[i], transport, &report));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_case_is_caught_by_some_fault() {
    // No case is a check that cannot fail: each one fails against at least one fault.
    for c in cases::all() {
        assert!(
            EXPECT.iter().any(|e| e.caught_by.contains(&c.id)),
            "no fault makes {} fail",
            c.id
        );
    }
}

fn verdict(report: &Report, id: &str) -> Verdict {
    report
        .case(id)
        .unwrap_or_else(|| panic!("{id} ran"))
        .verdict
}

fn faulty(fault: Fault) -> ServerConfig {
    ServerConfig {
        fault: Some(fault),
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
        let report = run_cases(
            faulty(Fault::Store5xx),
            Transport::Plain,
            &["errors/2"],
            |t| {
                t.profile = profile;
                t.strict = true;
            },
        )
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
        faulty(Fault::NoRetryAfter),
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
        faulty(Fault::NoRetryAfter),
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
        faulty(Fault::DropLocation),
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
        faulty(Fault::VolatileFingerprint),
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
        faulty(Fault::NeverRelease),
        Transport::Plain,
        &["errors/2"],
        |_| {},
    )
    .await;
    let c = ietf.case("errors/2").expect("ran");
    assert_eq!(c.verdict, Verdict::NonStrict, "{}", describe(&ietf));
    assert!(c.missed.iter().any(|m| m.requirement == "IDEM-OUT-6"));
    let strict = run_cases(
        faulty(Fault::NeverRelease),
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
        faulty(Fault::NeverRelease),
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
