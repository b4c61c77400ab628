//! Status queries (`IDEM-STATUS-1` to `IDEM-STATUS-4`): a `GET` with `Idempotency-Status` on
//! a route the layer sees, answered with what became of the key from the layer's store, in
//! the scope of the request asked about. idem-core's operation decides everything; this
//! reads the fields and drives it.

use crate::body::render;
use crate::drive::{advance, nonce, sleep_until, Shared};
use crate::telemetry::Trace;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Response};
use http_body_util::Full;
use idem_core::{AsyncStore, Plain, Reply, StatusQuery, Step, KEY_HEADER, STATUS_HEADER};
use std::fmt;
use tracing::Instrument;

/// Answers the status query `parts`.
pub(crate) async fn query<St>(shared: &Shared<St>, parts: &Parts) -> Response<Full<Bytes>>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    let keys: Vec<&[u8]> = parts
        .headers
        .get_all(KEY_HEADER)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    let (principal, route) = shared.scope_of(parts);
    let field = parts
        .headers
        .get(STATUS_HEADER)
        .map_or(&b""[..], HeaderValue::as_bytes);
    let machine = shared.policy.status(
        &StatusQuery {
            principal: principal.as_deref(),
            route: &route,
            keys: &keys,
            status: field,
            client: None,
        },
        nonce(),
    );
    let named = shared.route.as_ref().map(|_| route.as_str());
    let trace = Trace::new(&machine, Some(parts.method.as_str()), named);
    let span = trace.span().clone();
    answer(shared, machine, &trace).instrument(span).await
}

/// Drives a status query's machine to its answer.
async fn answer<St>(
    shared: &Shared<St>,
    mut machine: idem_core::Request,
    trace: &Trace,
) -> Response<Full<Bytes>>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    loop {
        match advance(shared, &mut machine, trace).await {
            Step::WaitUntil(t) => sleep_until(t).await,
            Step::Reply | Step::Done(_) => break,
            _ => {
                let reply = Reply::plain(Plain::Internal, "a status query runs nothing");
                trace.answered(Some(&reply), reply.status());
                return render(&reply);
            }
        }
    }
    let reply = machine
        .reply()
        .unwrap_or_else(|| Reply::plain(Plain::Internal, "the status query has no answer"));
    trace.answered(Some(&reply), reply.status());
    render(&reply)
}
