//! Wrapping counter keys (`--key-kind counter`): `client:epoch:seq` within a session the
//! client opens, a window of retained results and a low-water mark, compared in serial
//! arithmetic so that the rules hold across a wrap.

use super::{client_id, fail, other_body, pass_counted, runs, unsafe_, Case, Check, Ctx};
use crate::http::HarnessError;
use crate::suite::Confidence;
use idem_core::LOW_WATER_HEADER;

pub(super) const CASES: &[Case] = &[
    Case {
        id: "counter/1",
        requirement: "IDEM-CTR-3",
        title: "a counter key of a client without a session: refused, nothing executes",
        run: |ctx| Box::pin(unknown_client(ctx)),
        waits: false,
    },
    Case {
        id: "counter/2",
        requirement: "IDEM-CTR-8",
        title: "open a session; the next numbers execute once each, and a retry inside the window replays",
        run: |ctx| Box::pin(next_numbers(ctx)),
        waits: false,
    },
    Case {
        id: "counter/3",
        requirement: "IDEM-CTR-7",
        title: "a number inside the window with another payload is a collision: refused, nothing executes",
        run: |ctx| Box::pin(collision(ctx)),
        waits: false,
    },
    Case {
        id: "counter/4",
        requirement: "IDEM-CTR-6",
        title: "after the low-water mark moved past it, an old number is stale: refused, never executed again",
        run: |ctx| Box::pin(stale(ctx)),
        waits: false,
    },
    Case {
        id: "counter/5",
        requirement: "IDEM-CTR-9",
        title: "(needs --counter-window) a number that skips a whole window is refused, nothing executes",
        run: |ctx| Box::pin(gap(ctx)),
        waits: false,
    },
    Case {
        id: "counter/6",
        requirement: "IDEM-CTR-2",
        title: "(--counter-bits 12 or less) one client's numbers wrap around: each executes once, and a wrapped number onto a retained slot with another payload is refused",
        run: |ctx| Box::pin(wrap(ctx)),
        waits: false,
    },
    Case {
        id: "counter/7",
        requirement: "IDEM-CTR-5",
        title: "reopening a session moves it to a new epoch: the old epoch is refused, the new one executes",
        run: |ctx| Box::pin(new_epoch(ctx)),
        waits: false,
    },
];

/// The most requests the wrap case sends: 2^12 and a window.
const MAX_WRAP_BITS: u8 = 12;

/// A session: the client and its epoch.
struct Session {
    client: String,
    epoch: String,
}

impl Session {
    async fn open(ctx: &Ctx<'_>) -> Result<Session, HarnessError> {
        let client = client_id();
        let epoch = ctx.open_session(&client, 0).await?;
        Ok(Session { client, epoch })
    }

    fn key(&self, seq: u64) -> String {
        format!("{}:{}:{seq}", self.client, self.epoch)
    }
}

fn low_water(mark: u64) -> [(&'static str, String); 1] {
    [(LOW_WATER_HEADER, mark.to_string())]
}

async fn unknown_client<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let key = format!("{}:1:0", client_id());
    ctx.expect_refusal(
        "a client without a session",
        &ctx.kind_request(&key, &ctx.t.body, &[]),
        "IDEM-CTR-3",
    )
    .await
}

/// Sends numbers `0..n` of `s` once each, each expected to execute.
async fn run_numbers(ctx: &Ctx<'_>, s: &Session, n: u64) -> Result<Option<Check>, HarnessError> {
    answer_numbers(ctx, s, n).await.map(|r| r.err())
}

/// Sends numbers `0..n` of `s`: their answers, or the check when one does not succeed.
async fn answer_numbers(
    ctx: &Ctx<'_>,
    s: &Session,
    n: u64,
) -> Result<Result<Vec<crate::http::Resp>, Check>, HarnessError> {
    let mut answers = Vec::new();
    for seq in 0..n {
        let r = ctx
            .send(
                &format!("number {seq}"),
                &ctx.kind_request(&s.key(seq), &ctx.t.body, &[]),
            )
            .await?;
        if !r.is_success() {
            return Ok(Err(super::miss(
                "IDEM-CTR-8",
                "the next number of an open session executes",
                format!("number {seq} was answered {}", r.summary()),
            )));
        }
        answers.push(r);
    }
    Ok(Ok(answers))
}

async fn next_numbers<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let s = Session::open(ctx).await?;
    let before = ctx.count().await?;
    let answers = match answer_numbers(ctx, &s, 3).await? {
        Ok(answers) => answers,
        Err(missed) => return Ok(missed),
    };
    let retry = ctx
        .send(
            "retry of number 1",
            &ctx.kind_request(&s.key(1), &ctx.t.body, &[]),
        )
        .await?;
    let after = ctx.count().await?;
    match runs(before, after) {
        Some(n) if n > 3 => {
            return Ok(unsafe_(
                "three numbers and one retry: three executions",
                format!("the count oracle saw {n}"),
            ))
        }
        Some(n) if n < 3 => {
            return Ok(fail(
                "each of three numbers executes",
                format!("the count oracle saw {n} executions"),
            ))
        }
        _ => {}
    }
    if retry.is_success() && !retry.same_answer(&answers[1]) {
        return Ok(super::two_answers(
            ctx,
            &answers[1],
            &retry,
            "a retry of a number in the window gets its stored response, without executing",
            format!(
                "two different success answers for one key: number 1: {}; its retry: {}",
                answers[1].summary(),
                retry.summary()
            ),
        ));
    }
    if !retry.is_success() {
        return Ok(super::miss(
            "IDEM-CTR-7",
            "a retry of a number in the window gets its stored response",
            retry.summary(),
        ));
    }
    Ok(pass_counted(
        ctx,
        "three numbers executed once each, the retry replayed (count oracle)",
        (Confidence::Medium, "three numbers answered, the retry too"),
    ))
}

async fn collision<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let s = Session::open(ctx).await?;
    if let Some(missed) = run_numbers(ctx, &s, 2).await? {
        return Ok(missed);
    }
    ctx.expect_refusal(
        "number 1 again, with another payload",
        &ctx.kind_request(&s.key(1), &other_body(ctx.t), &[]),
        "IDEM-CTR-7",
    )
    .await
}

async fn stale<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let s = Session::open(ctx).await?;
    if let Some(missed) = run_numbers(ctx, &s, 2).await? {
        return Ok(missed);
    }
    // Every response below 2 was received.
    let r = ctx
        .send(
            "number 2, low-water mark 2",
            &ctx.kind_request(&s.key(2), &ctx.t.body, &low_water(2)),
        )
        .await?;
    if !r.is_success() {
        return Ok(super::miss(
            "IDEM-CTR-11",
            "a low-water mark at the next number is accepted",
            r.summary(),
        ));
    }
    ctx.expect_refusal(
        "number 0, below the mark",
        &ctx.kind_request(&s.key(0), &ctx.t.body, &[]),
        "IDEM-CTR-6",
    )
    .await
}

async fn gap<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let Some(window) = ctx.t.counter_window else {
        return Ok(Check::Skip(
            "needs --counter-window: the server's window".into(),
        ));
    };
    let s = Session::open(ctx).await?;
    ctx.expect_refusal(
        "a number a whole window ahead",
        &ctx.kind_request(&s.key(u64::from(window)), &ctx.t.body, &[]),
        "IDEM-CTR-9",
    )
    .await
}

async fn wrap<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let bits = ctx.t.counter_bits;
    if bits > MAX_WRAP_BITS {
        return Ok(Check::Skip(format!(
            "the counters have {bits} bits: a wrap takes 2^{bits} requests; run with a server and --counter-bits of {MAX_WRAP_BITS} or less"
        )));
    }
    let modulus = 1u64 << bits;
    let s = Session::open(ctx).await?;
    let total = modulus + modulus / 4;
    let before = ctx.count().await?;
    let mut wait = ctx.waiting(
        format!("{total} sequential requests across the wrap"),
        ctx.t.timeout * total as u32,
    );
    for i in 0..total {
        let seq = i % modulus;
        // The client has every response before this one.
        let r = ctx
            .send(
                &format!("request {i} (number {seq})"),
                &ctx.kind_request(&s.key(seq), &ctx.t.body, &low_water(seq)),
            )
            .await?;
        if !r.is_success() {
            return Ok(fail(
                "every number executes as the counter wraps",
                format!("request {i} (number {seq}) was answered {}", r.summary()),
            ));
        }
        wait.tick();
    }
    let last = (total - 1) % modulus;
    let middle = ctx.count().await?;
    if let Some(n) = runs(before, middle).filter(|n| *n != total) {
        return Ok(if n > total {
            unsafe_(
                format!("{total} numbers, {total} executions"),
                format!("the count oracle saw {n}"),
            )
        } else {
            fail(
                format!("{total} numbers, {total} executions"),
                format!("the count oracle saw {n}"),
            )
        });
    }
    // The last number is retained: a wrapped client sending it with another payload
    // collides.
    ctx.expect_refusal(
        "the retained last number, with another payload",
        &ctx.kind_request(&s.key(last), &super::other_body(ctx.t), &low_water(last)),
        "IDEM-CTR-7",
    )
    .await
}

async fn new_epoch<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let s = Session::open(ctx).await?;
    if let Some(missed) = run_numbers(ctx, &s, 1).await? {
        return Ok(missed);
    }
    let epoch = ctx.open_session(&s.client, 5).await?;
    if epoch == s.epoch {
        return Ok(fail(
            "reopening a live session moves it to a new epoch",
            format!("the epoch stayed {epoch}"),
        ));
    }
    let old = ctx
        .expect_refusal(
            "the old epoch's next number",
            &ctx.kind_request(&s.key(5), &ctx.t.body, &[]),
            "IDEM-CTR-4",
        )
        .await?;
    if !matches!(old, Check::Pass(..)) {
        return Ok(old);
    }
    let renewed = Session {
        client: s.client,
        epoch,
    };
    let r = ctx
        .send(
            "the new epoch's first number",
            &ctx.kind_request(&renewed.key(5), &ctx.t.body, &[]),
        )
        .await?;
    if !r.is_success() {
        return Ok(fail("the new epoch's first number executes", r.summary()));
    }
    Ok(old)
}
