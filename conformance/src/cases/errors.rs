//! Error responses: which are stored and replayed, which release the key.

use super::{fail, miss, problem_type, runs, Case, Check, Ctx};
use crate::http::{HarnessError, Resp};
use crate::suite::Confidence;

pub(super) const CASES: &[Case] = &[
    Case {
        id: "errors/1",
        requirement: "IDEM-REPLAY-3",
        title: "a deterministic 4xx (--decline-body) is stored: the retry replays it without executing",
        run: |ctx| Box::pin(decline_replayed(ctx)),
        waits: false,
    },
    Case {
        id: "errors/2",
        requirement: "IDEM-OUT-4",
        title: "a retryable failure (--fail-body, 5xx/408/425/429): the retry runs again, or (5xx) is held as outcome-unknown; a replayed 5xx is accepted where the profile allows it",
        run: |ctx| Box::pin(failure_not_stored(ctx)),
        waits: false,
    },
];

/// Answers after which the handler did nothing: the key must be released (`IDEM-OUT-2`).
fn released(status: u16) -> bool {
    matches!(status, 408 | 425 | 429)
}

fn retryable(status: u16) -> bool {
    released(status) || (500..600).contains(&status)
}

async fn decline_replayed<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
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
    // A declined request that runs again has done nothing twice: a miss of the requirement,
    // graded by the profile, not a double execution.
    if let Some(n) = runs(before, after).filter(|n| *n > 1) {
        return Ok(fail(
            "the retry replays the stored 4xx without executing",
            format!(
                "the 4xx was not stored: the retry ran again (the count oracle saw {n} executions) and got {}",
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

/// A failure was stored and replayed: for 408/425/429 a miss of `IDEM-OUT-2` (the key must
/// be released), for a 5xx a miss of the case's own requirement, which the profile grades.
fn replayed_failure(first: &Resp, second: &Resp, how: &str) -> Check {
    if released(first.status) {
        miss(
            "IDEM-OUT-2",
            format!(
                "a {} releases the key: the retry executes as new",
                first.status
            ),
            format!("the retry got {} {how}", second.summary()),
        )
    } else {
        fail(
            "a 5xx is not stored: the retry runs again or is held as outcome-unknown",
            format!(
                "the {} was stored: the retry got {} {how}",
                first.status,
                second.summary()
            ),
        )
    }
}

async fn failure_not_stored<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
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
    let mut second: Resp = ctx.post("retry", &key, &body).await?;
    let unknown = super::spec("IDEM-OUT-3").problem.as_deref();
    let held = |r: &Resp| {
        (500..600).contains(&first.status)
            && r.status == ctx.t.profile.conflict
            && problem_type(r).as_deref() == unknown
    };
    if held(&second) {
        return Ok(Check::Pass(
            Confidence::Medium,
            format!(
                "the outcome of the {} is held: the retry was refused with {} and the outcome-unknown problem type",
                first.status, second.status
            ),
        ));
    }
    if second.status == ctx.t.profile.conflict {
        // The attempt has answered; a server may still be releasing its key. Give it the
        // settle window before calling the key stuck.
        second = ctx.settle("retry (polled)", &key, &body).await?;
        if held(&second) {
            return Ok(Check::Pass(
                Confidence::Medium,
                format!(
                    "the outcome of the {} is held with the outcome-unknown problem type",
                    first.status
                ),
            ));
        }
        if second.status == ctx.t.profile.conflict {
            let observed = format!(
                "the retry is still refused as in progress after the attempt answered {}: {}",
                first.status,
                second.summary()
            );
            return Ok(if released(first.status) {
                miss(
                    "IDEM-OUT-2",
                    format!(
                        "a {} releases the key: the retry executes as new",
                        first.status
                    ),
                    observed,
                )
            } else {
                miss(
                    "IDEM-OUT-6",
                    "a retry after a failed attempt is never refused as in progress: it runs again, gets the stored answer, or is held with the outcome-unknown type",
                    observed,
                )
            });
        }
    }
    let after = ctx.count().await?;
    if ctx.marked(&second) {
        return Ok(replayed_failure(&first, &second, "marked as a replay"));
    }
    match (runs(before, middle), runs(middle, after)) {
        (Some(_), Some(0)) if first.same_answer(&second) => Ok(replayed_failure(
            &first,
            &second,
            "without executing: the failure was replayed",
        )),
        (Some(_), Some(0)) => Ok(miss(
            "IDEM-OUT-6",
            "the retry runs again, gets the stored answer, or is held with the outcome-unknown type",
            format!(
                "the retry got {} without executing: neither the stored failure ({}) nor a new attempt",
                second.summary(),
                first.status
            ),
        )),
        (Some(_), Some(_)) => Ok(Check::Pass(
            Confidence::High,
            format!(
                "the count oracle saw the retry execute again; it got {}",
                second.status
            ),
        )),
        // A refusal is neither the stored failure nor a new attempt.
        _ if !second.is_success() && !retryable(second.status) => Ok(miss(
            "IDEM-OUT-6",
            "the retry runs again, gets the stored answer, or is held with the outcome-unknown type",
            format!(
                "the retry was refused: {}; neither the stored failure ({}) nor a new attempt",
                second.summary(),
                first.status
            ),
        )),
        _ if first.same_answer(&second) => Ok(Check::Pass(
            Confidence::Low,
            "the retry got an identical, unmarked answer: a fresh failure or an unmarked replay look the same without a count oracle".into(),
        )),
        _ => Ok(Check::Pass(
            Confidence::Medium,
            format!(
                "the retry got a different answer ({}), not the stored failure",
                second.status
            ),
        )),
    }
}
