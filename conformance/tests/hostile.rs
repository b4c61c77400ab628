//! Hostile servers (slow, huge bodies, garbage, resets) give error verdicts within a
//! bounded time and bounded memory, and never hang or crash the harness.

use idem_conformance::cases;
use idem_conformance::suite::{self, Report, Target, Verdict};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use url::Url;

#[derive(Clone, Copy, Debug)]
enum Hostile {
    /// Reads the request and never answers.
    Slow,
    /// Starts an answer and then sends one byte every 50 ms, forever.
    Drip,
    /// Answers 200 with an endless body.
    Huge,
    /// Answers bytes that are not HTTP, then closes.
    Garbage,
    /// Resets every connection.
    Reset,
}

/// Starts a hostile server; returns its address, the most bytes it wrote on any one
/// connection, and the task to abort.
async fn start(kind: Hostile) -> (SocketAddr, Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let most = Arc::new(AtomicU64::new(0));
    let most2 = Arc::clone(&most);
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let most = Arc::clone(&most2);
            conns.spawn(serve(kind, stream, most));
        }
    });
    (addr, most, task)
}

async fn read_some(stream: &mut TcpStream) {
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf)).await;
}

async fn serve(kind: Hostile, mut stream: TcpStream, most: Arc<AtomicU64>) {
    match kind {
        Hostile::Slow => {
            read_some(&mut stream).await;
            // Hold the connection open without a byte of answer, for longer than any
            // sane timeout; the task is aborted with the server.
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Hostile::Drip => {
            read_some(&mut stream).await;
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\n").await;
            while stream.write_all(b"x").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Hostile::Huge => {
            read_some(&mut stream).await;
            let head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000000000\r\n\r\n";
            if stream.write_all(head).await.is_err() {
                return;
            }
            let chunk = vec![b'x'; 64 * 1024];
            let mut written = 0u64;
            while stream.write_all(&chunk).await.is_ok() {
                written += chunk.len() as u64;
                most.fetch_max(written, Ordering::SeqCst);
            }
        }
        Hostile::Garbage => {
            read_some(&mut stream).await;
            let _ = stream
                .write_all(b"\x00\x01\x02 this is not HTTP \xff\xfe\r\n\r\n")
                .await;
        }
        Hostile::Reset => {
            let _ = stream.set_zero_linger();
            drop(stream);
        }
    }
}

async fn run_against(addr: SocketAddr) -> (Report, Duration) {
    let url = Url::parse(&format!("http://{addr}/orders")).expect("url");
    let mut target = Target::new(url);
    target.timeout = Duration::from_millis(400);
    target.max_response_bytes = 64 * 1024;
    target.concurrency = 4;
    target.rounds = 2;
    target.count_url = target.url.join("/count").ok();
    target.second_credential = vec![(
        hyper::header::AUTHORIZATION,
        hyper::header::HeaderValue::from_static("Bearer b"),
    )];
    target.decline_body = Some("{\"outcome\":\"decline\"}".into());
    target.fail_body = Some("{\"outcome\":\"unavailable\"}".into());
    target.crash_body = Some("{\"outcome\":\"crash\"}".into());
    target.lease = Some(Duration::from_secs(1));
    target.response_ttl = Some(Duration::from_secs(1));
    target.key_ttl = Some(Duration::from_secs(2));
    // Every case sends something, keys/6 included.
    target.key_style = suite::KeyStyle::SfString;
    let all = cases::all();
    let started = Instant::now();
    let report = tokio::time::timeout(
        Duration::from_secs(60),
        suite::run(&target, all, None, &mut |_| {}),
    )
    .await
    .expect("the harness never hangs on a hostile server")
    .expect("the harness starts");
    (report, started.elapsed())
}

fn assert_all_errors(kind: Hostile, report: &Report, needle: &str) {
    for c in &report.cases {
        if suite::KeyKind::of_section(&c.section).is_some() {
            // The key kinds' cases need an endpoint of their kind: they skip.
            assert_eq!(c.verdict, Verdict::Skip, "{kind:?}: {}", c.id);
            continue;
        }
        assert_eq!(
            c.verdict,
            Verdict::Error,
            "{kind:?}: {} is {} ({:?})",
            c.id,
            c.verdict.name(),
            c.reason
        );
        let reason = c.reason.as_deref().unwrap_or("").to_lowercase();
        assert!(
            reason.contains(needle),
            "{kind:?}: {} says {reason:?}, expected it to mention {needle:?}",
            c.id
        );
    }
    assert_eq!(report.exit_code, suite::EXIT_HARNESS, "{kind:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_servers_give_bounded_error_verdicts() {
    let mut runs = tokio::task::JoinSet::new();
    for kind in [
        Hostile::Slow,
        Hostile::Drip,
        Hostile::Huge,
        Hostile::Garbage,
        Hostile::Reset,
    ] {
        runs.spawn(async move {
            let (addr, most, server) = start(kind).await;
            let (report, took) = run_against(addr).await;
            server.abort();
            (kind, report, took, most.load(Ordering::SeqCst))
        });
    }
    while let Some(done) = runs.join_next().await {
        let (kind, report, took, most_written) = done.expect("a hostile run completes");
        // Each case stops at its first error: about one timeout per case at worst.
        assert!(took < Duration::from_secs(40), "{kind:?} took {took:?}");
        match kind {
            Hostile::Slow | Hostile::Drip => assert_all_errors(kind, &report, "timed out"),
            Hostile::Huge => {
                assert_all_errors(kind, &report, "larger than 65536 bytes");
                // The harness stopped reading at its cap: what the server could push is
                // the cap plus the kernel's socket buffers, far below what 400 ms of
                // loopback would carry.
                assert!(
                    most_written < 32 << 20,
                    "the server wrote {most_written} bytes on one connection"
                );
            }
            Hostile::Garbage => assert_all_errors(kind, &report, "unexpected protocol"),
            // Refused at connect or reset after it, depending on timing.
            Hostile::Reset => assert_all_errors(kind, &report, "connect"),
        }
    }
}
