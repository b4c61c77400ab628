//! Cross-principal isolation: a key belongs to one principal.

use super::{fail, require_success, runs, Case, Check, Ctx, Who};
use crate::http::HarnessError;
use crate::suite::Confidence;

pub(super) const CASES: &[Case] = &[Case {
    id: "scope/1",
    requirement: "IDEM-SCOPE-1",
    title: "key K under credential A, then K under credential B: B never gets A's response",
    run: |ctx| Box::pin(cross_principal(ctx)),
    waits: false,
}];

async fn cross_principal<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    if ctx.t.second_credential.is_empty() {
        return Ok(Check::Skip(
            "needs --second-credential: the header of another principal".into(),
        ));
    }
    let key = ctx.fresh();
    let body = ctx.t.body.clone();
    let a = ctx.post("principal A", &key, &body).await?;
    require_success(&a, "principal A's request")?;
    let before = ctx.count().await?;
    let b = ctx
        .send("principal B, same key", &ctx.request(&key, &body, Who::B))
        .await?;
    let after = ctx.count().await?;
    if b.same_answer(&a) || ctx.marked(&b) {
        return Ok(fail(
            "principal B's request is independent of A's: it executes on its own",
            format!("B received A's response: {}", b.summary()),
        ));
    }
    if b.status == ctx.t.profile.conflict || b.status == ctx.t.profile.mismatch {
        return Ok(fail(
            "a key never reports a conflict or mismatch across principals",
            format!("B was refused: {}", b.summary()),
        ));
    }
    if !b.is_success() {
        return ctx
            .wrong_answer(
                "IDEM-SCOPE-1",
                "principal B's request executes on its own, as if the key were new",
                format!("B was answered {}", b.summary()),
                Who::B,
                &body,
            )
            .await;
    }
    if let (Some(x), Some(y)) = (ctx.resource_id(&a), ctx.resource_id(&b)) {
        if x == y {
            return Ok(fail(
                "principal B gets its own resource",
                format!("both name {x}"),
            ));
        }
    }
    match runs(before, after) {
        Some(0) => Ok(fail(
            "principal B's request executes",
            "the count oracle saw no execution for it",
        )),
        Some(_) => Ok(Check::Pass(
            Confidence::High,
            "B's request executed on its own (count oracle) and got its own response".into(),
        )),
        None => Ok(Check::Pass(
            Confidence::Medium,
            "B got a different, unmarked success response".into(),
        )),
    }
}
