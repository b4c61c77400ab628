//! The endpoints a service serves beside the layer, on the layer's store: an operation
//! answered on its own ([`answer`]: a counter session, a token), and a delivery to an inbox
//! ([`deliver`]). They run through the same drive loop as the layer's requests, and answer
//! with the same renderer.

use crate::body::render;
use crate::drive;
use crate::telemetry::Trace;
use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use idem_core::{AsyncStore, Delivery, Inbox, Message, Outcome, Plain, Reply, Step};
use std::fmt;
use std::future::Future;
use tracing::Instrument;

/// Drives an operation's machine ([`Policy::open_session`], [`Policy::open_session_from`],
/// [`Policy::issue_token`]) over `store` to its answer, rendered as the layer renders its own:
/// for the endpoints a service serves beside the layer (a session endpoint, a token
/// endpoint), on the layer's store. An operation that runs a handler (a delivery) is
/// answered 500 here: use [`deliver`].
///
/// [`Policy::open_session`]: idem_core::Policy::open_session
/// [`Policy::open_session_from`]: idem_core::Policy::open_session_from
/// [`Policy::issue_token`]: idem_core::Policy::issue_token
pub async fn answer<St>(store: &St, request: idem_core::Request) -> Response<Full<Bytes>>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    let trace = Trace::new(&request, None, None);
    let span = trace.span().clone();
    let reply = operate(store, request, &trace).instrument(span).await;
    trace.answered(Some(&reply), reply.status());
    render(&reply)
}

async fn operate<St>(store: &St, mut request: idem_core::Request, trace: &Trace) -> Reply
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    let waiters = std::sync::Mutex::default();
    let emit = |r: &mut idem_core::Request| log_events(r, trace);
    loop {
        match drive::drive_steps(store, &waiters, &emit, &mut request).await {
            Step::WaitUntil(t) => {
                drive::sleep_until(t).await;
            }
            Step::Reply | Step::Done(_) => {
                return request.reply().unwrap_or_else(|| {
                    Reply::plain(Plain::Internal, "the operation has no answer")
                })
            }
            _ => return Reply::plain(Plain::Internal, "this operation runs a handler"),
        }
    }
}

/// What became of one delivery to an inbox ([`deliver`]), and the receipt to answer its
/// sender with.
#[derive(Debug)]
pub struct Delivered {
    /// What became of it.
    pub delivery: Delivery,
    /// The engine's receipt: 200 for what the sender may stop delivering, the core's problem
    /// with `Retry-After` for what it must deliver again.
    pub receipt: Response<Full<Bytes>>,
}

/// One delivery of `message` to `inbox`, on `store`: the first delivery of a message runs
/// `process` (with the handler's [`idem_core::Context`]: whether it recovers from an
/// interrupted delivery), later ones are acknowledged without it (`IDEM-INBOX-1` to
/// `IDEM-INBOX-3`). If `process` fails, its error is returned once the failure is recorded:
/// the sender should deliver the message again, and the next delivery recovers.
pub async fn deliver<St, F, Fut, E>(
    store: &St,
    inbox: &Inbox,
    message: &Message<'_>,
    process: F,
) -> Result<Delivered, E>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
    F: FnOnce(idem_core::Context) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let request = inbox.deliver(message, drive::nonce());
    let trace = Trace::new(&request, None, None);
    let span = trace.span().clone();
    delivery(store, request, process, &trace)
        .instrument(span)
        .await
}

async fn delivery<St, F, Fut, E>(
    store: &St,
    mut request: idem_core::Request,
    process: F,
    trace: &Trace,
) -> Result<Delivered, E>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
    F: FnOnce(idem_core::Context) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let waiters = std::sync::Mutex::default();
    let emit = |r: &mut idem_core::Request| log_events(r, trace);
    let mut failure = None;
    let mut process = Some(process);
    loop {
        match drive::drive_steps(store, &waiters, &emit, &mut request).await {
            Step::WaitUntil(t) => {
                drive::sleep_until(t).await;
            }
            Step::Run(context) => {
                let outcome = match process.take() {
                    Some(process) => process(context).await,
                    None => Ok(()),
                };
                request.handle_outcome(match outcome {
                    Ok(()) => Inbox::processed(),
                    Err(e) => {
                        failure = Some(e);
                        Outcome::Unknown(None)
                    }
                });
            }
            _ => break,
        }
    }
    if let Some(e) = failure {
        trace.failed();
        return Err(e);
    }
    let delivery = request.delivery().unwrap_or(Delivery::Failed);
    let reply = request
        .reply()
        .unwrap_or_else(|| Reply::plain(Plain::Internal, "the delivery has no receipt"));
    trace.answered(Some(&reply), reply.status());
    Ok(Delivered {
        delivery,
        receipt: render(&reply),
    })
}

/// The events of an operation, as the default hook logs them.
fn log_events(request: &mut idem_core::Request, trace: &Trace) {
    while let Some(event) = request.poll_event() {
        trace.observe(&event);
        drive::log(&event, request.key());
    }
}
