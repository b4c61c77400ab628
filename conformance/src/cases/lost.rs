//! Lost responses: the request reaches the server, the response never reaches the client.

use super::{fail, require_success, runs, unsafe_, Check, Ctx, Who};
use crate::http::{send_and_drop, HarnessError};
use crate::suite::Confidence;
use std::time::{Duration, Instant};

/// How long the dropped connection stays open after the request is written, so that the
/// server has read it before it sees the connection close.
const LINGER: Duration = Duration::from_millis(20);

pub(super) async fn lost_response(ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
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
    require_success(&first, "the retry")?;
    let second = ctx.post("retry 2", &key, &body).await?;
    let after = ctx.count().await?;
    if let Some(n) = runs(before, after) {
        if n > 1 {
            return Ok(unsafe_(
                "exactly one execution for the dropped request and its two retries",
                format!("the count oracle saw {n} executions"),
            ));
        }
        if n == 0 {
            return Ok(fail(
                "exactly one execution",
                "the count oracle saw none, although the retry succeeded",
            ));
        }
    }
    if !first.same_answer(&second) {
        if let Some((a, b)) = ctx.distinct_ids(&first, &second) {
            return Ok(unsafe_(
                "both retries name the resource created once",
                format!("retry 1 names {a}, retry 2 names {b}: two executions"),
            ));
        }
        return Ok(fail(
            "both retries get the same status and body",
            format!(
                "retry 1: {}; retry 2: {}",
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
