//! Orphaned in-flight keys: a handler dies, and its key must not stay blocked forever.

use super::{fail, miss, require_success, Case, Check, Ctx, POLL};
use crate::http::HarnessError;
use crate::suite::Confidence;
use std::time::{Duration, Instant};

pub(super) const CASES: &[Case] = &[Case {
    id: "lease/1",
    requirement: "IDEM-LEASE-1",
    title: "(opt-in: --lease, --crash-body) a key whose handler died is taken over after the lease, not blocked forever",
    run: |ctx| Box::pin(orphan_recovers(ctx)),
    waits: true,
}];

async fn orphan_recovers<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let (Some(lease), Some(body)) = (ctx.t.lease, ctx.t.crash_body.clone()) else {
        return Ok(Check::Skip(
            "opt-in: needs --lease (the server's lease) and --crash-body (a request whose first attempt dies)".into(),
        ));
    };
    // A dying first attempt looks like a broken server unless the endpoint is known to work.
    let healthy = ctx
        .post("a normal request", &ctx.fresh(), &ctx.t.body)
        .await?;
    require_success(&healthy, "a normal request")?;
    let key = ctx.fresh();
    let started = Instant::now();
    let crash = match ctx.post("crashing request", &key, &body).await {
        Err(HarnessError::Closed(_)) => None,
        Ok(r) if r.status >= 500 => Some(r),
        Ok(r) => {
            return Err(HarnessError::Protocol(format!(
                "--crash-body must make the first attempt die (connection closed or 5xx), got {}",
                r.summary()
            )))
        }
        Err(e) => return Err(e),
    };
    let deadline = started + lease + lease / 2 + Duration::from_secs(2);
    let mut in_progress = 0u32;
    let mut wait = ctx.waiting(
        "the server's lease on the orphaned key to expire",
        deadline.saturating_duration_since(Instant::now()),
    );
    let recovered = loop {
        match ctx.post("retry", &key, &body).await {
            Ok(r) if r.status == ctx.t.profile.conflict => {
                in_progress += 1;
                if Instant::now() >= deadline {
                    return Ok(fail(
                        format!(
                            "after the lease ({:.1} s) a retry takes over the orphaned key",
                            lease.as_secs_f64()
                        ),
                        format!(
                            "still {} (in progress) {:.1} s after the handler died",
                            r.status,
                            started.elapsed().as_secs_f64()
                        ),
                    ));
                }
                wait.tick();
                tokio::time::sleep(POLL).await;
            }
            Ok(r) => break r,
            Err(HarnessError::Closed(_)) => {
                return Ok(fail(
                    "the retry that takes over is told it recovers, and completes",
                    "the retry died like a first attempt: it was not run as a recovery",
                ))
            }
            Err(e) => return Err(e),
        }
    };
    if !recovered.is_success() {
        let after = started.elapsed().as_secs_f64();
        // The first attempt answered a 5xx, and the retry got it back: the failure was
        // stored, not orphaned. Whether that is allowed is IDEM-OUT-4's question.
        let replayed = crash
            .as_ref()
            .is_some_and(|c| ctx.marked(&recovered) || c.same_answer(&recovered));
        if replayed {
            return Ok(miss(
                "IDEM-OUT-4",
                "a failed attempt's key is taken over by a retry that completes",
                format!(
                    "the failure was stored: the retry {after:.1} s after the crash got a replay of its answer, {}",
                    recovered.summary()
                ),
            ));
        }
        // The endpoint answered the normal request above: the key is what failed.
        return Ok(fail(
            format!(
                "after the lease ({:.1} s) a retry takes over the orphaned key and completes",
                lease.as_secs_f64()
            ),
            format!(
                "the retry {after:.1} s after the crash was answered {}",
                recovered.summary()
            ),
        ));
    }
    ctx.note(format!(
        "taken over {:.2} s after the crash, after {in_progress} in-progress answer(s)",
        started.elapsed().as_secs_f64()
    ));
    let again = match ctx.post("retry after recovery", &key, &body).await {
        Err(HarnessError::Closed(_)) => {
            return Ok(fail(
                "once recovered, the key replays the recovered response",
                "the next retry ran as a new first attempt and died: the recovered outcome was not kept",
            ))
        }
        other => other?,
    };
    if !again.same_answer(&recovered) {
        return Ok(fail(
            "once recovered, the key replays the recovered response",
            format!(
                "recovered: {}; then: {}",
                recovered.summary(),
                again.summary()
            ),
        ));
    }
    Ok(Check::Pass(
        Confidence::High,
        "the orphaned key was taken over after the lease and then replayed".into(),
    ))
}
