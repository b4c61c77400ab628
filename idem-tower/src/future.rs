//! The response future of [`Idempotent`](crate::Idempotent): [`ResponseFuture`].

use crate::body::OuterBody;
use http::Response;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What a [`ResponseFuture`] resolves to.
type Answer<B, E> = Result<Response<OuterBody<B>>, E>;

/// The response future of [`Idempotent`](crate::Idempotent): the layer's answer to one
/// request, a response with an [`OuterBody`] over the inner service's body `B`, or the inner
/// service's error `E`.
///
/// For a guarded request it reads the body, then awaits a task of its own that claims the
/// key, runs the inner service and records its outcome: dropped once that task has started
/// (a client that went away), the future leaves the task to finish, so that a handler is
/// never cancelled half-way, nor the write of its outcome. For a request that is not
/// guarded it is the inner service's future, with its body passed through.
#[must_use = "futures do nothing unless you `.await` or poll them"]
pub struct ResponseFuture<B, E> {
    future: Pin<Box<dyn Future<Output = Answer<B, E>> + Send>>,
}

impl<B, E> ResponseFuture<B, E> {
    pub(crate) fn new<F>(future: F) -> Self
    where
        F: Future<Output = Answer<B, E>> + Send + 'static,
    {
        ResponseFuture {
            future: Box::pin(future),
        }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Answer<B, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.future.as_mut().poll(cx)
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
