//! Expiry (opt-in): what a key means before and after the server's retention times.

use super::{fail, require_success, runs, two_answers, unsafe_, Case, Check, Ctx, Who};
use crate::http::HarnessError;
use crate::suite::Confidence;
use std::time::Duration;

pub(super) const CASES: &[Case] = &[
    Case {
        id: "expiry/1",
        requirement: "IDEM-TTL-1",
        title: "(opt-in: --response-ttl) halfway through the response retention the response still replays",
        run: |ctx| Box::pin(before_response_ttl(ctx)),
        waits: true,
    },
    Case {
        id: "expiry/2",
        requirement: "IDEM-TTL-3",
        title: "(opt-in: --response-ttl, --key-ttl) after the response retention, before the key retention: refused, not executed",
        run: |ctx| Box::pin(after_response_ttl(ctx)),
        waits: true,
    },
    Case {
        id: "expiry/3",
        requirement: "IDEM-TTL-2",
        title: "(opt-in: --key-ttl) after the key retention the key is new again: it executes",
        run: |ctx| Box::pin(after_key_ttl(ctx)),
        waits: true,
    },
];

/// How long past a deadline the harness waits before it checks it.
fn margin(ttl: Duration) -> Duration {
    Duration::from_millis(300) + ttl / 20
}

async fn before_response_ttl<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let Some(ttl) = ctx.t.response_ttl else {
        return Ok(Check::Skip(
            "opt-in: needs --response-ttl (or --ttl)".into(),
        ));
    };
    let key = ctx.fresh();
    let body = ctx.t.body.clone();
    let before = ctx.count().await?;
    let first = ctx.post("original", &key, &body).await?;
    require_success(&first, "the original request")?;
    ctx.sleep("half the response retention (--response-ttl)", ttl / 2)
        .await;
    let second = ctx
        .post("repeat at half the retention", &key, &body)
        .await?;
    let after = ctx.count().await?;
    if let Some(n) = runs(before, after).filter(|n| *n > 1) {
        return Ok(unsafe_(
            format!("replayed for the advertised {:.1} s", ttl.as_secs_f64()),
            format!(
                "forgotten after {:.1} s: the count oracle saw {n} executions",
                (ttl / 2).as_secs_f64()
            ),
        ));
    }
    if !second.is_success() {
        return ctx
            .wrong_answer(
                "IDEM-TTL-1",
                format!("replayed for the advertised {:.1} s", ttl.as_secs_f64()),
                format!(
                    "after {:.1} s the repeat was answered {}",
                    (ttl / 2).as_secs_f64(),
                    second.summary()
                ),
                Who::A,
                &body,
            )
            .await;
    }
    if !second.same_answer(&first) {
        return Ok(two_answers(
            ctx,
            &first,
            &second,
            format!("replayed for the advertised {:.1} s", ttl.as_secs_f64()),
            format!(
                "two different success answers for one key: after {:.1} s {} where the original got {}",
                (ttl / 2).as_secs_f64(),
                second.summary(),
                first.summary()
            ),
        ));
    }
    Ok(Check::Pass(
        if ctx.has_count() {
            Confidence::High
        } else {
            Confidence::Medium
        },
        format!("still replayed {:.1} s in", (ttl / 2).as_secs_f64()),
    ))
}

async fn after_response_ttl<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let (Some(response_ttl), Some(key_ttl)) = (ctx.t.response_ttl, ctx.t.key_ttl) else {
        return Ok(Check::Skip(
            "opt-in: needs --response-ttl and --key-ttl (a longer key retention)".into(),
        ));
    };
    let wait = response_ttl + margin(response_ttl);
    if key_ttl <= wait + Duration::from_millis(300) {
        return Ok(Check::Skip(
            "the key retention is not longer than the response retention (plus margin): there is no window to check".into(),
        ));
    }
    let want = idem_spec::get("IDEM-TTL-3")
        .and_then(|r| r.status)
        .unwrap_or(410);
    let key = ctx.fresh();
    let body = ctx.t.body.clone();
    let first = ctx.post("original", &key, &body).await?;
    require_success(&first, "the original request")?;
    ctx.sleep("the response retention (--response-ttl) to pass", wait)
        .await;
    let before = ctx.count().await?;
    let late = ctx.post("late retry", &key, &body).await?;
    let after = ctx.count().await?;
    if let Some(n) = runs(before, after).filter(|n| *n > 0) {
        return Ok(unsafe_(
            format!("refused with {want}: the key is still remembered, so it never executes again"),
            format!("it executed again ({n} execution(s)): {}", late.summary()),
        ));
    }
    if late.status != want {
        return Ok(fail(
            format!("refused with {want} between the response and the key retention"),
            late.summary(),
        ));
    }
    Ok(Check::Pass(
        Confidence::High,
        format!(
            "refused with {want} {:.1} s after completion",
            wait.as_secs_f64()
        ),
    ))
}

async fn after_key_ttl<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let Some(ttl) = ctx.t.key_ttl else {
        return Ok(Check::Skip("opt-in: needs --key-ttl (or --ttl)".into()));
    };
    let key = ctx.fresh();
    let body = ctx.t.body.clone();
    let first = ctx.post("original", &key, &body).await?;
    require_success(&first, "the original request")?;
    let wait = ttl + margin(ttl);
    ctx.sleep("the key retention (--key-ttl) to pass", wait)
        .await;
    let before = ctx.count().await?;
    let late = ctx.post("after the key retention", &key, &body).await?;
    let after = ctx.count().await?;
    if !late.is_success() {
        return Ok(fail(
            "after the key retention the key is new: the request executes",
            format!("{:.1} s later: {}", wait.as_secs_f64(), late.summary()),
        ));
    }
    if ctx.marked(&late) || runs(before, after) == Some(0) {
        return Ok(fail(
            "after the key retention the key is new: the request executes",
            "it was answered from the old record",
        ));
    }
    Ok(if ctx.has_count() {
        Check::Pass(Confidence::High, "executed as new (count oracle)".into())
    } else if !late.same_answer(&first) {
        Check::Pass(Confidence::Medium, "a new, unmarked response".into())
    } else {
        Check::Pass(
            Confidence::Low,
            "an unmarked success; identical to the first, so a replay cannot be ruled out".into(),
        )
    })
}
