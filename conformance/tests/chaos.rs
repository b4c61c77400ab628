//! Chaos: faults at the process and store level under load (IDEM-EXEC-1, IDEM-LEASE-1,
//! IDEM-STORE-3, IDEM-STORE-4, IDEM-STORE-10). Two `idem-conformance serve` processes
//! (idem-tower) and two Node processes (the npm package's `withIdempotency`,
//! idem-wasm/test/fixtures/orders-server.mjs) share one private Redis or Postgres behind a
//! round-robin balancer, so that a key claimed in one language is retried in the other.
//! Every run of their handlers is appended to one execution log (key, fence, recovered,
//! process), while hundreds of clients place orders, each with its own key, retrying as a
//! client does (after `Retry-After` on 409 and 503, at once after a lost connection) until
//! it has a 2xx. Then:
//!
//! * one `serve` and one Node process are killed with SIGKILL mid-run;
//! * the store is killed with SIGKILL and started again on its data, Redis with its
//!   append-only file and without (which loses records: shown, not hidden), then Postgres;
//! * the store stops answering (a gate that holds every byte back) and heals.
//!
//! After each, every key must have executed exactly once, or once and then again as a
//! takeover after its lease (`recovered`), never twice afresh; every answer a client got is
//! replayed to it unchanged (nothing stored is lost), but for one sent while the store failed
//! to keep it (`IDEM-OUT-5`), whose key is taken over; the refusals the fault caused are 503
//! problem+json. A soak through one `serve` on Redis prints the server's memory and the
//! latency percentiles over time.
//!
//! The test command runs the short form; `cargo xtask chaos` the long one (`IDEM_CHAOS=long`:
//! more keys and more in flight, and the soak of 10⁶ requests). The Node processes need the
//! npm package built (`cargo xtask test` builds it first).

#[path = "../../idem-tower/tests/common/mod.rs"]
mod common;
mod proxy;
mod served;

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use served::Served;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The servers' lease, in seconds: how long a key whose process died stays in flight.
const LEASE: &str = "2";
/// How long each handler run takes: long enough for hundreds of requests to be in flight.
const DELAY_MS: &str = "300";
/// How long a client keeps retrying one order before it calls it undetermined.
const GIVE_UP: Duration = Duration::from_secs(60);
const ORDER: &str = r#"{"amount":4200,"currency":"eur"}"#;
/// How long a killed store stays down, and a partitioned one silent: longer than a store
/// call may take (idem-core's `CALL_TIMEOUT`, 2 s).
const STORE_DOWN: Duration = Duration::from_secs(3);

/// How big a run is.
struct Scale {
    /// Orders per scenario, each with its own key.
    keys: usize,
    /// Orders in flight at once.
    in_flight: usize,
    /// Requests of the soak.
    soak: usize,
}

fn scale() -> Scale {
    match std::env::var("IDEM_CHAOS").as_deref() {
        Ok("long") => Scale {
            keys: 5_000,
            in_flight: 500,
            soak: 1_000_000,
        },
        _ => Scale {
            keys: 600,
            in_flight: 200,
            soak: 20_000,
        },
    }
}

/// One scenario at a time: each starts its own processes and fills both cores.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A temporary directory for one scenario's execution log, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "idem-chaos-{label}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        Scratch(dir)
    }

    fn log(&self) -> PathBuf {
        self.0.join("executions.tsv")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `serve` on `store` with the chaos lease and delay, logging executions to `log`.
fn serve_on(store: &str, log: &Path) -> (Served, u16) {
    let log = log.to_str().expect("a UTF-8 path");
    let args = [
        "--store",
        store,
        "--lease",
        LEASE,
        "--delay-ms",
        DELAY_MS,
        "--execution-log",
        log,
    ];
    let (served, lines) = served::serve(&args, 1);
    (served, served::port(&lines[0]))
}

/// The Node server of the npm package's tests.
fn node_fixture() -> PathBuf {
    let wasm = Path::new(env!("CARGO_MANIFEST_DIR")).join("../idem-wasm");
    assert!(
        wasm.join("dist/node.js").exists(),
        "the npm package is not built: run `cargo xtask test` (or `npm run build` in idem-wasm)"
    );
    wasm.join("test/fixtures/orders-server.mjs")
}

/// A Node orders server, killed when dropped (also when the test fails).
struct Node(std::process::Child);

impl Node {
    /// Starts the Node server on `store` (`redis://…` or `postgres://…`) with the chaos
    /// lease and delay, logging executions to `log`; it and its port.
    fn start(store: &str, log: &Path) -> (Node, u16) {
        use std::io::BufRead;
        let kind = if store.starts_with("redis") {
            "redis"
        } else {
            "postgres"
        };
        let lease_ms = LEASE.parse::<u64>().expect("seconds") * 1000;
        let mut child = std::process::Command::new("node")
            .arg(node_fixture())
            .args([kind, store])
            .env("ORDER_DELAY_MS", DELAY_MS)
            .env("IDEM_LEASE_MS", lease_ms.to_string())
            .env("EXECUTION_LOG", log)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("node starts");
        let stdout = child.stdout.take().expect("stdout");
        let node = Node(child);
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the port");
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no port in {line:?}"));
        (node, port)
    }

    /// Kills the process with SIGKILL and reaps it.
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the clients saw.
#[derive(Default)]
struct Load {
    /// Requests sent and not yet answered.
    in_flight: AtomicUsize,
    /// Answers by status (and what went wrong without one).
    answers: Mutex<BTreeMap<String, usize>>,
    /// Each order's first 2xx: its body.
    answered: Mutex<HashMap<String, bytes::Bytes>>,
    /// Orders given up on.
    undetermined: AtomicUsize,
}

impl Load {
    fn note(&self, what: String) {
        *lock(&self.answers).entry(what).or_default() += 1;
    }

    fn answers(&self) -> String {
        lock(&self.answers)
            .iter()
            .map(|(k, n)| format!("{k}×{n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client")
}

/// Sends the order with `key` once: its status, whether it is problem+json, its
/// `Retry-After`, and its body; `Err` with what went wrong when nothing came back.
async fn send(
    client: &reqwest::Client,
    url: &str,
    key: &str,
) -> Result<(u16, bool, Option<u64>, bytes::Bytes), String> {
    let r = client
        .post(url)
        .header("idempotency-key", key)
        .header(AUTHORIZATION, "Bearer chaos")
        .header(CONTENT_TYPE, "application/json")
        .body(ORDER)
        .send()
        .await
        .map_err(|e| {
            if e.is_timeout() {
                "timeout"
            } else {
                "no answer"
            }
            .to_owned()
        })?;
    let status = r.status().as_u16();
    let header = |name| r.headers().get(name).and_then(|v| v.to_str().ok());
    let problem = header(CONTENT_TYPE).is_some_and(|v| v.starts_with("application/problem+json"));
    let retry = header(RETRY_AFTER).and_then(|v| v.parse().ok());
    let body = r.bytes().await.map_err(|_| "body cut".to_owned())?;
    Ok((status, problem, retry, body))
}

/// One client's order: sent until a 2xx answers it, or given up after [`GIVE_UP`].
async fn place(client: reqwest::Client, url: Arc<str>, key: String, load: Arc<Load>) {
    let end = Instant::now() + GIVE_UP;
    loop {
        load.in_flight.fetch_add(1, Ordering::SeqCst);
        let answer = send(&client, &url, &key).await;
        load.in_flight.fetch_sub(1, Ordering::SeqCst);
        let pause = match answer {
            Ok((status, _, _, body)) if (200..300).contains(&status) => {
                load.note(status.to_string());
                lock(&load.answered).insert(key, body);
                return;
            }
            Ok((status, problem, retry, _)) => {
                let plain = status >= 400 && !problem;
                load.note(if plain {
                    format!("{status} (not problem+json)")
                } else {
                    status.to_string()
                });
                Duration::from_secs(retry.unwrap_or(1).min(2))
            }
            Err(what) => {
                load.note(what);
                Duration::from_millis(50)
            }
        };
        if Instant::now() + pause >= end {
            load.undetermined.fetch_add(1, Ordering::SeqCst);
            return;
        }
        tokio::time::sleep(pause).await;
    }
}

/// Places every order of `keys` at `url`, `in_flight` at a time.
async fn drive(url: String, keys: Vec<String>, in_flight: usize, load: Arc<Load>) {
    let client = client();
    let url: Arc<str> = url.into();
    let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut orders = tokio::task::JoinSet::new();
    for key in keys {
        let permit = Arc::clone(&permits)
            .acquire_owned()
            .await
            .expect("the semaphore stays open");
        let (client, url, load) = (client.clone(), Arc::clone(&url), Arc::clone(&load));
        orders.spawn(async move {
            place(client, url, key, load).await;
            drop(permit);
        });
    }
    while orders.join_next().await.is_some() {}
}

/// One handler run, as the execution log has it.
struct Run {
    recovered: bool,
}

/// The execution log: each key's runs, in order.
fn executions(log: &Path) -> HashMap<String, Vec<Run>> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut runs: HashMap<String, Vec<Run>> = HashMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), 4, "a line of the execution log: {line:?}");
        runs.entry(fields[0].to_owned()).or_default().push(Run {
            recovered: fields[2] == "true",
        });
    }
    runs
}

/// What a scenario ended with.
#[derive(Debug, Default)]
struct Figures {
    /// Requests in flight when the fault struck.
    in_flight_at_fault: usize,
    /// Keys run once.
    once: usize,
    /// Keys run once and taken over after the lease (each later run `recovered`).
    taken_over: usize,
    /// Keys run twice afresh: a double execution.
    twice: usize,
    /// Keys answered 2xx with no run in the log.
    never: usize,
    /// Answers a client got that a retry did not get back unchanged without running, or
    /// that ran afresh when asked again (the key forgotten).
    lost: usize,
    /// Orders given up on.
    undetermined: usize,
}

/// Asks for every answered order again (retrying as a client does) and counts each key's
/// runs in the log. A stored answer comes back unchanged and runs nothing; an answer that
/// was sent but could not be stored (the store failed as it was written, `IDEM-OUT-5`) is
/// taken over after the lease, a run marked recovered; a run afresh is a key forgotten.
fn tally(runtime: &tokio::runtime::Runtime, url: &str, log: &Path, load: &Load) -> Figures {
    let answered = lock(&load.answered).clone();
    let before = executions(log);
    let check = Arc::new(Load::default());
    runtime.block_on(drive(
        url.to_owned(),
        answered.keys().cloned().collect(),
        64,
        Arc::clone(&check),
    ));
    let again = lock(&check.answered).clone();
    let after = executions(log);
    let mut figures = Figures {
        undetermined: load.undetermined.load(Ordering::SeqCst)
            + check.undetermined.load(Ordering::SeqCst),
        ..Figures::default()
    };
    for (key, body) in &answered {
        let runs = after.get(key).map_or(&[][..], Vec::as_slice);
        let fresh = runs.iter().filter(|r| !r.recovered).count();
        match runs.len() {
            0 => figures.never += 1,
            1 => figures.once += 1,
            _ if fresh <= 1 => figures.taken_over += 1,
            _ => figures.twice += 1,
        }
        let new_runs = &runs[before.get(key).map_or(0, Vec::len).min(runs.len())..];
        let changed = new_runs.is_empty() && again.get(key) != Some(body);
        if changed || new_runs.iter().any(|r| !r.recovered) {
            figures.lost += 1;
        }
    }
    figures
}

fn keys(label: &str, n: usize) -> Vec<String> {
    let run = uuid::Uuid::new_v4().simple().to_string();
    (0..n)
        .map(|i| format!("{label}-{}-{i}", &run[..8]))
        .collect()
}

/// Runs the orders against `url`, strikes with `fault` once a quarter of them are answered,
/// and tallies the end; prints the figures under `title`.
fn scenario(
    title: &str,
    runtime: &tokio::runtime::Runtime,
    url: &str,
    log: &Path,
    fault: impl FnOnce(),
) -> (Figures, String) {
    let Scale {
        keys: n, in_flight, ..
    } = scale();
    let load = Arc::new(Load::default());
    let started = Instant::now();
    let driving = runtime.spawn(drive(
        format!("{url}/orders"),
        keys("chaos", n),
        in_flight,
        Arc::clone(&load),
    ));
    while lock(&load.answered).len() < n / 4 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let in_flight_at_fault = load.in_flight.load(Ordering::SeqCst);
    fault();
    runtime.block_on(driving).expect("the orders ran");
    let elapsed = started.elapsed();
    let mut figures = tally(runtime, &format!("{url}/orders"), log, &load);
    figures.in_flight_at_fault = in_flight_at_fault;
    let answers = load.answers();
    println!(
        "{title}: {n} orders, {in_flight_at_fault} requests in flight at the fault; \
         executions per key: once {}, taken over after the lease {}, twice {}, never {}; \
         stored answers lost {}; undetermined {}; answers: {answers} ({:.1} s)",
        figures.once,
        figures.taken_over,
        figures.twice,
        figures.never,
        figures.lost,
        figures.undetermined,
        elapsed.as_secs_f64()
    );
    (figures, answers)
}

/// Nothing ran twice, nothing answered was lost, every order was answered, and every
/// refusal was problem+json.
fn assert_safe(f: &Figures, answers: &str) {
    assert_eq!(f.twice, 0, "keys executed twice: {f:?}");
    assert_eq!(f.never, 0, "answers without an execution: {f:?}");
    assert_eq!(f.lost, 0, "stored answers lost: {f:?}");
    assert_eq!(f.undetermined, 0, "orders never answered: {f:?}");
    assert!(!answers.contains("not problem+json"), "{answers}");
}

/// Two `serve` and two Node processes on `store`, behind a balancer.
struct Fleet {
    serve: [Served; 2],
    node: [Node; 2],
    /// The balancer's port.
    port: u16,
}

fn fleet(store: &str, log: &Path, runtime: &tokio::runtime::Runtime) -> Fleet {
    // The serve processes first: they create the tables.
    let (a, port_a) = serve_on(store, log);
    let (b, port_b) = serve_on(store, log);
    let (c, port_c) = Node::start(store, log);
    let (d, port_d) = Node::start(store, log);
    let (port, _) = proxy::round_robin(vec![port_a, port_c, port_b, port_d], runtime);
    Fleet {
        serve: [a, b],
        node: [c, d],
        port,
    }
}

fn kill_one_server(store: &common::Server, name: &str) {
    let _serial = one_at_a_time();
    let runtime = runtime();
    let scratch = Scratch::new("kill-serve");
    let mut fleet = fleet(&store.url, &scratch.log(), &runtime);
    let url = format!("http://127.0.0.1:{}", fleet.port);
    let title = format!("SIGKILL to one serve and one Node process of four on {name}");
    let (f, answers) = scenario(&title, &runtime, &url, &scratch.log(), || {
        fleet.serve[0].kill();
        fleet.node[0].kill();
    });
    assert_safe(&f, &answers);
    assert!(f.in_flight_at_fault > 0, "{f:?}");
    assert!(
        f.taken_over > 0,
        "the killed process's orders were taken over: {f:?}"
    );
}

#[test]
fn a_server_process_killed_mid_run_on_redis_runs_no_key_twice() {
    kill_one_server(&common::redis_with(true), "Redis");
}

#[test]
fn a_server_process_killed_mid_run_on_postgres_runs_no_key_twice() {
    kill_one_server(&common::postgres_with(true), "Postgres");
}

/// Kills the store with SIGKILL mid-run and starts it again on its data.
fn restart_store(mut store: common::Server, name: &str) -> (Figures, String) {
    let _serial = one_at_a_time();
    let runtime = runtime();
    let scratch = Scratch::new("restart-store");
    let fleet = fleet(&store.url, &scratch.log(), &runtime);
    let url = format!("http://127.0.0.1:{}", fleet.port);
    let title = format!("SIGKILL to {name} and a restart");
    scenario(&title, &runtime, &url, &scratch.log(), || {
        store.kill();
        // Down for longer than a store call may take: the requests that reach it meanwhile
        // are refused.
        std::thread::sleep(STORE_DOWN);
        store.restart();
    })
}

#[test]
fn redis_killed_and_restarted_with_its_append_only_file_loses_nothing() {
    let (f, answers) = restart_store(
        common::redis_with(true),
        "Redis (appendonly yes, appendfsync always)",
    );
    assert_safe(&f, &answers);
    assert!(
        answers.contains("503"),
        "the store's absence answered: {answers}"
    );
}

/// Without persistence a restarted Redis has forgotten every key: the orders answered
/// before it run again when asked again. The figures say how many; the test shows that the
/// tally sees it.
#[test]
fn redis_killed_and_restarted_without_persistence_forgets_and_runs_again() {
    let (f, _) = restart_store(
        common::redis_with(false),
        "Redis without persistence (appendonly no, no snapshots)",
    );
    assert!(
        f.lost > 0,
        "a restart without persistence loses the stored answers: {f:?}"
    );
}

#[test]
fn postgres_killed_and_restarted_loses_nothing() {
    let (f, answers) = restart_store(
        common::postgres_with(true),
        "Postgres (synchronous_commit on)",
    );
    assert_safe(&f, &answers);
}

/// The store stops answering for three seconds mid-run (every byte held back), then heals.
fn partition(store: &common::Server, name: &str) {
    let _serial = one_at_a_time();
    let runtime = runtime();
    let scratch = Scratch::new("partition");
    let gate = proxy::Gate::new(store.port, &runtime);
    let behind = store
        .url
        .replace(&store.port.to_string(), &gate.port.to_string());
    let fleet = fleet(&behind, &scratch.log(), &runtime);
    let url = format!("http://127.0.0.1:{}", fleet.port);
    let title = format!("{name} stops answering for 3 s");
    let (f, answers) = scenario(&title, &runtime, &url, &scratch.log(), || {
        gate.shut();
        std::thread::sleep(STORE_DOWN);
        gate.open();
    });
    assert_safe(&f, &answers);
    assert!(
        answers.contains("503"),
        "the store's silence answered: {answers}"
    );
}

#[test]
fn redis_that_stops_answering_gets_503_and_runs_no_key_twice() {
    partition(&common::redis_with(true), "Redis");
}

#[test]
fn postgres_that_stops_answering_gets_503_and_runs_no_key_twice() {
    partition(&common::postgres_with(true), "Postgres");
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A soak through one `serve` on Redis: every request a new key, 32 at a time, no handler
/// delay, short retention so that Redis holds a steady number of records. Prints, for each
/// tenth of the run, the server's resident memory and the latency percentiles; every order
/// must be answered 201.
#[test]
fn a_soak_through_serve_on_redis_keeps_memory_and_latency_steady() {
    let _serial = one_at_a_time();
    let redis = common::redis();
    let runtime = runtime();
    let args = [
        "--store",
        &redis.url,
        "--delay-ms",
        "0",
        "--response-ttl",
        "5",
        "--key-ttl",
        "10",
        "--lease",
        LEASE,
    ];
    let (served, lines) = served::serve(&args, 1);
    let url: Arc<str> = format!("http://127.0.0.1:{}/orders", served::port(&lines[0])).into();
    let total = scale().soak;
    let windows = 10;
    let per_window = total.div_ceil(windows);
    let latencies: Arc<Vec<Mutex<Vec<Duration>>>> =
        Arc::new((0..windows).map(|_| Mutex::new(Vec::new())).collect());
    let window_len = |w: usize| per_window.min(total.saturating_sub(w * per_window));
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let run = uuid::Uuid::new_v4().simple().to_string();
    let started = Instant::now();
    let mut printed = 0;
    let driving = {
        let (latencies, next, failed) = (
            Arc::clone(&latencies),
            Arc::clone(&next),
            Arc::clone(&failed),
        );
        runtime.spawn(async move {
            let client = client();
            let mut workers = tokio::task::JoinSet::new();
            for _ in 0..32 {
                let (client, url, latencies, next, failed, run) = (
                    client.clone(),
                    Arc::clone(&url),
                    Arc::clone(&latencies),
                    Arc::clone(&next),
                    Arc::clone(&failed),
                    run.clone(),
                );
                workers.spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= total {
                            return;
                        }
                        let key = format!("soak-{}-{i}", &run[..8]);
                        let t = Instant::now();
                        let answer = send(&client, &url, &key).await;
                        let took = t.elapsed();
                        match answer {
                            Ok((201, ..)) => {}
                            Ok((status, ..)) => {
                                *lock(&failed).entry(status.to_string()).or_default() += 1
                            }
                            Err(what) => *lock(&failed).entry(what).or_default() += 1,
                        }
                        lock(&latencies[i / per_window]).push(took);
                    }
                });
            }
            workers.join_all().await;
        })
    };
    println!("soak through serve on Redis: {total} orders, 32 at a time, a new key each");
    let report = |w: usize| {
        let mut l = std::mem::take(&mut *lock(&latencies[w]));
        l.sort_unstable();
        let pct = |p: f64| {
            l.get(((l.len() as f64 * p) as usize).min(l.len().saturating_sub(1)))
                .map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        println!(
            "  {:>3}%  after {:>6.1} s  serve RSS {:>7} KiB  p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms",
            (w + 1) * 100 / windows,
            started.elapsed().as_secs_f64(),
            rss_kib(served.pid()),
            pct(0.50),
            pct(0.99),
            pct(0.999)
        );
    };
    while !driving.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
        while printed < windows && lock(&latencies[printed]).len() >= window_len(printed) {
            report(printed);
            printed += 1;
        }
    }
    runtime.block_on(driving).expect("the soak ran");
    while printed < windows {
        report(printed);
        printed += 1;
    }
    let failed = lock(&failed).clone();
    assert!(failed.is_empty(), "answers other than 201: {failed:?}");
}
