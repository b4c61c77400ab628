//! Concurrent duplicates: identical requests on separate connections, released together.

use super::{fail, runs, two_answers, unsafe_, Case, Check, Ctx, KeyHeader, Who};
use crate::http::{ms, HarnessError, Prepared, Raced, Resp};
use crate::suite::Confidence;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;

pub(super) const CASES: &[Case] = &[
    Case {
        id: "concurrent/1",
        requirement: "IDEM-CONC-1",
        title: "N identical requests on separate connections released together, several rounds: one execution per round, the rest conflict or replay",
        run: |ctx| Box::pin(duplicates(ctx)),
        waits: false,
    },
    Case {
        id: "concurrent/2",
        requirement: "IDEM-CONC-3",
        title: "an in-progress conflict answer carries Retry-After",
        run: |ctx| Box::pin(retry_after(ctx)),
        waits: false,
    },
];

/// One round: every answer, and the spread between the first and the last send.
struct Round {
    answers: Vec<Resp>,
    spread: Duration,
}

/// Opens `n` connections, prepares the same request on each, then releases all of them at
/// once through a barrier.
async fn race(
    ctx: &Ctx<'_>,
    key: &KeyHeader,
    n: usize,
    round: usize,
) -> Result<Round, HarnessError> {
    let req = ctx.request(key, &ctx.t.body, Who::A);
    let mut prepared = Vec::with_capacity(n);
    for _ in 0..n {
        prepared.push(Prepared::open(&req, ctx.http).await?);
    }
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for p in prepared {
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let sent = Instant::now();
            let result = p.send().await;
            (sent, Instant::now(), result)
        }));
    }
    let mut answers = Vec::with_capacity(n);
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut error = None;
    for (i, task) in tasks.into_iter().enumerate() {
        let (sent, answered, result) = task
            .await
            .map_err(|e| HarnessError::Protocol(format!("a sender task failed: {e}")))?;
        first = Some(first.map_or(sent, |f| f.min(sent)));
        last = Some(last.map_or(sent, |l| l.max(sent)));
        ctx.log.record_raced(
            &format!("round {round}, duplicate {}/{n}", i + 1),
            &req,
            Raced {
                round,
                connection: i + 1,
            },
            (sent, answered),
            &result,
        );
        match result {
            Ok(r) => answers.push(r),
            Err(e) => error = error.or(Some(e)),
        }
    }
    if let Some(e) = error {
        return Err(e);
    }
    let spread = match (first, last) {
        (Some(f), Some(l)) => l - f,
        _ => Duration::ZERO,
    };
    Ok(Round { answers, spread })
}

fn status_tally(answers: &[Resp]) -> String {
    let mut tally: Vec<(u16, usize)> = Vec::new();
    for a in answers {
        match tally.iter_mut().find(|(s, _)| *s == a.status) {
            Some((_, n)) => *n += 1,
            None => tally.push((a.status, 1)),
        }
    }
    tally.sort_unstable();
    tally
        .iter()
        .map(|(s, n)| format!("{s}×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn duplicates<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let n = ctx.t.concurrency.max(2);
    let rounds = ctx.t.rounds.max(1);
    let conflict = ctx.t.profile.conflict;
    let mut spreads = Vec::with_capacity(rounds);
    let mut single_success_rounds = 0;
    let mut odd_answers = false;
    for round in 1..=rounds {
        let key = ctx.fresh();
        let before = ctx.count().await?;
        let Round { answers, spread } = race(ctx, &key, n, round).await?;
        let after = ctx.count().await?;
        spreads.push(spread);
        let successes: Vec<&Resp> = answers.iter().filter(|r| r.is_success()).collect();
        let conflicts = answers.iter().filter(|r| r.status == conflict).count();
        ctx.note(format!(
            "round {round}: {} ({} succeeded, {conflicts} in progress), send spread {:.3} ms",
            status_tally(&answers),
            successes.len(),
            ms(spread)
        ));
        if let Some(runs) = runs(before, after) {
            ctx.log.record_round(round, runs);
            if runs > 1 {
                return Ok(unsafe_(
                    format!("exactly one execution for {n} identical requests"),
                    format!(
                        "round {round}: the count oracle saw {runs} executions ({})",
                        status_tally(&answers)
                    ),
                ));
            }
            if runs == 0 {
                return Ok(fail(
                    "exactly one execution",
                    format!(
                        "round {round}: the count oracle saw none ({})",
                        status_tally(&answers)
                    ),
                ));
            }
        }
        if let Some(first) = successes.first() {
            if let Some(other) = successes.iter().find(|r| !r.same_answer(first)) {
                if let Some((a, b)) = ctx.distinct_ids(first, other) {
                    return Ok(unsafe_(
                        "every success names the one resource created",
                        format!("round {round}: both {a} and {b} were created"),
                    ));
                }
                // Whatever the draft says of 409: two different successes for one key are
                // the evidence of two executions.
                return Ok(two_answers(
                    ctx,
                    first,
                    other,
                    "every answer that is not a conflict is the same response (a replay of the one execution)",
                    format!(
                        "round {round}: two different success answers for one key: {} and {} ({})",
                        first.summary(),
                        other.summary(),
                        status_tally(&answers)
                    ),
                ));
            }
        } else {
            return ctx
                .wrong_answer(
                    "IDEM-CONC-1",
                    "one request executes and succeeds",
                    format!("round {round}: none succeeded ({})", status_tally(&answers)),
                    Who::A,
                    &ctx.t.body,
                )
                .await;
        }
        if successes.len() + conflicts != answers.len() && !odd_answers {
            // Recorded once; the rounds go on, since a double execution would still count.
            odd_answers = true;
            ctx.miss(
                "IDEM-CONC-1",
                format!("the duplicates are answered {conflict} (in progress) or with the first response"),
                format!("round {round}: {}", status_tally(&answers)),
            );
        }
        if successes.len() == 1 {
            single_success_rounds += 1;
        }
    }
    let max = spreads.iter().max().copied().unwrap_or_default();
    let mut sorted = spreads.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    ctx.note(format!(
        "send spread over {rounds} rounds of {n}: median {:.3} ms, max {:.3} ms",
        ms(median),
        ms(max)
    ));
    Ok(if ctx.has_count() {
        Check::Pass(
            Confidence::High,
            format!("the count oracle saw exactly one execution in each of {rounds} rounds"),
        )
    } else if single_success_rounds == rounds {
        Check::Pass(
            Confidence::Medium,
            format!("in every round exactly one of {n} requests succeeded and the rest were refused as in progress"),
        )
    } else {
        Check::Pass(
            Confidence::Low,
            "several duplicates got identical success answers; without a count oracle the harness takes them for replays".into(),
        )
    })
}

fn valid_retry_after(v: &str) -> bool {
    let v = v.trim();
    (!v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())) || v.ends_with(" GMT")
}

async fn retry_after<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let n = ctx.t.concurrency.max(2);
    let key = ctx.fresh();
    let Round { answers, .. } = race(ctx, &key, n, 1).await?;
    let conflicts: Vec<&Resp> = answers
        .iter()
        .filter(|r| r.status == ctx.t.profile.conflict)
        .collect();
    if conflicts.is_empty() {
        return Ok(Check::Skip(format!(
            "no in-progress answer was seen among {n} duplicates ({}): the server waits, or its handler is too fast to overlap",
            status_tally(&answers)
        )));
    }
    if let Some(bad) = conflicts
        .iter()
        .find(|r| !r.header("retry-after").is_some_and(valid_retry_after))
    {
        return Ok(fail(
            format!(
                "every {} in-progress answer carries Retry-After (seconds or an HTTP date)",
                ctx.t.profile.conflict
            ),
            match bad.header("retry-after") {
                Some(v) => format!("Retry-After: {v}"),
                None => "no Retry-After header".into(),
            },
        ));
    }
    Ok(Check::Pass(
        Confidence::High,
        format!(
            "all {} in-progress answers carry Retry-After",
            conflicts.len()
        ),
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn retry_after_values() {
        assert!(super::valid_retry_after("1"));
        assert!(super::valid_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert!(!super::valid_retry_after(""));
        assert!(!super::valid_retry_after("soon"));
    }
}
