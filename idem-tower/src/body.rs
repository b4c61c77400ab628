//! The bodies the layer hands on and answers with, reading a guarded request's body through
//! the core's intake, and the responses made from the engine's replies.

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Either, Full};
use idem_core::{Plain, Policy, Reply, StoredResponse};
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The error type the bodies may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of a request the inner service gets: the buffered body of a guarded request,
/// or the body as it came for a request that passes through.
pub type InnerBody<B> = Either<Full<Bytes>, B>;

/// The body of a response of the layer: a stored, replayed or refused response, or the inner
/// service's body: as it is for a request that passes through, or, for a guarded answer
/// longer than the store keeps, what the layer read of it and then the rest ([`PassOn`]).
pub type OuterBody<B> = Either<Full<Bytes>, Either<B, PassOn<B>>>;

/// The body of a guarded answer the store does not keep (`IDEM-STORE-5`: longer than it
/// keeps, or ending with trailers): the frames the layer read of it before it knew, then the
/// rest as the inner service produces it, at the pace the client reads it.
pub struct PassOn<B> {
    /// The frames read, each as it came (no copy into one buffer while they are alive).
    held: VecDeque<Frame<Bytes>>,
    rest: Pin<Box<B>>,
}

impl<B> PassOn<B> {
    pub(crate) fn new(held: VecDeque<Frame<Bytes>>, rest: Pin<Box<B>>) -> PassOn<B> {
        PassOn { held, rest }
    }
}

impl<B: Body<Data = Bytes>> Body for PassOn<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(held) = self.held.pop_front() {
            return Poll::Ready(Some(Ok(held)));
        }
        self.rest.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let held = self
            .held
            .iter()
            .filter_map(Frame::data_ref)
            .map(|b| b.len() as u64)
            .sum();
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(held));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint
    }
}

/// What [`read_answer`] read of an answer's body.
pub(crate) enum Answer<B> {
    /// The whole body, within the limit.
    Whole(Bytes),
    /// More than the limit: what was read, and the body to read the rest from.
    Longer(PassOn<B>),
    /// Within the limit, ending with trailers, which a stored answer does not carry: what
    /// was read, trailers included, and the body (at its end).
    Trailed(PassOn<B>),
    /// The body failed, with its error.
    Failed(BoxError),
}

/// Reads an answer's body, up to `max` bytes (`IDEM-STORE-5`): no more than that is held. A
/// body of one frame (a `Full`, most handlers' answer) is kept as it came, without a copy.
pub(crate) async fn read_answer<B>(body: B, max: usize) -> Answer<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut held: Vec<Bytes> = Vec::new();
    let mut total = 0;
    let frames = |held: Vec<Bytes>| held.into_iter().map(Frame::data).collect::<VecDeque<_>>();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => return Answer::Failed(e.into()),
        };
        match frame.into_data() {
            Ok(data) => {
                total += data.len();
                held.push(data);
                if total > max {
                    return Answer::Longer(PassOn::new(frames(held), body));
                }
            }
            // Empty trailers are no trailers.
            Err(other) if other.trailers_ref().is_some_and(http::HeaderMap::is_empty) => {}
            Err(other) => {
                // Trailers (gRPC's status among them) go on to the client; a frame of
                // another kind is not known to this layer, and is passed on too.
                let mut held = frames(held);
                held.push_back(other);
                return Answer::Trailed(PassOn::new(held, body));
            }
        }
    }
    Answer::Whole(joined(held, total))
}

/// The frames read, as one buffer: a single frame as it is.
fn joined(mut frames: Vec<Bytes>, total: usize) -> Bytes {
    if frames.len() == 1 {
        return frames.swap_remove(0);
    }
    let mut out = BytesMut::with_capacity(total);
    for frame in frames {
        out.extend_from_slice(&frame);
    }
    out.freeze()
}

/// A response with `body` and `status`, and `headers`.
fn response<'h>(
    status: u16,
    headers: impl Iterator<Item = (&'h str, &'h str)>,
    body: Bytes,
) -> Response<Full<Bytes>> {
    let mut out = Response::new(Full::new(body));
    *out.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let map = out.headers_mut();
    for (name, value) in headers {
        // A stored value is its field's bytes, one per character (`IDEM-REPLAY-1`); one
        // with a character past U+00FF (written before that rule) is its UTF-8.
        let value = if value.is_ascii() {
            HeaderValue::from_str(value)
        } else {
            let bytes = StoredResponse::field_bytes(value);
            HeaderValue::from_bytes(bytes.as_deref().unwrap_or(value.as_bytes()))
        };
        if let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(name.as_bytes()), value) {
            map.append(name, value);
        }
    }
    out
}

/// The engine's reply (a replay or a refusal) as a response.
pub(crate) fn reply_response<B>(reply: &Reply) -> Response<OuterBody<B>> {
    render(reply).map(Either::Left)
}

/// An engine reply as the layer sends it: its status, headers and body. For endpoints a
/// service writes itself beside the layer (a counter session, a token issuer), so that their
/// refusals are the same `application/problem+json` as the layer's.
pub fn render(reply: &Reply) -> Response<Full<Bytes>> {
    response(
        reply.status(),
        reply.headers(),
        Bytes::copy_from_slice(reply.body()),
    )
}

/// Reads `body` through the core's intake ([`Policy::read_body`]): its bytes, or the reply
/// that refuses it (413 `body-too-large`, or 400 when the client stopped sending). The layer
/// reads guarded bodies with it; an endpoint served beside the layer (a session endpoint)
/// can too.
pub async fn read_body<B>(policy: &Policy, declared: Option<u64>, body: B) -> Result<Bytes, Reply>
where
    B: Body<Data = Bytes>,
{
    let mut reader = policy.read_body(declared)?;
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Err(reader.broken());
        };
        if let Ok(data) = frame.into_data() {
            reader.push(&data)?;
        }
    }
    Ok(Bytes::from(reader.finish()))
}

/// A 500 problem for a state the request machine should never be in.
pub(crate) fn internal<B>(detail: &'static str) -> Response<OuterBody<B>> {
    reply_response(&Reply::plain(Plain::Internal, detail))
}
