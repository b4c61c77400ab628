//! Unix-time keys (`--key-kind time`): a client timestamp as the key, accepted within a clock
//! skew and a maximum age, where another payload under the same key is a collision.

use super::{client_id, fail, other_body, pass_counted, runs, unix_ms, unsafe_, Case, Check, Ctx};
use crate::http::HarnessError;
use crate::suite::Confidence;
use std::time::Duration;

pub(super) const CASES: &[Case] = &[
    Case {
        id: "time/1",
        requirement: "IDEM-TIME-4",
        title: "a fresh timestamp key executes once and its retry replays; the same key with another payload is a collision: refused, never replayed, never executed",
        run: |ctx| Box::pin(collision(ctx)),
        waits: false,
    },
    Case {
        id: "time/2",
        requirement: "IDEM-TIME-2",
        title: "(needs --time-skew) a timestamp beyond the clock skew is refused and nothing executes; one inside it executes",
        run: |ctx| Box::pin(skew(ctx)),
        waits: false,
    },
    Case {
        id: "time/3",
        requirement: "IDEM-TIME-3",
        title: "(needs --time-max-age) a timestamp older than the purge horizon is refused and nothing executes",
        run: |ctx| Box::pin(stale(ctx)),
        waits: false,
    },
];

/// A time key with a client id of its own, so that runs never collide with each other.
fn key(client: &str, at: u64) -> String {
    format!("{client}:{at}")
}

/// How far past a bound the harness places a timestamp: clocks differ, and a request takes
/// time to arrive (on a loaded machine, a new TLS connection alone can take a quarter of a
/// second), so the farther the better; but a server that allows twice its bound must still
/// be caught, so it stays inside that: nine tenths of the bound, at least 250 ms.
fn margin(bound: Duration) -> u64 {
    (bound.as_millis() as u64 * 9 / 10).clamp(250, 60_000)
}

async fn collision<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let body = ctx.t.body.clone();
    let before = ctx.count().await?;
    // Taken after the oracle's reading, so that a slow oracle does not age the key.
    let k = key(&client_id(), unix_ms());
    let first = ctx
        .send("fresh timestamp", &ctx.kind_request(&k, &body, &[]))
        .await?;
    super::require_success(&first, "a request with a fresh timestamp key")?;
    let retry = ctx.send("retry", &ctx.kind_request(&k, &body, &[])).await?;
    let middle = ctx.count().await?;
    if let Some(n) = runs(before, middle).filter(|n| *n > 1) {
        return Ok(unsafe_(
            "the retry replays the stored response",
            format!("the count oracle saw {n} executions"),
        ));
    }
    if retry.is_success() && !retry.same_answer(&first) {
        return Ok(super::two_answers(
            ctx,
            &first,
            &retry,
            "the retry of a time key gets the stored response, without executing",
            format!(
                "two different success answers for one key: first: {}; retry: {}",
                first.summary(),
                retry.summary()
            ),
        ));
    }
    if !retry.is_success() {
        return Ok(super::miss(
            "IDEM-REPLAY-1",
            "the retry of a time key gets the stored response",
            format!("first: {}; retry: {}", first.summary(), retry.summary()),
        ));
    }
    let other = ctx
        .send(
            "same key, another payload",
            &ctx.kind_request(&k, &other_body(ctx.t), &[]),
        )
        .await?;
    let after = ctx.count().await?;
    if let Some(n) = runs(middle, after).filter(|n| *n > 0) {
        return Ok(fail(
            "another payload under a used time key is a collision: never executed",
            format!("it executed ({n}): {}", other.summary()),
        ));
    }
    if other.is_success() {
        return Ok(fail(
            "another payload under a used time key is refused as a collision, never replayed",
            format!("it was answered {}", other.summary()),
        ));
    }
    ctx.expect_code(&other, 422, "a collision");
    Ok(pass_counted(
        ctx,
        "executed once, replayed, and the other payload was refused without executing",
        (
            Confidence::Medium,
            "replayed, and the other payload was refused",
        ),
    ))
}

async fn skew<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let Some(skew) = ctx.t.time_skew else {
        return Ok(Check::Skip(
            "needs --time-skew: the clock skew the server allows".into(),
        ));
    };
    let client = client_id();
    let ahead = || unix_ms() + skew.as_millis() as u64 + margin(skew);
    let refused = ctx
        .expect_refusal_of(
            "a timestamp beyond the skew",
            || ctx.kind_request(&key(&client, ahead()), &ctx.t.body, &[]),
            "IDEM-TIME-2",
        )
        .await?;
    if !matches!(refused, Check::Pass(..)) {
        return Ok(refused);
    }
    let inside = unix_ms() + skew.as_millis() as u64 / 4;
    let r = ctx
        .send(
            "a timestamp inside the skew",
            &ctx.kind_request(&key(&client, inside), &ctx.t.body, &[]),
        )
        .await?;
    if !r.is_success() {
        return Ok(fail(
            "a timestamp within the skew executes",
            format!(
                "{} ms ahead: {}",
                inside.saturating_sub(unix_ms()),
                r.summary()
            ),
        ));
    }
    Ok(refused)
}

async fn stale<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let Some(max_age) = ctx.t.time_max_age else {
        return Ok(Check::Skip(
            "needs --time-max-age: the oldest timestamp the server accepts".into(),
        ));
    };
    let old = || unix_ms().saturating_sub(max_age.as_millis() as u64 + margin(max_age));
    ctx.expect_refusal_of(
        "a timestamp past the purge horizon",
        || ctx.kind_request(&key(&client_id(), old()), &ctx.t.body, &[]),
        "IDEM-TIME-3",
    )
    .await
}
