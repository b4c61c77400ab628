//! Status queries through the layer on a real axum app over loopback HTTP: what became of a
//! key (unknown, in progress, completed), another principal's key unknown, a settled key
//! refusing the late original, bad fields refused with problem+json, and the switch that
//! lets such a `GET` through (IDEM-STATUS-1 to IDEM-STATUS-4).

use axum::routing::post;
use axum::Router;
use idem_core::STATUS_MEDIA_TYPE;
use idem_tower::{IdempotencyLayer, MemoryStore};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
mod http;

use http::{exchange, request, Answer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

struct App {
    port: u16,
    runs: Arc<AtomicUsize>,
    /// Orders with `"slow"` in their body wait for a permit.
    gate: Arc<Semaphore>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(status_queries: bool) -> App {
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let (counter, permits) = (Arc::clone(&runs), Arc::clone(&gate));
    let layer = IdempotencyLayer::builder(MemoryStore::default())
        .principal(|parts| Some(parts.headers.get("x-user")?.to_str().ok()?.to_owned()))
        .status_queries(status_queries)
        .build()
        .expect("a principal");
    let create = move |body: String| {
        let (counter, permits) = (Arc::clone(&counter), Arc::clone(&permits));
        async move {
            if body.contains("slow") {
                permits.acquire().await.expect("the gate").forget();
            }
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            (axum::http::StatusCode::CREATED, format!(r#"{{"id":{n}}}"#))
        }
    };
    let app = Router::new()
        .route(
            "/orders",
            post(create).get(|| async { "the list of orders" }),
        )
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("an address").port();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("the server");
    });
    App {
        port,
        runs,
        gate,
        task,
    }
}

/// The status document's `status`, checking the document's framing.
fn key_status(answer: &Answer) -> String {
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.header("content-type"), Some(STATUS_MEDIA_TYPE));
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    answer.json()["status"]
        .as_str()
        .expect("a status")
        .to_owned()
}

async fn send(port: u16, method: &str, head: &[String], body: &str) -> Answer {
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    exchange(port, &request(method, "/orders", &head, body.as_bytes())).await
}

async fn order(app: &App, who: &str, key: &str, body: &str) -> Answer {
    let head = [
        format!("x-user: {who}"),
        format!("idempotency-key: {key}"),
        "content-type: application/json".to_owned(),
    ];
    send(app.port, "POST", &head, body).await
}

async fn ask(app: &App, who: &str, key: &str, field: &str) -> Answer {
    let head = [
        format!("x-user: {who}"),
        format!("idempotency-key: {key}"),
        format!("idempotency-status: {field}"),
    ];
    send(app.port, "GET", &head, "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_with_idempotency_status_tells_what_became_of_the_key() {
    // IDEM-STATUS-1 IDEM-STATUS-2 IDEM-STATUS-4
    let app = start(true).await;
    assert_eq!(
        key_status(&ask(&app, "alice", "\"k1\"", "POST").await),
        "unknown"
    );
    assert_eq!(order(&app, "alice", "\"k1\"", "{}").await.status, 201);
    let done = ask(&app, "alice", "\"k1\"", "POST").await;
    assert_eq!(key_status(&done), "completed");
    assert_eq!(
        done.json()["response"],
        serde_json::json!({"status": 201, "replayable": true})
    );
    // Another principal asking about the same key learns nothing.
    let bob = ask(&app, "bob", "\"k1\"", "POST").await;
    assert_eq!(key_status(&bob), "unknown");
    assert!(!bob.body.contains("201"), "{}", bob.body);

    // In flight: in progress, with when to ask again; then completed.
    let port = app.port;
    let slow = tokio::spawn(async move {
        let head = [
            "x-user: alice".to_owned(),
            "idempotency-key: \"k2\"".to_owned(),
            "content-type: application/json".to_owned(),
        ];
        send(port, "POST", &head, r#"{"slow":true}"#).await
    });
    let mut busy = ask(&app, "alice", "\"k2\"", "POST").await;
    while key_status(&busy) == "unknown" {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        busy = ask(&app, "alice", "\"k2\"", "POST").await;
    }
    assert_eq!(key_status(&busy), "in-progress");
    let after: u64 = busy
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert_eq!(busy.json()["retryAfter"].as_u64(), Some(after));
    app.gate.add_permits(1);
    assert_eq!(slow.await.unwrap().status, 201);
    assert_eq!(
        key_status(&ask(&app, "alice", "\"k2\"", "POST").await),
        "completed"
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 2, "asking ran nothing");

    // A plain GET is the route's own.
    let list = send(app.port, "GET", &["x-user: alice".to_owned()], "").await;
    assert_eq!(
        (list.status, list.body.as_str()),
        (200, "the list of orders")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_key_refuses_the_late_original_and_it_never_runs() {
    // IDEM-STATUS-3
    let app = start(true).await;
    let settled = ask(&app, "alice", "\"lost\"", "POST; settle").await;
    assert_eq!(key_status(&settled), "not-executed");
    let late = order(&app, "alice", "\"lost\"", "{}").await;
    assert_eq!(late.status, 409);
    assert_eq!(late.json()["type"], "urn:idem:problem:key-settled");
    assert_eq!(app.runs.load(Ordering::SeqCst), 0);
    // A settle is in the asker's scope only: Bob's own "lost" still runs.
    assert_eq!(order(&app, "bob", "\"lost\"", "{}").await.status, 201);
    // A key that ran is reported, never settled.
    let ran = ask(&app, "bob", "\"lost\"", "POST; settle").await;
    assert_eq!(key_status(&ran), "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_status_queries_are_refused_with_problem_json() {
    // IDEM-STATUS-4 IDEM-SCOPE-3
    let app = start(true).await;
    let problem = |a: &Answer| {
        assert_eq!(
            a.header("content-type"),
            Some("application/problem+json"),
            "{a:?}"
        );
        (a.status, a.json()["type"].as_str().unwrap_or("").to_owned())
    };
    for field in ["", "POST; cancel", "PO ST", "GET"] {
        let a = ask(&app, "alice", "\"k\"", field).await;
        assert_eq!(problem(&a), (400, "about:blank".to_owned()), "{field:?}");
    }
    let malformed = ask(&app, "alice", "\"unterminated", "POST").await;
    assert_eq!(
        problem(&malformed),
        (400, "urn:idem:problem:malformed-key".to_owned())
    );
    let head = [
        "x-user: alice".to_owned(),
        "idempotency-status: POST".to_owned(),
    ];
    let missing = send(app.port, "GET", &head, "").await;
    assert_eq!(
        problem(&missing),
        (400, "urn:idem:problem:missing-key".to_owned())
    );
    let anonymous = [
        "idempotency-key: \"k\"".to_owned(),
        "idempotency-status: POST".to_owned(),
    ];
    let refused = send(app.port, "GET", &anonymous, "").await;
    // No principal is the host's fault, as for the request itself.
    assert_eq!(
        problem(&refused),
        (500, "urn:idem:problem:no-principal".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_status_queries_off_the_get_is_the_routes_own() {
    // IDEM-STATUS-4
    let app = start(false).await;
    let a = ask(&app, "alice", "\"k1\"", "POST").await;
    assert_eq!((a.status, a.body.as_str()), (200, "the list of orders"));
}
