//! Replay of a completed request: its status and body, its marker, its headers.

use super::{
    fail, pass_counted, require_success, runs, two_answers, unsafe_, Case, Check, Ctx, Who,
};
use crate::http::{HarnessError, Resp};
use crate::suite::Confidence;

pub(super) const CASES: &[Case] = &[
    Case {
        id: "replay/1",
        requirement: "IDEM-REPLAY-1",
        title: "repeat a completed request: the same status and body, no second execution",
        run: |ctx| Box::pin(replay(ctx)),
        waits: false,
    },
    Case {
        id: "replay/2",
        requirement: "IDEM-REPLAY-2",
        title: "the replay carries the profile's replay marker, the first response does not",
        run: |ctx| Box::pin(marker(ctx)),
        waits: false,
    },
    Case {
        id: "replay/3",
        requirement: "IDEM-REPLAY-4",
        title: "the replay carries the first response's headers (Location, Set-Cookie, the application's own) byte for byte",
        run: |ctx| Box::pin(headers(ctx)),
        waits: false,
    },
];

/// A completed request and its repeat with the same key.
struct Repeat {
    first: Resp,
    second: Resp,
    /// Executions the count oracle saw for both, if there is one.
    executions: Option<u64>,
}

/// The original and its repeat, once the repeat is known to be a success; a repeat that is
/// not one is judged as a wrong answer (or, if the endpoint refuses any such request, an
/// error).
async fn original_and_repeat<'c>(ctx: &'c Ctx<'c>) -> Result<Result<Repeat, Check>, HarnessError> {
    let key = ctx.fresh();
    let body = ctx.t.body.clone();
    let before = ctx.count().await?;
    let first = ctx.post("original", &key, &body).await?;
    require_success(&first, "the original request")?;
    let second = ctx.post("repeat", &key, &body).await?;
    let executions = runs(before, ctx.count().await?);
    if !second.is_success() {
        let check = ctx
            .wrong_answer(
                "IDEM-REPLAY-1",
                "the repeat of a completed request gets its stored response",
                format!(
                    "the original got {}; the repeat was answered {}",
                    first.status,
                    second.summary()
                ),
                Who::A,
                &body,
            )
            .await?;
        return Ok(Err(check));
    }
    Ok(Ok(Repeat {
        first,
        second,
        executions,
    }))
}

async fn replay<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let Repeat {
        first,
        second,
        executions,
    } = match original_and_repeat(ctx).await? {
        Ok(repeat) => repeat,
        Err(check) => return Ok(check),
    };
    if let Some(n) = executions.filter(|n| *n > 1) {
        return Ok(unsafe_(
            "the repeat is answered from the stored response, without executing",
            format!("the count oracle saw {n} executions"),
        ));
    }
    if !first.same_answer(&second) {
        if let Some((a, b)) = ctx.distinct_ids(&first, &second) {
            return Ok(unsafe_(
                "the repeat names the resource created by the original",
                format!("the original created {a}, the repeat {b}"),
            ));
        }
        return Ok(two_answers(
            ctx,
            &first,
            &second,
            "the repeat gets the stored status and body, byte for byte, without executing",
            format!(
                "two different success answers for one key: original: {}; repeat: {}",
                first.summary(),
                second.summary()
            ),
        ));
    }
    Ok(pass_counted(
        ctx,
        "same status and body; the count oracle saw one execution",
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

async fn marker<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let Some((name, value)) = ctx.t.profile.replay_marker.clone() else {
        return Ok(Check::Skip("the profile expects no replay marker".into()));
    };
    let Repeat { first, second, .. } = match original_and_repeat(ctx).await? {
        Ok(repeat) => repeat,
        Err(check) => return Ok(check),
    };
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

/// Response headers that describe the connection, the message framing or the moment of
/// sending, or that servers compute for every response: a replay need not repeat them.
const PER_RESPONSE: &[&str] = &[
    "date",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "age",
    "server-timing",
    "x-response-time",
    "x-request-id",
    "request-id",
    "x-correlation-id",
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
];

/// The values of header `name` in `r`, in order.
fn values<'r>(r: &'r Resp, name: &str) -> Vec<&'r str> {
    r.headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect()
}

/// How a header's values are shown: cookies only by count, never by value.
fn shown(name: &str, vs: &[&str]) -> String {
    if name.eq_ignore_ascii_case("set-cookie") {
        format!("{} value(s)", vs.len())
    } else if vs.is_empty() {
        "absent".into()
    } else {
        vs.iter()
            .map(|v| format!("{v:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

async fn headers<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let Repeat { first, second, .. } = match original_and_repeat(ctx).await? {
        Ok(repeat) => repeat,
        Err(check) => return Ok(check),
    };
    if !first.same_answer(&second) {
        return Ok(Check::Skip(format!(
            "the repeat is not a replay of the original (original: {}; repeat: {}): replay/1 judges that; headers are compared only on a replay",
            first.summary(),
            second.summary()
        )));
    }
    let marker = ctx
        .t
        .profile
        .replay_marker
        .as_ref()
        .map(|(n, _)| n.as_str());
    let mut names: Vec<&str> = Vec::new();
    for (n, _) in &first.headers {
        let skip = PER_RESPONSE.iter().any(|p| n.eq_ignore_ascii_case(p))
            || marker.is_some_and(|m| n.eq_ignore_ascii_case(m));
        if !skip && !names.iter().any(|m| m.eq_ignore_ascii_case(n)) {
            names.push(n);
        }
    }
    let differing: Vec<String> = names
        .iter()
        .filter_map(|n| {
            let (a, b) = (values(&first, n), values(&second, n));
            (a != b).then(|| format!("{n}: {} then {}", shown(n, &a), shown(n, &b)))
        })
        .collect();
    if !differing.is_empty() {
        return Ok(fail(
            "the replay repeats the first response's headers, byte for byte",
            differing.join("; "),
        ));
    }
    let compared = names.join(", ");
    Ok(
        if names
            .iter()
            .any(|n| !n.eq_ignore_ascii_case("content-type"))
        {
            Check::Pass(
                Confidence::High,
                format!("the replay repeats every header of the first response ({compared})"),
            )
        } else {
            Check::Pass(
                Confidence::Low,
                format!("the first response carried only {compared}; there was little to compare"),
            )
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_shown_by_count_only() {
        assert_eq!(shown("Set-Cookie", &["sid=secret"]), "1 value(s)");
        assert_eq!(shown("location", &["/a"]), "\"/a\"");
        assert_eq!(shown("location", &[]), "absent");
    }
}
