//! A load benchmark of the reference server: requests per second for fresh keys (claim,
//! handler, completion) and for replays, over keep-alive HTTP/1.1 connections on loopback.
//! Client and server share the machine, so the numbers are for the pair.

use crate::server::{Server, ServerConfig, ORDERS_PATH};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// The settings of a benchmark run.
#[derive(Clone, Copy, Debug)]
pub struct BenchConfig {
    /// Concurrent keep-alive connections.
    pub connections: usize,
    /// How long each phase runs.
    pub duration: Duration,
    /// The handler's delay.
    pub delay: Duration,
}

/// One phase's numbers.
#[derive(Clone, Debug)]
pub struct PhaseResult {
    /// What was measured: the baseline, or a store's fresh keys or replays.
    pub label: String,
    /// Requests answered as expected.
    pub requests: u64,
    /// Requests answered otherwise, or failed.
    pub errors: u64,
    /// Wall time of the phase.
    pub elapsed: Duration,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
}

impl PhaseResult {
    /// Requests per second.
    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

const BODY: &str = r#"{"amount":4200,"currency":"eur"}"#;

/// Runs the baseline (the same handler with no idempotency), then both phases against a
/// fresh in-process reference server on each store (`None`: memory; else a `--store` URL).
pub async fn run(
    config: BenchConfig,
    stores: &[Option<String>],
) -> Result<Vec<PhaseResult>, String> {
    let baseline = Baseline::start(config.delay).await?;
    let mut out = vec![
        phase(
            baseline.addr,
            config,
            "no idempotency (baseline)".into(),
            false,
        )
        .await?,
    ];
    drop(baseline);
    for store in stores {
        let server = Server::start(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            ServerConfig {
                delay: config.delay,
                store: store.clone(),
                ..ServerConfig::default()
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        let name = store
            .as_deref()
            .map_or_else(|| "memory".to_owned(), crate::store::shown);
        out.push(phase(server.addr(), config, format!("{name}: fresh keys"), false).await?);
        out.push(phase(server.addr(), config, format!("{name}: replays"), true).await?);
    }
    Ok(out)
}

/// The baseline: a server with the demo handler's work (read the body, wait the delay,
/// answer 201 with a small JSON body) and no idempotency at all.
struct Baseline {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Baseline {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Baseline {
    async fn start(delay: Duration) -> Result<Baseline, String> {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                connections.spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| async move {
                            let _ = req.into_body().collect().await;
                            if !delay.is_zero() {
                                tokio::time::sleep(delay).await;
                            }
                            hyper::Response::builder()
                                .status(201)
                                .header(hyper::header::CONTENT_TYPE, "application/json")
                                .body(Full::new(Bytes::from_static(
                                    br#"{"id":"ord_000001","execution":1}"#,
                                )))
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Baseline { addr, task })
    }
}

async fn phase(
    addr: SocketAddr,
    config: BenchConfig,
    label: String,
    replay: bool,
) -> Result<PhaseResult, String> {
    let started = Instant::now();
    let deadline = started + config.duration;
    let mut tasks = Vec::with_capacity(config.connections);
    for _ in 0..config.connections {
        tasks.push(tokio::spawn(worker(addr, deadline, replay)));
    }
    let mut result = PhaseResult {
        label,
        requests: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        p50: Duration::ZERO,
        p99: Duration::ZERO,
    };
    let mut latencies = Vec::new();
    for t in tasks {
        let (ok, errors, mut lat) = t.await.map_err(|e| e.to_string())??;
        result.requests += ok;
        result.errors += errors;
        latencies.append(&mut lat);
    }
    result.elapsed = started.elapsed();
    latencies.sort_unstable();
    let pick = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    result.p50 = pick(0.5);
    result.p99 = pick(0.99);
    Ok(result)
}

async fn worker(
    addr: SocketAddr,
    deadline: Instant,
    replay: bool,
) -> Result<(u64, u64, Vec<Duration>), String> {
    let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let fixed_key = uuid::Uuid::new_v4().to_string();
    let (mut ok, mut errors, mut latencies) = (0u64, 0u64, Vec::new());
    let mut first = true;
    while Instant::now() < deadline {
        let key = if replay {
            fixed_key.clone()
        } else {
            uuid::Uuid::new_v4().to_string()
        };
        let req = hyper::Request::post(ORDERS_PATH)
            .header(hyper::header::HOST, addr.to_string())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::AUTHORIZATION, "Bearer bench")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(BODY.as_bytes())))
            .map_err(|e| e.to_string())?;
        let t = Instant::now();
        sender.ready().await.map_err(|e| e.to_string())?;
        let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let marked = response.headers().contains_key("idempotent-replayed");
        response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        let expected = status == 201 && (marked == (replay && !first));
        first = false;
        if expected {
            ok += 1;
            latencies.push(t.elapsed());
        } else {
            errors += 1;
        }
    }
    Ok((ok, errors, latencies))
}
