//! The service: [`Idempotent`] and the path of a request through it. A request the layer
//! does not guard goes to the inner service as it came; a guarded one has its body read
//! (`serve`), then is claimed, run and completed in a task of its own (`guard`).

use crate::body::{
    internal, read_answer, read_body, reply_response, Answer, BoxError, InnerBody, OuterBody,
};
use crate::context::IdempotencyContext;
use crate::drive::{advance, nonce, sleep_until, Beat, Running, Shared};
use crate::future::ResponseFuture;
use crate::telemetry::Trace;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use idem_core::{
    AsyncStore, Intake, Outcome, Plain, Reply, Step, StoredResponse, KEY_HEADER, LOW_WATER_HEADER,
    STATUS_HEADER,
};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;
use tracing::Instrument;

/// A service with Idempotency-Key semantics (see the crate docs).
pub struct Idempotent<S, St> {
    inner: S,
    shared: Arc<Shared<St>>,
}

impl<S, St> Idempotent<S, St> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<St>>) -> Self {
        Idempotent { inner, shared }
    }
}

impl<S: Clone, St> Clone for Idempotent<S, St> {
    fn clone(&self) -> Self {
        Idempotent {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for Idempotent<S, St>
where
    S: Service<Request<InnerBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
{
    type Response = Response<OuterBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The service that was polled ready handles this request; a clone takes its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        ResponseFuture::new(serve(shared, inner, request))
    }
}

async fn serve<S, St, ReqB, ResB>(
    shared: Arc<Shared<St>>,
    inner: S,
    request: Request<ReqB>,
) -> Result<Response<OuterBody<ResB>>, S::Error>
where
    S: Service<Request<InnerBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
{
    let (parts, body) = request.into_parts();
    let passes = shared.filter.as_ref().is_none_or(|f| f(&parts));
    if shared.status_queries
        && passes
        && parts.method == http::Method::GET
        && parts.headers.contains_key(STATUS_HEADER)
    {
        return Ok(crate::status::query(&shared, &parts)
            .await
            .map(Either::Left));
    }
    let has_key = parts.headers.contains_key(KEY_HEADER);
    let guarded = passes && shared.policy.protects(parts.method.as_str(), has_key);
    if !guarded {
        let mut inner = inner;
        let request = Request::from_parts(parts, Either::Right(body));
        return Ok(inner
            .call(request)
            .await?
            .map(|b| Either::Right(Either::Left(b))));
    }
    // The body is read chunk by chunk through the core's intake: a declared length past the
    // limit is refused before anything is read, and an undeclared one once it goes past it,
    // so that an endless upload cannot fill the memory (IDEM-LIMIT-1).
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let body = match read_body(&shared.policy, declared, body).await {
        Ok(body) => body,
        Err(reply) => {
            let mut response = reply_response(&reply);
            // The rest of the body is never read: an HTTP/1.1 connection closes after the
            // answer, and says so (IDEM-LIMIT-1). HTTP/2 resets the stream and has no such field.
            if parts.version <= http::Version::HTTP_11 {
                response.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
            return Ok(response);
        }
    };
    // The rest runs in a task of its own: a client that goes away must not cancel a handler
    // half-way, nor the write of its outcome.
    match tokio::spawn(guard(shared, inner, parts, body)).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => Ok(reply_response(&Reply::plain(
            Plain::Unavailable,
            "the server is shutting down",
        ))),
    }
}

/// Claims, runs and completes one guarded request.
async fn guard<S, St, ReqB, ResB>(
    shared: Arc<Shared<St>>,
    inner: S,
    parts: Parts,
    body: Bytes,
) -> Result<Response<OuterBody<ResB>>, S::Error>
where
    S: Service<Request<InnerBody<ReqB>>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes>,
    ResB::Error: Into<BoxError>,
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
{
    let keys: Vec<&[u8]> = parts
        .headers
        .get_all(KEY_HEADER)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    let (principal, route) = shared.scope_of(&parts);
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |p| p.as_str());
    let spec = shared.policy.fingerprint_spec();
    let selected: Vec<(&str, &[u8])> = spec
        .headers
        .iter()
        .flat_map(|name| {
            parts
                .headers
                .get_all(name.as_str())
                .iter()
                .map(move |v| (name.as_str(), v.as_bytes()))
        })
        .collect();
    let text = |name| {
        parts
            .headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let intake = Intake {
        principal: principal.as_deref(),
        method: parts.method.as_str(),
        route: &route,
        target,
        keys: &keys,
        low_water: text(LOW_WATER_HEADER),
        client: None,
        content_type: text(http::header::CONTENT_TYPE.as_str()),
        headers: &selected,
        body: &body,
    };
    let machine = shared.policy.request(&intake, nonce());
    drop(keys);
    // A route is a span's `http.route` only when the host names routes: a raw path may
    // carry ids.
    let named = shared.route.as_ref().map(|_| route.as_str());
    let trace = Arc::new(Trace::new(&machine, Some(parts.method.as_str()), named));
    let span = trace.span().clone();
    run(shared, inner, parts, body, machine, trace)
        .instrument(span)
        .await
}

/// Runs one guarded request from its claim, in its span.
async fn run<S, St, ReqB, ResB>(
    shared: Arc<Shared<St>>,
    mut inner: S,
    parts: Parts,
    body: Bytes,
    mut machine: idem_core::Request,
    trace: Arc<Trace>,
) -> Result<Response<OuterBody<ResB>>, S::Error>
where
    S: Service<Request<InnerBody<ReqB>>, Response = Response<ResB>>,
    ResB: Body<Data = Bytes>,
    ResB::Error: Into<BoxError>,
    St: AsyncStore + Send + Sync + 'static,
    St::Error: fmt::Display,
{
    let reply = |trace: &Trace, reply: &Reply| {
        trace.answered(Some(reply), reply.status());
        reply_response(reply)
    };
    let context = loop {
        match advance(&shared, &mut machine, &trace).await {
            Step::WaitUntil(t) => {
                sleep_until(t).await;
            }
            Step::Run(context) => break context,
            Step::Reply => {
                return Ok(match machine.reply() {
                    Some(r) => reply(&trace, &r),
                    None => {
                        trace.answered(None, 500);
                        internal("the request machine has no reply")
                    }
                })
            }
            other => {
                // The step's text stays in the log: `plain` bodies carry fixed text only.
                tracing::error!(step = ?other, "idempotency: unexpected step before the handler ran");
                trace.answered(None, 500);
                return Ok(internal("the request machine asked for an unexpected step"));
            }
        }
    };
    let record = machine.key().clone();
    let running = Arc::new(Running::new(
        Arc::clone(&shared),
        machine,
        context.attempt,
        Arc::clone(&trace),
    ));
    let mut request = Request::from_parts(parts, Either::Left(Full::new(body)));
    request.extensions_mut().insert(IdempotencyContext::new(
        record,
        &context,
        Arc::clone(&running) as Arc<dyn Beat>,
    ));
    // A handler that panics is a crash: nothing is recorded and its lease is left to end, as
    // after a process that died; whatever the store holds for the attempt (a transaction)
    // is let go when the request is dropped (`Running`'s destructor).
    let answered = match inner.call(request).await {
        Ok(answered) => answered,
        Err(e) => {
            // A handler that failed: its outcome is unknown (IDEM-OUT-3). Its error goes on.
            let _ = running.finish(Outcome::Unknown(None)).await;
            trace.failed();
            return Err(e);
        }
    };
    let (head, body) = answered.into_parts();
    let read = running.within_lease(read_answer(body, shared.policy.max_response_bytes()));
    let Some(answer) = read.await else {
        // The body neither ended nor passed the limit within the lease: it is let go, and
        // what the client would have seen is unknown (IDEM-OUT-7).
        tracing::warn!("idempotency: the response body was not read whole before the lease ended");
        return Ok(match running.finish(Outcome::Unknown(None)).await {
            Some(r) => reply(&trace, &r),
            None => {
                trace.answered(None, 500);
                internal("the response body was not read whole before the lease ended")
            }
        });
    };
    let (rest, record): (_, fn(&mut idem_core::Request, u16)) = match answer {
        Answer::Whole(bytes) => {
            let stored = StoredResponse {
                status: head.status.as_u16(),
                headers: head
                    .headers
                    .iter()
                    .map(|(n, v)| {
                        (
                            n.as_str().to_owned(),
                            StoredResponse::field_text(v.as_bytes()),
                        )
                    })
                    .collect(),
                body: bytes.to_vec(),
            };
            // The outcome is written before the response leaves (IDEM-OUT-5); the response
            // is sent whatever the write came to, unless another attempt took the lease
            // over: then its caller gets the key's outcome instead (IDEM-LEASE-5).
            if let Some(r) = running.finish(Outcome::classify(stored)).await {
                return Ok(reply(&trace, &r));
            }
            trace.answered(None, head.status.as_u16());
            return Ok(Response::from_parts(head, Either::Left(Full::new(bytes))));
        }
        Answer::Longer(rest) => (rest, idem_core::Request::handle_oversized),
        Answer::Trailed(rest) => (rest, idem_core::Request::handle_with_trailers),
        Answer::Failed(e) => {
            // The response failed half-way: what the client would have seen is unknown.
            tracing::warn!(error = %e, "idempotency: the response body failed before it was read whole");
            return Ok(match running.finish(Outcome::Unknown(None)).await {
                Some(r) => reply(&trace, &r),
                None => {
                    trace.answered(None, 500);
                    internal("the response body failed")
                }
            });
        }
    };
    // Longer than the store keeps, or ending with trailers, which a stored answer does not
    // carry (IDEM-STORE-5): recorded so, then sent on as it comes, trailers included, once
    // the outcome is written (IDEM-OUT-5), unless another attempt took the lease over.
    let status = head.status.as_u16();
    if let Some(r) = running.finish_with(|m| record(m, status)).await {
        return Ok(reply(&trace, &r));
    }
    trace.answered(None, status);
    Ok(Response::from_parts(
        head,
        Either::Right(Either::Right(rest)),
    ))
}
