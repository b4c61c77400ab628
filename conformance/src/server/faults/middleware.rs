//! The middleware around a faulty server's layer (the fault's [`Apply::before`],
//! [`Apply::ignores`] and [`Apply::after`]), and around its status query
//! ([`Apply::query`], [`Apply::query_runs`]).

use super::super::{principal_of, render, run_handler, App, Route};
use super::{Answer, Fault, Incoming};
use axum::body::Body;
use axum::extract::State;
use axum::middleware::Next;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::CONTENT_TYPE;
use hyper::{Request, Response};
use idem_core::{Refusal, KEY_HEADER, REPLAYED_HEADER};
use std::sync::Arc;

/// Runs `req` through the layer (`next`) as the fault changes it.
pub(crate) async fn misbehave(
    State((app, route, fault)): State<(Arc<App>, Route, Fault)>,
    req: Request<Body>,
    next: Next,
) -> Response<Body> {
    let apply = fault.apply();
    // The body is kept for the fault to see, and for a run without protection.
    let (mut parts, body) = req.into_parts();
    let max = app.config.max_body;
    let Ok(body) = Limited::new(body, max).collect().await else {
        // As the layer refuses it.
        let refusal = Refusal::body_too_large(max as u64 + 1, max);
        return render(&refusal.reply()).map(Body::new);
    };
    let body = body.to_bytes();
    let principal = principal_of(&parts.headers);
    let key = parts.headers.get(KEY_HEADER).map(|v| v.as_bytes().to_vec());
    let incoming = Incoming {
        route,
        principal: &principal,
        key: key.as_deref(),
        body: &body,
    };
    if let Some(before) = apply.before {
        if let Some(refusal) = before(&app.faults, &incoming, &mut parts.headers) {
            return render(&refusal.reply()).map(Body::new);
        }
    }
    let req = Request::from_parts(parts, Body::from(body.clone()));
    let ignored = apply.ignores.map_or(&[][..], |ignores| ignores(route));
    let response = if ignored.is_empty() {
        next.run(req).await
    } else {
        let response = next.run(req).await;
        let (head, answer) = response.into_parts();
        let answer = answer
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        if ignored
            .iter()
            .any(|p| problem_type(&head, &answer) == Some(p.type_uri))
        {
            run_handler(&app, &body, false).await.map(Body::new)
        } else {
            Response::from_parts(head, Body::new(Full::new(answer)))
        }
    };
    let Some(after) = apply.after else {
        return response;
    };
    let (mut head, answer) = response.into_parts();
    let replay = head.headers.contains_key(REPLAYED_HEADER);
    after(
        &app.faults,
        &incoming,
        &mut Answer {
            status: head.status.as_u16(),
            replay,
            headers: &mut head.headers,
        },
    );
    Response::from_parts(head, answer)
}

/// Answers the status query `req` (`next`) as the fault changes it.
pub(crate) async fn misask(
    State((app, route, fault)): State<(Arc<App>, Route, Fault)>,
    req: Request<Body>,
    next: Next,
) -> Response<Body> {
    let apply = fault.apply();
    let (mut parts, body) = req.into_parts();
    let principal = principal_of(&parts.headers);
    let key = parts.headers.get(KEY_HEADER).map(|v| v.as_bytes().to_vec());
    let empty = Bytes::new();
    let incoming = Incoming {
        route,
        principal: &principal,
        key: key.as_deref(),
        body: &empty,
    };
    if let Some(query) = apply.query {
        query(&app.faults, &incoming, &mut parts.headers);
    }
    if apply.query_runs {
        // Its answer is dropped: the query is answered as if nothing ran.
        let _ = run_handler(&app, &empty, false).await;
    }
    next.run(Request::from_parts(parts, body)).await
}

/// The `type` of a problem+json answer.
fn problem_type<'a>(head: &hyper::http::response::Parts, body: &'a [u8]) -> Option<&'a str> {
    let problem = head
        .headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/problem+json");
    if !problem {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow)]
        type_: &'a str,
    }
    serde_json::from_slice::<Typed<'a>>(body)
        .ok()
        .map(|t| t.type_)
}
