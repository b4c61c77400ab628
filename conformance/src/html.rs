//! The HTML report (`run --html DIR`): a static site with no external asset, an index of
//! the verdicts by section and one page per case with its requirement, what was expected
//! and observed, every HTTP exchange, and SVG timelines: one per round of raced duplicates
//! (a lane per connection) and one of the waits for the server's clock.
//!
//! The pages are minijinja templates (`conformance/templates/`) rendered from the report's
//! own serde form, HTML-escaped by the engine; this module only lays out the timelines.

use crate::cases::SECTIONS;
use crate::http::Exchange;
use crate::report::outcome;
use crate::suite::{CaseResult, Report};
use minijinja::value::Serde;
use minijinja::{context, Environment, Value};
use serde::Serialize;
use std::path::Path;

/// The file name of case `id`'s page (`concurrent/1` → `concurrent-1.html`).
pub fn case_file(id: &str) -> String {
    let stem: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("{stem}.html")
}

/// Writes the report into `dir` (created if missing): `index.html` and one page per case.
/// Files of other names in `dir` are left alone.
pub fn write(report: &Report, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, text) in render(report)? {
        let path = dir.join(&name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Writes the report of an OpenAPI run into `dir`: `index.html`, a table of the
/// operations, and each operation's report (its index and case pages) in a folder of its
/// own.
pub fn write_operations(c: &crate::openapi::Combined, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let env = environment()?;
    let rows: Vec<_> = c
        .operations
        .iter()
        .map(|o| {
            let folder = o.report.as_ref().map(|_| operation_dir(&o.operation.id));
            context! {
                operation => Value::from(Serde(&o.operation)),
                report => o.report.as_ref().map(|r| Value::from(Serde(r))),
                verdict => o.verdict(),
                folder => folder,
            }
        })
        .collect();
    let index = env
        .get_template("operations.html")
        .and_then(|t| {
            t.render(context! {
                report => Value::from(Serde(c)),
                rows => rows,
                worst => match c.exit_code {
                    0 => "pass",
                    crate::suite::EXIT_UNSAFE => "unsafe",
                    crate::suite::EXIT_FAIL => "fail",
                    _ => "error",
                },
                exit_meaning => crate::report::exit_meaning(c.exit_code),
            })
        })
        .map_err(|e| format!("HTML report: {e:#}"))?;
    let path = dir.join("index.html");
    std::fs::write(&path, index).map_err(|e| format!("{}: {e}", path.display()))?;
    for o in &c.operations {
        if let Some(r) = &o.report {
            write(r, &dir.join(operation_dir(&o.operation.id)))?;
        }
    }
    Ok(())
}

/// The folder of an operation's pages (`createOrder`, `POST /orders` → `POST--orders`).
pub fn operation_dir(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The pages of the report as `(file name, HTML)`: the index first, then each case's page.
pub fn render(report: &Report) -> Result<Vec<(String, String)>, String> {
    let env = environment()?;
    let fail = |e: minijinja::Error| format!("HTML report: {e:#}");
    let mut pages = Vec::with_capacity(report.cases.len() + 1);
    let index = env
        .get_template("index.html")
        .and_then(|t| {
            t.render(context! {
                report => Value::from(Serde(report)),
                sections => Value::from(Serde(sections(report))),
                worst => worst(report),
                exit_meaning => outcome(report),
            })
        })
        .map_err(fail)?;
    pages.push(("index.html".to_owned(), index));
    let page = env.get_template("case.html").map_err(fail)?;
    for (i, case) in report.cases.iter().enumerate() {
        let neighbour = |j: Option<usize>| {
            j.and_then(|j| report.cases.get(j))
                .map(|c| case_file(&c.id))
        };
        let html = page
            .render(context! {
                report => Value::from(Serde(report)),
                case => Value::from(Serde(case)),
                prev => neighbour(i.checked_sub(1)),
                next => neighbour(Some(i + 1)),
                rounds => Value::from(Serde(rounds(report, case))),
                waits => Value::from(Serde(waits(report, case))),
            })
            .map_err(fail)?;
        pages.push((case_file(&case.id), html));
    }
    Ok(pages)
}

fn environment() -> Result<Environment<'static>, String> {
    let mut env = Environment::new();
    // Escaping follows the template's extension: HTML-escaped for .html, none for .css.
    for (name, source) in [
        ("style.css", include_str!("../templates/style.css")),
        ("base.html", include_str!("../templates/base.html")),
        ("timeline.html", include_str!("../templates/timeline.html")),
        ("index.html", include_str!("../templates/index.html")),
        ("case.html", include_str!("../templates/case.html")),
        (
            "operations.html",
            include_str!("../templates/operations.html"),
        ),
    ] {
        env.add_template(name, source)
            .map_err(|e| format!("HTML template {name}: {e:#}"))?;
    }
    Ok(env)
}

/// The verdict that names the whole run, from its exit code and, for a safety failure, the
/// worst verdict it saw.
fn worst(report: &Report) -> &'static str {
    match report.exit_code {
        0 => "pass",
        crate::suite::EXIT_UNSAFE if report.summary.leak > 0 => "leak",
        crate::suite::EXIT_UNSAFE => "unsafe",
        crate::suite::EXIT_FAIL => "fail",
        _ => "error",
    }
}

#[derive(Serialize)]
struct SectionView<'a> {
    name: &'static str,
    title: &'static str,
    cases: Vec<CaseLink<'a>>,
}

#[derive(Serialize)]
struct CaseLink<'a> {
    case: &'a CaseResult,
    file: String,
}

/// The cases run, by section in suite order.
fn sections(report: &Report) -> Vec<SectionView<'_>> {
    SECTIONS
        .iter()
        .map(|s| SectionView {
            name: s.name,
            title: s.title,
            cases: report
                .cases
                .iter()
                .filter(|c| c.section == s.name)
                .map(|case| CaseLink {
                    case,
                    file: case_file(&case.id),
                })
                .collect(),
        })
        .filter(|s| !s.cases.is_empty())
        .collect()
}

/// Width of a timeline, in SVG units (pixels at 100%).
const WIDTH: f64 = 960.0;
/// Room for the row labels on the left.
const LEFT: f64 = 190.0;
/// Room on the right for the text after the last bar.
const RIGHT: f64 = 120.0;
/// Height of one row.
const ROW: f64 = 16.0;
/// Space between rows.
const GAP: f64 = 3.0;
/// Characters of a row label.
const LABEL_CHARS: usize = 30;

#[derive(Serialize)]
struct Timeline {
    caption: String,
    width: f64,
    height: f64,
    left: f64,
    plot: f64,
    row_height: f64,
    axis_y: f64,
    rows: Vec<Row>,
    ticks: Vec<Tick>,
}

#[derive(Serialize)]
struct Row {
    y: f64,
    label: String,
    bars: Vec<Bar>,
}

#[derive(Serialize)]
struct Bar {
    class: &'static str,
    x: f64,
    width: f64,
    text: String,
    text_x: f64,
    tip: String,
}

#[derive(Serialize)]
struct Tick {
    x: f64,
    label: String,
}

/// A bar before layout: from `start` to `end` (ms from the start of the case).
struct Span {
    start: f64,
    end: f64,
    class: &'static str,
    text: String,
    tip: String,
}

fn short(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(chars.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

/// Lays out `rows` (a label and its spans) on one time axis from the earliest start to the
/// latest end.
fn layout(caption: String, rows: Vec<(String, Vec<Span>)>) -> Timeline {
    let spans = || rows.iter().flat_map(|(_, s)| s.iter());
    let t0 = spans().map(|s| s.start).fold(f64::INFINITY, f64::min);
    let t1 = spans().map(|s| s.end).fold(f64::NEG_INFINITY, f64::max);
    let (t0, t1) = if t0.is_finite() && t1.is_finite() {
        (t0, t1)
    } else {
        (0.0, 0.0)
    };
    let span = (t1 - t0).max(0.001);
    let plot = WIDTH - LEFT - RIGHT;
    let x = |t: f64| LEFT + (t - t0) / span * plot;
    let mut out = Vec::with_capacity(rows.len());
    for (i, (label, spans)) in rows.into_iter().enumerate() {
        let y = 4.0 + i as f64 * (ROW + GAP);
        let bars = spans
            .into_iter()
            .map(|s| {
                let x0 = x(s.start);
                let width = (x(s.end) - x0).max(2.0);
                // Text inside a bar that spans most of the plot, after it otherwise.
                let text_x = if width > plot / 2.0 {
                    x0 + 4.0
                } else {
                    x0 + width + 4.0
                };
                Bar {
                    class: s.class,
                    x: round2(x0),
                    width: round2(width),
                    text: s.text,
                    text_x: round2(text_x),
                    tip: s.tip,
                }
            })
            .collect();
        out.push(Row {
            y,
            label: short(&label, LABEL_CHARS),
            bars,
        });
    }
    let axis_y = 4.0 + out.len() as f64 * (ROW + GAP) + 2.0;
    let ticks = (0..=4)
        .map(|i| {
            let t = span * f64::from(i) / 4.0;
            Tick {
                x: round2(x(t0 + t)),
                label: duration_label(t, span),
            }
        })
        .collect();
    Timeline {
        caption,
        width: WIDTH,
        height: axis_y + 22.0,
        left: LEFT,
        plot,
        row_height: ROW,
        axis_y,
        rows: out,
        ticks,
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// A tick's label: milliseconds with the precision the whole span calls for.
fn duration_label(t: f64, span: f64) -> String {
    if span >= 10_000.0 {
        format!("{:.1} s", t / 1000.0)
    } else if span >= 10.0 {
        format!("{t:.0} ms")
    } else {
        format!("{t:.2} ms")
    }
}

/// How an exchange is drawn: its class and short text, from its answer.
fn look(report: &Report, e: &Exchange) -> (&'static str, String) {
    let Some(r) = &e.response else {
        return ("err", "no answer".to_owned());
    };
    let marker = report.profile.replay_marker.as_ref();
    let replayed = marker.is_some_and(|(name, value)| {
        r.headers
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case(name) && v.trim().eq_ignore_ascii_case(value))
    });
    if (200..300).contains(&r.status) {
        if replayed {
            ("replayed", format!("{} replayed", r.status))
        } else {
            ("ok", r.status.to_string())
        }
    } else if r.status == report.profile.conflict {
        ("conflict", format!("{} in progress", r.status))
    } else {
        ("other", r.status.to_string())
    }
}

fn exchange_span(report: &Report, e: &Exchange, who: &str) -> Span {
    let (class, text) = look(report, e);
    let answer = match (&e.response, &e.error) {
        (Some(r), _) => format!("answered {}", r.status),
        (None, Some(err)) => err.clone(),
        (None, None) => "no answer".to_owned(),
    };
    Span {
        start: e.at_ms,
        end: e.at_ms + e.elapsed_ms,
        class,
        text,
        tip: format!(
            "{who}: sent at {:.2} ms, {answer} after {:.2} ms",
            e.at_ms, e.elapsed_ms
        ),
    }
}

#[derive(Serialize)]
struct RoundView {
    title: String,
    timeline: Timeline,
}

/// One timeline per round of raced duplicates, a lane per connection, with what the count
/// oracle attributes to the round.
fn rounds(report: &Report, case: &CaseResult) -> Vec<RoundView> {
    let mut numbers: Vec<usize> = case
        .exchanges
        .iter()
        .filter_map(|e| e.raced.map(|r| r.round))
        .collect();
    numbers.dedup();
    numbers
        .into_iter()
        .map(|round| {
            let mut lanes: Vec<(usize, &Exchange)> = case
                .exchanges
                .iter()
                .filter_map(|e| {
                    e.raced
                        .filter(|r| r.round == round)
                        .map(|r| (r.connection, e))
                })
                .collect();
            lanes.sort_by_key(|(c, _)| *c);
            let executed = case.rounds.iter().find(|r| r.round == round);
            let title = match executed {
                Some(r) => format!(
                    "Round {round}: the count oracle saw {} execution{}",
                    r.executions,
                    if r.executions == 1 { "" } else { "s" }
                ),
                None => format!("Round {round}: no execution count (no count oracle)"),
            };
            let rows = lanes
                .into_iter()
                .map(|(c, e)| {
                    let who = format!("connection {c}");
                    let span = exchange_span(report, e, &who);
                    (who, vec![span])
                })
                .collect();
            RoundView {
                timeline: layout(title.clone(), rows),
                title,
            }
        })
        .collect()
}

/// The timeline of a case that waited: its waits, then every request it sent, one row each.
fn waits(report: &Report, case: &CaseResult) -> Option<Timeline> {
    if case.waits.is_empty() {
        return None;
    }
    let mut rows: Vec<(String, Vec<Span>)> = case
        .waits
        .iter()
        .map(|w| {
            (
                format!("wait: {}", w.what),
                vec![Span {
                    start: w.at_ms,
                    end: w.at_ms + w.duration_ms,
                    class: "wait",
                    text: short(&format!("{:.0} ms: {}", w.duration_ms, w.what), 80),
                    tip: format!(
                        "waited {:.0} ms from {:.0} ms for {}",
                        w.duration_ms, w.at_ms, w.what
                    ),
                }],
            )
        })
        .collect();
    rows.extend(
        case.exchanges
            .iter()
            .map(|e| (e.label.clone(), vec![exchange_span(report, e, &e.label)])),
    );
    Some(layout(
        format!(
            "{}: waits and requests over {:.0} ms",
            case.id, case.duration_ms
        ),
        rows,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_files_are_plain_names() {
        assert_eq!(case_file("concurrent/1"), "concurrent-1.html");
        assert_eq!(case_file("lost-response/2"), "lost-response-2.html");
    }

    #[test]
    fn a_timeline_spans_the_plot_and_keeps_order() {
        let span = |start: f64, end: f64| Span {
            start,
            end,
            class: "ok",
            text: String::new(),
            tip: String::new(),
        };
        let t = layout(
            "t".into(),
            vec![
                ("a".into(), vec![span(10.0, 20.0)]),
                ("b".into(), vec![span(15.0, 30.0)]),
            ],
        );
        let (a, b) = (&t.rows[0].bars[0], &t.rows[1].bars[0]);
        assert_eq!(a.x, LEFT);
        assert!((b.x + b.width - (LEFT + t.plot)).abs() < 0.01);
        assert!(a.x < b.x && t.rows[0].y < t.rows[1].y);
        assert_eq!(t.ticks.first().map(|k| k.label.as_str()), Some("0 ms"));
        assert_eq!(t.ticks.last().map(|k| k.label.as_str()), Some("20 ms"));
    }
}
