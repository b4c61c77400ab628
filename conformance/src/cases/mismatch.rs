//! Payload mismatch: one key, two different requests.

use super::{fail, pass_counted, require_success, runs, unsafe_, Case, Check, Ctx};
use crate::http::HarnessError;
use crate::suite::Confidence;
use bytes::Bytes;

pub(super) const CASES: &[Case] = &[Case {
    id: "mismatch/1",
    requirement: "IDEM-FP-1",
    title: "reuse a key with a changed body: refused, nothing executes, the original still replays unchanged",
    run: |ctx| Box::pin(mismatch(ctx)),
    waits: false,
}];

/// A body that differs from `body`: a JSON object or array gains a member, anything else
/// gains a suffix.
pub(crate) fn changed(body: &[u8]) -> Bytes {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(mut map)) => {
            map.insert(
                "idem_conformance_variant".into(),
                serde_json::Value::String("changed".into()),
            );
            Bytes::from(serde_json::Value::Object(map).to_string())
        }
        Ok(serde_json::Value::Array(mut items)) => {
            items.push(serde_json::Value::String("idem-conformance-variant".into()));
            Bytes::from(serde_json::Value::Array(items).to_string())
        }
        _ => {
            let mut b = body.to_vec();
            b.extend_from_slice(b" (changed)");
            Bytes::from(b)
        }
    }
}

async fn mismatch<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let key = ctx.fresh();
    let body = ctx.t.body.clone();
    let other = ctx
        .t
        .mismatch_body
        .clone()
        .unwrap_or_else(|| changed(&body));
    let original = ctx.post("original", &key, &body).await?;
    require_success(&original, "the original request")?;
    let before = ctx.count().await?;
    let changed = ctx.post("same key, changed body", &key, &other).await?;
    let middle = ctx.count().await?;
    let again = ctx.post("original again", &key, &body).await?;
    let after = ctx.count().await?;
    if let Some(n) = runs(before, middle).filter(|n| *n > 0) {
        return Ok(fail(
            "the request with the changed body is refused and does not execute",
            format!(
                "it executed ({n} execution(s) on the count oracle) and was answered {}",
                changed.summary()
            ),
        ));
    }
    if changed.is_success() {
        let observed = if changed.same_answer(&original) {
            format!(
                "{}: the original's response was replayed for a different request",
                changed.status
            )
        } else {
            format!("{}: it was answered as a success", changed.summary())
        };
        return Ok(fail(
            "the request with the changed body is refused",
            observed,
        ));
    }
    ctx.expect_code(
        &changed,
        ctx.t.profile.mismatch,
        "a key reused with a different payload",
    );
    if let Some(n) = runs(middle, after).filter(|n| *n > 0) {
        return Ok(unsafe_(
            "the original request still replays without executing",
            format!(
                "the count oracle saw it execute again ({n}): {}",
                again.summary()
            ),
        ));
    }
    if !again.same_answer(&original) {
        return Ok(fail(
            "the original request still replays unchanged",
            format!(
                "original: {}; afterwards: {}",
                original.summary(),
                again.summary()
            ),
        ));
    }
    Ok(pass_counted(
        ctx,
        "refused, nothing executed (count oracle), the original still replays",
        (
            Confidence::Medium,
            "refused and the original still replays; without a count oracle the harness trusts that a refusal did not execute",
        ),
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn changed_bodies_differ() {
        for b in [&br#"{"a":1}"#[..], b"[1]", b"plain", b""] {
            assert_ne!(&super::changed(b)[..], b);
        }
    }
}
