//! Server-issued tokens (`--key-kind token`): the server hands out a one-time key, the first
//! request that presents it consumes it, later ones replay; forged and expired tokens are
//! refused.

use super::{fail, pass_counted, runs, unsafe_, Case, Check, Ctx};
use crate::http::HarnessError;
use crate::suite::Confidence;

pub(super) const CASES: &[Case] = &[
    Case {
        id: "token/1",
        requirement: "IDEM-TOKEN-2",
        title: "an issued token: the first request executes, the retries replay, none executes again",
        run: |ctx| Box::pin(consumed_once(ctx)),
        waits: false,
    },
    Case {
        id: "token/2",
        requirement: "IDEM-TOKEN-3",
        title: "a forged token (an issued one with one digit changed) and an invented one: refused, nothing executes",
        run: |ctx| Box::pin(forged(ctx)),
        waits: false,
    },
    Case {
        id: "token/3",
        requirement: "IDEM-TOKEN-4",
        title: "(needs --token-ttl) a token never used until after its expiry: refused, nothing executes",
        run: |ctx| Box::pin(expired(ctx)),
        waits: true,
    },
];

async fn consumed_once<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let token = ctx.issue_token().await?;
    let body = ctx.t.body.clone();
    let before = ctx.count().await?;
    let first = ctx
        .send("first use", &ctx.kind_request(&token, &body, &[]))
        .await?;
    super::require_success(&first, "the first request with an issued token")?;
    let mut answers = Vec::new();
    for i in 1..=2 {
        answers.push(
            ctx.send(&format!("retry {i}"), &ctx.kind_request(&token, &body, &[]))
                .await?,
        );
    }
    let after = ctx.count().await?;
    if let Some(n) = runs(before, after).filter(|n| *n > 1) {
        return Ok(unsafe_(
            "a consumed token never executes again",
            format!("the count oracle saw {n} executions for one token"),
        ));
    }
    if let Some(r) = answers
        .iter()
        .find(|r| r.is_success() && !r.same_answer(&first))
    {
        return Ok(super::two_answers(
            ctx,
            &first,
            r,
            "a consumed token never executes again: its retries get the stored response",
            format!(
                "two different success answers for one token: first: {}; retry: {}",
                first.summary(),
                r.summary()
            ),
        ));
    }
    if let Some(r) = answers.iter().find(|r| !r.same_answer(&first)) {
        return Ok(fail(
            "a retry with a consumed token gets the stored response",
            format!("first: {}; retry: {}", first.summary(), r.summary()),
        ));
    }
    Ok(pass_counted(
        ctx,
        "executed once; both retries replayed (count oracle)",
        (Confidence::Medium, "both retries got the first response"),
    ))
}

/// `token` with its last hex digit changed.
fn flipped(token: &str) -> String {
    let mut t = token.to_owned();
    if let Some(last) = t.pop() {
        t.push(if last == '0' { '1' } else { '0' });
    }
    t
}

async fn forged<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let token = ctx.issue_token().await?;
    let invented = format!("tok_{}", "0".repeat(token.len().saturating_sub(4)));
    let mut last = None;
    for (label, key) in [
        ("a changed token", flipped(&token)),
        ("an invented token", invented),
    ] {
        let check = ctx
            .expect_refusal(
                label,
                &ctx.kind_request(&key, &ctx.t.body, &[]),
                "IDEM-TOKEN-3",
            )
            .await?;
        if !matches!(check, Check::Pass(..)) {
            return Ok(check);
        }
        last = Some(check);
    }
    Ok(last.unwrap_or(Check::Skip("nothing sent".into())))
}

async fn expired<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let Some(ttl) = ctx.t.token_ttl else {
        return Ok(Check::Skip(
            "needs --token-ttl: how long an issued token is valid".into(),
        ));
    };
    let token = ctx.issue_token().await?;
    let wait = ttl + ttl / 10 + std::time::Duration::from_millis(300);
    ctx.sleep("the unused token to expire (--token-ttl)", wait)
        .await;
    ctx.expect_refusal(
        "a token used after its expiry",
        &ctx.kind_request(&token, &ctx.t.body, &[]),
        "IDEM-TOKEN-4",
    )
    .await
}
