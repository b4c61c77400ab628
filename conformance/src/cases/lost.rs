//! Lost responses: the request reaches the server, the response never reaches the client.

use super::{fail, runs, two_answers, unsafe_, Case, Check, Ctx, Who};
use crate::http::{send_and_drop, HarnessError};
use crate::suite::Confidence;
use std::time::{Duration, Instant};

pub(super) const CASES: &[Case] = &[Case {
    id: "lost-response/1",
    requirement: "IDEM-EXEC-1",
    title: "send, close the connection before the response, retry twice with the same key: one execution, the retries agree",
    run: |ctx| Box::pin(lost_response(ctx)),
    waits: false,
}];

/// How long the dropped connection stays open after the request is written, so that the
/// server has read it before it sees the connection close.
const LINGER: Duration = Duration::from_millis(20);

/// What a retry after a lost response must get.
const OUTCOME: &str = "a retry gets the outcome of the one execution of the dropped request";

async fn lost_response<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let key = ctx.fresh();
    let body = ctx.t.body.clone();
    let before = ctx.count().await?;
    let req = ctx.request(&key, &body, Who::A);
    let sent = Instant::now();
    send_and_drop(&req, ctx.http, LINGER).await?;
    ctx.log.record_dropped(
        "original",
        &req,
        sent,
        "request written, connection closed before reading the response",
    );
    let first = ctx.settle("retry 1", &key, &body).await?;
    if first.status == ctx.t.profile.conflict {
        return Ok(fail(
            "the retry gets the outcome of the request once it has completed",
            format!(
                "still {} (in progress) after waiting; the dropped request never completed",
                first.status
            ),
        ));
    }
    let second = ctx.post("retry 2", &key, &body).await?;
    let after = ctx.count().await?;
    if let Some(n) = runs(before, after) {
        if n > 1 {
            return Ok(unsafe_(
                "exactly one execution for the dropped request and its two retries",
                format!("the count oracle saw {n} executions"),
            ));
        }
    }
    if !first.is_success() {
        return ctx
            .wrong_answer(
                "IDEM-REPLAY-1",
                OUTCOME,
                format!("retry 1 was answered {}", first.summary()),
                Who::A,
                &body,
            )
            .await;
    }
    if runs(before, after) == Some(0) {
        return Ok(fail(
            "exactly one execution",
            "the count oracle saw none, although the retry succeeded",
        ));
    }
    if !second.is_success() {
        return ctx
            .wrong_answer(
                "IDEM-REPLAY-1",
                OUTCOME,
                format!(
                    "retry 1 got {}, then retry 2 was answered {}",
                    first.status,
                    second.summary()
                ),
                Who::A,
                &body,
            )
            .await;
    }
    if !first.same_answer(&second) {
        if let Some((a, b)) = ctx.distinct_ids(&first, &second) {
            return Ok(unsafe_(
                "both retries name the resource created once",
                format!("retry 1 names {a}, retry 2 names {b}: two executions"),
            ));
        }
        return Ok(two_answers(
            ctx,
            &first,
            &second,
            "both retries get the outcome of the one execution, the same status and body",
            format!(
                "two different success answers for one key: retry 1: {}; retry 2: {}",
                first.summary(),
                second.summary()
            ),
        ));
    }
    let replay_marked = ctx.marked(&first) && ctx.marked(&second);
    Ok(if ctx.has_count() {
        Check::Pass(
            Confidence::High,
            "the count oracle saw exactly one execution; the retries agree".into(),
        )
    } else if replay_marked {
        Check::Pass(
            Confidence::Medium,
            "both retries are marked as replays of one execution and agree; without a count oracle an unseen extra execution cannot be ruled out".into(),
        )
    } else {
        Check::Pass(
            Confidence::Low,
            "the retries agree, but without a count oracle or replay marker the harness cannot tell how often the handler ran".into(),
        )
    })
}
