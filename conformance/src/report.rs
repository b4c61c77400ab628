//! Reports: the terminal report, JSON and JUnit XML.

use crate::cases::SECTIONS;
use crate::http::Exchange;
use crate::suite::{
    CaseResult, Confidence, Progress, Report, Verdict, EXIT_FAIL, EXIT_HARNESS, EXIT_UNSAFE,
    EXIT_USAGE,
};
use quick_xml::events::{BytesDecl, BytesText, Event};
use quick_xml::Writer;
use std::fmt::Write as _;

/// Whether to colour the terminal report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Color {
    /// ANSI colours.
    On,
    /// Plain text.
    Off,
}

impl Color {
    /// Colours when `is_terminal` and `NO_COLOR` is not set.
    pub fn detect(is_terminal: bool) -> Color {
        if is_terminal && std::env::var_os("NO_COLOR").is_none() {
            Color::On
        } else {
            Color::Off
        }
    }

    fn paint(self, v: Verdict, text: &str) -> String {
        if self == Color::Off {
            return text.to_owned();
        }
        let code = match v {
            Verdict::Pass => "32",
            Verdict::NonStrict | Verdict::Skip => "33",
            Verdict::Fail => "31",
            Verdict::Unsafe => "1;31",
            Verdict::Leak => "1;35",
            Verdict::Error => "35",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }
}

/// One progress line (without newline) for a progress event.
pub fn progress_line(p: &Progress<'_>, color: Color) -> String {
    match p {
        Progress::Started { index, total, case } => {
            format!(
                "[{index:>2}/{total}] {:<16} {} …",
                case.id, case.requirement
            )
        }
        Progress::Waiting { case, wait } => format!(
            "        {:<16} waiting for {} ({:.0} s left at most)",
            case.id,
            wait.what,
            wait.left.as_secs_f64().ceil()
        ),
        Progress::Finished {
            index,
            total,
            result,
        } => format!(
            "[{index:>2}/{total}] {:<16} {:<14} {:>10} ({:.0} ms)",
            result.id,
            result.requirement,
            color.paint(result.verdict, &result.verdict.name().to_uppercase()),
            result.duration_ms
        ),
    }
}

/// What each exit code means.
pub fn exit_meaning(code: u8) -> &'static str {
    match code {
        0 => "all required cases passed",
        EXIT_FAIL => "a case failed",
        EXIT_UNSAFE => {
            "a safety failure: a request executed more than once (UNSAFE), or a principal's record disclosed to another (LEAK)"
        }
        EXIT_USAGE => "usage error: a bad option or value",
        EXIT_HARNESS => {
            "the harness could not judge some cases (unreachable, TLS, timeouts, unusable answers)"
        }
        _ => "unknown",
    }
}

fn exchange_text(out: &mut String, e: &Exchange) {
    let _ = writeln!(
        out,
        "      ── {} (sent at {:.1} ms, answered in {:.1} ms)",
        e.label, e.at_ms, e.elapsed_ms
    );
    let _ = writeln!(out, "      > {} {}", e.request.method, e.request.url);
    for (n, v) in &e.request.headers {
        let _ = writeln!(out, "      > {n}: {v}");
    }
    if !e.request.body.is_empty() {
        let _ = writeln!(out, "      > {}", one_line(&e.request.body, 300));
    }
    match (&e.response, &e.error) {
        (Some(r), _) => {
            let _ = writeln!(out, "      < {}", r.status);
            for (n, v) in &r.headers {
                let _ = writeln!(out, "      < {n}: {v}");
            }
            if !r.body.is_empty() {
                let _ = writeln!(out, "      < {}", one_line(&r.body, 300));
            }
        }
        (None, Some(err)) => {
            let _ = writeln!(out, "      ! {err}");
        }
        (None, None) => {}
    }
}

fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > max {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    } else {
        flat
    }
}

/// How many exchanges a failure shows in the terminal (the last ones; JSON has them all).
const SHOWN_EXCHANGES: usize = 6;

/// The readable report: cases grouped by section, details for every case that did not
/// pass, a summary line and what the exit code means.
pub fn terminal(report: &Report, color: Color) -> String {
    let mut out = String::new();
    let target = if report.embedded {
        match report.fault {
            Some(f) => format!("{} (embedded reference server, fault {f})", report.target),
            None => format!("{} (embedded reference server)", report.target),
        }
    } else {
        report.target.clone()
    };
    let _ = writeln!(
        out,
        "\nidem-conformance {} against {target}",
        report.version
    );
    let _ = writeln!(
        out,
        "profile {} (levels of {}, codes {}/{}/{}){}",
        report.profile.name,
        report.profile.levels.name(),
        report.profile.bad_key,
        report.profile.conflict,
        report.profile.mismatch,
        if report.strict {
            ", strict: SHOULD misses fail"
        } else {
            ""
        }
    );
    if let Some(tls) = report.tls {
        let _ = writeln!(out, "TLS: {tls}");
    }
    for section in SECTIONS {
        let cases: Vec<&CaseResult> = report
            .cases
            .iter()
            .filter(|c| c.section == section.name)
            .collect();
        if cases.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{}", section.title);
        for c in cases {
            let verdict = color.paint(
                c.verdict,
                &format!("{:<10}", c.verdict.name().to_uppercase()),
            );
            let _ = writeln!(
                out,
                "  {verdict} {:<16} {:<6} {:<14} {}",
                c.id,
                c.level.as_str(),
                c.requirement,
                c.title
            );
            case_details(&mut out, c);
        }
    }
    let s = &report.summary;
    let _ = writeln!(
        out,
        "\n{} cases: {} passed, {} non-strict, {} failed, {} unsafe, {} leaked, {} skipped, {} errors ({:.1} s)",
        report.cases.len(),
        s.pass,
        s.non_strict,
        s.fail,
        s.unsafe_,
        s.leak,
        s.skip,
        s.error,
        report.duration_ms / 1000.0
    );
    let _ = writeln!(out, "exit code {}: {}", report.exit_code, outcome(report));
    out
}

/// What the exit code of `report` means, naming the safety failures it saw.
pub fn outcome(report: &Report) -> String {
    if report.exit_code != EXIT_UNSAFE {
        return exit_meaning(report.exit_code).to_owned();
    }
    let mut seen = Vec::new();
    if report.summary.unsafe_ > 0 {
        seen.push("UNSAFE: a request was executed more than once");
    }
    if report.summary.leak > 0 {
        seen.push("LEAK: a principal's record was disclosed to another");
    }
    seen.join("; ")
}

fn case_details(out: &mut String, c: &CaseResult) {
    match c.verdict {
        Verdict::Pass => {
            if let (Some(conf), Some(why)) = (&c.confidence, &c.reason) {
                let _ = writeln!(
                    out,
                    "             confidence {}: {why}",
                    confidence_name(*conf)
                );
            }
            missed_lines(out, c, "             ");
            for n in &c.notes {
                let _ = writeln!(out, "             {n}");
            }
        }
        Verdict::Skip => {
            if let Some(why) = &c.reason {
                let _ = writeln!(out, "             {why}");
            }
        }
        Verdict::Fail | Verdict::Unsafe | Verdict::Leak | Verdict::NonStrict | Verdict::Error => {
            let _ = writeln!(
                out,
                "      requirement {} ({}): {}",
                c.requirement,
                c.level.as_str(),
                c.requirement_text
            );
            if let (Verdict::Unsafe | Verdict::Leak, Some(conf), Some(why)) =
                (c.verdict, &c.confidence, &c.reason)
            {
                let _ = writeln!(
                    out,
                    "      {} under every profile, confidence {}: {why}",
                    c.verdict.name().to_uppercase(),
                    confidence_name(*conf)
                );
            }
            if let Some(m) = c.missed.iter().find(|m| {
                m.requirement != c.requirement && c.observed.as_deref() == Some(&m.observed)
            }) {
                let text = idem_spec::get(&m.requirement).map_or("", |r| r.text.as_str());
                let _ = writeln!(
                    out,
                    "      missed {} ({}): {text}",
                    m.requirement,
                    m.level.as_str()
                );
            }
            if let Some(e) = &c.expected {
                let _ = writeln!(out, "      expected: {e}");
            }
            if let Some(o) = &c.observed {
                let _ = writeln!(out, "      observed: {o}");
            }
            missed_lines(out, c, "      ");
            if let Some(r) = c.reason.as_ref().filter(|_| c.confidence.is_none()) {
                let _ = writeln!(out, "      harness:  {r}");
            }
            for n in &c.notes {
                let _ = writeln!(out, "      note: {n}");
            }
            let skip = c.exchanges.len().saturating_sub(SHOWN_EXCHANGES);
            if skip > 0 {
                let _ = writeln!(out, "      ({skip} earlier exchanges in the JSON report)");
            }
            for e in &c.exchanges[skip..] {
                exchange_text(out, e);
            }
        }
    }
}

/// `high`, `medium` or `low`.
fn confidence_name(c: Confidence) -> &'static str {
    match c {
        Confidence::High => "high",
        Confidence::Medium => "medium",
        Confidence::Low => "low",
    }
}

/// The misses of a case that did not decide its verdict, with what each means under the
/// profile (the deciding one is shown as expected/observed).
fn missed_lines(out: &mut String, c: &CaseResult, indent: &str) {
    for m in &c.missed {
        if c.observed.as_deref() == Some(m.observed.as_str()) || m.verdict == Verdict::Pass {
            continue;
        }
        let _ = writeln!(
            out,
            "{indent}also missed {} ({}, {}): {}",
            m.requirement,
            m.level.as_str(),
            m.verdict.name(),
            m.observed
        );
    }
}

/// The report as pretty JSON.
pub fn json(report: &Report) -> String {
    serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// The report as JUnit XML: one `<testsuite>` per section, `<failure>` when the server is
/// wrong (fail, unsafe, leak, and non-strict under `--strict`), `<error>` when the harness could
/// not tell, `<skipped>` for skips.
pub fn junit(report: &Report) -> std::io::Result<String> {
    junit_runs(&[(None, report)], &[])
}

/// Several runs as one JUnit XML document: each run's sections as `<testsuite>`s named
/// `idem-conformance.PREFIX.SECTION` (for the operations of an OpenAPI document), and a
/// `<testsuite>` with one `<skipped>` case for each run that could not be made, with why.
pub fn junit_runs(
    runs: &[(Option<&str>, &Report)],
    skipped_runs: &[(&str, &str)],
) -> std::io::Result<String> {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
    let count = |cases: &[&CaseResult], f: &dyn Fn(Verdict) -> bool| {
        cases.iter().filter(|c| f(c.verdict)).count()
    };
    let failed = |v: Verdict| matches!(v, Verdict::Fail | Verdict::Unsafe | Verdict::Leak);
    let all: Vec<&CaseResult> = runs.iter().flat_map(|(_, r)| r.cases.iter()).collect();
    let failures = count(&all, &failed).to_string();
    let errors = count(&all, &|v| v == Verdict::Error).to_string();
    let skipped = (count(&all, &|v| v == Verdict::Skip) + skipped_runs.len()).to_string();
    let total = (all.len() + skipped_runs.len()).to_string();
    let time = format!(
        "{:.3}",
        runs.iter().map(|(_, r)| r.duration_ms).sum::<f64>() / 1000.0
    );
    w.create_element("testsuites")
        .with_attributes([
            ("name", "idem-conformance"),
            ("tests", total.as_str()),
            ("failures", failures.as_str()),
            ("errors", errors.as_str()),
            ("skipped", skipped.as_str()),
            ("time", time.as_str()),
        ])
        .write_inner_content(|w| {
            for (prefix, report) in runs {
                let scope = prefix.map_or_else(String::new, |p| format!("{p}."));
                for section in SECTIONS {
                    let cases: Vec<&CaseResult> = report
                        .cases
                        .iter()
                        .filter(|c| c.section == section.name)
                        .collect();
                    if cases.is_empty() {
                        continue;
                    }
                    let tests = cases.len().to_string();
                    let failures = count(&cases, &failed).to_string();
                    let errors = count(&cases, &|v| v == Verdict::Error).to_string();
                    let skipped = count(&cases, &|v| v == Verdict::Skip).to_string();
                    let time = format!(
                        "{:.3}",
                        cases.iter().map(|c| c.duration_ms).sum::<f64>() / 1000.0
                    );
                    let name = format!("idem-conformance.{scope}{}", section.name);
                    w.create_element("testsuite")
                        .with_attributes([
                            ("name", name.as_str()),
                            ("tests", tests.as_str()),
                            ("failures", failures.as_str()),
                            ("errors", errors.as_str()),
                            ("skipped", skipped.as_str()),
                            ("time", time.as_str()),
                        ])
                        .write_inner_content(|w| {
                            for c in &cases {
                                testcase(w, c, &scope)?;
                            }
                            Ok(())
                        })?;
                }
            }
            for (id, why) in skipped_runs {
                let name = format!("idem-conformance.{id}");
                w.create_element("testsuite")
                    .with_attributes([
                        ("name", name.as_str()),
                        ("tests", "1"),
                        ("failures", "0"),
                        ("errors", "0"),
                        ("skipped", "1"),
                        ("time", "0.000"),
                    ])
                    .write_inner_content(|w| {
                        w.create_element("testcase")
                            .with_attributes([("name", *id), ("classname", name.as_str())])
                            .write_inner_content(|w| {
                                w.create_element("skipped")
                                    .with_attribute(("message", *why))
                                    .write_empty()?;
                                Ok(())
                            })?;
                        Ok(())
                    })?;
            }
            Ok(())
        })?;
    String::from_utf8(w.into_inner()).map_err(std::io::Error::other)
}

fn testcase(w: &mut Writer<Vec<u8>>, c: &CaseResult, scope: &str) -> std::io::Result<()> {
    let name = format!("{} {}", c.id, c.title);
    let classname = format!("idem-conformance.{scope}{}", c.section);
    let time = format!("{:.3}", c.duration_ms / 1000.0);
    let element = w.create_element("testcase").with_attributes([
        ("name", name.as_str()),
        ("classname", classname.as_str()),
        ("time", time.as_str()),
    ]);
    let mut details = format!(
        "requirement {} ({}): {}\n",
        c.requirement,
        c.level.as_str(),
        c.requirement_text
    );
    if let Some(e) = &c.expected {
        let _ = writeln!(details, "expected: {e}");
    }
    if let Some(o) = &c.observed {
        let _ = writeln!(details, "observed: {o}");
    }
    if let Some(r) = &c.reason {
        let _ = writeln!(details, "{r}");
    }
    missed_lines(&mut details, c, "");
    for n in &c.notes {
        let _ = writeln!(details, "note: {n}");
    }
    for e in &c.exchanges {
        exchange_text(&mut details, e);
    }
    let message = c
        .observed
        .clone()
        .or_else(|| c.reason.clone())
        .unwrap_or_default();
    match c.verdict {
        Verdict::Pass => {
            element.write_empty()?;
        }
        Verdict::NonStrict => {
            element.write_inner_content(|w| {
                w.create_element("system-out")
                    .write_text_content(BytesText::new(&format!(
                        "non-strict: a SHOULD was missed (a failure only with --strict)\n{details}"
                    )))?;
                Ok(())
            })?;
        }
        Verdict::Skip => {
            element.write_inner_content(|w| {
                w.create_element("skipped")
                    .with_attribute(("message", message.as_str()))
                    .write_empty()?;
                Ok(())
            })?;
        }
        Verdict::Fail | Verdict::Unsafe | Verdict::Leak | Verdict::Error => {
            let (tag, kind) = match c.verdict {
                Verdict::Error => ("error", "error"),
                Verdict::Unsafe => ("failure", "unsafe"),
                Verdict::Leak => ("failure", "leak"),
                _ => ("failure", "fail"),
            };
            element.write_inner_content(|w| {
                w.create_element(tag)
                    .with_attributes([("message", message.as_str()), ("type", kind)])
                    .write_text_content(BytesText::new(&details))?;
                Ok(())
            })?;
        }
    }
    Ok(())
}
