//! What the suite runs against ([`Target`], [`Profile`]), what it concludes ([`Verdict`],
//! [`CaseResult`], [`Report`]) and the runner ([`run`]).

use crate::cases::{self, Case, Check, Ctx, Miss, Waiting};
use crate::http::{Exchange, HarnessError, Http, Log, RoundCount, WaitSpan};
use crate::server::{
    Fault, Server, ServerConfig, CHECKOUT_PATH, COUNT_PATH, ORDERS_PATH, PAYMENTS_PATH,
    SESSIONS_PATH, TOKENS_PATH, TRANSFERS_PATH,
};
use crate::tls::Trust;
use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::Method;
use idem_spec::Level;
use serde::Serialize;
use std::time::{Duration, Instant};
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

/// How a server is graded: the level of each requirement, and the status codes (and replay
/// marker) it is expected to use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// `ietf`, `idem`, `stripe`, or the codes as given.
    pub name: String,
    /// Whose levels grade the requirements: a miss of a MUST fails, of a SHOULD is
    /// non-strict, of a MAY is an accepted outcome.
    pub levels: idem_spec::Profile,
    /// Whether requests without a key must be refused.
    pub keys_required: bool,
    /// Status for a missing, empty, oversized or malformed key.
    pub bad_key: u16,
    /// Status for a duplicate of a request still in progress.
    pub conflict: u16,
    /// Status for a key reused with a different payload.
    pub mismatch: u16,
    /// The header (name, value) expected on replays, if any.
    pub replay_marker: Option<(String, String)>,
}

impl Profile {
    /// draft-07's levels and codes (400/409/422), keys required, `Idempotent-Replayed:
    /// true` on replays (a SHOULD of the idem spec).
    pub fn ietf() -> Profile {
        Profile {
            name: "ietf".into(),
            levels: idem_spec::Profile::Ietf,
            keys_required: true,
            bad_key: 400,
            conflict: 409,
            mismatch: 422,
            replay_marker: Some(("idempotent-replayed".into(), "true".into())),
        }
    }

    /// idem's own levels, stricter than the draft (the 255-character limit, visible ASCII,
    /// one key line, `Retry-After`, headers replayed byte for byte, 5xx never replayed),
    /// with the IETF codes.
    pub fn idem() -> Profile {
        Profile {
            name: "idem".into(),
            levels: idem_spec::Profile::Idem,
            ..Profile::ietf()
        }
    }

    /// Stripe's behaviour: keys optional, 400 for bad keys and for a changed payload, 409
    /// while in progress, `Idempotent-Replayed: true` on replays, stored 5xx accepted.
    pub fn stripe() -> Profile {
        Profile {
            name: "stripe".into(),
            levels: idem_spec::Profile::Stripe,
            keys_required: false,
            bad_key: 400,
            conflict: 409,
            mismatch: 400,
            replay_marker: Some(("idempotent-replayed".into(), "true".into())),
        }
    }

    /// `ietf`, `idem`, `stripe`, or three codes `BAD_KEY/CONFLICT/MISMATCH` (for example
    /// `400/409/400`) on top of the IETF profile and its levels.
    pub fn parse(s: &str) -> Result<Profile, String> {
        match s {
            "ietf" => return Ok(Profile::ietf()),
            "idem" => return Ok(Profile::idem()),
            "stripe" => return Ok(Profile::stripe()),
            _ => {}
        }
        let codes: Vec<u16> = s
            .split('/')
            .map(|c| {
                c.trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|c| (100..600).contains(c))
            })
            .collect::<Option<_>>()
            .ok_or_else(|| profile_error(s))?;
        let [bad_key, conflict, mismatch] = codes[..] else {
            return Err(profile_error(s));
        };
        Ok(Profile {
            name: s.to_owned(),
            bad_key,
            conflict,
            mismatch,
            ..Profile::ietf()
        })
    }
}

fn profile_error(s: &str) -> String {
    format!("unknown profile {s:?}: use ietf, idem, stripe, or BAD_KEY/CONFLICT/MISMATCH codes such as 400/409/422")
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

/// The outcome of one case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The server did what the requirement says.
    Pass,
    /// A SHOULD-level requirement was missed (counted as a failure only with `--strict`).
    NonStrict,
    /// The server is wrong.
    Fail,
    /// The server executed a request more often than once: the worst kind of wrong.
    Unsafe,
    /// Not run: it needs an option that was not given, or does not apply to the profile.
    Skip,
    /// The harness could not tell: unreachable, timeout, unexpected protocol.
    Error,
}

impl Verdict {
    /// How bad it is, for picking the worst of several: unsafe, fail, error, non-strict,
    /// pass, skip.
    fn rank(self) -> u8 {
        match self {
            Verdict::Skip => 0,
            Verdict::Pass => 1,
            Verdict::NonStrict => 2,
            Verdict::Error => 3,
            Verdict::Fail => 4,
            Verdict::Unsafe => 5,
        }
    }

    /// The verdict for a missed requirement of `level`.
    pub fn for_miss(level: Level, strict: bool) -> Verdict {
        match level {
            Level::Must => Verdict::Fail,
            Level::Should if strict => Verdict::Fail,
            Level::Should => Verdict::NonStrict,
            Level::May => Verdict::Pass,
        }
    }
}

impl Verdict {
    /// Lower-case name, as in the reports.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::NonStrict => "non-strict",
            Verdict::Fail => "fail",
            Verdict::Unsafe => "unsafe",
            Verdict::Skip => "skip",
            Verdict::Error => "error",
        }
    }
}

/// How sure a pass is, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Confidence {
    /// A side-effect oracle confirmed it.
    High,
    /// The responses and the replay marker support it; no oracle saw the side effects.
    Medium,
    /// Only the responses support it.
    Low,
}

/// A requirement a case found missed, and what that means under the profile.
#[derive(Clone, Debug, Serialize)]
pub struct Missed {
    /// The requirement ID.
    pub requirement: String,
    /// Its level under the profile.
    pub level: Level,
    /// What the miss alone makes of the case.
    pub verdict: Verdict,
    /// What the requirement expects.
    pub expected: String,
    /// What the server did.
    pub observed: String,
}

/// One case's result.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    /// Stable case ID (`concurrent/1`).
    pub id: String,
    /// Its section (the ID up to the slash).
    pub section: String,
    /// The requirement's level under the profile.
    pub level: Level,
    /// The requirement ID (`IDEM-CONC-1`).
    pub requirement: String,
    /// The requirement sentence, from `spec/requirements.toml`.
    pub requirement_text: String,
    /// What the case sends and checks.
    pub title: String,
    /// The verdict.
    pub verdict: Verdict,
    /// For passes: how sure, and why.
    pub confidence: Option<Confidence>,
    /// Why (passes: the outcome seen and the evidence; skips and errors: the reason).
    pub reason: Option<String>,
    /// For failures: what the requirement that decided the verdict expects.
    pub expected: Option<String>,
    /// For failures: what the server did.
    pub observed: Option<String>,
    /// Every requirement the case found missed, including those the profile accepts.
    pub missed: Vec<Missed>,
    /// Measurements and remarks.
    pub notes: Vec<String>,
    /// Wall time of the case.
    pub duration_ms: f64,
    /// The HTTP exchanges, in order.
    pub exchanges: Vec<Exchange>,
    /// The waits for the server's clock or for a key to leave in-progress, in order.
    pub waits: Vec<WaitSpan>,
    /// The executions the count oracle attributes to each round of raced duplicates.
    pub rounds: Vec<RoundCount>,
}

/// Counts of verdicts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Passed.
    pub pass: usize,
    /// SHOULD missed without `--strict`.
    pub non_strict: usize,
    /// Failed.
    pub fail: usize,
    /// Unsafe.
    #[serde(rename = "unsafe")]
    pub unsafe_: usize,
    /// Skipped.
    pub skip: usize,
    /// Harness errors.
    pub error: usize,
}

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// `idem-conformance`.
    pub tool: &'static str,
    /// The tool's version.
    pub version: &'static str,
    /// The endpoint.
    pub target: String,
    /// Whether it was the embedded reference server.
    pub embedded: bool,
    /// The reference server's fault, if any.
    pub fault: Option<Fault>,
    /// The profile used.
    pub profile: Profile,
    /// Whether SHOULD-level misses counted as failures.
    pub strict: bool,
    /// For an `https://` target: which certificates were trusted.
    pub tls: Option<&'static str>,
    /// Wall time of the run.
    pub duration_ms: f64,
    /// Verdict counts.
    pub summary: Summary,
    /// The process exit code this report calls for.
    pub exit_code: u8,
    /// The options the run used, as `(name, value)` (credentials redacted unless
    /// `--show-secrets`).
    pub options: Vec<(String, String)>,
    /// Every case run, in order.
    pub cases: Vec<CaseResult>,
}

impl Report {
    /// The exit code: [`EXIT_UNSAFE`] if anything was unsafe, else [`EXIT_FAIL`] if a
    /// case failed, else [`EXIT_HARNESS`] if the harness could not judge a case (connection
    /// or protocol trouble), else 0.
    pub fn compute_exit_code(cases: &[CaseResult]) -> u8 {
        let has = |v: Verdict| cases.iter().any(|c| c.verdict == v);
        if has(Verdict::Unsafe) {
            EXIT_UNSAFE
        } else if has(Verdict::Fail) {
            EXIT_FAIL
        } else if has(Verdict::Error) {
            EXIT_HARNESS
        } else {
            0
        }
    }

    /// The result of case `id`, if it ran.
    pub fn case(&self, id: &str) -> Option<&CaseResult> {
        self.cases.iter().find(|c| c.id == id)
    }
}

/// Exit code: a case failed.
pub const EXIT_FAIL: u8 = 1;
/// Exit code: a request executed more often than once.
pub const EXIT_UNSAFE: u8 = 2;
/// Exit code: the command line or an option's value is wrong.
pub const EXIT_USAGE: u8 = 3;
/// Exit code: the target could not be reached or judged (connection, TLS, timeout,
/// unusable answers), or the harness itself failed.
pub const EXIT_HARNESS: u8 = 4;

/// Progress events, for a live terminal display.
#[derive(Debug)]
pub enum Progress<'a> {
    /// Case `index` of `total` (1-based) starts.
    Started {
        /// 1-based position in this run.
        index: usize,
        /// Cases in this run.
        total: usize,
        /// The case.
        case: &'a Case,
    },
    /// The running case waits, for longer than a second: announced when it has lasted a
    /// second, then every few seconds.
    Waiting {
        /// The case.
        case: &'a Case,
        /// What it waits for, and how long is left at most.
        wait: &'a Waiting,
    },
    /// It finished.
    Finished {
        /// 1-based position in this run.
        index: usize,
        /// Cases in this run.
        total: usize,
        /// Its result.
        result: &'a CaseResult,
    },
}

/// The cases whose IDs start with any of `prefixes` (all cases when empty), in suite order.
pub fn select(prefixes: &[String]) -> Result<Vec<&'static Case>, String> {
    let all = cases::all();
    if prefixes.is_empty() {
        return Ok(all.to_vec());
    }
    for p in prefixes {
        if !all.iter().any(|c| c.id.starts_with(p.as_str())) {
            return Err(format!("no case ID starts with {p:?} (see --list)"));
        }
    }
    Ok(all
        .iter()
        .filter(|c| prefixes.iter().any(|p| c.id.starts_with(p.as_str())))
        .copied()
        .collect())
}

/// The client for `target`: TLS is set up when the endpoint or the count oracle is
/// `https://`.
pub fn client(target: &Target) -> Result<Http, HarnessError> {
    let https = std::iter::once(&target.url)
        .chain(&target.count_url)
        .any(|u| u.scheme() == "https");
    let tls = if https {
        Some(crate::tls::client_config(&target.trust).map_err(HarnessError::Usage)?)
    } else {
        None
    };
    Ok(Http::new(target.timeout, target.max_response_bytes, tls))
}

/// Runs `cases` against `target`, one after the other (the count oracle is global, so
/// cases never overlap), reporting progress as it goes. The report carries no credential
/// unless `target.show_secrets`.
pub async fn run(
    target: &Target,
    cases: &[&'static Case],
    embedded: Option<Option<Fault>>,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<Report, HarnessError> {
    let lane = Lane {
        target: target.clone(),
        cases: cases.to_vec(),
    };
    run_lanes(vec![lane], embedded, progress).await
}

/// Cases that run one after the other against one target.
#[derive(Clone, Debug)]
pub struct Lane {
    /// Where they are sent (with its own count oracle).
    pub target: Target,
    /// The cases, in suite order.
    pub cases: Vec<&'static Case>,
}

/// What a lane reports to the run.
enum LaneEvent {
    Started(usize, &'static Case),
    Waiting(&'static Case, Waiting),
    Finished(usize, Box<CaseResult>),
}

/// Runs `lanes` side by side, the cases of each one after the other; the report lists
/// every case in suite order, for the first lane's target. Lanes must not share a count
/// oracle (an execution in one would be counted in another), and a case runs in one lane
/// only.
pub async fn run_lanes(
    lanes: Vec<Lane>,
    embedded: Option<Option<Fault>>,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<Report, HarnessError> {
    let started = Instant::now();
    let Some(target) = lanes.first().map(|l| l.target.clone()) else {
        return Err(HarnessError::Usage("no lane to run".into()));
    };
    let mut order: Vec<&'static Case> =
        lanes.iter().flat_map(|l| l.cases.iter().copied()).collect();
    let all = cases::all();
    order.sort_by_key(|c| all.iter().position(|a| std::ptr::eq(*a, *c)));
    if order.windows(2).any(|w| std::ptr::eq(w[0], w[1])) {
        return Err(HarnessError::Usage(
            "a case is in more than one lane".into(),
        ));
    }
    let total = order.len();
    let index_of = |case: &Case| {
        order
            .iter()
            .position(|c| std::ptr::eq(*c, case))
            .unwrap_or(0)
    };
    let (events, mut received) = tokio::sync::mpsc::unbounded_channel();
    let mut running = tokio::task::JoinSet::new();
    for lane in lanes {
        let http = client(&lane.target)?;
        let cases: Vec<(usize, &'static Case)> =
            lane.cases.iter().map(|c| (index_of(c), *c)).collect();
        let events = events.clone();
        running.spawn(async move {
            for (i, case) in cases {
                let _ = events.send(LaneEvent::Started(i, case));
                let mut forward = |p: Progress<'_>| {
                    if let Progress::Waiting { wait, .. } = p {
                        let _ = events.send(LaneEvent::Waiting(case, wait.clone()));
                    }
                };
                let result = run_case(&lane.target, &http, case, &mut forward).await;
                let _ = events.send(LaneEvent::Finished(i, Box::new(result)));
            }
        });
    }
    drop(events);
    let mut results: Vec<Option<CaseResult>> = (0..total).map(|_| None).collect();
    while let Some(event) = received.recv().await {
        match event {
            LaneEvent::Started(i, case) => progress(Progress::Started {
                index: i + 1,
                total,
                case,
            }),
            LaneEvent::Waiting(case, wait) => progress(Progress::Waiting { case, wait: &wait }),
            LaneEvent::Finished(i, result) => {
                progress(Progress::Finished {
                    index: i + 1,
                    total,
                    result: &result,
                });
                results[i] = Some(*result);
            }
        }
    }
    while let Some(done) = running.join_next().await {
        if let Err(e) = done {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    }
    // Every lane ran to its end (a panic is raised above), so every case has its result.
    let results: Vec<CaseResult> = results.into_iter().flatten().collect();
    debug_assert_eq!(results.len(), total);
    let mut summary = Summary::default();
    for r in &results {
        match r.verdict {
            Verdict::Pass => summary.pass += 1,
            Verdict::NonStrict => summary.non_strict += 1,
            Verdict::Fail => summary.fail += 1,
            Verdict::Unsafe => summary.unsafe_ += 1,
            Verdict::Skip => summary.skip += 1,
            Verdict::Error => summary.error += 1,
        }
    }
    let mut report = Report {
        tool: "idem-conformance",
        version: env!("CARGO_PKG_VERSION"),
        target: target.url.to_string(),
        embedded: embedded.is_some(),
        fault: embedded.flatten(),
        profile: target.profile.clone(),
        strict: target.strict,
        tls: (target.url.scheme() == "https").then(|| target.trust.describe()),
        duration_ms: crate::http::ms(started.elapsed()),
        summary,
        exit_code: Report::compute_exit_code(&results),
        options: target.options(),
        cases: results,
    };
    if !target.show_secrets {
        crate::secrets::Redactor::for_target(&target).report(&mut report);
    }
    Ok(report)
}

async fn run_case(
    target: &Target,
    http: &Http,
    case: &'static Case,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> CaseResult {
    let (tx, mut waits) = tokio::sync::mpsc::unbounded_channel();
    let ctx = Ctx::new(target, http, Log::new(), Some(tx));
    if let Some(why) = kind_mismatch(target.key_kind, case) {
        return grade(target, case, &ctx, Ok(Check::Skip(why)));
    }
    let outcome = {
        let running = case.run(&ctx);
        tokio::pin!(running);
        loop {
            tokio::select! {
                outcome = &mut running => break outcome,
                Some(wait) = waits.recv() => progress(Progress::Waiting { case, wait: &wait }),
            }
        }
    };
    grade(target, case, &ctx, outcome)
}

/// Why `case` does not apply to an endpoint of `kind`, if it does not.
fn kind_mismatch(kind: KeyKind, case: &Case) -> Option<String> {
    match (KeyKind::of_section(case.section()), kind) {
        (None, KeyKind::Opaque) => None,
        (None, k) => Some(format!(
            "the endpoint takes {} keys (--key-kind); the generic cases need an endpoint with opaque keys",
            k.section().unwrap_or("other")
        )),
        (Some(f), k) if f == k => None,
        (Some(f), _) => Some(format!(
            "needs --key-kind {} and an endpoint with those keys",
            f.section().unwrap_or("")
        )),
    }
}

/// The verdict of a case: the worst of its end and of every miss it recorded, each miss
/// graded by its requirement's level under the profile.
fn grade(
    target: &Target,
    case: &'static Case,
    ctx: &Ctx<'_>,
    outcome: Result<Check, HarnessError>,
) -> CaseResult {
    let profile = target.profile.levels;
    let mut result = CaseResult {
        id: case.id.to_owned(),
        section: case.section().to_owned(),
        level: case.level(profile),
        requirement: case.requirement.to_owned(),
        requirement_text: case.requirement_text().to_owned(),
        title: case.title.to_owned(),
        verdict: Verdict::Pass,
        confidence: None,
        reason: None,
        expected: None,
        observed: None,
        missed: Vec::new(),
        notes: Vec::new(),
        duration_ms: crate::http::ms(ctx.log.elapsed()),
        exchanges: Vec::new(),
        waits: Vec::new(),
        rounds: Vec::new(),
    };
    let mut misses = ctx.take_misses();
    match outcome {
        Ok(Check::Pass(confidence, why)) => {
            result.confidence = Some(confidence);
            result.reason = Some(why);
        }
        Ok(Check::Miss(m)) => misses.push(m),
        Ok(Check::Unsafe { expected, observed }) => {
            result.verdict = Verdict::Unsafe;
            result.expected = Some(expected);
            result.observed = Some(observed);
        }
        Ok(Check::Skip(why)) => {
            result.verdict = Verdict::Skip;
            result.reason = Some(why);
        }
        Err(e) => {
            result.verdict = Verdict::Error;
            result.reason = Some(e.to_string());
        }
    }
    let mut accepted = Vec::new();
    for Miss {
        requirement,
        expected,
        observed,
    } in misses
    {
        let requirement = requirement.unwrap_or(case.requirement);
        let level = cases::level(requirement, profile);
        let verdict = Verdict::for_miss(level, target.strict);
        if verdict == Verdict::Pass {
            accepted.push(format!(
                "accepted under the {} profile ({requirement} is {}): {observed}",
                target.profile.name,
                level.as_str()
            ));
        } else if verdict.rank() > result.verdict.rank() {
            result.verdict = verdict;
            result.expected = Some(expected.clone());
            result.observed = Some(observed.clone());
        }
        result.missed.push(Missed {
            requirement: requirement.to_owned(),
            level,
            verdict,
            expected,
            observed,
        });
    }
    if !accepted.is_empty() && result.verdict == Verdict::Pass {
        let seen = result.reason.take();
        result.reason = Some(
            accepted
                .into_iter()
                .chain(seen)
                .collect::<Vec<_>>()
                .join("; "),
        );
    }
    result.notes = ctx.take_notes();
    let logged = ctx.log.take();
    result.exchanges = logged.exchanges;
    result.waits = logged.waits;
    result.rounds = logged.rounds;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse() {
        assert_eq!(Profile::parse("ietf"), Ok(Profile::ietf()));
        let stripe = Profile::parse("stripe").expect("stripe");
        assert!(!stripe.keys_required);
        assert_eq!(
            (stripe.bad_key, stripe.conflict, stripe.mismatch),
            (400, 409, 400)
        );
        let custom = Profile::parse("400/409/400").expect("codes");
        assert_eq!((custom.conflict, custom.mismatch), (409, 400));
        assert!(custom.keys_required);
        for bad in [
            "",
            "400/409",
            "400/409/422/500",
            "4OO/409/422",
            "99/409/422",
            "ietf2",
        ] {
            assert!(Profile::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn selection_by_prefix_keeps_suite_order() {
        let ids = |p: &[&str]| {
            select(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map(|cs| cs.iter().map(|c| c.id).collect::<Vec<_>>())
        };
        assert_eq!(
            ids(&["keys/3", "concurrent"]).expect("known"),
            ["concurrent/1", "concurrent/2", "keys/3"]
        );
        assert_eq!(ids(&[]).expect("all").len(), cases::all().len());
        assert!(ids(&["nope"]).is_err());
    }

    #[test]
    fn exit_codes_rank_unsafe_over_fail_over_error() {
        let case = |v: Verdict| CaseResult {
            id: "x/1".into(),
            section: "x".into(),
            level: Level::Must,
            requirement: "IDEM-EXEC-1".into(),
            requirement_text: String::new(),
            title: String::new(),
            verdict: v,
            confidence: None,
            reason: None,
            expected: None,
            observed: None,
            missed: Vec::new(),
            notes: Vec::new(),
            duration_ms: 0.0,
            exchanges: Vec::new(),
            waits: Vec::new(),
            rounds: Vec::new(),
        };
        let code = |vs: &[Verdict]| {
            Report::compute_exit_code(&vs.iter().map(|v| case(*v)).collect::<Vec<_>>())
        };
        assert_eq!(code(&[Verdict::Pass, Verdict::Skip, Verdict::NonStrict]), 0);
        assert_eq!(code(&[Verdict::Pass, Verdict::Error]), EXIT_HARNESS);
        assert_eq!(code(&[Verdict::Error, Verdict::Fail]), 1);
        assert_eq!(code(&[Verdict::Fail, Verdict::Unsafe, Verdict::Error]), 2);
    }

    /// Grades `outcome` of case `id` (with `soft` misses recorded on the way) under
    /// `profile`.
    fn graded(
        id: &str,
        profile: Profile,
        strict: bool,
        soft: &[&'static str],
        outcome: Result<Check, HarnessError>,
    ) -> CaseResult {
        let mut target = Target::new(Url::parse("http://127.0.0.1:1/").expect("url"));
        target.profile = profile;
        target.strict = strict;
        let http = client(&target).expect("client");
        let ctx = Ctx::new(&target, &http, Log::new(), None);
        for r in soft {
            ctx.miss(r, "expected", format!("soft miss of {r}"));
        }
        let case = cases::all()
            .iter()
            .find(|c| c.id == id)
            .expect("case exists");
        grade(&target, case, &ctx, outcome)
    }

    fn own_miss() -> Result<Check, HarnessError> {
        Ok(cases::fail("a 5xx is not stored", "the 500 was replayed"))
    }

    #[test]
    fn a_miss_is_graded_by_its_level_under_the_profile() {
        // errors/2 cites IDEM-OUT-4: MAY under ietf and stripe, MUST under idem.
        for p in [Profile::ietf(), Profile::stripe()] {
            let r = graded("errors/2", p.clone(), true, &[], own_miss());
            assert_eq!(r.verdict, Verdict::Pass, "{}", p.name);
            let reason = r.reason.expect("the accepted outcome is named");
            assert!(
                reason.contains("accepted under the")
                    && reason.contains("IDEM-OUT-4 is MAY")
                    && reason.contains("the 500 was replayed"),
                "{reason}"
            );
            assert_eq!(r.missed.len(), 1);
        }
        let r = graded("errors/2", Profile::idem(), false, &[], own_miss());
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(r.observed.as_deref(), Some("the 500 was replayed"));
        assert_eq!(r.level, Level::Must);
    }

    #[test]
    fn a_should_miss_is_non_strict_unless_strict_and_the_worst_miss_decides() {
        // concurrent/2 cites IDEM-CONC-3 (Retry-After): SHOULD under ietf, MUST under idem.
        let pass = || Ok(Check::Pass(Confidence::High, "ok".into()));
        let r = graded(
            "concurrent/2",
            Profile::ietf(),
            false,
            &["IDEM-CONC-3"],
            pass(),
        );
        assert_eq!(r.verdict, Verdict::NonStrict);
        let r = graded(
            "concurrent/2",
            Profile::ietf(),
            true,
            &["IDEM-CONC-3"],
            pass(),
        );
        assert_eq!(r.verdict, Verdict::Fail);
        let r = graded(
            "concurrent/2",
            Profile::idem(),
            false,
            &["IDEM-CONC-3"],
            pass(),
        );
        assert_eq!(r.verdict, Verdict::Fail);
        // A SHOULD miss of the status code does not hide a MUST miss recorded with it.
        let r = graded(
            "replay/1",
            Profile::ietf(),
            false,
            &["IDEM-HTTP-1"],
            Ok(cases::fail("the same body", "another body")),
        );
        assert_eq!(r.verdict, Verdict::Fail);
        assert_eq!(r.observed.as_deref(), Some("another body"));
        assert_eq!(r.missed.len(), 2);
        // Unsafe stays unsafe whatever else was missed; a harness error stays an error
        // unless a miss is a failure.
        let r = graded(
            "replay/1",
            Profile::ietf(),
            false,
            &["IDEM-HTTP-1"],
            Ok(cases::unsafe_("once", "twice")),
        );
        assert_eq!(r.verdict, Verdict::Unsafe);
        let err = || Err(HarnessError::Timeout("x".into()));
        assert_eq!(
            graded("replay/1", Profile::ietf(), false, &["IDEM-HTTP-1"], err()).verdict,
            Verdict::Error
        );
        assert_eq!(
            graded(
                "replay/1",
                Profile::ietf(),
                false,
                &["IDEM-REPLAY-1"],
                err()
            )
            .verdict,
            Verdict::Fail
        );
    }
}
