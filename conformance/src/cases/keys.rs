//! Key validation: requests whose key is missing, empty, too long, malformed or doubled.

use super::{fail, pass_counted, runs, Check, Ctx, KeyHeader};
use crate::http::HarnessError;
use crate::suite::{Confidence, KeyStyle};
use hyper::header::HeaderValue;

/// A key of `len` characters, random enough never to collide.
fn long_key(len: usize) -> String {
    let mut s = String::with_capacity(len + 32);
    while s.len() < len {
        s.push_str(&uuid::Uuid::new_v4().simple().to_string());
    }
    s.truncate(len);
    s
}

async fn refused(ctx: &Ctx<'_>, label: &str, key: KeyHeader) -> Result<Check, HarnessError> {
    let want = ctx.t.profile.bad_key;
    let before = ctx.count().await?;
    let r = ctx.post(label, &key, &ctx.t.body).await?;
    let after = ctx.count().await?;
    let executed = runs(before, after).filter(|n| *n > 0);
    if r.status != want {
        let mut observed = r.summary();
        if let Some(n) = executed {
            observed.push_str(&format!("; the count oracle saw {n} execution(s)"));
        }
        return Ok(fail(format!("refused with {want}"), observed));
    }
    if let Some(n) = executed {
        return Ok(fail(
            "nothing executes",
            format!("refused with {want}, but the count oracle saw {n} execution(s)"),
        ));
    }
    Ok(pass_counted(
        ctx,
        "refused, and the count oracle saw no execution",
        (
            Confidence::Medium,
            "refused; without a count oracle the harness trusts that a refusal did not execute",
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

pub(super) async fn missing(ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
    if let Some(skip) = keys_optional(ctx) {
        return Ok(skip);
    }
    refused(ctx, "no key", KeyHeader::None).await
}

pub(super) async fn empty(ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
    if let Some(skip) = keys_optional(ctx) {
        return Ok(skip);
    }
    let value = match ctx.t.key_style {
        KeyStyle::SfString => HeaderValue::from_static("\"\""),
        KeyStyle::Uuid | KeyStyle::Bare => HeaderValue::from_static(""),
    };
    refused(ctx, "empty key", KeyHeader::One(value)).await
}

pub(super) async fn oversized(ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
    let key = ctx.key_value(long_key(256).as_bytes());
    refused(ctx, "256-character key", KeyHeader::One(key)).await
}

pub(super) async fn non_ascii(ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
    let mut raw = "caf\u{e9}-".as_bytes().to_vec();
    raw.extend_from_slice(ctx.new_key().as_bytes());
    refused(ctx, "non-ASCII key", KeyHeader::One(ctx.key_value(&raw))).await
}

pub(super) async fn two_keys(ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
    let a = ctx.key_value(ctx.new_key().as_bytes());
    let b = ctx.key_value(ctx.new_key().as_bytes());
    refused(ctx, "two key lines", KeyHeader::Many(vec![a, b])).await
}

pub(super) async fn longest(ctx: &Ctx<'_>) -> Result<Check, HarnessError> {
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
