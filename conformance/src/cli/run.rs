//! `run [URL]`: its options, how they configure a [`Target`], and the run itself.

use super::{harness, out, seconds, start_error, Failure};
use crate::embedded::{self, Embedded};
use crate::report::{self, Color};
use crate::server::{Fault, ServerConfig};
use crate::suite::{self, KeyKind, KeyStyle, Profile, Target};
use bytes::Bytes;
use clap::Args;
use hyper::header::{HeaderName, HeaderValue};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;
use url::Url;

/// Options of `run`.
#[derive(Debug, Args)]
pub(super) struct RunArgs {
    /// The endpoint to test (http:// or https://). Without it, the reference server is
    /// started in-process on 127.0.0.1 with short retention times and every case enabled.
    url: Option<String>,
    #[command(flatten)]
    suite: SuiteArgs,
    /// Embedded server only: start it with this deliberate defect.
    #[arg(long, value_enum)]
    fault: Option<Fault>,
    /// Embedded server only: the handler's delay in milliseconds.
    #[arg(long)]
    delay_ms: Option<u64>,
    /// Embedded server only: serve it over HTTPS with a certificate generated at start (the
    /// harness trusts its CA).
    #[arg(long)]
    tls: bool,
    /// Embedded server only: accept only UUID keys.
    #[arg(long)]
    uuid_keys: bool,
}

/// The options of a run that any target takes: `run`'s and `openapi`'s.
#[derive(Debug, Args)]
pub(super) struct SuiteArgs {
    /// Trust only the certificate authorities in this PEM file (instead of the system's
    /// roots) for https:// targets.
    #[arg(long, value_name = "FILE", conflicts_with = "insecure")]
    pub(super) cacert: Option<PathBuf>,
    /// Do not verify the server's certificate (printed in the report header).
    #[arg(long)]
    pub(super) insecure: bool,
    /// The request method.
    #[arg(short = 'X', long, default_value = "POST")]
    pub(super) method: String,
    /// The body of a request that succeeds, inline or @FILE.
    #[arg(long)]
    pub(super) body: Option<String>,
    /// The body's Content-Type ("none" to send none).
    #[arg(long, default_value = "application/json")]
    pub(super) content_type: String,
    /// An extra header on every request, "Name: value" (repeatable): the credential.
    /// Redacted in reports.
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    pub(super) headers: Vec<String>,
    /// An extra header whose value is read from an environment variable (repeatable), so
    /// that it appears in no process list or CI log.
    #[arg(long, value_name = "NAME=VAR")]
    pub(super) header_env: Vec<String>,
    /// Extra headers read from a file of "Name: value" lines (# comments and blank lines
    /// are skipped).
    #[arg(long, value_name = "FILE")]
    pub(super) header_file: Vec<PathBuf>,
    /// The header of a second principal, "Name: value" (repeatable); it replaces the
    /// same-named -H header. Enables scope/1. Redacted in reports.
    #[arg(long, value_name = "HEADER")]
    pub(super) second_credential: Vec<String>,
    /// A second principal's header whose value is read from an environment variable.
    #[arg(long, value_name = "NAME=VAR")]
    pub(super) second_credential_env: Vec<String>,
    /// A second principal's headers, read from a file of "Name: value" lines.
    #[arg(long, value_name = "FILE")]
    pub(super) second_credential_file: Vec<PathBuf>,
    /// Show credentials in the reports (by default every header given by the options above,
    /// and Authorization, Cookie and API-key headers, are redacted).
    #[arg(long)]
    pub(super) show_secrets: bool,
    /// The key header's name.
    #[arg(long, default_value = "Idempotency-Key")]
    pub(super) key_header: String,
    /// How opaque keys are written: uuid (bare UUID v4, the default against a URL),
    /// sf-string (quoted, the default against the embedded server) or bare.
    #[arg(long, value_enum)]
    pub(super) key_style: Option<KeyStyle>,
    /// The kind of key the endpoint takes: opaque (the generic cases, the default), or
    /// time, counter or token (their own case families). Without a URL every family runs
    /// against the reference server's endpoint of its kind; this keeps only one.
    #[arg(long, value_enum)]
    pub(super) key_kind: Option<KeyKind>,
    /// Time keys: the clock skew the server allows, in seconds (enables time/2).
    #[arg(long, value_name = "SECS")]
    pub(super) time_skew: Option<f64>,
    /// Time keys: the oldest timestamp the server accepts, in seconds (enables time/3).
    #[arg(long, value_name = "SECS")]
    pub(super) time_max_age: Option<f64>,
    /// Counter keys: the URL (or path) that opens a client's session: POST
    /// {"client", "firstSeq"} answering {"epoch"}.
    #[arg(long, value_name = "URL")]
    pub(super) session_url: Option<String>,
    /// Counter keys: the sequence number's width in bits (default 32; 12 or less lets
    /// counter/6 wrap).
    #[arg(long, value_name = "BITS")]
    pub(super) counter_bits: Option<u8>,
    /// Counter keys: the server's window (enables counter/5).
    #[arg(long, value_name = "N")]
    pub(super) counter_window: Option<u32>,
    /// Tokens: the URL (or path) that issues one: POST answering {"token"}.
    #[arg(long, value_name = "URL")]
    pub(super) token_url: Option<String>,
    /// Tokens: how long an issued token is valid, in seconds (enables token/3).
    #[arg(long, value_name = "SECS")]
    pub(super) token_ttl: Option<f64>,
    /// Status queries: the URL (or path) that answers them, when it is not the endpoint's
    /// own (the default: a GET on the endpoint with Idempotency-Status).
    #[arg(long, value_name = "URL")]
    pub(super) status_url: Option<String>,
    /// How the server is graded: ietf (draft-07's levels, 400/409/422), idem (idem's
    /// stricter levels), stripe (Stripe's choices accepted: keys optional, 400/409/400,
    /// stored 5xx), or BAD_KEY/CONFLICT/MISMATCH codes such as 400/409/400 with the ietf
    /// levels.
    #[arg(long, default_value = "ietf")]
    pub(super) profile: String,
    /// Keys are optional: skip the missing- and empty-key cases.
    #[arg(long)]
    pub(super) keys_optional: bool,
    /// The replay marker header, "Name: value", or "none".
    #[arg(long)]
    pub(super) replay_marker: Option<String>,
    /// A miss of a SHOULD (under the profile) is a failure, not non-strict.
    #[arg(long)]
    pub(super) strict: bool,
    /// Run only the cases whose ID starts with PREFIX (repeatable), e.g. concurrent or keys/3.
    #[arg(long = "case", value_name = "PREFIX")]
    pub(super) cases: Vec<String>,
    /// List the cases and exit.
    #[arg(long)]
    pub(super) list: bool,
    /// Per-request timeout, in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub(super) timeout: f64,
    /// The largest response body read, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub(super) max_response_bytes: usize,
    /// Identical requests per concurrency round.
    #[arg(long, default_value_t = 16)]
    pub(super) concurrency: usize,
    /// Concurrency rounds.
    #[arg(long, default_value_t = 5)]
    pub(super) rounds: usize,
    /// Side-effect oracle: a URL (or a path on the target) answering the number of
    /// executions, as a number or JSON {"count": N}.
    #[arg(long)]
    pub(super) count_url: Option<String>,
    /// Side-effect oracle: a JSON pointer to the created resource's id in a success body,
    /// e.g. /id.
    #[arg(long)]
    pub(super) id_pointer: Option<String>,
    /// The server's retention, in seconds: sets --response-ttl and --key-ttl.
    #[arg(long)]
    pub(super) ttl: Option<f64>,
    /// The server's response retention in seconds (enables expiry/1, with --key-ttl expiry/2).
    #[arg(long)]
    pub(super) response_ttl: Option<f64>,
    /// The server's key retention in seconds (enables expiry/3).
    #[arg(long)]
    pub(super) key_ttl: Option<f64>,
    /// The server's lease in seconds (with --crash-body, enables lease/1).
    #[arg(long)]
    pub(super) lease: Option<f64>,
    /// A body the server answers with a deterministic 4xx, inline or @FILE (enables errors/1).
    #[arg(long)]
    pub(super) decline_body: Option<String>,
    /// A body the server fails with a 5xx/408/425/429, inline or @FILE (enables errors/2).
    #[arg(long)]
    pub(super) fail_body: Option<String>,
    /// A body whose first attempt dies without completing, inline or @FILE (enables lease/1).
    #[arg(long)]
    pub(super) crash_body: Option<String>,
    /// A body that differs from --body, for mismatch/1 (default: --body with a member added).
    #[arg(long)]
    pub(super) mismatch_body: Option<String>,
    /// Write the JSON report to FILE.
    #[arg(long, value_name = "FILE")]
    pub(super) json: Option<PathBuf>,
    /// Write a JUnit XML report to FILE.
    #[arg(long, value_name = "FILE")]
    pub(super) junit: Option<PathBuf>,
    /// Write an HTML report into DIR: index.html and one page per case, with every exchange
    /// and timelines of the raced rounds and the waits (self-contained, no network).
    #[arg(long, value_name = "DIR")]
    pub(super) html: Option<PathBuf>,
    /// No progress lines.
    #[arg(short, long)]
    pub(super) quiet: bool,
}

fn header(s: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("header {s:?} is not \"Name: value\""))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("invalid header name in {s:?}"))?;
    let value = HeaderValue::from_str(value.trim())
        .map_err(|_| format!("invalid header value in {s:?}"))?;
    Ok((name, value))
}

/// `NAME=VAR`: header NAME with the value of environment variable VAR.
fn header_env(option: &str, s: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, var) = s
        .split_once('=')
        .ok_or_else(|| format!("--{option} {s:?} is not NAME=VAR"))?;
    let value = std::env::var(var.trim()).map_err(|_| {
        format!("--{option} {s:?}: environment variable {var} is not set or not UTF-8")
    })?;
    header(&format!("{name}: {value}"))
        .map_err(|_| format!("--{option} {s:?}: the header name or the value of {var} is invalid"))
}

/// The "Name: value" lines of `path`; `#` comments and blank lines are skipped.
fn header_file(
    option: &str,
    path: &std::path::Path,
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--{option} {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        // The line is not quoted back: it holds a credential.
        .map(|(i, l)| {
            header(l).map_err(|_| {
                format!(
                    "--{option} {} line {}: not a valid \"Name: value\" header",
                    path.display(),
                    i + 1
                )
            })
        })
        .collect()
}

pub(super) fn body(name: &str, s: &str) -> Result<Bytes, String> {
    match s.strip_prefix('@') {
        Some(path) => std::fs::read(path)
            .map(Bytes::from)
            .map_err(|e| format!("--{name} {s}: {e}")),
        None => Ok(Bytes::from(s.to_owned())),
    }
}
/// Applies the options to `t`.
pub(super) fn configure(t: &mut Target, a: &SuiteArgs, against_url: bool) -> Result<(), String> {
    if let Some(path) = &a.cacert {
        t.trust = crate::tls::Trust::from_pem_file(path)?;
    }
    if a.insecure {
        t.trust = crate::tls::Trust::Insecure;
    }
    t.method = a
        .method
        .parse()
        .map_err(|_| format!("invalid method {:?}", a.method))?;
    if let Some(b) = &a.body {
        t.body = body("body", b)?;
    }
    t.content_type = match a.content_type.as_str() {
        "none" => None,
        ct => Some(HeaderValue::from_str(ct).map_err(|_| format!("invalid content type {ct:?}"))?),
    };
    let mut headers = Vec::new();
    for h in &a.headers {
        headers.push(header(h)?);
    }
    for h in &a.header_env {
        headers.push(header_env("header-env", h)?);
    }
    for f in &a.header_file {
        headers.extend(header_file("header-file", f)?);
    }
    for (n, v) in headers {
        t.headers.retain(|(m, _)| *m != n);
        t.headers.push((n, v));
    }
    let mut second = Vec::new();
    for h in &a.second_credential {
        second.push(header(h)?);
    }
    for h in &a.second_credential_env {
        second.push(header_env("second-credential-env", h)?);
    }
    for f in &a.second_credential_file {
        second.extend(header_file("second-credential-file", f)?);
    }
    if !second.is_empty() {
        t.second_credential = second;
    }
    t.show_secrets = a.show_secrets;
    t.key_header = HeaderName::from_bytes(a.key_header.as_bytes())
        .map_err(|_| format!("invalid key header name {:?}", a.key_header))?;
    if against_url {
        t.key_kind = a.key_kind.unwrap_or_default();
    }
    match a.key_style {
        // Kind keys are not sf-strings: they are sent bare.
        _ if t.key_kind != KeyKind::Opaque => t.key_style = KeyStyle::Bare,
        Some(style) => t.key_style = style,
        None => {}
    }
    if let Some(v) = a.time_skew {
        t.time_skew = Some(seconds("time-skew", v)?);
    }
    if let Some(v) = a.time_max_age {
        t.time_max_age = Some(seconds("time-max-age", v)?);
    }
    for (name, src, dst) in [
        ("session-url", &a.session_url, &mut t.session_url),
        ("token-url", &a.token_url, &mut t.token_url),
        ("status-url", &a.status_url, &mut t.status_url),
    ] {
        if let Some(u) = src {
            *dst = Some(t.url.join(u).map_err(|e| format!("--{name} {u:?}: {e}"))?);
        }
    }
    if let Some(bits) = a.counter_bits {
        if !(8..=64).contains(&bits) {
            return Err("--counter-bits must be between 8 and 64".into());
        }
        t.counter_bits = bits;
    }
    if let Some(w) = a.counter_window {
        if w == 0 {
            return Err("--counter-window must be positive".into());
        }
        t.counter_window = Some(w);
    }
    if let Some(v) = a.token_ttl {
        t.token_ttl = Some(seconds("token-ttl", v)?);
    }
    t.profile = Profile::parse(&a.profile)?;
    if a.keys_optional {
        t.profile.keys_required = false;
    }
    match a.replay_marker.as_deref() {
        None => {}
        Some("none") => t.profile.replay_marker = None,
        Some(m) => {
            let (n, v) = header(m)?;
            let v = v.to_str().map_err(|_| "invalid replay marker".to_owned())?;
            t.profile.replay_marker = Some((n.as_str().to_owned(), v.to_owned()));
        }
    }
    t.strict = a.strict;
    t.timeout = seconds("timeout", a.timeout)?;
    if a.max_response_bytes == 0 {
        return Err("--max-response-bytes must be positive".into());
    }
    t.max_response_bytes = a.max_response_bytes;
    if !(2..=1024).contains(&a.concurrency) {
        return Err("--concurrency must be between 2 and 1024".into());
    }
    t.concurrency = a.concurrency;
    if !(1..=1000).contains(&a.rounds) {
        return Err("--rounds must be between 1 and 1000".into());
    }
    t.rounds = a.rounds;
    if let Some(c) = &a.count_url {
        t.count_url = Some(
            t.url
                .join(c)
                .map_err(|e| format!("--count-url {c:?}: {e}"))?,
        );
    }
    if let Some(p) = &a.id_pointer {
        if !p.starts_with('/') {
            return Err(format!(
                "--id-pointer {p:?} is not a JSON pointer (it starts with /)"
            ));
        }
        t.id_pointer = Some(p.clone());
    }
    if let Some(v) = a.ttl {
        let d = seconds("ttl", v)?;
        t.response_ttl = Some(d);
        t.key_ttl = Some(d);
    }
    if let Some(v) = a.response_ttl {
        t.response_ttl = Some(seconds("response-ttl", v)?);
    }
    if let Some(v) = a.key_ttl {
        t.key_ttl = Some(seconds("key-ttl", v)?);
    }
    if let Some(v) = a.lease {
        t.lease = Some(seconds("lease", v)?);
    }
    for (name, src, dst) in [
        ("decline-body", &a.decline_body, &mut t.decline_body),
        ("fail-body", &a.fail_body, &mut t.fail_body),
        ("crash-body", &a.crash_body, &mut t.crash_body),
        ("mismatch-body", &a.mismatch_body, &mut t.mismatch_body),
    ] {
        if let Some(s) = src {
            *dst = Some(body(name, s)?);
        }
    }
    Ok(())
}

/// The cases with their requirement's level under each profile.
fn list() {
    use idem_spec::Profile as P;
    outln!(
        "{:<16} {:<14} {:<7} {:<7} {:<7} WHAT IT SENDS AND CHECKS",
        "ID",
        "REQUIREMENT",
        "IETF",
        "IDEM",
        "STRIPE"
    );
    for c in crate::cases::all() {
        outln!(
            "{:<16} {:<14} {:<7} {:<7} {:<7} {}",
            c.id,
            c.requirement,
            c.level(P::Ietf).as_str(),
            c.level(P::Idem).as_str(),
            c.level(P::Stripe).as_str(),
            c.title
        );
    }
}

/// The URL of the server under test: `http` or `https`, its host name in the ASCII form DNS
/// knows (a name with other letters is mapped by UTS 46, as a browser maps it).
fn target_url(text: &str) -> Result<Url, Failure> {
    let url = Url::parse(text).map_err(|e| format!("invalid URL {text:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Failure::Usage(format!(
            "{url}: only http:// and https:// URLs are supported"
        )));
    }
    Ok(url)
}

pub(super) async fn run(a: RunArgs) -> Result<u8, Failure> {
    let s = &a.suite;
    let cases = suite::select(&s.cases)?;
    if s.list {
        list();
        return Ok(0);
    }
    // The embedded servers live until the end of this function.
    let mut embedded = None;
    let lanes = match &a.url {
        Some(url) => {
            if a.fault.is_some() || a.delay_ms.is_some() || a.tls || a.uuid_keys {
                return Err(
                    "--fault, --delay-ms, --tls and --uuid-keys apply to the embedded server only (give no URL)"
                        .into(),
                );
            }
            let mut target = Target::new(target_url(url)?);
            configure(&mut target, s, true)?;
            // Against a URL every case runs one after the other: the count oracle is shared.
            vec![suite::Lane { target, cases }]
        }
        None => {
            let mut settings = ServerConfig::fast();
            settings.fault = a.fault;
            settings.uuid_keys = a.uuid_keys;
            if a.tls {
                settings.tls = Some(crate::tls::Identity::generate().map_err(harness)?);
            }
            if let Some(ms) = a.delay_ms {
                settings.delay = Duration::from_millis(ms);
            }
            // Every family against the endpoint of its kind; --key-kind keeps one.
            let cases: Vec<_> = cases
                .into_iter()
                .filter(|c| s.key_kind.is_none_or(|k| embedded::kind_of(c) == k))
                .collect();
            if cases.is_empty() {
                return Err("no selected case takes keys of that --key-kind".into());
            }
            let started = Embedded::start(&settings, &cases)
                .await
                .map_err(start_error)?;
            let lanes = embedded.insert(started);
            for lane in &mut lanes.lanes {
                configure(&mut lane.target, s, false)?;
            }
            std::mem::take(&mut lanes.lanes)
        }
    };
    let target = lanes[0].target.clone();
    let total: usize = lanes.iter().map(|l| l.cases.len()).sum();
    let fault = embedded.is_some().then_some(a.fault);
    let color = Color::detect(std::io::stdout().is_terminal());
    let err_color = Color::detect(std::io::stderr().is_terminal());
    let quiet = s.quiet;
    let mut progress = move |p: suite::Progress<'_>| {
        if quiet {
            return;
        }
        if let suite::Progress::Finished { .. } | suite::Progress::Waiting { .. } = p {
            eprintln!("{}", report::progress_line(&p, err_color));
        }
    };
    if !quiet {
        eprintln!(
            "running {total} case(s) against {}{}",
            target.url,
            if embedded.is_some() {
                " (embedded reference servers: one per key kind and per case that waits)"
            } else {
                ""
            }
        );
    }
    let report = suite::run_lanes(lanes, fault, &mut progress)
        .await
        .map_err(|e| match e {
            crate::http::HarnessError::Usage(m) => Failure::Usage(m),
            e => harness(e),
        })?;
    drop(embedded);
    out(&report::terminal(&report, color));
    write_reports(s, &report)?;
    Ok(report.exit_code)
}

/// Writes the JSON, JUnit and HTML reports the options ask for.
fn write_reports(a: &SuiteArgs, report: &suite::Report) -> Result<(), Failure> {
    if let Some(path) = &a.json {
        std::fs::write(path, report::json(report))
            .map_err(|e| harness(format!("--json {}: {e}", path.display())))?;
    }
    if let Some(path) = &a.junit {
        let xml = report::junit(report).map_err(|e| harness(format!("JUnit report: {e}")))?;
        std::fs::write(path, xml)
            .map_err(|e| harness(format!("--junit {}: {e}", path.display())))?;
    }
    if let Some(dir) = &a.html {
        crate::html::write(report, dir).map_err(|e| harness(format!("--html {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{target_url, Failure};

    #[test]
    fn a_target_is_an_http_or_https_url_with_its_host_in_ascii() {
        let url = target_url("http://Bücher.example:8080/orders").expect("a non-ASCII host");
        assert_eq!(url.host_str(), Some("xn--bcher-kva.example"));
        assert_eq!(url.port(), Some(8080));
        assert!(target_url("https://127.0.0.1/orders").is_ok());
        for bad in [
            "ftp://example.com/orders",
            "http://exa mple/orders",
            "/orders",
        ] {
            assert!(
                matches!(target_url(bad), Err(Failure::Usage(_))),
                "{bad} is a usage error"
            );
        }
    }
}
