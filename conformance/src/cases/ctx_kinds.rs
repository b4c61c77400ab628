//! [`Ctx`]'s helpers for the key kinds' families: requests with a raw kind key, sessions,
//! tokens, and refusals that must execute nothing.

use super::{miss, pass_counted, require_success, runs, spec, Check, Ctx, KeyHeader, Who};
use crate::http::{HarnessError, Req};
use crate::suite::Confidence;
use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};

impl Ctx<'_> {
    /// A request with the raw key `key` (a time, counter or token key: never quoted) and
    /// `extra` headers, as the first principal.
    pub(crate) fn kind_request(
        &self,
        key: &str,
        body: &Bytes,
        extra: &[(&'static str, String)],
    ) -> Req {
        let value = HeaderValue::from_str(key).unwrap_or(HeaderValue::from_static("invalid"));
        let mut req = self.request(&KeyHeader::One(value), body, Who::A);
        for (name, v) in extra {
            if let Ok(v) = HeaderValue::from_str(v) {
                req.headers
                    .push((hyper::header::HeaderName::from_static(name), v));
            }
        }
        req
    }

    /// POSTs `body` as JSON to `url` with the first principal's headers: a session or
    /// token endpoint. Its JSON answer, which must be a success.
    async fn post_json(
        &self,
        label: &str,
        url: &url::Url,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, HarnessError> {
        let mut headers = self.t.headers.clone();
        headers.push((CONTENT_TYPE, HeaderValue::from_static("application/json")));
        let req = Req {
            method: hyper::Method::POST,
            url: url.clone(),
            headers,
            body: Bytes::from(body.to_string()),
        };
        let r = self.send(label, &req).await?;
        require_success(&r, label)?;
        serde_json::from_slice(&r.body).map_err(|_| {
            HarnessError::Protocol(format!("{label}: {url} answered {}, not JSON", r.summary()))
        })
    }

    /// Opens the session of `client` at the session endpoint; its epoch.
    pub(crate) async fn open_session(
        &self,
        client: &str,
        first_seq: u64,
    ) -> Result<String, HarnessError> {
        let url = self
            .t
            .session_url
            .as_ref()
            .ok_or_else(|| HarnessError::Usage("counter keys need --session-url".into()))?;
        let v = self
            .post_json(
                "open the client's session",
                url,
                serde_json::json!({ "client": client, "firstSeq": first_seq }),
            )
            .await?;
        match &v["epoch"] {
            serde_json::Value::String(e) => Ok(e.clone()),
            serde_json::Value::Number(n) => Ok(n.to_string()),
            _ => Err(HarnessError::Protocol(format!(
                "the session endpoint answered {v}, without an \"epoch\""
            ))),
        }
    }

    /// A token from the token endpoint.
    pub(crate) async fn issue_token(&self) -> Result<String, HarnessError> {
        let url = self
            .t
            .token_url
            .as_ref()
            .ok_or_else(|| HarnessError::Usage("tokens need --token-url".into()))?;
        let v = self
            .post_json("issue a token", url, serde_json::json!({}))
            .await?;
        v["token"].as_str().map(str::to_owned).ok_or_else(|| {
            HarnessError::Protocol(format!(
                "the token endpoint answered {v}, without a \"token\""
            ))
        })
    }

    /// Sends `req` and expects a refusal with the status of `requirement` (from the spec)
    /// that executes nothing: a success or an execution is a miss of `requirement`; another
    /// 4xx holds it and misses `IDEM-HTTP-1`.
    pub(crate) async fn expect_refusal(
        &self,
        label: &str,
        req: &Req,
        requirement: &'static str,
    ) -> Result<Check, HarnessError> {
        self.expect_refusal_of(label, || req.clone(), requirement)
            .await
    }

    /// [`Ctx::expect_refusal`] of the request `make` builds right before it is sent, after
    /// the count oracle's first reading: a timestamp taken then is as far from the server's
    /// clock as it was meant to be, however slow the oracle.
    pub(crate) async fn expect_refusal_of(
        &self,
        label: &str,
        make: impl FnOnce() -> Req,
        requirement: &'static str,
    ) -> Result<Check, HarnessError> {
        let want = spec(requirement).status.unwrap_or(400);
        let before = self.count().await?;
        let r = self.send(label, &make()).await?;
        let after = self.count().await?;
        if let Some(n) = runs(before, after).filter(|n| *n > 0) {
            return Ok(miss(
                requirement,
                format!("{label}: refused with {want}, nothing executes"),
                format!(
                    "answered {}; the count oracle saw {n} execution(s)",
                    r.summary()
                ),
            ));
        }
        if !(400..500).contains(&r.status) {
            return Ok(miss(
                requirement,
                format!("{label}: refused with {want}"),
                r.summary(),
            ));
        }
        if r.status != want {
            self.miss(
                "IDEM-HTTP-1",
                format!("{label}: refused with {want}"),
                r.summary(),
            );
        }
        Ok(pass_counted(
            self,
            &format!(
                "{label}: refused with {}, nothing executed (count oracle)",
                r.status
            ),
            (
                Confidence::Medium,
                &format!("{label}: refused with {}", r.status),
            ),
        ))
    }
}
