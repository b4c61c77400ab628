//! Serving connections: the accept loop, plain or TLS, and HTTP/1.1 on each connection.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// How long a connection may take to send a request's headers (and finish its TLS
/// handshake).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves one connection; a request body that goes `body_timeout` without a frame fails
/// (`ServerConfig::body_timeout`).
async fn serve_connection<S>(router: Router, body_timeout: Duration, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = tower_http::timeout::RequestBodyTimeout::new(router, body_timeout);
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
        .await;
}

pub(super) async fn accept_loop(
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    router: Router,
    body_timeout: Duration,
) {
    // Connections live in this set: when the server is dropped the accept task is aborted,
    // the set is dropped with it, and every connection task ends.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        // Out of file descriptors or similar: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let router = router.clone();
                let acceptor = acceptor.clone();
                connections.spawn(async move {
                    match acceptor {
                        None => serve_connection(router, body_timeout, stream).await,
                        Some(acceptor) => {
                            // A client that never finishes its handshake costs one task for
                            // as long as a client that never sends its headers.
                            let handshake = tokio::time::timeout(
                                HEADER_READ_TIMEOUT,
                                acceptor.accept(stream),
                            );
                            if let Ok(Ok(tls)) = handshake.await {
                                serve_connection(router, body_timeout, tls).await;
                            }
                        }
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}
