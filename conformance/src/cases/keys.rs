//! Key validation: requests whose key is missing, empty, too long, malformed or doubled, and
//! the longest key that must be accepted.

use super::{fail, pass_counted, runs, Case, Check, Ctx, KeyHeader};
use crate::http::HarnessError;
use crate::suite::{Confidence, KeyStyle};
use hyper::header::HeaderValue;

pub(super) const CASES: &[Case] = &[
    Case {
        id: "keys/1",
        requirement: "IDEM-KEY-3",
        title: "no key header: refused, nothing executes",
        run: |ctx| Box::pin(missing(ctx)),
        waits: false,
    },
    Case {
        id: "keys/2",
        requirement: "IDEM-KEY-3",
        title: "an empty key: refused, nothing executes",
        run: |ctx| Box::pin(empty(ctx)),
        waits: false,
    },
    Case {
        id: "keys/3",
        requirement: "IDEM-KEY-6",
        title: "a key of 256 characters: refused, nothing executes",
        run: |ctx| Box::pin(oversized(ctx)),
        waits: false,
    },
    Case {
        id: "keys/4",
        requirement: "IDEM-KEY-1",
        title: "a key with non-ASCII bytes: refused, nothing executes",
        run: |ctx| Box::pin(non_ascii(ctx)),
        waits: false,
    },
    Case {
        id: "keys/5",
        requirement: "IDEM-KEY-5",
        title: "two key header lines: refused, nothing executes",
        run: |ctx| Box::pin(two_keys(ctx)),
        waits: false,
    },
    Case {
        id: "keys/6",
        requirement: "IDEM-KEY-6",
        title: "a key of exactly 255 characters in the key style: accepted and executed (skipped for --key-style uuid)",
        run: |ctx| Box::pin(longest(ctx)),
        waits: false,
    },
];

/// A key of `len` characters, random enough never to collide.
fn long_key(len: usize) -> String {
    let mut s = String::with_capacity(len + 32);
    while s.len() < len {
        s.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    s.truncate(len);
    s
}

/// Sends `key` and expects a refusal that executes nothing. A refusal with another 4xx than
/// the profile's holds the case's requirement and misses `IDEM-HTTP-1`.
async fn refused<'c>(ctx: &'c Ctx<'c>, label: &str, key: KeyHeader) -> Result<Check, HarnessError> {
    let want = ctx.t.profile.bad_key;
    let before = ctx.count().await?;
    let r = ctx.post(label, &key, &ctx.t.body).await?;
    let after = ctx.count().await?;
    let executed = runs(before, after).filter(|n| *n > 0);
    if let Some(n) = executed {
        return Ok(fail(
            format!("refused with {want}; nothing executes"),
            format!(
                "answered {}, and the count oracle saw {n} execution(s)",
                r.summary()
            ),
        ));
    }
    if !(400..500).contains(&r.status) {
        return Ok(fail(
            format!("refused with {want}"),
            if r.is_success() {
                format!("accepted: {}", r.summary())
            } else {
                r.summary()
            },
        ));
    }
    ctx.expect_code(&r, want, label);
    Ok(pass_counted(
        ctx,
        &format!("refused with {}, and the count oracle saw no execution", r.status),
        (
            Confidence::Medium,
            &format!(
                "refused with {}; without a count oracle the harness trusts that a refusal did not execute",
                r.status
            ),
        ),
    ))
}

fn keys_optional(ctx: &Ctx<'_>) -> Option<Check> {
    (!ctx.t.profile.keys_required).then(|| {
        Check::Skip(format!(
            "the {} profile does not require keys",
            ctx.t.profile.name
        ))
    })
}

async fn missing<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    if let Some(skip) = keys_optional(ctx) {
        return Ok(skip);
    }
    refused(ctx, "no key", KeyHeader::None).await
}

async fn empty<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    if let Some(skip) = keys_optional(ctx) {
        return Ok(skip);
    }
    let value = match ctx.t.key_style {
        KeyStyle::SfString => HeaderValue::from_static("\"\""),
        KeyStyle::Uuid | KeyStyle::Bare => HeaderValue::from_static(""),
    };
    refused(ctx, "empty key", KeyHeader::One(value)).await
}

async fn oversized<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let key = ctx.key_value(long_key(256).as_bytes());
    refused(ctx, "256-character key", KeyHeader::One(key)).await
}

async fn non_ascii<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let mut raw = "caf\u{e9}-".as_bytes().to_vec();
    raw.extend_from_slice(ctx.new_key().as_bytes());
    refused(ctx, "non-ASCII key", KeyHeader::One(ctx.key_value(&raw))).await
}

async fn two_keys<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    let a = ctx.key_value(ctx.new_key().as_bytes());
    let b = ctx.key_value(ctx.new_key().as_bytes());
    refused(ctx, "two key lines", KeyHeader::Many(vec![a, b])).await
}

async fn longest<'c>(ctx: &'c Ctx<'c>) -> Result<Check, HarnessError> {
    if ctx.t.key_style == KeyStyle::Uuid {
        return Ok(Check::Skip(
            "--key-style uuid: a UUID has 36 characters, so a 255-character key is not one the server must accept".into(),
        ));
    }
    let key = KeyHeader::One(ctx.key_value(long_key(255).as_bytes()));
    let before = ctx.count().await?;
    let r = ctx.post("255-character key", &key, &ctx.t.body).await?;
    let after = ctx.count().await?;
    if !r.is_success() {
        return Ok(fail(
            "a key of 255 characters is accepted and the request executes",
            r.summary(),
        ));
    }
    if runs(before, after) == Some(0) {
        return Ok(fail(
            "the request executes",
            "it succeeded, but the count oracle saw no execution",
        ));
    }
    Ok(pass_counted(
        ctx,
        "accepted and executed once",
        (Confidence::Medium, "accepted with a success answer"),
    ))
}
