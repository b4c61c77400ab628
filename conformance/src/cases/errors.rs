//! Error responses: which are stored and replayed, which release the key.

use super::{fail, runs, unsafe_, Check, Ctx};
use crate::http::{HarnessError, Resp};
use crate::suite::Confidence;

fn retryable(status: u16) -> bool {
    matches!(status, 408 | 425 | 429) || (500..600).contains(&status)
}

pub(super) async fn decline_replayed(ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
    let Some(body) = ctx.t.decline_body.clone() else {
        return Ok(Check::Skip(
            "needs --decline-body: a request the server refuses with a deterministic 4xx".into(),
        ));
    };
    let key = ctx.fresh();
    let before = ctx.count().await?;
    let first = ctx.post("declined request", &key, &body).await?;
    if !(400..500).contains(&first.status) || retryable(first.status) {
        return Err(HarnessError::Protocol(format!(
            "--decline-body must produce a deterministic 4xx (not 408/425/429), got {}",
            first.summary()
        )));
    }
    let second = ctx.post("retry", &key, &body).await?;
    let after = ctx.count().await?;
    if let Some(n) = runs(before, after).filter(|n| *n > 1) {
        return Ok(unsafe_(
            "the retry replays the stored 4xx without executing",
            format!(
                "the count oracle saw {n} executions; the retry got {}",
                second.summary()
            ),
        ));
    }
    if !first.same_answer(&second) {
        return Ok(fail(
            "the retry gets the stored 4xx, same status and body",
            format!("first: {}; retry: {}", first.summary(), second.summary()),
        ));
    }
    Ok(if ctx.has_count() {
        Check::Pass(
            Confidence::High,
            "replayed; the count oracle saw one execution".into(),
        )
    } else if ctx.marked(&second) {
        Check::Pass(Confidence::Medium, "replayed with the replay marker".into())
    } else {
        Check::Pass(
            Confidence::Low,
            "the same answer; without an oracle or marker a re-execution would look the same"
                .into(),
        )
    })
}

pub(super) async fn failure_not_stored(ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
    let Some(body) = ctx.t.fail_body.clone() else {
        return Ok(Check::Skip(
            "needs --fail-body: a request the server fails with a 5xx, 408, 425 or 429".into(),
        ));
    };
    let key = ctx.fresh();
    let before = ctx.count().await?;
    let first = ctx.post("failing request", &key, &body).await?;
    if !retryable(first.status) {
        return Err(HarnessError::Protocol(format!(
            "--fail-body must produce a 5xx, 408, 425 or 429, got {}",
            first.summary()
        )));
    }
    let middle = ctx.count().await?;
    let second: Resp = ctx.post("retry", &key, &body).await?;
    let after = ctx.count().await?;
    if ctx.marked(&second) {
        return Ok(fail(
            "the failure is not stored: the retry runs again",
            format!(
                "the retry is a marked replay of the failure: {}",
                second.summary()
            ),
        ));
    }
    if second.status == ctx.t.profile.conflict {
        return Ok(Check::Pass(
            Confidence::Medium,
            format!(
                "the retry was refused with {} (the outcome is held), not answered with the stored failure",
                second.status
            ),
        ));
    }
    match (runs(before, middle), runs(middle, after)) {
        (Some(_), Some(0)) => Ok(fail(
            "the failure is not stored: the retry runs again",
            format!(
                "the retry got {} without executing: the failure was replayed",
                second.summary()
            ),
        )),
        (Some(_), Some(_)) => Ok(Check::Pass(
            Confidence::High,
            "the count oracle saw the retry execute again".into(),
        )),
        _ if first.same_answer(&second) => Ok(Check::Pass(
            Confidence::Low,
            "the retry got an identical, unmarked answer: a fresh failure or an unmarked replay look the same without a count oracle".into(),
        )),
        _ => Ok(Check::Pass(
            Confidence::Medium,
            format!("the retry got a different answer ({}), not the stored failure", second.status),
        )),
    }
}
