//! The settle race over two processes on one store (IDEM-STATUS-3): two `idem-conformance
//! serve` processes on one private Redis, and again on one private Postgres. Each of 64
//! rounds takes a fresh key and sends a settling status query about it to one process and
//! the original request with it to the other, on connections opened ahead and released
//! together by a barrier (the roles alternate between the processes). Exactly one of the two
//! compare-and-sets applies, so each round ends in exactly one of: the original executed
//! once (the count oracle, which lives in the store, saw it) and the query reported it
//! (in-progress or completed); or the query answered not-executed and the original was
//! refused with 409 key-settled and never executed. Never both, never neither. A pair whose
//! settle records nothing (`--fault settle-records-nothing`) ends rounds both ways.

#[path = "../../idem-tower/tests/common/mod.rs"]
mod common;
mod served;

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::Method;
use idem_conformance::http::{Http, Prepared, Req, Resp};
use served::Served;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;
use url::Url;

const ROUNDS: usize = 64;
/// Rounds against a pair whose settle records nothing.
const FAULTY_ROUNDS: usize = 32;

/// `serve` on `store` with no handler delay and `extra` arguments; its port.
fn serve_on(store: &str, extra: &[&str]) -> (Served, u16) {
    let mut args = vec!["--store", store, "--delay-ms", "0"];
    args.extend_from_slice(extra);
    let (served, lines) = served::serve(&args, 1);
    (served, served::port(&lines[0]))
}

/// How a round ended, when it ended as it must.
#[derive(Debug, Default)]
struct Tally {
    /// The settle applied: not-executed, the original refused as settled, no execution.
    settled: usize,
    /// The original's claim applied: one execution, the query saw it in progress...
    in_progress: usize,
    /// ...or already completed.
    completed: usize,
}

fn url(port: u16, path: &str) -> Url {
    Url::parse(&format!("http://127.0.0.1:{port}{path}")).expect("a URL")
}

fn header(name: &'static str, value: &str) -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static(name),
        HeaderValue::from_str(value).expect("a header value"),
    )
}

async fn executions(http: &Http, port: u16) -> u64 {
    let r = http
        .send(&Req {
            method: Method::GET,
            url: url(port, "/count"),
            headers: Vec::new(),
            body: Bytes::new(),
        })
        .await
        .expect("the count oracle answers");
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
    v["count"].as_u64().expect("a count")
}

fn json(r: &Resp, member: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
    v.get(member)?.as_str().map(str::to_owned)
}

/// One round: the settling query to `query_port`, the original to `original_port`, released
/// together. How it ended, or what was wrong with it.
async fn round(
    http: &Http,
    key: &str,
    query_port: u16,
    original_port: u16,
    tally: &mut Tally,
) -> Result<(), String> {
    let credential = (AUTHORIZATION, HeaderValue::from_static("Bearer race"));
    let query = Req {
        method: Method::GET,
        url: url(query_port, "/orders"),
        headers: vec![
            credential.clone(),
            header("idempotency-key", key),
            header("idempotency-status", "POST; settle"),
        ],
        body: Bytes::new(),
    };
    let original = Req {
        method: Method::POST,
        url: url(original_port, "/orders"),
        headers: vec![
            credential,
            (CONTENT_TYPE, HeaderValue::from_static("application/json")),
            header("idempotency-key", key),
        ],
        body: Bytes::from_static(br#"{"amount":4200,"currency":"eur"}"#),
    };
    let before = executions(http, original_port).await;
    let barrier = Arc::new(Barrier::new(2));
    let mut sent = Vec::new();
    for req in [&query, &original] {
        let prepared = Prepared::open(req, http).await.expect("a connection");
        let barrier = Arc::clone(&barrier);
        sent.push(tokio::spawn(async move {
            barrier.wait().await;
            prepared.send().await
        }));
    }
    let mut answers = Vec::new();
    for task in sent {
        answers.push(task.await.expect("a sender").expect("an answer"));
    }
    let (q, o) = (&answers[0], &answers[1]);
    let executed = executions(http, original_port).await - before;
    let status = json(q, "status").unwrap_or_default();
    let settled =
        o.status == 409 && json(o, "type").as_deref() == Some("urn:idem:problem:key-settled");
    let ran = o.status == 201;
    match (status.as_str(), settled, ran, executed) {
        ("not-executed", true, false, 0) => tally.settled += 1,
        ("in-progress", false, true, 1) => tally.in_progress += 1,
        ("completed", false, true, 1) => tally.completed += 1,
        _ => {
            let verdict = if status == "not-executed" && executed > 0 {
                "both: settled as not executed, and executed"
            } else {
                "neither, or not as one of the two"
            };
            return Err(format!(
                "{verdict}: the query answered {} {}; the original {} {}; {executed} execution(s)",
                q.status,
                String::from_utf8_lossy(&q.body),
                o.status,
                String::from_utf8_lossy(&o.body)
            ));
        }
    }
    Ok(())
}

/// `rounds` rounds against two `serve` processes on `store` started with `extra` arguments:
/// how they ended, and what was wrong with the others.
fn race(store: &str, extra: &[&str], rounds: usize) -> (Tally, Vec<String>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let (a, port_a) = serve_on(store, extra);
    let (b, port_b) = serve_on(store, extra);
    let http = Http::new(Duration::from_secs(10), 1 << 20, None);
    let run = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let mut tally = Tally::default();
    let mut wrong = Vec::new();
    runtime.block_on(async {
        for i in 0..rounds {
            // The roles alternate: each process settles and runs originals.
            let (query, original) = if i % 2 == 0 {
                (port_a, port_b)
            } else {
                (port_b, port_a)
            };
            let key = format!("\"settle-race-{run}-{i}\"");
            if let Err(e) = round(&http, &key, query, original, &mut tally).await {
                wrong.push(format!("round {i}: {e}"));
            }
        }
    });
    drop((a, b));
    (tally, wrong)
}

fn race_on(store: &str) {
    let (tally, wrong) = race(store, &[], ROUNDS);
    println!(
        "{store}: {ROUNDS} rounds of a settling query and the original on two processes: settled first ×{} (not-executed; the original refused 409 key-settled, never executed), original first ×{} (executed once; the query answered in-progress ×{}, completed ×{}), both or neither ×{}",
        tally.settled,
        tally.in_progress + tally.completed,
        tally.in_progress,
        tally.completed,
        wrong.len()
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert_eq!(tally.settled + tally.in_progress + tally.completed, ROUNDS);
    // The same race against a pair whose settle records nothing: wherever the settle reads
    // first, it answers not-executed and the original runs all the same.
    let (_, wrong) = race(store, &["--fault", "settle-records-nothing"], FAULTY_ROUNDS);
    let both = wrong.iter().filter(|w| w.contains(": both:")).count();
    println!("{store}, --fault settle-records-nothing: {FAULTY_ROUNDS} rounds, both ×{both}");
    assert!(
        both > 0,
        "the race never caught a settle that records nothing: {wrong:?}"
    );
}

#[test]
fn the_settle_race_on_one_redis_ends_one_way_per_round() {
    let redis = common::redis();
    race_on(&redis.url);
}

#[test]
fn the_settle_race_on_one_postgres_ends_one_way_per_round() {
    let postgres = common::postgres();
    race_on(&postgres.url);
}
