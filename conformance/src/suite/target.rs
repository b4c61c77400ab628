//! What the suite runs against: the endpoint and its options ([`Target`]), the kind of key it
//! takes ([`KeyKind`]) and how keys are written ([`KeyStyle`]).

use super::Profile;
use crate::server::{
    Server, ServerConfig, CHECKOUT_PATH, COUNT_PATH, ORDERS_PATH, PAYMENTS_PATH, SESSIONS_PATH,
    TOKENS_PATH, TRANSFERS_PATH,
};
use crate::tls::Trust;
use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::Method;
use serde::Serialize;
use std::time::Duration;
use url::Url;

/// The body the suite sends by default.
pub const DEFAULT_BODY: &str =
    r#"{"amount":4200,"currency":"eur","description":"idem-conformance"}"#;

/// The kind of key the endpoint takes, and so which cases apply: the generic cases need
/// opaque keys (or UUIDs); the `time/…`, `counter/…` and `token/…` families need their
/// kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyKind {
    /// Opaque keys or UUIDs: the generic cases.
    #[default]
    Opaque,
    /// Client timestamps, `client:millis`: the `time/…` cases.
    Time,
    /// Wrapping counters, `client:epoch:seq`, with sessions: the `counter/…` cases.
    Counter,
    /// Server-issued one-time tokens: the `token/…` cases.
    Token,
}

impl KeyKind {
    /// The kind whose family of cases a section holds (`time`, `counter`, `token`), if any.
    pub fn of_section(section: &str) -> Option<KeyKind> {
        [KeyKind::Time, KeyKind::Counter, KeyKind::Token]
            .into_iter()
            .find(|k| k.section() == Some(section))
    }

    /// The section of the cases of this kind, if it has its own.
    pub fn section(self) -> Option<&'static str> {
        match self {
            KeyKind::Opaque => None,
            KeyKind::Time => Some("time"),
            KeyKind::Counter => Some("counter"),
            KeyKind::Token => Some("token"),
        }
    }
}

/// How the harness writes keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyStyle {
    /// A bare UUID v4 (`Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324`).
    Uuid,
    /// A quoted RFC 8941 sf-string (`Idempotency-Key: "8e03978e-…"`), as the IETF draft writes.
    SfString,
    /// A bare token that is not a UUID (`Idempotency-Key: idem-5f0c…`).
    Bare,
}
/// Everything the suite needs to know about the endpoint under test.
#[derive(Clone, Debug)]
pub struct Target {
    /// The endpoint (an `http://` or `https://` URL).
    pub url: Url,
    /// Which certificates an `https://` server may present.
    pub trust: Trust,
    /// The method of the requests.
    pub method: Method,
    /// The body of a request that succeeds.
    pub body: Bytes,
    /// Its `Content-Type`, if any.
    pub content_type: Option<HeaderValue>,
    /// Extra headers on every request (the first principal's credential).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Headers that replace same-named ones in `headers` for the second principal; empty
    /// skips the cross-principal case.
    pub second_credential: Vec<(HeaderName, HeaderValue)>,
    /// The key header's name.
    pub key_header: HeaderName,
    /// How keys are written.
    pub key_style: KeyStyle,
    /// Expected status codes.
    pub profile: Profile,
    /// Whether misses of SHOULD-level requirements count as failures.
    pub strict: bool,
    /// Deadline of each request.
    pub timeout: Duration,
    /// The largest response body read.
    pub max_response_bytes: usize,
    /// Identical requests per concurrency round.
    pub concurrency: usize,
    /// Concurrency rounds.
    pub rounds: usize,
    /// A URL answering the number of executions (a number, or JSON `{"count": N}`).
    pub count_url: Option<Url>,
    /// A JSON pointer to the created resource's id in a success response.
    pub id_pointer: Option<String>,
    /// The server's response retention (enables `expiry/1`, with `key_ttl` `expiry/2`).
    pub response_ttl: Option<Duration>,
    /// The server's key retention (enables `expiry/3`).
    pub key_ttl: Option<Duration>,
    /// The server's lease (with `crash_body`, enables `lease/1`).
    pub lease: Option<Duration>,
    /// A body the server answers with a deterministic 4xx (enables `errors/1`).
    pub decline_body: Option<Bytes>,
    /// A body the server answers with a retryable failure, 5xx or 408/425/429 (enables
    /// `errors/2`).
    pub fail_body: Option<Bytes>,
    /// A body whose first attempt dies without completing, and whose recovery succeeds
    /// (enables `lease/1`).
    pub crash_body: Option<Bytes>,
    /// A body that differs from `body`; derived from it when absent.
    pub mismatch_body: Option<Bytes>,
    /// Whether reports show credentials (by default they are redacted: see
    /// [`crate::secrets`]).
    pub show_secrets: bool,
    /// The kind of key the endpoint takes.
    pub key_kind: KeyKind,
    /// Time keys: the clock skew the server allows (enables `time/2`).
    pub time_skew: Option<Duration>,
    /// Time keys: the oldest timestamp the server accepts (enables `time/3`).
    pub time_max_age: Option<Duration>,
    /// Counter keys: where a client opens its session (`POST {"client", "firstSeq"}` →
    /// `{"epoch"}`).
    pub session_url: Option<Url>,
    /// Counter keys: the sequence number's width in bits.
    pub counter_bits: u8,
    /// Counter keys: the server's window (enables `counter/5`).
    pub counter_window: Option<u32>,
    /// Tokens: where one is issued (`POST` → `{"token"}`).
    pub token_url: Option<Url>,
    /// Tokens: how long an issued token is valid (enables `token/3`).
    pub token_ttl: Option<Duration>,
    /// Where status queries are sent (`GET` with `Idempotency-Status`): the endpoint's own
    /// URL when `None`, as the spec's default shape has it.
    pub status_url: Option<Url>,
}

impl Target {
    /// Defaults for an endpoint: `POST` of [`DEFAULT_BODY`] as JSON, UUID keys, the IETF
    /// profile, 10 s timeout, 16 duplicates × 5 rounds, no oracle, no opt-in case.
    pub fn new(url: Url) -> Target {
        Target {
            url,
            trust: Trust::System,
            method: Method::POST,
            body: Bytes::from_static(DEFAULT_BODY.as_bytes()),
            content_type: Some(HeaderValue::from_static("application/json")),
            headers: Vec::new(),
            second_credential: Vec::new(),
            key_header: HeaderName::from_static("idempotency-key"),
            key_style: KeyStyle::Uuid,
            profile: Profile::ietf(),
            strict: false,
            timeout: Duration::from_secs(10),
            max_response_bytes: 1 << 20,
            concurrency: 16,
            rounds: 5,
            count_url: None,
            id_pointer: None,
            response_ttl: None,
            key_ttl: None,
            lease: None,
            decline_body: None,
            fail_body: None,
            crash_body: None,
            mismatch_body: None,
            show_secrets: false,
            key_kind: KeyKind::Opaque,
            time_skew: None,
            time_max_age: None,
            session_url: None,
            counter_bits: 32,
            counter_window: None,
            token_url: None,
            token_ttl: None,
            status_url: None,
        }
    }

    /// The options of this target as a report lists them: `(name, value)`, with every
    /// header (`header` and `second credential`) as `Name: value`, and each opt-in setting
    /// only when set.
    pub fn options(&self) -> Vec<(String, String)> {
        let secs = |d: Duration| format!("{} ms", d.as_millis());
        let mut out: Vec<(String, String)> = vec![
            ("method".into(), self.method.to_string()),
            ("key header".into(), self.key_header.to_string()),
            (
                "key kind".into(),
                format!("{:?}", self.key_kind).to_lowercase(),
            ),
            (
                "key style".into(),
                format!("{:?}", self.key_style).to_lowercase(),
            ),
            (
                "concurrency".into(),
                format!("{} duplicates × {} rounds", self.concurrency, self.rounds),
            ),
            ("timeout".into(), secs(self.timeout)),
        ];
        let header = |(n, v): &(HeaderName, HeaderValue)| {
            format!("{}: {}", n, String::from_utf8_lossy(v.as_bytes()))
        };
        out.extend(self.headers.iter().map(|h| ("header".into(), header(h))));
        out.extend(
            self.second_credential
                .iter()
                .map(|h| ("second credential".into(), header(h))),
        );
        let urls = [
            ("count oracle", &self.count_url),
            ("sessions", &self.session_url),
            ("tokens", &self.token_url),
            ("status queries", &self.status_url),
        ];
        for (name, url) in urls {
            if let Some(u) = url {
                out.push((name.into(), u.to_string()));
            }
        }
        if let Some(p) = &self.id_pointer {
            out.push(("id pointer".into(), p.clone()));
        }
        let times = [
            ("response retention", self.response_ttl),
            ("key retention", self.key_ttl),
            ("lease", self.lease),
            ("time skew", self.time_skew),
            ("time max age", self.time_max_age),
            ("token ttl", self.token_ttl),
        ];
        for (name, d) in times {
            if let Some(d) = d {
                out.push((name.into(), secs(d)));
            }
        }
        out
    }

    /// The target for a running reference server: its demo endpoint with two bearer
    /// credentials, the count and id oracles, its retention and lease, and the bodies that
    /// make its handler decline, fail and crash. Every case is enabled.
    pub fn for_reference(server: &Server, config: &ServerConfig) -> Target {
        let base = server.base_url();
        let url = |path: &str| {
            Url::parse(&format!("{base}{path}")).expect("a socket address forms a valid URL")
        };
        let bearer = |token: &str| {
            vec![(
                hyper::header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {token}"))
                    .unwrap_or(HeaderValue::from_static("Bearer conformance")),
            )]
        };
        let with_outcome = |outcome: &str| {
            Bytes::from(format!(
                r#"{{"amount":4200,"currency":"eur","outcome":"{outcome}"}}"#
            ))
        };
        let mut target = Target::new(url(ORDERS_PATH));
        if let Some(identity) = server.tls() {
            target.trust = identity.trust();
        }
        target.headers = bearer("conformance-a");
        target.second_credential = bearer("conformance-b");
        target.count_url = Some(url(COUNT_PATH));
        target.id_pointer = Some("/id".into());
        target.response_ttl = Some(config.response_ttl);
        target.key_ttl = Some(config.key_ttl);
        target.lease = Some(config.lease);
        target.decline_body = Some(with_outcome("decline"));
        target.fail_body = Some(with_outcome("unavailable"));
        target.crash_body = Some(with_outcome("crash"));
        // Quoted keys, as the draft writes them; a UUID-only server takes bare UUIDs.
        target.key_style = if config.uuid_keys {
            KeyStyle::Uuid
        } else {
            KeyStyle::SfString
        };
        target.time_skew = Some(config.time_keys.max_ahead);
        target.time_max_age = Some(config.time_keys.max_age);
        target.session_url = Some(url(SESSIONS_PATH));
        target.counter_bits = config.counter.bits;
        target.counter_window = Some(config.counter.window);
        target.token_url = Some(url(TOKENS_PATH));
        target.token_ttl = Some(config.token_ttl);
        target
    }

    /// The target for the reference server's endpoint of `kind`: `/payments`, `/transfers`
    /// or `/checkout` (opaque: `/orders`), with everything [`Target::for_reference`] sets.
    pub fn for_reference_kind(server: &Server, config: &ServerConfig, kind: KeyKind) -> Target {
        let mut target = Target::for_reference(server, config);
        let path = match kind {
            KeyKind::Opaque => ORDERS_PATH,
            KeyKind::Time => PAYMENTS_PATH,
            KeyKind::Counter => TRANSFERS_PATH,
            KeyKind::Token => CHECKOUT_PATH,
        };
        if let Ok(url) = target.url.join(path) {
            target.url = url;
        }
        target.key_kind = kind;
        if kind != KeyKind::Opaque {
            // Kind keys are bare: they are not sf-strings of their own.
            target.key_style = KeyStyle::Bare;
        }
        target
    }
}
