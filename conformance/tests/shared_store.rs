//! Two processes, one store (IDEM-CONC-1, IDEM-EXEC-1): two `idem-conformance serve`
//! processes on one private Redis, and again on one private Postgres, behind a round-robin
//! proxy (each connection to the next process), so that the duplicates of every round split
//! across both. The concurrent case races 64 duplicates per round over 160 rounds (10,240
//! requests per store); the count of executions lives in the store, so the oracle counts
//! both processes. Then the whole suite runs against the pair, lease, expiry and crash
//! included; and a pair with the no-lock fault on the same store is caught as unsafe.

#[path = "../../idem-tower/tests/common/mod.rs"]
mod common;
mod proxy;
mod served;

use served::Served;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const CONCURRENCY: usize = 64;
const ROUNDS: usize = 160;

/// The short retention and lease the servers run with, and the suite is told of.
const TIMES: [&str; 6] = ["--response-ttl", "1", "--key-ttl", "2", "--lease", "1"];

/// `serve` on `store`, with short retention, lease and handler delay, and `extra`
/// arguments; its port.
fn serve_on(store: &str, extra: &[&str]) -> (Served, u16) {
    let mut args = vec!["--delay-ms", "50", "--store", store];
    args.extend_from_slice(&TIMES);
    args.extend_from_slice(extra);
    let (served, lines) = served::serve(&args, 1);
    (served, served::port(&lines[0]))
}

/// Two `serve` processes on `store` (with `extra` arguments) behind a round-robin proxy:
/// both processes, the proxy's port, and its connection counts.
fn pair(
    store: &str,
    extra: &[&str],
    runtime: &tokio::runtime::Runtime,
) -> ((Served, Served), u16, Arc<Vec<AtomicUsize>>) {
    let (a, port_a) = serve_on(store, extra);
    let (b, port_b) = serve_on(store, extra);
    let (port, counts) = proxy::round_robin(vec![port_a, port_b], runtime);
    ((a, b), port, counts)
}

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_idem-conformance"))
        .args(args)
        .output()
        .expect("run starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn two_processes_on(store: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let (served, port, counts) = pair(store, &[], &runtime);
    let url = format!("http://127.0.0.1:{port}");
    let json = std::env::temp_dir().join(format!("idem-shared-{}-{port}.json", std::process::id()));
    let (code, output) = run(&[
        "run",
        &format!("{url}/orders"),
        "--case",
        "concurrent",
        "--count-url",
        "/count",
        "--concurrency",
        &CONCURRENCY.to_string(),
        "--rounds",
        &ROUNDS.to_string(),
        "-H",
        "Authorization: Bearer shared",
        "--json",
        json.to_str().expect("utf-8"),
        "--quiet",
    ]);
    assert_eq!(code, 0, "{output}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the report")).expect("JSON");
    let _ = std::fs::remove_file(&json);
    let case = report["cases"]
        .as_array()
        .and_then(|cases| cases.iter().find(|c| c["id"] == "concurrent/1"))
        .expect("concurrent/1");
    assert_eq!(case["verdict"], "pass", "{case}");
    let reason = case["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("exactly one execution in each of {ROUNDS} rounds")),
        "{reason}"
    );
    let rounds: Vec<&str> = case["notes"]
        .as_array()
        .map(|n| {
            n.iter()
                .filter_map(|v| v.as_str())
                .filter(|s| s.starts_with("round "))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(rounds.len(), ROUNDS);
    for note in &rounds {
        // "round N: 201×1 409×63 …": every request of the round was answered.
        let answered: usize = note
            .split_whitespace()
            .filter_map(|w| w.split_once('×'))
            .filter_map(|(_, n)| n.trim_end_matches([',', ';']).parse::<usize>().ok())
            .sum();
        assert_eq!(answered, CONCURRENCY, "{note}");
    }
    let (a_connections, b_connections) = (
        counts[0].load(Ordering::SeqCst),
        counts[1].load(Ordering::SeqCst),
    );
    assert!(
        a_connections >= CONCURRENCY * ROUNDS / 3 && b_connections >= CONCURRENCY * ROUNDS / 3,
        "connections per process: {a_connections} + {b_connections}"
    );
    println!(
        "{store}: {} racing requests in {ROUNDS} rounds of {CONCURRENCY}, over 2 processes ({a_connections} + {b_connections} connections): {reason}",
        CONCURRENCY * ROUNDS
    );

    // The whole suite against the pair: lost responses, replays, mismatches, keys, errors,
    // scope, the lease after a crash, and both expiry windows.
    let order =
        |outcome: &str| format!(r#"{{"amount":4200,"currency":"eur","outcome":"{outcome}"}}"#);
    let (crash, decline, fail) = (order("crash"), order("decline"), order("unavailable"));
    let endpoint = format!("{url}/orders");
    let mut args = vec![
        "run",
        &endpoint,
        "--count-url",
        "/count",
        "-H",
        "Authorization: Bearer a",
        "--second-credential",
        "Authorization: Bearer b",
    ];
    args.extend_from_slice(&TIMES);
    args.extend_from_slice(&[
        "--crash-body",
        &crash,
        "--decline-body",
        &decline,
        "--fail-body",
        &fail,
        "--quiet",
    ]);
    let (code, output) = run(&args);
    assert_eq!(code, 0, "{output}");
    drop(served);

    // The same pair without the lock (the fault wraps the shared store): the suite sees
    // the duplicates of a round run in both processes.
    let (served, port, _) = pair(store, &["--fault", "no-lock"], &runtime);
    let (code, output) = run(&[
        "run",
        &format!("http://127.0.0.1:{port}/orders"),
        "--case",
        "concurrent/1",
        "--count-url",
        "/count",
        "--rounds",
        "3",
        "-H",
        "Authorization: Bearer faulty",
    ]);
    assert_eq!(code, 2, "no-lock on a shared store is unsafe:\n{output}");
    assert!(output.contains("UNSAFE"), "{output}");
    drop(served);
}

#[test]
fn two_processes_on_one_redis_execute_each_key_once() {
    let redis = common::redis();
    two_processes_on(&redis.url);
}

#[test]
fn two_processes_on_one_postgres_execute_each_key_once() {
    let postgres = common::postgres();
    two_processes_on(&postgres.url);
}
