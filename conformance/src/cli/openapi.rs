//! `openapi SPEC`: the suite against every operation of an OpenAPI document that takes an
//! idempotency key, one after the other, with one combined report.

use super::run::{body, configure, SuiteArgs};
use super::{harness, out, Failure};
use crate::openapi::{option_base, Combined, Document, OperationReport, Selection};
use crate::report::{self, Color};
use crate::suite::{self, Target};
use bytes::Bytes;
use clap::Args;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;
use url::Url;

/// Options of `openapi`.
#[derive(Debug, Args)]
pub(super) struct OpenapiArgs {
    /// The OpenAPI 3.0 or 3.1 document, YAML or JSON.
    spec: PathBuf,
    /// The server to send the requests to, instead of the document's `servers`.
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// Test only this operation, by operationId or as "METHOD /path" (repeatable); by
    /// default every operation that declares the key header.
    #[arg(long = "operation", value_name = "OPERATION")]
    operations: Vec<String>,
    /// The body of a request that succeeds for OPERATION, inline or @FILE (repeatable);
    /// by default the example of the operation's request body.
    #[arg(long = "body-for", value_name = "OPERATION=BODY")]
    bodies: Vec<String>,
    #[command(flatten)]
    suite: SuiteArgs,
}

pub(super) async fn openapi(a: OpenapiArgs) -> Result<u8, Failure> {
    let started = Instant::now();
    let s = &a.suite;
    let cases = suite::select(&s.cases)?;
    let doc = Document::read(&a.spec)?;
    let base_url = match &a.base_url {
        Some(u) => {
            let url = Url::parse(u).map_err(|e| format!("--base-url {u:?}: {e}"))?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(
                    format!("--base-url {url}: only http:// and https:// are supported").into(),
                );
            }
            Some(url)
        }
        None => None,
    };
    let mut bodies = BTreeMap::new();
    for b in &a.bodies {
        let (op, text) = b
            .split_once('=')
            .ok_or_else(|| format!("--body-for {b:?} is not OPERATION=BODY"))?;
        bodies.insert(op.to_owned(), body("body-for", text)?);
    }
    let key_header = s.key_header.clone();
    let operations = doc.operations(&Selection {
        key_header: &key_header,
        operations: &a.operations,
        base_url: base_url.as_ref(),
        bodies: &bodies,
    })?;
    // The run's options, on a placeholder URL: each operation puts its own in.
    let mut base = Target::new(option_base());
    configure(&mut base, s, true)?;
    base.body = Bytes::new();
    let quiet = s.quiet;
    let err_color = Color::detect(std::io::stderr().is_terminal());
    let color = Color::detect(std::io::stdout().is_terminal());
    let mut results = Vec::with_capacity(operations.len());
    for op in operations {
        let mut op = op;
        let target = match op.target(&base) {
            Some(t) => t,
            None => {
                results.push(OperationReport {
                    operation: op,
                    report: None,
                });
                continue;
            }
        };
        // A kind's family needs where its sessions or tokens come from.
        let needs = match op.key_kind {
            suite::KeyKind::Counter if target.session_url.is_none() => Some("--session-url"),
            suite::KeyKind::Token if target.token_url.is_none() => Some("--token-url"),
            _ => None,
        };
        if let Some(option) = needs {
            op.skipped = Some(format!(
                "it takes {} keys: give {option}",
                op.key_kind.section().unwrap_or("other")
            ));
            results.push(OperationReport {
                operation: op,
                report: None,
            });
            continue;
        }
        if !quiet {
            eprintln!(
                "operation {}: {} {} ({} keys)",
                op.id,
                op.method,
                target.url,
                op.key_kind.section().unwrap_or("opaque")
            );
        }
        let mut progress = move |p: suite::Progress<'_>| {
            if !quiet {
                if let suite::Progress::Finished { .. } | suite::Progress::Waiting { .. } = p {
                    eprintln!("{}", report::progress_line(&p, err_color));
                }
            }
        };
        // The generic cases against an operation with opaque keys, its family against one
        // with keys of a kind.
        let lane = suite::Lane {
            target,
            cases: cases
                .iter()
                .copied()
                .filter(|c| crate::embedded::kind_of(c) == op.key_kind)
                .collect(),
        };
        if lane.cases.is_empty() {
            op.skipped = Some("no selected case takes its kind of key (--case)".into());
            results.push(OperationReport {
                operation: op,
                report: None,
            });
            continue;
        }
        let report = suite::run_lanes(vec![lane], None, &mut progress)
            .await
            .map_err(|e| match e {
                crate::http::HarnessError::Usage(m) => Failure::Usage(m),
                e => harness(e),
            })?;
        results.push(OperationReport {
            operation: op,
            report: Some(report),
        });
    }
    let combined = Combined {
        tool: "idem-conformance",
        version: env!("CARGO_PKG_VERSION"),
        document: a.spec.display().to_string(),
        duration_ms: crate::http::ms(started.elapsed()),
        exit_code: Combined::exit_code(&results),
        operations: results,
    };
    for o in &combined.operations {
        if let Some(r) = &o.report {
            out(&format!(
                "\n=== operation {}: {} {}\n",
                o.operation.id, o.operation.method, o.operation.path
            ));
            out(&report::terminal(r, color));
        }
    }
    out(&table(&combined));
    write_reports(s, &combined)?;
    Ok(combined.exit_code)
}

/// The closing table: one row per operation, with its verdict and counts.
pub(crate) fn table(c: &Combined) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\n{} operation(s) of {} ({:.1} s)",
        c.operations.len(),
        c.document,
        c.duration_ms / 1000.0
    );
    let _ = writeln!(
        t,
        "{:<28} {:<7} {:<24} {:<8} {:>4} {:>10} {:>4} {:>6} {:>4} {:>4} {:>5}",
        "OPERATION",
        "METHOD",
        "PATH",
        "VERDICT",
        "PASS",
        "NON-STRICT",
        "FAIL",
        "UNSAFE",
        "LEAK",
        "SKIP",
        "ERROR"
    );
    for o in &c.operations {
        let op = &o.operation;
        match &o.report {
            Some(r) => {
                let s = &r.summary;
                let _ = writeln!(
                    t,
                    "{:<28} {:<7} {:<24} {:<8} {:>4} {:>10} {:>4} {:>6} {:>4} {:>4} {:>5}",
                    op.id,
                    op.method,
                    op.path,
                    o.verdict().to_uppercase(),
                    s.pass,
                    s.non_strict,
                    s.fail,
                    s.unsafe_,
                    s.leak,
                    s.skip,
                    s.error
                );
            }
            None => {
                let _ = writeln!(
                    t,
                    "{:<28} {:<7} {:<24} SKIPPED  {}",
                    op.id,
                    op.method,
                    op.path,
                    op.skipped.as_deref().unwrap_or("")
                );
            }
        }
    }
    let meaning = if c.operations.iter().all(|o| o.report.is_none()) {
        "no operation could be run".to_owned()
    } else {
        report::exit_meaning(c.exit_code).to_owned()
    };
    let _ = writeln!(t, "exit code {}: {meaning}", c.exit_code);
    t
}

/// Writes the JSON, JUnit and HTML reports the options ask for.
fn write_reports(a: &SuiteArgs, c: &Combined) -> Result<(), Failure> {
    if let Some(path) = &a.json {
        let json = serde_json::to_string_pretty(c).map_err(harness)?;
        std::fs::write(path, json)
            .map_err(|e| harness(format!("--json {}: {e}", path.display())))?;
    }
    if let Some(path) = &a.junit {
        let runs: Vec<(Option<&str>, &suite::Report)> = c
            .operations
            .iter()
            .filter_map(|o| {
                o.report
                    .as_ref()
                    .map(|r| (Some(o.operation.id.as_str()), r))
            })
            .collect();
        let skipped: Vec<(&str, &str)> = c
            .operations
            .iter()
            .filter_map(|o| {
                o.operation
                    .skipped
                    .as_deref()
                    .map(|why| (o.operation.id.as_str(), why))
            })
            .collect();
        let xml = report::junit_runs(&runs, &skipped)
            .map_err(|e| harness(format!("JUnit report: {e}")))?;
        std::fs::write(path, xml)
            .map_err(|e| harness(format!("--junit {}: {e}", path.display())))?;
    }
    if let Some(dir) = &a.html {
        crate::html::write_operations(c, dir).map_err(|e| harness(format!("--html {e}")))?;
    }
    Ok(())
}
