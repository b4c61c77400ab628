//! Replay of a completed request.

use super::{fail, pass_counted, require_success, runs, unsafe_, Check, Ctx};
use crate::http::{HarnessError, Resp};
use crate::suite::Confidence;

/// Response headers whose values a replay keeps.
const KEPT_HEADERS: &[&str] = &["content-type", "location"];

fn differing_header(a: &Resp, b: &Resp) -> Option<String> {
    KEPT_HEADERS.iter().find_map(|h| {
        let (x, y) = (a.header(h), b.header(h));
        (x.is_some() && x != y).then(|| format!("{h}: {x:?} then {y:?}"))
    })
}

pub(super) async fn replay(ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
    let key = ctx.fresh();
    let body = ctx.t.body.clone();
    let before = ctx.count().await?;
    let first = ctx.post("original", &key, &body).await?;
    require_success(&first, "the original request")?;
    let second = ctx.post("repeat", &key, &body).await?;
    let after = ctx.count().await?;
    if let Some(n) = runs(before, after) {
        if n > 1 {
            return Ok(unsafe_(
                "the repeat is answered from the stored response, without executing",
                format!("the count oracle saw {n} executions"),
            ));
        }
    }
    if !first.same_answer(&second) {
        if let Some((a, b)) = ctx.distinct_ids(&first, &second) {
            return Ok(unsafe_(
                "the repeat names the resource created by the original",
                format!("the original created {a}, the repeat {b}"),
            ));
        }
        return Ok(fail(
            "the repeat gets the stored status and body, byte for byte",
            format!(
                "original: {}; repeat: {}",
                first.summary(),
                second.summary()
            ),
        ));
    }
    if let Some(d) = differing_header(&first, &second) {
        return Ok(fail("the repeat gets the stored headers", d));
    }
    Ok(pass_counted(
        ctx,
        "same status, headers and body; the count oracle saw one execution",
        if ctx.marked(&second) {
            (
                Confidence::Medium,
                "same status and body, and the repeat is marked as a replay",
            )
        } else {
            (
                Confidence::Low,
                "same status and body; without an oracle or marker a deterministic re-execution would look the same",
            )
        },
    ))
}

pub(super) async fn marker(ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
    let Some((name, value)) = ctx.t.profile.replay_marker.clone() else {
        return Ok(Check::Skip("the profile expects no replay marker".into()));
    };
    let key = ctx.fresh();
    let body = ctx.t.body.clone();
    let first = ctx.post("original", &key, &body).await?;
    require_success(&first, "the original request")?;
    let second = ctx.post("repeat", &key, &body).await?;
    require_success(&second, "the repeat")?;
    if ctx.marked(&first) {
        return Ok(fail(
            format!("only replays carry {name}: {value}"),
            "the first, executed response carries it too",
        ));
    }
    if !ctx.marked(&second) {
        return Ok(fail(
            format!("the replay carries {name}: {value}"),
            match second.header(&name) {
                Some(v) => format!("{name}: {v}"),
                None => format!("no {name} header"),
            },
        ));
    }
    Ok(Check::Pass(
        Confidence::High,
        format!("the replay carries {name}: {value}, the original does not"),
    ))
}
