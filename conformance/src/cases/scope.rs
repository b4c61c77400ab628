//! Cross-principal isolation: a key belongs to one principal. Another principal who sends
//! the same key gets an execution of its own: never the first principal's stored response,
//! never a conflict because the first principal's request is in flight, never a mismatch
//! because the first principal used the key with another payload. Each of those answers
//! discloses the first principal's record, and is a leak whatever the profile.

use super::{fail, leak, other_body, problem_type, require_success, runs, Case, Check, Ctx, Who};
use crate::http::{HarnessError, Prepared, Req, Resp};
use crate::suite::Confidence;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Barrier;

pub(super) const CASES: &[Case] = &[Case {
    id: "scope/1",
    requirement: "IDEM-SCOPE-1",
    title: "key K under credential A, then under credential B (the same body, another body, and both at once): B's request executes on its own, and is never given A's response, a conflict or a mismatch",
    run: |ctx| Box::pin(cross_principal(ctx)),
    waits: false,
}];

/// What B must get: an execution of its own.
const OWN: &str = "principal B's request executes on its own, as if the key were new";

async fn cross_principal<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    if ctx.t.second_credential.is_empty() {
        return Ok(Check::Skip(
            "needs --second-credential: the header of another principal".into(),
        ));
    }
    let body = ctx.t.body.clone();
    // A replay: A's completed key, B's identical request.
    if let Some(check) = after_a(ctx, "the same body", &body).await? {
        return Ok(check);
    }
    // A mismatch: A's completed key, B's request with another payload.
    if let Some(check) = after_a(ctx, "another body", &other_body(ctx.t)).await? {
        return Ok(check);
    }
    // A conflict: A and B send the key at the same moment.
    if let Some(check) = at_once(ctx).await? {
        return Ok(check);
    }
    Ok(if ctx.has_count() {
        Check::Pass(
            Confidence::High,
            "B's requests executed on their own (count oracle): no replay, conflict or mismatch across principals".into(),
        )
    } else {
        Check::Pass(
            Confidence::Medium,
            "B's requests got success answers of their own, unmarked: no replay, conflict or mismatch across principals".into(),
        )
    })
}

/// A completes a request with a fresh key; then B sends the key with `b_body`. A check when
/// B's answer discloses A's record or is otherwise wrong.
async fn after_a<'c>(
    ctx: &'c Ctx<'c>,
    what: &str,
    b_body: &bytes::Bytes,
) -> Result<Option<Check>, HarnessError> {
    let key = ctx.fresh();
    let a = ctx
        .post(&format!("principal A ({what} follows)"), &key, &ctx.t.body)
        .await?;
    require_success(&a, "principal A's request")?;
    let before = ctx.count().await?;
    let b = ctx
        .send(
            &format!("principal B, A's key, {what}"),
            &ctx.request(&key, b_body, Who::B),
        )
        .await?;
    let after = ctx.count().await?;
    if let Some(check) = disclosed(ctx, (&a, "A"), (&b, "B"), what) {
        return Ok(Some(check));
    }
    if !b.is_success() {
        return ctx
            .wrong_answer(
                "IDEM-SCOPE-1",
                OWN,
                format!("with A's key and {what}, B was answered {}", b.summary()),
                Who::B,
                b_body,
            )
            .await
            .map(Some);
    }
    if let (Some(x), Some(y)) = (ctx.resource_id(&a), ctx.resource_id(&b)) {
        if x == y {
            return Ok(Some(leak(
                "principal B gets its own resource",
                format!("with A's key and {what}, B was given A's resource: both name {x}"),
            )));
        }
    }
    if runs(before, after) == Some(0) {
        return Ok(Some(fail(
            OWN,
            format!("with A's key and {what}, the count oracle saw no execution for B"),
        )));
    }
    Ok(None)
}

/// A leak when the answer `b` to principal `other` reveals the record of principal `owner`
/// (`a` is the owner's answer): the owner's response, or a conflict or mismatch answer.
fn disclosed(
    ctx: &Ctx<'_>,
    (a, owner): (&Resp, &str),
    (b, other): (&Resp, &str),
    what: &str,
) -> Option<Check> {
    let own = format!("principal {other}'s request executes on its own, as if the key were new");
    let shared = |name: &str| a.header(name).is_some_and(|v| b.header(name) == Some(v));
    if b.same_answer(a) || ctx.marked(b) || (b.is_success() && shared("set-cookie")) {
        let cookie = if shared("set-cookie") {
            " (its Set-Cookie too)"
        } else {
            ""
        };
        return Some(leak(
            own,
            format!(
                "with {owner}'s key and {what}, {other} received {owner}'s stored response{cookie}: {}",
                b.summary()
            ),
        ));
    }
    let profile = &ctx.t.profile;
    let ty = problem_type(b);
    let typed = |id: &str| ty.is_some() && ty.as_deref() == super::spec(id).problem.as_deref();
    if b.status == profile.conflict || typed("IDEM-CONC-1") {
        return Some(leak(
            own,
            format!(
                "with {owner}'s key and {what}, {other} was answered as if its request were in progress: {}; {owner}'s use of the key was disclosed",
                b.summary()
            ),
        ));
    }
    if b.status == profile.mismatch || typed("IDEM-FP-1") {
        return Some(leak(
            own,
            format!(
                "with {owner}'s key and {what}, {other} was told the key was used with another payload: {}; {owner}'s record was disclosed",
                b.summary()
            ),
        ));
    }
    None
}

/// A and B send a fresh key at the same moment, each on a connection opened ahead. A leak
/// when either is refused as in progress (or as a mismatch) because of the other.
async fn at_once<'c>(ctx: &'c Ctx<'c>) -> Result<Option<Check>, HarnessError> {
    let key = ctx.fresh();
    let body = ctx.t.body.clone();
    let reqs = [
        (
            "principal A, at the same moment as B",
            ctx.request(&key, &body, Who::A),
        ),
        (
            "principal B, at the same moment as A",
            ctx.request(&key, &body, Who::B),
        ),
    ];
    let before = ctx.count().await?;
    let answers = race(ctx, &reqs).await?;
    let after = ctx.count().await?;
    let [(a, a_at), (b, b_at)] = answers;
    let overlap = a_at.0.max(b_at.0) < a_at.1.min(b_at.1);
    ctx.note(if overlap {
        "A's and B's requests with one key were in flight together"
    } else {
        "A's and B's requests with one key did not overlap (the server answers faster than they were sent): no conflict could be provoked"
    });
    for (owner, other) in [((&a, "A"), (&b, "B")), ((&b, "B"), (&a, "A"))] {
        if let Some(check) = disclosed(ctx, owner, other, "at the same moment") {
            return Ok(Some(check));
        }
    }
    for (r, who) in [(&a, Who::A), (&b, Who::B)] {
        if !r.is_success() {
            let name = if who == Who::A { "A" } else { "B" };
            return ctx
                .wrong_answer(
                    "IDEM-SCOPE-1",
                    "each principal's request executes on its own",
                    format!(
                        "sent at the same moment as the other's, {name} was answered {}",
                        r.summary()
                    ),
                    who,
                    &body,
                )
                .await
                .map(Some);
        }
    }
    if let Some(n) = runs(before, after).filter(|n| *n < 2) {
        return Ok(Some(fail(
            "each principal's request executes on its own",
            format!("sent at the same moment, both succeeded, but the count oracle saw {n} execution(s)"),
        )));
    }
    Ok(None)
}

/// The answers to `reqs`, sent together through a barrier once every connection is open,
/// with when each was sent and answered.
async fn race(
    ctx: &Ctx<'_>,
    reqs: &[(&str, Req); 2],
) -> Result<[(Resp, (Instant, Instant)); 2], HarnessError> {
    let barrier = Arc::new(Barrier::new(reqs.len()));
    let mut tasks = Vec::with_capacity(reqs.len());
    for (_, req) in reqs {
        let prepared = Prepared::open(req, ctx.http).await?;
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let sent = Instant::now();
            let result = prepared.send().await;
            (sent, Instant::now(), result)
        }));
    }
    let mut out = Vec::with_capacity(reqs.len());
    for ((label, req), task) in reqs.iter().zip(tasks) {
        let (sent, answered, result) = task
            .await
            .map_err(|e| HarnessError::Protocol(format!("a sender task failed: {e}")))?;
        ctx.log.record(label, req, sent, &result);
        out.push((result?, (sent, answered)));
    }
    let b = out.pop();
    let a = out.pop();
    match (a, b) {
        (Some(a), Some(b)) => Ok([a, b]),
        _ => Err(HarnessError::Protocol(
            "a raced request went missing".into(),
        )),
    }
}
