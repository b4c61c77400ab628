//! The harness's HTTP layer: bounded HTTP/1.1 requests over TCP or TLS, an exchange log, the
//! raw send-and-drop used for lost responses, and pre-opened connections (TLS handshake
//! done) for racing duplicates.
//!
//! Every request has a deadline, every response body is read up to a byte limit, and every
//! connection is new (no pooling), so a hostile server (slow, huge, garbage, resets) costs
//! at most one timeout and a bounded amount of memory per request.
//!
//! One file for one client: the connection, its deadlines, the raw exchange and the log of
//! it share their types, and a request's whole path reads top to bottom here.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderName, HeaderValue};
use hyper::Method;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde::Serialize;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use url::Url;

/// Bytes of a body kept in the exchange log.
const LOGGED_BODY: usize = 2048;
/// Exchanges kept per case.
const LOGGED_EXCHANGES: usize = 200;

/// Why the harness could not get an answer it can judge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HarnessError {
    /// No answer within the deadline.
    Timeout(String),
    /// The connection could not be opened.
    Connect(String),
    /// The connection was closed or reset before a complete response arrived.
    Closed(String),
    /// The server sent something that is not HTTP/1.1, or a response the harness cannot use.
    Protocol(String),
    /// The response body exceeded the limit.
    TooLarge(usize),
    /// The harness was set up wrongly (a bad URL, header or option).
    Usage(String),
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HarnessError::Timeout(s) => write!(f, "timed out: {s}"),
            HarnessError::Connect(s) => write!(f, "cannot connect: {s}"),
            HarnessError::Closed(s) => write!(f, "connection closed without a response: {s}"),
            HarnessError::Protocol(s) => write!(f, "unexpected protocol: {s}"),
            HarnessError::TooLarge(n) => write!(f, "response body larger than {n} bytes"),
            HarnessError::Usage(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for HarnessError {}

/// A request to send.
#[derive(Clone, Debug)]
pub struct Req {
    /// The method.
    pub method: Method,
    /// The absolute `http://` or `https://` URL.
    pub url: Url,
    /// Header lines in order; a name may repeat.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body.
    pub body: Bytes,
}

/// A complete response.
#[derive(Clone, Debug)]
pub struct Resp {
    /// Status code.
    pub status: u16,
    /// Header lines, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Bytes,
}

impl Resp {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The string at JSON pointer `pointer` in the body, if the body is JSON and has it
    /// (numbers are rendered as text).
    pub fn json_pointer(&self, pointer: &str) -> Option<String> {
        let v: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        match v.pointer(pointer)? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Null => None,
            other => Some(other.to_string()),
        }
    }

    /// Status and body, as the retries of one request are compared.
    pub fn same_answer(&self, other: &Resp) -> bool {
        self.status == other.status && self.body == other.body
    }

    /// `201, 57 bytes` style summary.
    pub fn summary(&self) -> String {
        format!(
            "{} with {}",
            self.status,
            body_preview(&self.body, 160).unwrap_or_else(|| "an empty body".into())
        )
    }
}

/// A short, printable rendering of a body.
pub(crate) fn body_preview(body: &[u8], max: usize) -> Option<String> {
    if body.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(max)]).into_owned();
    Some(if body.len() > max {
        format!("{text}… ({} bytes)", body.len())
    } else {
        text
    })
}

/// One request and what came back, as logged for the report.
#[derive(Clone, Debug, Serialize)]
pub struct Exchange {
    /// What the case called this request.
    pub label: String,
    /// Milliseconds from the start of the case to the send.
    pub at_ms: f64,
    /// Milliseconds until the answer (or the error).
    pub elapsed_ms: f64,
    /// The request.
    pub request: LoggedRequest,
    /// The response, when one arrived.
    pub response: Option<LoggedResponse>,
    /// The transport error, when none did (or, for a dropped connection, what was done).
    pub error: Option<String>,
    /// For raced duplicates: the round and the connection (1-based) it was sent on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raced: Option<Raced>,
}

/// Where a raced duplicate was sent: its round and its connection, both 1-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Raced {
    /// The concurrency round.
    pub round: usize,
    /// The connection within the round.
    pub connection: usize,
}

/// A time a case spent waiting for the server's clock (a lease, a retention) or for a key
/// to leave in-progress.
#[derive(Clone, Debug, Serialize)]
pub struct WaitSpan {
    /// What the case waited for.
    pub what: String,
    /// Milliseconds from the start of the case to the start of the wait.
    pub at_ms: f64,
    /// How long it waited, in milliseconds.
    pub duration_ms: f64,
}

/// What the count oracle attributes to one round of raced duplicates: the executions it
/// counted between just before the round and just after it.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RoundCount {
    /// The round (1-based).
    pub round: usize,
    /// Executions the oracle counted in the round.
    pub executions: u64,
}

/// A request as logged.
#[derive(Clone, Debug, Serialize)]
pub struct LoggedRequest {
    /// Method.
    pub method: String,
    /// URL.
    pub url: String,
    /// Header lines.
    pub headers: Vec<(String, String)>,
    /// Body (the first 2 KiB, lossily decoded).
    pub body: String,
}

/// A response as logged.
#[derive(Clone, Debug, Serialize)]
pub struct LoggedResponse {
    /// Status.
    pub status: u16,
    /// Header lines.
    pub headers: Vec<(String, String)>,
    /// Body (the first 2 KiB, lossily decoded).
    pub body: String,
}

fn logged_body(body: &[u8]) -> String {
    let mut s = String::from_utf8_lossy(&body[..body.len().min(LOGGED_BODY)]).into_owned();
    if body.len() > LOGGED_BODY {
        s.push_str(&format!("… ({} bytes in all)", body.len()));
    }
    s
}

impl LoggedRequest {
    fn of(req: &Req) -> LoggedRequest {
        LoggedRequest {
            method: req.method.to_string(),
            url: req.url.to_string(),
            headers: header_list(req.headers.iter().map(|(n, v)| (n, v))),
            body: logged_body(&req.body),
        }
    }
}

/// The exchange log of one case, with its waits and what the count oracle attributes to
/// each round of raced duplicates.
#[derive(Debug)]
pub(crate) struct Log {
    start: Instant,
    entries: Mutex<Vec<Exchange>>,
    waits: Mutex<Vec<WaitSpan>>,
    rounds: Mutex<Vec<RoundCount>>,
}

/// The contents of a [`Log`], taken at the end of a case.
pub(crate) struct Logged {
    pub(crate) exchanges: Vec<Exchange>,
    pub(crate) waits: Vec<WaitSpan>,
    pub(crate) rounds: Vec<RoundCount>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Log {
    pub(crate) fn new() -> Log {
        Log {
            start: Instant::now(),
            entries: Mutex::new(Vec::new()),
            waits: Mutex::new(Vec::new()),
            rounds: Mutex::new(Vec::new()),
        }
    }

    /// Logs a raced duplicate: sent on connection `raced.connection` of round
    /// `raced.round` at `sent`, answered (or failed) at `answered`.
    pub(crate) fn record_raced(
        &self,
        label: &str,
        req: &Req,
        raced: Raced,
        (sent, answered): (Instant, Instant),
        result: &Result<Resp, HarnessError>,
    ) {
        let mut exchange = self.exchange(label, req, sent, answered, result);
        exchange.raced = Some(raced);
        self.push(exchange);
    }

    /// Logs a wait that started at `started` and ended now.
    pub(crate) fn record_wait(&self, what: &str, started: Instant) {
        let mut waits = locked(&self.waits);
        if waits.len() < LOGGED_EXCHANGES {
            waits.push(WaitSpan {
                what: what.to_owned(),
                at_ms: ms(started.saturating_duration_since(self.start)),
                duration_ms: ms(started.elapsed()),
            });
        }
    }

    /// Logs the executions the count oracle attributes to round `round`.
    pub(crate) fn record_round(&self, round: usize, executions: u64) {
        locked(&self.rounds).push(RoundCount { round, executions });
    }

    fn exchange(
        &self,
        label: &str,
        req: &Req,
        sent: Instant,
        answered: Instant,
        result: &Result<Resp, HarnessError>,
    ) -> Exchange {
        Exchange {
            label: label.to_owned(),
            at_ms: ms(sent.saturating_duration_since(self.start)),
            elapsed_ms: ms(answered.saturating_duration_since(sent)),
            request: LoggedRequest::of(req),
            response: result.as_ref().ok().map(|r| LoggedResponse {
                status: r.status,
                headers: r.headers.clone(),
                body: logged_body(&r.body),
            }),
            error: result.as_ref().err().map(ToString::to_string),
            raced: None,
        }
    }

    pub(crate) fn record(
        &self,
        label: &str,
        req: &Req,
        sent: Instant,
        result: &Result<Resp, HarnessError>,
    ) {
        let exchange = self.exchange(label, req, sent, Instant::now(), result);
        self.push(exchange);
    }

    pub(crate) fn record_dropped(&self, label: &str, req: &Req, sent: Instant, what: &str) {
        self.push(Exchange {
            label: label.to_owned(),
            at_ms: ms(sent.saturating_duration_since(self.start)),
            elapsed_ms: ms(sent.elapsed()),
            request: LoggedRequest::of(req),
            response: None,
            error: Some(what.to_owned()),
            raced: None,
        });
    }

    fn push(&self, exchange: Exchange) {
        let mut entries = locked(&self.entries);
        if entries.len() < LOGGED_EXCHANGES {
            entries.push(exchange);
        }
    }

    pub(crate) fn take(&self) -> Logged {
        Logged {
            exchanges: std::mem::take(&mut *locked(&self.entries)),
            waits: std::mem::take(&mut *locked(&self.waits)),
            rounds: std::mem::take(&mut *locked(&self.rounds)),
        }
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// The client: a new connection per request (plain TCP or TLS), HTTP/1.1, no redirects, no
/// proxies, a deadline per request and a cap on response bodies.
#[derive(Clone, Debug)]
pub struct Http {
    timeout: Duration,
    max_body: usize,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Http {
    /// A client with this per-request deadline and response body cap, for `http://` URLs
    /// and, with a TLS configuration, `https://` ones.
    pub fn new(timeout: Duration, max_body: usize, tls: Option<Arc<rustls::ClientConfig>>) -> Http {
        Http {
            timeout,
            max_body,
            tls,
        }
    }

    /// The per-request deadline.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The response body cap.
    pub fn max_body(&self) -> usize {
        self.max_body
    }

    /// Sends `req` on a new connection and reads the whole response, within the deadline
    /// (connecting included) and the cap.
    pub async fn send(&self, req: &Req) -> Result<Resp, HarnessError> {
        let work = async { Prepared::open(req, self).await?.send().await };
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(HarnessError::Timeout(format!(
                    "no complete response within {:?}",
                    self.timeout
                )))
            })
    }

    /// Opens a connection to `url`'s authority, completing the TLS handshake for
    /// `https://`, and returns it with the `Host` header value.
    async fn connect(&self, url: &Url) -> Result<(Stream, String), HarnessError> {
        let (addr, host, tls) = authority(url)?;
        let tcp = tokio::time::timeout(self.timeout, TcpStream::connect(&addr))
            .await
            .map_err(|_| HarnessError::Timeout(format!("connecting to {addr}")))?
            .map_err(|e| HarnessError::Connect(format!("{addr}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        if !tls {
            return Ok((Stream::Plain(tcp), host));
        }
        let config = self.tls.clone().ok_or_else(|| {
            HarnessError::Usage(format!("{url}: TLS is not configured for this client"))
        })?;
        let name = server_name(url)?;
        let tls = tokio::time::timeout(
            self.timeout,
            tokio_rustls::TlsConnector::from(config).connect(name, tcp),
        )
        .await
        .map_err(|_| HarnessError::Timeout(format!("TLS handshake with {addr}")))?
        .map_err(|e| HarnessError::Connect(tls_failure(&addr, &e)))?;
        Ok((Stream::Tls(Box::new(tls)), host))
    }
}

/// A TLS handshake failure, with what to do about a certificate the harness does not trust.
fn tls_failure(addr: &str, e: &std::io::Error) -> String {
    let text = chain(e);
    let certificate = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|r| {
            matches!(
                r,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            )
        });
    if certificate {
        format!("TLS handshake with {addr}: {text} (for a private CA give --cacert FILE; --insecure skips verification)")
    } else {
        format!("TLS handshake with {addr}: {text}")
    }
}

/// A connection, plain or TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Header fields as text, for reports: a value that is not UTF-8 is shown lossily.
fn header_list<'a>(
    fields: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
) -> Vec<(String, String)> {
    fields
        .map(|(n, v)| {
            (
                n.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

/// The whole chain of an error, for messages.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let next = inner.to_string();
        if !s.ends_with(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        source = inner.source();
    }
    s
}

/// The `host:port` to connect to, the `Host` header, and whether the URL needs TLS.
fn authority(url: &Url) -> Result<(String, String, bool), HarnessError> {
    let tls = match url.scheme() {
        "http" => false,
        "https" => true,
        other => {
            return Err(HarnessError::Usage(format!(
                "{url}: the scheme {other}:// is not supported (use http:// or https://)"
            )))
        }
    };
    let host = url
        .host_str()
        .ok_or_else(|| HarnessError::Usage(format!("no host in {url}")))?;
    let port = url
        .port_or_known_default()
        .unwrap_or(if tls { 443 } else { 80 });
    let host_header = match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    };
    Ok((format!("{host}:{port}"), host_header, tls))
}

/// The name the server's certificate must carry.
fn server_name(url: &Url) -> Result<ServerName<'static>, HarnessError> {
    match url.host() {
        Some(url::Host::Domain(d)) => ServerName::try_from(d.to_owned())
            .map_err(|e| HarnessError::Usage(format!("{url}: {e}"))),
        Some(url::Host::Ipv4(ip)) => Ok(ServerName::IpAddress(std::net::IpAddr::V4(ip).into())),
        Some(url::Host::Ipv6(ip)) => Ok(ServerName::IpAddress(std::net::IpAddr::V6(ip).into())),
        None => Err(HarnessError::Usage(format!("no host in {url}"))),
    }
}

/// The request target (path and query) of `url`.
fn request_target(url: &Url) -> String {
    match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_owned(),
    }
}

/// Writes `req` as HTTP/1.1 on a new connection (TLS for `https://`), waits `linger`, and
/// closes the connection without reading a byte of the response: the response is lost.
pub async fn send_and_drop(req: &Req, http: &Http, linger: Duration) -> Result<(), HarnessError> {
    let (mut stream, host) = http.connect(&req.url).await?;
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: {host}\r\n",
        req.method,
        request_target(&req.url)
    )
    .into_bytes();
    for (n, v) in &req.headers {
        head.extend_from_slice(n.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(v.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(
        format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            req.body.len()
        )
        .as_bytes(),
    );
    head.extend_from_slice(&req.body);
    tokio::time::timeout(http.timeout, async {
        stream.write_all(&head).await?;
        stream.flush().await
    })
    .await
    .map_err(|_| HarnessError::Timeout("sending the request".into()))?
    .map_err(|e| HarnessError::Closed(format!("while sending: {e}")))?;
    tokio::time::sleep(linger).await;
    drop(stream);
    Ok(())
}

/// A connection opened ahead of time (TLS handshake included), ready to send one request:
/// requests released together by a barrier race on the server, not in the connect.
#[derive(Debug)]
pub struct Prepared {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    request: hyper::Request<Full<Bytes>>,
    timeout: Duration,
    max_body: usize,
}

impl Prepared {
    /// Connects and completes the TLS and HTTP/1.1 handshakes for `req`.
    pub async fn open(req: &Req, http: &Http) -> Result<Prepared, HarnessError> {
        let (stream, host) = http.connect(&req.url).await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| HarnessError::Connect(chain(&e)))?;
        tokio::spawn(connection);
        let mut builder = hyper::Request::builder()
            .method(req.method.clone())
            .uri(request_target(&req.url))
            .header(hyper::header::HOST, host);
        for (n, v) in &req.headers {
            builder = builder.header(n, v);
        }
        let request = builder
            .body(Full::new(req.body.clone()))
            .map_err(|e| HarnessError::Usage(e.to_string()))?;
        Ok(Prepared {
            sender,
            request,
            timeout: http.timeout,
            max_body: http.max_body,
        })
    }

    /// Sends the prepared request and reads the response within the deadline and the cap.
    pub async fn send(mut self) -> Result<Resp, HarnessError> {
        let timeout = self.timeout;
        let max_body = self.max_body;
        let work = async move {
            let response = self.sender.send_request(self.request).await.map_err(|e| {
                if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
                    HarnessError::Protocol(chain(&e))
                } else {
                    HarnessError::Closed(chain(&e))
                }
            })?;
            let status = response.status().as_u16();
            let headers = header_list(response.headers().iter());
            let body = Limited::new(response.into_body(), max_body)
                .collect()
                .await
                .map_err(|e| {
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        HarnessError::TooLarge(max_body)
                    } else {
                        HarnessError::Closed(e.to_string())
                    }
                })?
                .to_bytes();
            Ok(Resp {
                status,
                headers,
                body,
            })
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(HarnessError::Timeout(format!(
                    "no complete response within {timeout:?}"
                )))
            })
    }
}
