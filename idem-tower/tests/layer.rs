//! The layer on a real axum app over loopback HTTP: execution once, replays, racing
//! duplicates over separate connections, mismatches, pass-through, the handler's context,
//! the required principal, and bad input (IDEM-KEY-1, IDEM-KEY-3, IDEM-KEY-5, IDEM-KEY-6,
//! IDEM-FP-6, IDEM-LIMIT-1, IDEM-SCOPE-3): problem+json, nothing executed; answers past the
//! store's limit (IDEM-STORE-5) and answers that stall past the lease (IDEM-OUT-7).

use axum::extract::MatchedPath;
use axum::routing::{get, post};
use axum::{Extension, Router};
use idem_core::{Engine, FingerprintSpec, Policy};
use idem_tower::{BuildError, IdempotencyContext, IdempotencyLayer, MemoryStore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
mod http;

use http::{exchange, parse, request, Answer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MAX_BODY: usize = 1024;
const ORDER: &str = r#"{"amount":4200,"currency":"eur"}"#;

struct App {
    port: u16,
    runs: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start() -> App {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let policy = Policy::new(Engine::default()).with_fingerprint(FingerprintSpec {
        max_body: MAX_BODY,
        ..FingerprintSpec::default()
    });
    let layer = IdempotencyLayer::builder(MemoryStore::default())
        .policy(policy)
        .principal(|parts| {
            parts
                .headers
                .get("x-user")?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .route(|parts| {
            parts
                .extensions
                .get::<MatchedPath>()
                .map_or_else(|| parts.uri.path().to_owned(), |m| m.as_str().to_owned())
        })
        .build()
        .expect("a principal");
    let app = Router::new()
        .route(
            "/orders/{shop}",
            post(
                move |Extension(ctx): Extension<IdempotencyContext>, body: String| {
                    let counter = Arc::clone(&counter);
                    async move {
                        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                        tokio::time::sleep(Duration::from_millis(40)).await;
                        (
                            axum::http::StatusCode::CREATED,
                            [("x-order-id", n.to_string())],
                            format!(
                                r#"{{"id":{n},"key":"{}","fence":{},"order":{body}}}"#,
                                ctx.key(),
                                ctx.fence()
                            ),
                        )
                    }
                },
            ),
        )
        .route("/health", get(|| async { "ok" }))
        .layer(layer);
    serve(app, runs).await
}

/// `app` served on a port the OS chose, until the [`App`] is dropped.
async fn serve(app: Router, runs: Arc<AtomicUsize>) -> App {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("an address").port();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("the server");
    });
    App { port, runs, task }
}

/// One request to /orders/acme on a connection of its own, with the header lines `head`.
async fn raw(port: u16, head: &[&[u8]], body: &[u8]) -> Answer {
    let head: Vec<&str> = head
        .iter()
        .map(|l| std::str::from_utf8(l).expect("a header line"))
        .collect();
    exchange(port, &request("POST", "/orders/acme", &head, body)).await
}

async fn order(port: u16, key: &str, body: &str) -> Answer {
    let key = format!("idempotency-key: {key}");
    raw(
        port,
        &[
            b"x-user: alice",
            b"content-type: application/json",
            key.as_bytes(),
        ],
        body.as_bytes(),
    )
    .await
}

fn fresh() -> String {
    format!(
        "\"k-{:x}\"",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_runs_once_and_its_retry_replays_with_the_stored_headers() {
    let app = start().await;
    let key = fresh();
    let first = order(app.port, &key, ORDER).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert!(
        first.body.contains(r#""order":{"amount":4200"#),
        "{}",
        first.body
    );
    assert!(first.body.contains(r#""fence":1"#));
    let retry = order(app.port, &key, ORDER).await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.header("x-order-id"), first.header("x-order-id"));
    assert_eq!(retry.body, first.body);
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    // Another body under the key: 422, nothing runs.
    let changed = order(app.port, &key, r#"{"amount":1}"#).await;
    assert_eq!(changed.status, 422);
    assert_eq!(
        changed.problem_type(),
        "urn:idem:problem:key-reuse-mismatch"
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    // Unguarded: GET passes through.
    let mut stream = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out).await;
    assert_eq!(parse(&out).status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_duplicates_over_separate_connections_run_once() {
    // IDEM-CONC-1
    let app = start().await;
    for round in 0..5 {
        let key = fresh();
        let before = app.runs.load(Ordering::SeqCst);
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (key, barrier, port) = (key.clone(), Arc::clone(&barrier), app.port);
                tokio::spawn(async move {
                    barrier.wait().await;
                    order(port, &key, ORDER).await.status
                })
            })
            .collect();
        for t in tasks {
            let status = t.await.unwrap();
            assert!(status == 201 || status == 409, "round {round}: {status}");
        }
        assert_eq!(app.runs.load(Ordering::SeqCst) - before, 1, "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_are_refused_with_problem_json_and_nothing_runs() {
    let app = start().await;
    let refused = |a: Answer, status: u16, kind: &str| {
        assert_eq!(a.status, status, "{}", a.body);
        assert_eq!(a.problem_type(), format!("urn:idem:problem:{kind}"));
    };
    // IDEM-KEY-6: more than 255 characters.
    refused(
        order(app.port, &"k".repeat(256), ORDER).await,
        400,
        "malformed-key",
    );
    refused(
        order(app.port, &format!("\"{}\"", "k".repeat(4096)), ORDER).await,
        400,
        "malformed-key",
    );
    // IDEM-KEY-1: malformed sf-strings and bytes outside visible ASCII.
    for key in [
        &b"\"unterminated"[..],
        b"\"bad\\escape\"",
        b"\"trailing\"junk",
        b"\"two\", \"keys\"",
        b"white space",
        b"\"\xc3\xa9\"",
    ] {
        let mut line = b"idempotency-key: ".to_vec();
        line.extend_from_slice(key);
        let a = raw(
            app.port,
            &[b"x-user: alice", b"content-type: application/json", &line],
            ORDER.as_bytes(),
        )
        .await;
        refused(a, 400, "malformed-key");
    }
    // IDEM-KEY-3, IDEM-KEY-5: missing, empty, repeated.
    let a = raw(
        app.port,
        &[b"x-user: alice", b"content-type: application/json"],
        ORDER.as_bytes(),
    )
    .await;
    refused(a, 400, "missing-key");
    refused(order(app.port, "\"\"", ORDER).await, 400, "missing-key");
    let a = raw(
        app.port,
        &[
            b"x-user: alice",
            b"idempotency-key: \"a\"",
            b"idempotency-key: \"b\"",
        ],
        ORDER.as_bytes(),
    )
    .await;
    refused(a, 400, "malformed-key");
    // IDEM-FP-6: a JSON body that is not JSON, before anything is claimed.
    let key = fresh();
    for body in [r#"{"amount":"#, "{'amount':1}", r#"{"amount":1}}"#, "NaN"] {
        refused(order(app.port, &key, body).await, 400, "invalid-json");
    }
    // IDEM-LIMIT-1: a body over the limit, declared.
    let big = format!(r#"{{"note":"{}"}}"#, "x".repeat(MAX_BODY));
    refused(order(app.port, &key, &big).await, 413, "body-too-large");
    // IDEM-SCOPE-3: no principal.
    let line = format!("idempotency-key: {key}");
    let a = raw(
        app.port,
        &[b"content-type: application/json", line.as_bytes()],
        ORDER.as_bytes(),
    )
    .await;
    assert!(a.status >= 400, "{}", a.body);
    a.problem_type();
    assert_eq!(app.runs.load(Ordering::SeqCst), 0, "nothing executed");
    // The refusals did not use the key up.
    assert_eq!(order(app.port, &key, ORDER).await.status, 201);
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_streamed_past_the_limit_is_refused_with_413() {
    // IDEM-LIMIT-1: no declared length (chunked): refused once the cap is passed.
    let app = start().await;
    let mut stream = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    let chunk = "x".repeat(600);
    let request = format!(
        "POST /orders/acme HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-user: alice\r\ncontent-type: text/plain\r\nidempotency-key: \"chunked\"\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len(),
        chunk.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out).await;
    let a = parse(&out);
    assert_eq!(a.status, 413);
    assert_eq!(a.problem_type(), "urn:idem:problem:body-too-large");
    assert_eq!(app.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_upload_is_refused_with_413_and_its_connection_closed() {
    // IDEM-LIMIT-1: the rest of a refused upload is not read after the answer.
    let app = start().await;
    let stream = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    write
        .write_all(b"POST /orders/acme HTTP/1.1\r\nhost: x\r\nx-user: alice\r\ncontent-type: text/plain\r\nidempotency-key: \"endless\"\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    // The client sends for as long as the connection takes it.
    let sending = tokio::spawn(async move {
        let chunk = format!("400\r\n{}\r\n", "x".repeat(1024));
        let mut sent = 0usize;
        while write.write_all(chunk.as_bytes()).await.is_ok() {
            sent += 1024;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        sent
    });
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    sending.abort();
    let head = String::from_utf8_lossy(&seen);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\nconnection: close\r\n"),
        "the answer says the connection closes: {head}"
    );
    assert!(
        closed.is_ok(),
        "the server went on reading the upload after its 413"
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_breaks_off_is_refused_with_400_and_nothing_runs() {
    // IDEM-LIMIT-1: a chunked body whose sender stops half-way (its write side closed).
    let app = start().await;
    let mut stream = TcpStream::connect(("127.0.0.1", app.port)).await.unwrap();
    let request = "POST /orders/acme HTTP/1.1\r\nhost: x\r\nx-user: alice\r\ncontent-type: text/plain\r\nidempotency-key: \"broken\"\r\ntransfer-encoding: chunked\r\n\r\n10\r\nonly half";
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out).await;
    let a = parse(&out);
    assert_eq!(a.status, 400, "{}", String::from_utf8_lossy(&out));
    assert_eq!(a.problem_type(), "about:blank");
    assert_eq!(app.runs.load(Ordering::SeqCst), 0);
    // Nothing was claimed: the key runs when the whole body comes.
    assert_eq!(order(app.port, "\"broken\"", ORDER).await.status, 201);
}

#[test]
fn a_layer_without_a_principal_is_refused_when_built() {
    // IDEM-SCOPE-3: no silent default.
    let built = IdempotencyLayer::builder(MemoryStore::default()).build();
    assert_eq!(built.err(), Some(BuildError::NoPrincipal));
}

#[tokio::test]
async fn render_sends_an_engine_refusal_as_the_layer_does() {
    // An endpoint beside the layer (a token issuer, a counter session) answers its own
    // refusals with the same problem+json.
    let refusal = idem_core::Refusal::new(idem_core::Problem::STORE_FULL, "no room");
    let response = idem_tower::render(&refusal.reply());
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(
        response.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/problem+json"[..])
    );
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_else(|never| match never {});
    let problem: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(problem["type"], "urn:idem:problem:store-full");
    assert_eq!(problem["detail"], "no room");
    assert_eq!(problem["status"], 503);
}

/// A body of `left` 100-byte frames (endless for `None`), each made when it is polled and
/// counted in `produced`; `closed` is set when the body is dropped.
struct Frames {
    left: Option<usize>,
    produced: Arc<AtomicUsize>,
    closed: Arc<std::sync::atomic::AtomicBool>,
}

impl http_body::Body for Frames {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        if self.left == Some(0) {
            return std::task::Poll::Ready(None);
        }
        let n = self.produced.fetch_add(1, Ordering::SeqCst);
        if let Some(left) = self.left.as_mut() {
            *left -= 1;
        }
        let digit = b'0' + (n % 10) as u8;
        let frame = http_body::Frame::data(bytes::Bytes::from(vec![digit; 100]));
        std::task::Poll::Ready(Some(Ok(frame)))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.left.map_or_else(http_body::SizeHint::new, |left| {
            http_body::SizeHint::with_exact(left as u64 * 100)
        })
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

/// A body of one 100-byte frame, and then an error.
struct Broken(bool);

impl http_body::Body for Broken {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        if self.0 {
            return std::task::Poll::Ready(Some(Err(std::io::Error::other("the source broke"))));
        }
        self.0 = true;
        let frame = http_body::Frame::data(bytes::Bytes::from(vec![b'b'; 100]));
        std::task::Poll::Ready(Some(Ok(frame)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_longer_than_the_store_keeps_goes_out_as_it_comes_and_is_kept_as_not_stored() {
    // IDEM-STORE-5: the layer holds at most the limit; the rest goes at the client's pace.
    let produced = Arc::new(AtomicUsize::new(0));
    let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runs = Arc::new(AtomicUsize::new(0));
    let frames = |left| {
        let (produced, closed, runs) = (
            Arc::clone(&produced),
            Arc::clone(&closed),
            Arc::clone(&runs),
        );
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            produced.store(0, Ordering::SeqCst);
            closed.store(false, Ordering::SeqCst);
            axum::http::Response::builder()
                .status(201)
                .body(axum::body::Body::new(Frames {
                    left,
                    produced,
                    closed,
                }))
                .expect("a response")
        }
    };
    let layer = IdempotencyLayer::builder(MemoryStore::default())
        .policy(Policy::new(Engine::default()).with_max_response_bytes(1_000))
        .principal(|_| Some("alice".to_owned()))
        .build()
        .expect("a principal");
    let app = Router::new()
        .route("/long", post(frames(Some(50))))
        .route("/endless", post(frames(None)))
        .route("/broken", {
            let runs = Arc::clone(&runs);
            post(move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                axum::http::Response::builder()
                    .status(201)
                    .body(axum::body::Body::new(Broken(false)))
                    .expect("a response")
            })
        })
        .layer(layer);
    let app = serve(app, Arc::clone(&runs)).await;
    let port = app.port;
    let key = fresh();
    let head = format!("idempotency-key: {key}");
    let long = || request("POST", "/long", &[head.as_str()], b"{}");
    let first = exchange(port, &long()).await;
    assert_eq!(first.status, 201);
    let frames: String = (0..50u8)
        .map(|i| char::from(b'0' + i % 10).to_string().repeat(100))
        .collect();
    assert_eq!(first.body, frames, "every frame once, in order");
    let retry = exchange(port, &long()).await;
    assert_eq!(retry.status, 410);
    assert_eq!(retry.problem_type(), "urn:idem:problem:response-not-stored");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never runs again");

    // A body that fails within the limit: nothing is stored, the client gets a 500 problem,
    // and the retry runs again (IDEM-OUT-3).
    let key = fresh();
    let head = format!("idempotency-key: {key}");
    let broken = || request("POST", "/broken", &[head.as_str()], b"{}");
    let first = exchange(port, &broken()).await;
    assert_eq!(first.status, 500);
    let retry = exchange(port, &broken()).await;
    assert_eq!(retry.status, 500);
    assert_eq!(retry.header("idempotent-replayed"), None);
    assert_eq!(runs.load(Ordering::SeqCst), 3, "the retry runs again");

    // An answer that never ends: its head comes, and the body is made as the client reads.
    let key = fresh();
    let head = format!("idempotency-key: {key}");
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("a connection");
    stream
        .write_all(&request("POST", "/endless", &[head.as_str()], b"{}"))
        .await
        .expect("the request");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("the head within 5 s: the answer was held")
            .expect("a read");
        assert_ne!(n, 0, "the connection closed");
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 201"));
    // The body stops being made (unchanged for half a second, within 10 s however busy the
    // machine).
    let mut made = produced.load(Ordering::SeqCst);
    let (mut still, mut waited) = (0, 0);
    while still < 500 {
        assert!(waited < 10_000, "the body never waited for the client");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = produced.load(Ordering::SeqCst);
        still = if now == made { still + 100 } else { 0 };
        made = now;
        waited += 100;
    }
    assert!(made * 100 < 64 << 20, "{made} frames made");
    drop(stream);
    for _ in 0..100 {
        if closed.load(Ordering::SeqCst) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        closed.load(Ordering::SeqCst),
        "the body is dropped when the client leaves"
    );
}

/// A body of one 100-byte frame, then nothing until `gate` opens (never, for `None`): then
/// one frame more and the end. `dropped` is set when the body is dropped.
struct Gated {
    first: bool,
    gate: Option<tokio::sync::oneshot::Receiver<()>>,
    done: bool,
    dropped: Arc<std::sync::atomic::AtomicBool>,
}

impl http_body::Body for Gated {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        use std::task::Poll;
        if !self.first {
            self.first = true;
            return Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from(
                vec![b'a'; 100],
            )))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        let Some(gate) = self.gate.as_mut() else {
            return Poll::Pending;
        };
        match std::future::Future::poll(std::pin::Pin::new(gate), cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => {
                self.done = true;
                Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from(
                    vec![b'b'; 100],
                )))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_that_stalls_is_let_go_when_its_lease_ends() {
    // IDEM-OUT-7: the answer is read no longer than the lease, as heartbeats extend it.
    let lease = Duration::from_millis(1_000);
    let engine = Engine::new(idem_core::Config {
        lease,
        ..idem_core::Config::default()
    })
    .expect("valid times");
    let layer = IdempotencyLayer::builder(MemoryStore::default())
        .policy(Policy::new(engine))
        .principal(|_| Some("alice".to_owned()))
        .build()
        .expect("a principal");
    let runs = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let app = Router::new()
        .route("/stalls", {
            let (runs, dropped) = (Arc::clone(&runs), Arc::clone(&dropped));
            post(move || async move {
                // The first run's body stalls; the retry's answers.
                if runs.fetch_add(1, Ordering::SeqCst) > 0 {
                    return axum::http::Response::builder()
                        .status(201)
                        .body(axum::body::Body::from("second"))
                        .expect("a response");
                }
                let body = Gated {
                    first: false,
                    gate: None,
                    done: false,
                    dropped,
                };
                axum::http::Response::builder()
                    .status(201)
                    .body(axum::body::Body::new(body))
                    .expect("a response")
            })
        })
        .route("/beats", {
            let runs = Arc::clone(&runs);
            post(
                move |Extension(ctx): Extension<IdempotencyContext>| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // The body ends past the lease the claim gave, within the one a heartbeat
                    // gave.
                    let (open, gate) = tokio::sync::oneshot::channel();
                    tokio::spawn(async move {
                        tokio::time::sleep(lease * 6 / 10).await;
                        ctx.extend().await.expect("the heartbeat");
                        tokio::time::sleep(lease * 6 / 10).await;
                        let _ = open.send(());
                    });
                    let body = Gated {
                        first: false,
                        gate: Some(gate),
                        done: false,
                        dropped: Arc::default(),
                    };
                    axum::http::Response::builder()
                        .status(201)
                        .body(axum::body::Body::new(body))
                        .expect("a response")
                },
            )
        })
        .layer(layer);
    let app = serve(app, Arc::clone(&runs)).await;
    let port = app.port;

    let key = fresh();
    let head = format!("idempotency-key: {key}");
    let stalls = || request("POST", "/stalls", &[head.as_str()], b"{}");
    let since = std::time::Instant::now();
    let first = tokio::time::timeout(Duration::from_secs(20), exchange(port, &stalls()))
        .await
        .expect("an answer once the lease ends: the stalled body held the attempt");
    assert!(since.elapsed() >= lease, "not before the lease ends");
    assert_eq!(first.status, 500);
    assert_eq!(
        first.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the stalled body is dropped"
    );
    // The outcome is unknown: under the default policy, the retry runs again.
    let retry = exchange(port, &stalls()).await;
    assert_eq!((retry.status, retry.body.as_str()), (201, "second"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let key = fresh();
    let head = format!("idempotency-key: {key}");
    let beats = || request("POST", "/beats", &[head.as_str()], b"{}");
    let first = exchange(port, &beats()).await;
    let whole = format!("{}{}", "a".repeat(100), "b".repeat(100));
    assert_eq!((first.status, first.body.as_str()), (201, whole.as_str()));
    let retry = exchange(port, &beats()).await;
    assert_eq!((retry.status, retry.body.as_str()), (201, whole.as_str()));
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(runs.load(Ordering::SeqCst), 3, "stored, and replayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_trailers_goes_out_with_them_and_is_kept_as_not_stored() {
    // IDEM-STORE-5: a stored answer carries no trailers (gRPC's status is one), so an answer
    // that ends with them goes out whole and a retry learns it cannot be replayed.
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::builder(MemoryStore::default())
        .principal(|_| Some("alice".to_owned()))
        .build()
        .expect("a principal");
    let app = Router::new()
        .route("/call", {
            let runs = Arc::clone(&runs);
            post(move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                axum::http::Response::builder()
                    .status(200)
                    .body(axum::body::Body::new(Trailed(0)))
                    .expect("a response")
            })
        })
        .layer(layer);
    let call = || {
        axum::http::Request::post("/call")
            .header("idempotency-key", "\"call-1\"")
            .body(axum::body::Body::from("{}"))
            .expect("a request")
    };
    let first = app.clone().oneshot(call()).await.expect("an answer");
    assert_eq!(first.status(), 200);
    let whole = first.into_body().collect().await.expect("the body");
    assert_eq!(
        whole.trailers().and_then(|t| t.get("grpc-status")),
        Some(&axum::http::HeaderValue::from_static("0")),
        "the trailers reach the client"
    );
    assert_eq!(whole.to_bytes(), "reply");
    let retry = app.oneshot(call()).await.expect("an answer");
    assert_eq!(retry.status(), 410);
    let body = retry
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes();
    let problem: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(problem["type"], "urn:idem:problem:response-not-stored");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("trailer fields")),
        "{problem}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never runs again");
}

/// A body of "reply" and then a `grpc-status: 0` trailer, as a gRPC unary answer ends.
struct Trailed(u8);

impl http_body::Body for Trailed {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0 += 1;
        std::task::Poll::Ready(match self.0 {
            1 => Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(
                b"reply",
            )))),
            2 => {
                let mut trailers = axum::http::HeaderMap::new();
                trailers.insert("grpc-status", axum::http::HeaderValue::from_static("0"));
                Some(Ok(http_body::Frame::trailers(trailers)))
            }
            _ => None,
        })
    }
}

#[tokio::test]
async fn a_replay_carries_the_answers_header_bytes_those_not_utf8_too() {
    // IDEM-REPLAY-1: a header value is kept as its bytes, one character each, and replayed
    // as the same bytes: no U+FFFD for bytes that are not UTF-8, no re-encoding of those
    // that are.
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::{Layer, ServiceExt};
    const RAW: &[u8] = &[0xFF, b'a', 0xC3, 0xA9, b' ', 0xE9, b'!'];
    let layer = IdempotencyLayer::builder(MemoryStore::default())
        .single_tenant()
        .build()
        .unwrap();
    let service = layer.layer(tower::service_fn(|_: ::http::Request<_>| async {
        let mut answer = ::http::Response::new(Full::new(Bytes::from_static(b"made")));
        let value = ::http::HeaderValue::from_bytes(RAW).unwrap();
        answer.headers_mut().insert("x-raw", value);
        Ok::<_, std::convert::Infallible>(answer)
    }));
    let post = || {
        ::http::Request::post("/orders")
            .header("idempotency-key", "\"bytes\"")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    let first = service.clone().oneshot(post()).await.unwrap();
    assert_eq!(first.headers()["x-raw"].as_bytes(), RAW);
    let replay = service.oneshot(post()).await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["x-raw"].as_bytes(), RAW);
}
