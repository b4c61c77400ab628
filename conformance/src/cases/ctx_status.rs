//! [`Ctx`]'s helpers for the status family: a status query (`GET` on the endpoint, or on
//! `--status-url`, with the key and `Idempotency-Status`), the document it answers, and the
//! probe that tells whether the target offers the operation at all.

use super::{Check, Ctx, KeyHeader, Who};
use crate::http::{HarnessError, Req, Resp};
use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use idem_core::{STATUS_HEADER, STATUS_MEDIA_TYPE};

/// What a status document says of a key (`IDEM-STATUS-1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyStatus {
    /// `completed`, `in-progress`, `released`, `held`, `expired`, `unknown` or
    /// `not-executed`.
    pub(crate) status: String,
    /// A completed key's stored status.
    pub(crate) response_status: Option<u16>,
    /// Whether a completed key's response is still replayed.
    pub(crate) replayable: Option<bool>,
    /// A key in progress: when to ask again (`retryAfter`), in seconds.
    pub(crate) retry_after: Option<u64>,
}

/// The statuses a document may name.
const STATUSES: [&str; 7] = [
    "completed",
    "in-progress",
    "released",
    "held",
    "expired",
    "unknown",
    "not-executed",
];

impl KeyStatus {
    /// The document `r` holds, if it is a status document: 200, the status media type, and
    /// a JSON object whose `status` is one of the seven.
    pub(crate) fn of(r: &Resp) -> Option<KeyStatus> {
        if r.status != 200 || !is_document(r) {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
        let status = v.get("status")?.as_str()?;
        if !STATUSES.contains(&status) {
            return None;
        }
        let response = v.get("response");
        Some(KeyStatus {
            status: status.to_owned(),
            response_status: response
                .and_then(|r| r.get("status")?.as_u64())
                .and_then(|s| u16::try_from(s).ok()),
            replayable: response.and_then(|r| r.get("replayable")?.as_bool()),
            retry_after: v.get("retryAfter").and_then(serde_json::Value::as_u64),
        })
    }

    /// Whether it says `name`.
    pub(crate) fn is(&self, name: &str) -> bool {
        self.status == name
    }

    /// What it says, for reports: `completed (201, replayed)`, `in-progress (retryAfter 2)`.
    pub(crate) fn describe(&self) -> String {
        match (self.response_status, self.replayable, self.retry_after) {
            (Some(s), Some(true), _) => format!("{} ({s}, replayed)", self.status),
            (Some(s), _, _) => format!("{} ({s})", self.status),
            (_, _, Some(secs)) => format!("{} (retryAfter {secs})", self.status),
            _ => self.status.clone(),
        }
    }
}

/// Whether `r` is of the status media type (parameters aside).
fn is_document(r: &Resp) -> bool {
    r.header("content-type").is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case(STATUS_MEDIA_TYPE))
    })
}

impl Ctx<'_> {
    /// A status query about `key` (raw header values, as [`Ctx::request`] sends them) as
    /// principal `who`: `GET` with the credential, the key and `Idempotency-Status: METHOD`
    /// (`; settle` to settle an unknown key).
    pub(crate) fn status_request(&self, key: &KeyHeader, field: &str, who: Who) -> Req {
        let mut req = self.request(key, &Bytes::new(), who);
        req.method = hyper::Method::GET;
        if let Some(url) = &self.t.status_url {
            req.url = url.clone();
        }
        // A GET carries no body, so no Content-Type either.
        req.headers
            .retain(|(n, _)| n != hyper::header::CONTENT_TYPE);
        if let Ok(v) = HeaderValue::from_str(field) {
            req.headers
                .push((HeaderName::from_static(STATUS_HEADER), v));
        }
        req
    }

    /// The `Idempotency-Status` field that asks about the target's requests, settling with
    /// `settle`.
    pub(crate) fn status_field(&self, settle: bool) -> String {
        if settle {
            format!("{}; settle", self.t.method)
        } else {
            self.t.method.to_string()
        }
    }

    /// Asks about `key` as `who` (settling with `settle`): the answer, and its document if
    /// it is one. A document that may be cached misses `IDEM-STATUS-4`.
    pub(crate) async fn ask(
        &self,
        label: &str,
        key: &KeyHeader,
        settle: bool,
        who: Who,
    ) -> Result<(Resp, Option<KeyStatus>), HarnessError> {
        let req = self.status_request(key, &self.status_field(settle), who);
        let r = self.send(label, &req).await?;
        let doc = KeyStatus::of(&r);
        if doc.is_some() {
            let no_store = r.header("cache-control").is_some_and(|v| {
                v.split(',')
                    .any(|d| d.trim().eq_ignore_ascii_case("no-store"))
            });
            if !no_store {
                self.miss(
                    "IDEM-STATUS-4",
                    "a status document is never cached: Cache-Control: no-store",
                    format!(
                        "{label}: Cache-Control {:?}",
                        r.header("cache-control").unwrap_or("absent")
                    ),
                );
            }
        }
        Ok((r, doc))
    }

    /// Whether the target offers the status query: a query about a fresh key is answered
    /// 200 with the status media type. `Some(skip)` when it does not: the family's cases are
    /// skipped with what it answered.
    pub(crate) async fn status_offered(&self) -> Result<Option<Check>, HarnessError> {
        let (r, _) = self
            .ask(
                "probe: a status query about a fresh key",
                &self.fresh(),
                false,
                Who::A,
            )
            .await?;
        if r.status == 200 && is_document(&r) {
            return Ok(None);
        }
        Ok(Some(Check::Skip(format!(
            "the target does not offer the status query: a GET with {} about a fresh key was answered {}, not 200 {STATUS_MEDIA_TYPE} (--status-url names where a server answers it elsewhere)",
            STATUS_HEADER,
            r.summary()
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(ct: &str, body: &str) -> Resp {
        Resp {
            status: 200,
            headers: vec![("content-type".into(), ct.into())],
            body: Bytes::from(body.to_owned()),
        }
    }

    #[test]
    fn documents_are_recognised_by_their_media_type_and_status() {
        let doc = KeyStatus::of(&resp(
            "application/vnd.idem.key-status+json",
            r#"{"key":"k","response":{"replayable":true,"status":201},"status":"completed"}"#,
        ))
        .expect("a document");
        assert_eq!(doc.describe(), "completed (201, replayed)");
        let busy = KeyStatus::of(&resp(
            "Application/Vnd.Idem.Key-Status+JSON; charset=utf-8",
            r#"{"key":"k","retryAfter":2,"status":"in-progress"}"#,
        ))
        .expect("a document");
        assert_eq!(busy.retry_after, Some(2));
        assert!(KeyStatus::of(&resp("application/json", r#"{"status":"unknown"}"#)).is_none());
        assert!(KeyStatus::of(&resp(
            "application/vnd.idem.key-status+json",
            r#"{"status":"gone"}"#
        ))
        .is_none());
    }
}
