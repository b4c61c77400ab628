//! The reference server's own behaviour: every refusal is problem+json with the status and
//! type idem-core assigns, and nothing runs for a refused request.

use idem_conformance::server::{Server, ServerConfig};
use idem_core::MemoryStoreLimits;
use std::net::SocketAddr;
use std::time::Duration;

async fn start(config: ServerConfig) -> (Server, reqwest::Client) {
    let server = Server::start(SocketAddr::from(([127, 0, 0, 1], 0)), config)
        .await
        .expect("the server starts");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .no_proxy()
        .build()
        .expect("client");
    (server, client)
}

fn quick() -> ServerConfig {
    ServerConfig {
        delay: Duration::ZERO,
        ..ServerConfig::fast()
    }
}

async fn order(
    client: &reqwest::Client,
    server: &Server,
    key: Option<&str>,
    body: &'static str,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let mut req = client
        .post(format!("{}/orders", server.base_url()))
        .header("content-type", "application/json")
        .header("authorization", "Bearer t")
        .body(body);
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let r = req.send().await.expect("an answer");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let body = json(r).await;
    (status, headers, body)
}

async fn json(r: reqwest::Response) -> serde_json::Value {
    let bytes = r.bytes().await.expect("a body");
    serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)
}

fn problem_type(headers: &reqwest::header::HeaderMap, body: &serde_json::Value) -> String {
    assert_eq!(
        headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    body["type"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_new_key_executes_and_a_repeat_replays_with_the_marker() {
    let (server, client) = start(quick()).await;
    let (s1, h1, b1) = order(&client, &server, Some("k-1"), r#"{"a":1}"#).await;
    assert_eq!(s1, 201);
    assert!(h1.get("idempotent-replayed").is_none());
    let (s2, h2, b2) = order(&client, &server, Some("\"k-1\""), r#"{ "a" : 1 }"#).await;
    assert_eq!(
        (s2, &b2),
        (201, &b1),
        "the quoted form names the same key; JSON is canonical"
    );
    assert_eq!(
        h2.get("idempotent-replayed").map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(server.executions().await, 1);
    let count = json(
        client
            .get(format!("{}/count", server.base_url()))
            .send()
            .await
            .expect("count"),
    )
    .await;
    assert_eq!(count["count"], 1);
}

#[tokio::test]
async fn refusals_are_problems_and_execute_nothing() {
    let config = ServerConfig {
        max_body: 64,
        ..quick()
    };
    let (server, client) = start(config).await;
    let (s, h, b) = order(&client, &server, None, "{}").await;
    assert_eq!(
        (s, problem_type(&h, &b).as_str()),
        (400, "urn:idem:problem:missing-key")
    );
    let (s, h, b) = order(&client, &server, Some("a,b"), "{}").await;
    assert_eq!(
        (s, problem_type(&h, &b).as_str()),
        (400, "urn:idem:problem:malformed-key")
    );
    let (s, h, b) = order(&client, &server, Some("k"), "{not json").await;
    assert_eq!(
        (s, problem_type(&h, &b).as_str()),
        (400, "urn:idem:problem:invalid-json")
    );
    let big = Box::leak(format!("{{\"pad\":\"{}\"}}", "x".repeat(100)).into_boxed_str());
    let (s, h, b) = order(&client, &server, Some("k"), big).await;
    assert_eq!(
        (s, problem_type(&h, &b).as_str()),
        (413, "urn:idem:problem:body-too-large")
    );
    let (s, _, _) = order(&client, &server, Some("k"), r#"{"a":1}"#).await;
    assert_eq!(s, 201);
    let (s, h, b) = order(&client, &server, Some("k"), r#"{"a":2}"#).await;
    assert_eq!(
        (s, problem_type(&h, &b).as_str()),
        (422, "urn:idem:problem:key-reuse-mismatch")
    );
    // The detail and requirement come from idem-core's renderer, as in every host.
    assert_eq!(
        b["detail"],
        "the key was used with a different request; differing fields: a"
    );
    assert_eq!(b["requirement"], "IDEM-FP-1");
    assert_eq!(server.executions().await, 1);
    let r = client
        .get(format!("{}/nowhere", server.base_url()))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 404);
    let r = client
        .get(format!("{}/orders", server.base_url()))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 405);
    assert_eq!(
        r.headers().get("allow").map(|v| v.as_bytes()),
        Some(&b"POST"[..])
    );
}

#[tokio::test]
async fn a_full_store_refuses_new_keys_with_503_and_keeps_the_old_one() {
    let config = ServerConfig {
        limits: MemoryStoreLimits {
            max_entries: 1,
            ..MemoryStoreLimits::default()
        },
        ..quick()
    };
    let (server, client) = start(config).await;
    let (s, _, first) = order(&client, &server, Some("one"), "{}").await;
    assert_eq!(s, 201);
    let (s, h, b) = order(&client, &server, Some("two"), "{}").await;
    assert_eq!(
        (s, problem_type(&h, &b).as_str()),
        (503, "urn:idem:problem:store-full")
    );
    assert!(h.get("retry-after").is_some());
    let (s, _, again) = order(&client, &server, Some("one"), "{}").await;
    assert_eq!((s, again), (201, first), "the live record is never evicted");
    assert_eq!(server.executions().await, 1);
    assert_eq!(server.stored_records(), 1);
}

#[tokio::test]
async fn a_duplicate_in_flight_gets_409_with_retry_after() {
    let config = ServerConfig {
        delay: Duration::from_millis(400),
        ..ServerConfig::fast()
    };
    let (server, client) = start(config).await;
    let first = {
        let client = client.clone();
        let url = server.base_url();
        tokio::spawn(async move {
            client
                .post(format!("{url}/orders"))
                .header("idempotency-key", "slow")
                .body("{}")
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = client
        .post(format!("{}/orders", server.base_url()))
        .header("idempotency-key", "slow")
        .body("{}")
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 409);
    assert_eq!(
        r.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    assert_eq!(first.await.expect("task").expect("answer"), 201);
    assert_eq!(server.executions().await, 1);
}

#[tokio::test]
async fn a_key_is_scoped_by_principal() {
    let (server, client) = start(quick()).await;
    let send = |token: &'static str| {
        client
            .post(format!("{}/orders", server.base_url()))
            .header("authorization", format!("Bearer {token}"))
            .header("idempotency-key", "shared")
            .body("{}")
            .send()
    };
    let a = json(send("alice").await.expect("a")).await;
    let b = json(send("bob").await.expect("b")).await;
    assert_ne!(a["id"], b["id"]);
    assert_eq!(server.executions().await, 2);
}

#[tokio::test]
async fn different_credentials_never_share_a_scope() {
    // IDEM-SCOPE-1 IDEM-SCOPE-3: a non-Bearer credential is a principal of its own, never
    // "anonymous", and no Authorization value shares the scope of requests without one.
    let (server, client) = start(quick()).await;
    let send = |auth: Option<&'static str>| {
        let mut req = client
            .post(format!("{}/orders", server.base_url()))
            .header("content-type", "application/json")
            .header("idempotency-key", "shared-key")
            .body("{}");
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        req.send()
    };
    let mut ids = Vec::new();
    for auth in [
        Some("Basic YTpi"),
        Some("Basic Yzpk"),
        Some("anonymous"),
        None,
        Some("Bearer anonymous"),
    ] {
        let r = send(auth).await.expect("an answer");
        assert_eq!(r.status().as_u16(), 201, "{auth:?} runs on its own");
        assert!(r.headers().get("idempotent-replayed").is_none());
        ids.push(json(r).await["id"].clone());
    }
    assert_eq!(server.executions().await, 5);
    // The same credential again replays its own response.
    let r = send(Some("Basic Yzpk")).await.expect("an answer");
    assert_eq!(r.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(json(r).await["id"], ids[1]);
}

#[tokio::test]
async fn a_credential_that_is_not_text_names_nobody() {
    // IDEM-SCOPE-1 IDEM-SCOPE-3: read lossily, "Bearer \xff" and "Bearer \xfe" would be one
    // principal, each replayed the other's answer; such a credential is refused instead.
    let (server, client) = start(quick()).await;
    for bytes in [&b"Bearer \xff"[..], &b"Bearer \xfe"[..]] {
        let r = client
            .post(format!("{}/orders", server.base_url()))
            .header("content-type", "application/json")
            .header("idempotency-key", "shared-key")
            .header(
                "authorization",
                reqwest::header::HeaderValue::from_bytes(bytes).unwrap(),
            )
            .body("{}")
            .send()
            .await
            .expect("an answer");
        assert_eq!(r.status().as_u16(), 500);
        let headers = r.headers().clone();
        let body = json(r).await;
        assert_eq!(
            problem_type(&headers, &body),
            "urn:idem:problem:no-principal"
        );
    }
    assert_eq!(server.executions().await, 0);
}

#[tokio::test]
async fn a_body_that_stalls_is_answered_and_its_connection_freed() {
    // A client that declares a body and stops sending it neither holds its connection for
    // ever nor claims the key: after the body timeout the layer answers 400, nothing runs.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (server, _) = start(ServerConfig {
        body_timeout: Duration::from_millis(300),
        ..quick()
    })
    .await;
    let addr = server.base_url().trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST /orders HTTP/1.1\r\nhost: x\r\nauthorization: Bearer t\r\ncontent-type: application/json\r\nidempotency-key: \"stalled\"\r\ncontent-length: 100\r\n\r\n{\"amount\":")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 1024];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer to a stalled body");
    let head = String::from_utf8_lossy(&answer);
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    assert_eq!(server.executions().await, 0);
}

#[tokio::test]
async fn a_body_up_to_the_configured_limit_runs_even_beyond_two_mib() {
    // The layer caps bodies at `max_body`; nothing in front of the handler caps them lower.
    let config = ServerConfig {
        max_body: 4 << 20,
        ..quick()
    };
    let (server, client) = start(config).await;
    let big = Box::leak(format!("{{\"pad\":\"{}\"}}", "x".repeat(3 << 20)).into_boxed_str());
    let (s, _, b) = order(&client, &server, Some("big"), big).await;
    assert_eq!(s, 201, "{b}");
    let (s, h, _) = order(&client, &server, Some("big"), big).await;
    assert_eq!(s, 201);
    assert_eq!(
        h.get("idempotent-replayed").map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(server.executions().await, 1);
}
