//! The status query: a client that does not know what became of a request asks the server
//! about its key (`GET` on the request's URL with its `Idempotency-Key` and
//! `Idempotency-Status: POST`), and may settle a key the server never saw so that a late copy
//! of the request never runs. A wrong answer makes the client run the request twice or never,
//! so a server that offers the query is held to it under every profile. Each case first
//! checks that the target offers it (a 200 of the status media type about a fresh key) and
//! is skipped otherwise.
//!
//! One family in one file, as every family of cases has: the seven cases share the query's
//! helpers below (the requests themselves are in ctx_status.rs), and a reader looks a case up
//! by its ID here.

use super::{
    fail, leak_of, miss, pass_counted, problem_type, require_success, runs, spec, Case, Check, Ctx,
    KeyHeader, Who, POLL,
};
use crate::cases::ctx_status::KeyStatus;
use crate::http::{HarnessError, Prepared, Resp};
use crate::suite::Confidence;
use std::time::{Duration, Instant};

pub(super) const CASES: &[Case] = &[
    Case {
        id: "status/1",
        requirement: "IDEM-STATUS-1",
        title: "after a request completed, a status query about its key answers completed with the stored status, still replayed, and executes nothing",
        run: |ctx| Box::pin(completed(ctx)),
        waits: false,
    },
    Case {
        id: "status/2",
        requirement: "IDEM-STATUS-1",
        title: "while the request runs, status queries about its key answer in-progress with retryAfter and Retry-After (or unknown before its claim), never another status, and execute nothing; when it is answered first, a key whose attempt died (--crash-body, --lease) is asked about within its lease",
        run: |ctx| Box::pin(in_flight(ctx)),
        waits: false,
    },
    Case {
        id: "status/3",
        requirement: "IDEM-STATUS-1",
        title: "after a retryable failure (--fail-body), a status query answers released or held, never completed with another status or unknown",
        run: |ctx| Box::pin(failed(ctx)),
        waits: false,
    },
    Case {
        id: "status/4",
        requirement: "IDEM-STATUS-1",
        title: "a status query about a fresh key answers unknown and writes nothing: the request with the key then executes",
        run: |ctx| Box::pin(unknown(ctx)),
        waits: false,
    },
    Case {
        id: "status/5",
        requirement: "IDEM-STATUS-3",
        title: "a settling query about a fresh key answers not-executed; the request with the key is then refused with 409 key-settled and never executes, and the key stays not-executed",
        run: |ctx| Box::pin(settled(ctx)),
        waits: false,
    },
    Case {
        id: "status/6",
        requirement: "IDEM-STATUS-2",
        title: "principal B asks about principal A's completed key: unknown, never A's record (`leak`); B's settle of a fresh key leaves A's request with it to run",
        run: |ctx| Box::pin(other_principal(ctx)),
        waits: false,
    },
    Case {
        id: "status/7",
        requirement: "IDEM-STATUS-4",
        title: "queries with two key lines, no key, a string for the method or a non-boolean settle are refused with 400 problem+json, never answered with a document",
        run: |ctx| Box::pin(bad_queries(ctx)),
        waits: false,
    },
];

/// The skip when the target does not offer the query.
async fn offered(ctx: &Ctx<'_>) -> Result<Option<Check>, HarnessError> {
    ctx.status_offered().await
}

/// A fail when the count oracle saw the query execute: the query runs nothing.
fn executed_by_query(n: Option<u64>, what: &str) -> Option<Check> {
    n.filter(|n| *n > 0).map(|n| {
        fail(
            "a status query executes nothing",
            format!("{what}: the count oracle saw {n} execution(s) during the query"),
        )
    })
}

async fn completed<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    if let Some(skip) = offered(ctx).await? {
        return Ok(skip);
    }
    let key = ctx.fresh();
    let first = ctx.post("the request", &key, &ctx.t.body).await?;
    require_success(&first, "the request")?;
    let before = ctx.count().await?;
    let (r, doc) = ctx.ask("status query", &key, false, Who::A).await?;
    let after = ctx.count().await?;
    if let Some(check) = executed_by_query(runs(before, after), "asked about a completed key") {
        return Ok(check);
    }
    let expected = format!(
        "completed, with the stored status {} and still replayed",
        first.status
    );
    let Some(doc) = doc else {
        return Ok(fail(
            expected,
            format!("not a status document: {}", r.summary()),
        ));
    };
    if !doc.is("completed") || doc.response_status != Some(first.status) {
        return Ok(fail(
            expected,
            format!(
                "the request completed with {}; the query answered {}",
                first.status,
                doc.describe()
            ),
        ));
    }
    if doc.replayable != Some(true) {
        return Ok(fail(
            expected,
            format!(
                "right after the request, the query answered {} with replayable {:?}",
                doc.describe(),
                doc.replayable
            ),
        ));
    }
    Ok(pass_counted(
        ctx,
        &format!(
            "answered {}; the count oracle saw no execution by the query",
            doc.describe()
        ),
        (Confidence::Medium, &format!("answered {}", doc.describe())),
    ))
}

/// Status queries sent while the request runs, at most this many.
const IN_FLIGHT_QUERIES: usize = 200;

async fn in_flight<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    if let Some(skip) = offered(ctx).await? {
        return Ok(skip);
    }
    let key = ctx.fresh();
    let req = ctx.request(&key, &ctx.t.body, Who::A);
    let before = ctx.count().await?;
    let prepared = Prepared::open(&req, ctx.http).await?;
    let sent = Instant::now();
    let original = tokio::spawn(prepared.send());
    let mut seen: Vec<KeyStatus> = Vec::new();
    let mut busy: Option<(Resp, KeyStatus)> = None;
    for _ in 0..IN_FLIGHT_QUERIES {
        let (r, doc) = ctx
            .ask("status query while the request runs", &key, false, Who::A)
            .await?;
        let Some(doc) = doc else {
            original.abort();
            return Ok(fail(
                "in-progress (or unknown before the request's claim)",
                format!(
                    "while the request ran, the query was answered {}",
                    r.summary()
                ),
            ));
        };
        seen.push(doc.clone());
        if doc.is("in-progress") {
            busy = Some((r, doc));
            break;
        }
        if !doc.is("unknown") || original.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let result = original
        .await
        .map_err(|e| HarnessError::Protocol(format!("the request's task failed: {e}")))?;
    ctx.log.record("the request", &req, sent, &result);
    let first = result?;
    let after = ctx.count().await?;
    let tally = tally(&seen);
    // A query that settles or claims the key shows in what it answers, or in the request's
    // refusal.
    if let Some(odd) = seen
        .iter()
        .find(|d| !d.is("unknown") && !d.is("in-progress") && !d.is("completed"))
    {
        return Ok(fail(
            "in-progress while the request runs (unknown before its claim)",
            format!(
                "while the request ran, a query without settle was answered {} (queries: {tally}); the request got {}",
                odd.describe(),
                first.summary()
            ),
        ));
    }
    require_success(&first, "the request")?;
    if let Some(n) = runs(before, after).filter(|n| *n > 1) {
        return Ok(fail(
            "status queries execute nothing: one execution, the request's",
            format!(
                "the count oracle saw {n} executions ({} queries)",
                seen.len()
            ),
        ));
    }
    if let Some((r, doc)) = busy {
        return Ok(when_to_ask(ctx, &r, &doc, "while the request ran"));
    }
    let raced = format!(
        "the request was answered ({}) before a status query saw it in flight ({} queries: {tally})",
        first.status,
        seen.len()
    );
    orphaned(ctx, &raced).await
}

/// The race saw no key in flight (`raced` says how it went): with `--crash-body`, a key whose
/// attempt died stays in flight until its lease ends, and a query about it then answers
/// in-progress.
async fn orphaned(ctx: &Ctx<'_>, raced: &str) -> Result<Check, HarnessError> {
    let (Some(_), Some(body)) = (ctx.t.lease, ctx.t.crash_body.clone()) else {
        return Ok(Check::Skip(format!(
            "{raced}; a slower handler, or --lease and --crash-body (a request whose attempt dies), show it"
        )));
    };
    let key = ctx.fresh();
    match ctx
        .post("a request that dies (--crash-body)", &key, &body)
        .await
    {
        Err(HarnessError::Closed(_)) => {}
        Ok(r) if r.status >= 500 => {}
        Ok(r) => {
            return Err(HarnessError::Protocol(format!(
                "--crash-body must make the first attempt die (connection closed or 5xx), got {}",
                r.summary()
            )))
        }
        Err(e) => return Err(e),
    }
    let (r, doc) = ctx
        .ask(
            "status query about the dead attempt's key",
            &key,
            false,
            Who::A,
        )
        .await?;
    match doc {
        Some(doc) if doc.is("in-progress") => Ok(when_to_ask(
            ctx,
            &r,
            &doc,
            &format!("about a key whose attempt died, within its lease ({raced})"),
        )),
        // The server released the key when its attempt died, or the lease already ended.
        Some(doc) if doc.is("released") || doc.is("held") || doc.is("unknown") => {
            Ok(Check::Skip(format!(
                "{raced}; and a key whose attempt died was {} at once: no key in flight to ask about",
                doc.describe()
            )))
        }
        Some(doc) => Ok(fail(
            "in-progress (or released) for a key whose attempt died within its lease",
            format!("answered {}", doc.describe()),
        )),
        None => Ok(fail(
            "in-progress (or released) for a key whose attempt died within its lease",
            format!("not a status document: {}", r.summary()),
        )),
    }
}

/// An in-progress answer `r` (with `doc`) says when to ask again: `retryAfter` in the
/// document and a `Retry-After` field.
fn when_to_ask(ctx: &Ctx<'_>, r: &Resp, doc: &KeyStatus, when: &str) -> Check {
    let header = r.header("retry-after").map(str::to_owned);
    let Some(secs) = header.as_deref().and_then(|v| v.trim().parse::<u64>().ok()) else {
        return fail(
            "in-progress with when to ask again: retryAfter in the document and a Retry-After field",
            format!(
                "answered {} {when}, with Retry-After {header:?}",
                doc.describe()
            ),
        );
    };
    if doc.retry_after.is_none() {
        return fail(
            "in-progress with when to ask again: retryAfter in the document and a Retry-After field",
            format!("answered {} {when}, without retryAfter", doc.describe()),
        );
    }
    let said = format!("answered {} with Retry-After {secs} {when}", doc.describe());
    pass_counted(
        ctx,
        &format!("{said}; the count oracle saw no execution by a query"),
        (Confidence::Medium, &said),
    )
}

/// `unknown×3, in-progress×1`: what the queries answered, in order of first appearance.
fn tally(seen: &[KeyStatus]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for d in seen {
        match counts.iter_mut().find(|(s, _)| *s == d.status) {
            Some((_, n)) => *n += 1,
            None => counts.push((&d.status, 1)),
        }
    }
    counts
        .iter()
        .map(|(s, n)| format!("{s}×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Answers after which the handler did nothing: the key must be released (`IDEM-OUT-2`).
fn released(status: u16) -> bool {
    matches!(status, 408 | 425 | 429)
}

async fn failed<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let Some(body) = ctx.t.fail_body.clone() else {
        return Ok(Check::Skip(
            "needs --fail-body: a request the server fails with a 5xx, 408, 425 or 429".into(),
        ));
    };
    if let Some(skip) = offered(ctx).await? {
        return Ok(skip);
    }
    let key = ctx.fresh();
    let first = ctx.post("failing request", &key, &body).await?;
    if !(released(first.status) || (500..600).contains(&first.status)) {
        return Err(HarnessError::Protocol(format!(
            "--fail-body must produce a 5xx, 408, 425 or 429, got {}",
            first.summary()
        )));
    }
    let before = ctx.count().await?;
    // The attempt has answered; a server may still be releasing its key.
    let window = ctx.t.timeout.max(Duration::from_secs(5)) + ctx.t.lease.unwrap_or_default();
    let deadline = Instant::now() + window;
    let mut wait = ctx.waiting("the failed key to leave in-progress", window);
    let (r, doc) = loop {
        let (r, doc) = ctx.ask("status query", &key, false, Who::A).await?;
        if !doc.as_ref().is_some_and(|d| d.is("in-progress")) || Instant::now() >= deadline {
            break (r, doc);
        }
        wait.tick();
        tokio::time::sleep(POLL).await;
    };
    drop(wait);
    let after = ctx.count().await?;
    if let Some(check) = executed_by_query(runs(before, after), "asked about a failed key") {
        return Ok(check);
    }
    let expected = "released (a retry runs again) or held (the outcome is unknown)";
    let Some(doc) = doc else {
        return Ok(fail(
            expected,
            format!("not a status document: {}", r.summary()),
        ));
    };
    match doc.status.as_str() {
        "released" | "held" => as_said(ctx, &key, &body, first.status, &doc).await,
        // The key is stuck: the query says so honestly, the server is wrong to keep it.
        "in-progress" => Ok(stuck(first.status, &doc)),
        // A stored failure, honestly reported: the profile grades storing it.
        "completed" if doc.response_status == Some(first.status) => {
            let observed = format!(
                "the {} was stored: the query answered {}",
                first.status,
                doc.describe()
            );
            if released(first.status) {
                ctx.miss(
                    "IDEM-OUT-2",
                    format!("a {} releases the key", first.status),
                    observed,
                );
            } else {
                ctx.miss("IDEM-OUT-4", "a 5xx is not stored", observed);
            }
            Ok(Check::Pass(
                Confidence::Medium,
                format!("the query reports the stored failure: {}", doc.describe()),
            ))
        }
        _ => Ok(fail(
            expected,
            format!("after a {}, answered {}", first.status, doc.describe()),
        )),
    }
}

/// A retry of a failed request whose key the query called `doc` (released or held): it runs
/// again after released, and is refused with the outcome-unknown type after held.
async fn as_said(
    ctx: &Ctx<'_>,
    key: &KeyHeader,
    body: &bytes::Bytes,
    failed: u16,
    doc: &KeyStatus,
) -> Result<Check, HarnessError> {
    let said = format!("after a {failed}, answered {}", doc.describe());
    let before = ctx.count().await?;
    let retry = ctx.post("retry, as the query said", key, body).await?;
    let after = ctx.count().await?;
    let held = spec("IDEM-OUT-3").problem.as_deref();
    let refused_held =
        retry.status == ctx.t.profile.conflict && problem_type(&retry).as_deref() == held;
    if doc.is("held") {
        return Ok(if refused_held {
            Check::Pass(
                Confidence::Medium,
                format!("{said}; the retry was refused with the outcome-unknown type"),
            )
        } else {
            fail(
                "a held key's retry is refused with the outcome-unknown type",
                format!("{said}, but the retry got {}", retry.summary()),
            )
        });
    }
    // Run again, the request fails again (or succeeds): anything else is a refusal.
    let attempted = retry.is_success() || released(retry.status) || retry.status >= 500;
    if refused_held || !attempted || runs(before, after) == Some(0) {
        return Ok(fail(
            "a released key's retry runs again",
            format!(
                "{said}, but the retry got {}{}",
                retry.summary(),
                if runs(before, after) == Some(0) {
                    " without executing"
                } else {
                    ""
                }
            ),
        ));
    }
    Ok(pass_counted(
        ctx,
        &format!("{said}; the retry ran again (count oracle)"),
        (
            Confidence::Medium,
            &format!("{said}; the retry was not refused ({})", retry.status),
        ),
    ))
}

/// A failed key still in progress after the settle window.
fn stuck(status: u16, doc: &KeyStatus) -> Check {
    let observed = format!(
        "after the attempt answered {status}, the key is still {}",
        doc.describe()
    );
    if released(status) {
        miss(
            "IDEM-OUT-2",
            format!("a {status} releases the key: the query answers released"),
            observed,
        )
    } else {
        miss(
            "IDEM-OUT-6",
            "a failed attempt's key is released or held, never left in progress",
            observed,
        )
    }
}

async fn unknown<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    if let Some(skip) = offered(ctx).await? {
        return Ok(skip);
    }
    let key = ctx.fresh();
    let before = ctx.count().await?;
    let (r, doc) = ctx
        .ask("status query about a fresh key", &key, false, Who::A)
        .await?;
    let middle = ctx.count().await?;
    if let Some(check) = executed_by_query(runs(before, middle), "asked about a fresh key") {
        return Ok(check);
    }
    match &doc {
        Some(d) if d.is("unknown") => {}
        Some(d) => {
            return Ok(fail(
                "unknown: nothing with the key is recorded",
                format!("a fresh key was answered {}", d.describe()),
            ))
        }
        None => {
            return Ok(fail(
                "unknown: nothing with the key is recorded",
                format!("not a status document: {}", r.summary()),
            ))
        }
    }
    // The query wrote nothing: the request with the key runs as new.
    let first = ctx
        .post("the request with the key", &key, &ctx.t.body)
        .await?;
    let after = ctx.count().await?;
    if !first.is_success() {
        if problem_type(&first).as_deref() == spec("IDEM-STATUS-3").problem.as_deref() {
            return Ok(fail(
                "a query without settle writes nothing: the request with the key executes",
                format!(
                    "after the query answered unknown, the request was refused as settled: {}",
                    first.summary()
                ),
            ));
        }
        return ctx
            .wrong_answer(
                "IDEM-STATUS-1",
                "a query writes nothing: the request with the key executes",
                format!(
                    "after the query answered unknown, the request got {}",
                    first.summary()
                ),
                Who::A,
                &ctx.t.body,
            )
            .await;
    }
    if runs(middle, after) == Some(0) {
        return Ok(fail(
            "a query writes nothing: the request with the key executes",
            "the request succeeded, but the count oracle saw no execution",
        ));
    }
    Ok(pass_counted(
        ctx,
        "answered unknown; the request with the key then executed (count oracle)",
        (
            Confidence::Medium,
            "answered unknown; the request with the key then succeeded",
        ),
    ))
}

async fn settled<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    if let Some(skip) = offered(ctx).await? {
        return Ok(skip);
    }
    let key = ctx.fresh();
    let before = ctx.count().await?;
    let (r, doc) = ctx
        .ask("settling query about a fresh key", &key, true, Who::A)
        .await?;
    let middle = ctx.count().await?;
    if let Some(check) = executed_by_query(runs(before, middle), "settled a fresh key") {
        return Ok(check);
    }
    match &doc {
        Some(d) if d.is("not-executed") => {}
        Some(d) => {
            return Ok(fail(
                "not-executed: the fresh key is settled as never to run",
                format!("the settling query answered {}", d.describe()),
            ))
        }
        None => {
            return Ok(fail(
                "not-executed: the fresh key is settled as never to run",
                format!("not a status document: {}", r.summary()),
            ))
        }
    }
    let label = "the request with the settled key";
    let settled_type = spec("IDEM-STATUS-3").problem.as_deref().unwrap_or_default();
    let expected = format!("{label}: refused with 409 {settled_type}, nothing executes");
    let late = ctx.post(label, &key, &ctx.t.body).await?;
    let after = ctx.count().await?;
    // A client told not-executed sends the request again under a new key: a settle that
    // does not hold runs it twice.
    let twice =
        "a client told not-executed sends the request again under a new key, so it runs twice";
    if let Some(n) = runs(middle, after).filter(|n| *n > 0) {
        return Ok(fail(
            expected,
            format!(
                "answered {}; the count oracle saw {n} execution(s): {twice}",
                late.summary()
            ),
        ));
    }
    if late.is_success() {
        return Ok(fail(
            expected,
            format!("answered {}: {twice}", late.summary()),
        ));
    }
    // The refusal says why: a client retries an in-progress refusal, and stops at a settled
    // one.
    if problem_type(&late).as_deref() != Some(settled_type) {
        return Ok(fail(expected, format!("refused with {}", late.summary())));
    }
    ctx.expect_code(&late, 409, label);
    let (r, doc) = ctx
        .ask("status query after the refusal", &key, false, Who::A)
        .await?;
    if !doc.as_ref().is_some_and(|d| d.is("not-executed")) {
        return Ok(fail(
            "a settled key stays not-executed",
            format!(
                "after the settle and the refusal, the query answered {}",
                doc.map_or_else(|| r.summary(), |d| d.describe())
            ),
        ));
    }
    Ok(pass_counted(
        ctx,
        "answered not-executed; the request with the key was refused as settled and never executed (count oracle); the key stays not-executed",
        (
            Confidence::Medium,
            "answered not-executed; the request with the key was refused as settled; the key stays not-executed",
        ),
    ))
}

async fn other_principal<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    if ctx.t.second_credential.is_empty() {
        return Ok(Check::Skip(
            "needs --second-credential: the header of another principal".into(),
        ));
    }
    if let Some(skip) = offered(ctx).await? {
        return Ok(skip);
    }
    // A's completed key, asked about by B.
    let key = ctx.fresh();
    let a = ctx.post("principal A's request", &key, &ctx.t.body).await?;
    require_success(&a, "principal A's request")?;
    let (r, doc) = ctx
        .ask("principal B asks about A's key", &key, false, Who::B)
        .await?;
    let unknown = "principal B's query about A's key answers unknown: keys are looked up in the asker's scope only";
    match doc {
        Some(d) if d.is("unknown") => {}
        Some(d) if d.is("not-executed") => {
            return Ok(fail(
                unknown,
                "B's query without settle was answered not-executed",
            ))
        }
        Some(d) => {
            return Ok(leak_of(
                Some("IDEM-STATUS-2"),
                unknown,
                format!(
                    "B's query about A's key was answered {}: A's record was disclosed to B",
                    d.describe()
                ),
            ))
        }
        None => {
            return Ok(fail(
                unknown,
                format!(
                    "B's query was not answered with a document: {}",
                    r.summary()
                ),
            ))
        }
    }
    // B settles a fresh key in B's scope: A's request with it still runs.
    let fresh = ctx.fresh();
    let (r, doc) = ctx
        .ask("principal B settles a fresh key", &fresh, true, Who::B)
        .await?;
    if !doc.as_ref().is_some_and(|d| d.is("not-executed")) {
        return Ok(fail(
            "B's settling query about a fresh key answers not-executed",
            doc.map_or_else(|| r.summary(), |d| d.describe()),
        ));
    }
    let before = ctx.count().await?;
    let a = ctx
        .post(
            "principal A's request with the key B settled",
            &fresh,
            &ctx.t.body,
        )
        .await?;
    let after = ctx.count().await?;
    let own =
        "a settle writes only in the asker's scope: A's request with the key B settled executes";
    if problem_type(&a).as_deref() == spec("IDEM-STATUS-3").problem.as_deref() {
        return Ok(leak_of(
                Some("IDEM-STATUS-2"),
            own,
            format!(
                "A's request was refused as settled ({}): B's settle was written in A's scope, and B's use of the key disclosed to A",
                a.status
            ),
        ));
    }
    if !a.is_success() {
        return ctx
            .wrong_answer(
                "IDEM-STATUS-2",
                own,
                format!("A's request got {}", a.summary()),
                Who::A,
                &ctx.t.body,
            )
            .await;
    }
    if runs(before, after) == Some(0) {
        return Ok(fail(
            own,
            "A's request succeeded, but the count oracle saw no execution",
        ));
    }
    Ok(pass_counted(
        ctx,
        "B was answered unknown about A's key; A's request with a key B settled executed (count oracle)",
        (
            Confidence::Medium,
            "B was answered unknown about A's key; A's request with a key B settled succeeded",
        ),
    ))
}

async fn bad_queries<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    if let Some(skip) = offered(ctx).await? {
        return Ok(skip);
    }
    let two = KeyHeader::Many(vec![
        ctx.key_value(ctx.new_key().as_bytes()),
        ctx.key_value(ctx.new_key().as_bytes()),
    ]);
    let method = ctx.t.method.to_string();
    let queries = [
        ("two key lines", two, method.clone()),
        ("no key", KeyHeader::None, method.clone()),
        (
            "a string for the method",
            ctx.fresh(),
            format!("\"{method}\""),
        ),
        (
            "a settle that is not a boolean",
            ctx.fresh(),
            format!("{method}; settle=1"),
        ),
    ];
    let before = ctx.count().await?;
    let mut refused = Vec::new();
    for (what, key, field) in &queries {
        let label = format!("status query with {what}");
        let r = ctx
            .send(&label, &ctx.status_request(key, field, Who::A))
            .await?;
        let expected = format!("a status query with {what} is refused with 400 problem+json");
        if let Some(doc) = KeyStatus::of(&r) {
            return Ok(fail(
                expected,
                format!("answered with a status document: {}", doc.describe()),
            ));
        }
        if !(400..500).contains(&r.status) {
            return Ok(fail(expected, r.summary()));
        }
        let problem = r
            .header("content-type")
            .is_some_and(|ct| ct.trim().starts_with("application/problem+json"));
        if !problem {
            return Ok(fail(
                expected,
                format!(
                    "refused with {} of type {:?}",
                    r.status,
                    r.header("content-type").unwrap_or("none")
                ),
            ));
        }
        ctx.expect_code(&r, 400, &format!("a status query with {what}"));
        refused.push(format!("{what}: {}", r.status));
    }
    let after = ctx.count().await?;
    if let Some(n) = runs(before, after).filter(|n| *n > 0) {
        return Ok(fail(
            "a refused status query executes nothing",
            format!("the count oracle saw {n} execution(s)"),
        ));
    }
    Ok(pass_counted(
        ctx,
        &format!(
            "refused with problem+json, nothing executed ({})",
            refused.join(", ")
        ),
        (
            Confidence::Medium,
            &format!("refused with problem+json ({})", refused.join(", ")),
        ),
    ))
}
