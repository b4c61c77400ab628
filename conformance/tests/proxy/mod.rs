//! TCP proxies on 127.0.0.1 for the tests that put something between two processes: a
//! round-robin balancer in front of server processes, and a gate in front of a store that
//! can stop passing bytes (a network partition: connections stay open, nothing arrives, and
//! what was held back arrives once it heals).
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A round-robin TCP proxy to `ports`: each connection goes to the next port that accepts
/// it (a port whose process died is passed over, as a balancer's health check would);
/// `counts[i]` is how many connections went to port i. Runs on `runtime` until it ends.
pub(crate) fn round_robin(
    ports: Vec<u16>,
    runtime: &tokio::runtime::Runtime,
) -> (u16, Arc<Vec<AtomicUsize>>) {
    let counts: Arc<Vec<AtomicUsize>> =
        Arc::new(ports.iter().map(|_| AtomicUsize::new(0)).collect());
    let listener = runtime
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("a port");
    let port = listener.local_addr().expect("an address").port();
    let seen = Arc::clone(&counts);
    let next = Arc::new(AtomicUsize::new(0));
    runtime.spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let (ports, seen, next) = (ports.clone(), Arc::clone(&seen), Arc::clone(&next));
            tokio::spawn(async move {
                let first = next.fetch_add(1, Ordering::SeqCst);
                for i in (0..ports.len()).map(|k| (first + k) % ports.len()) {
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", ports[i])).await {
                        seen[i].fetch_add(1, Ordering::SeqCst);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        return;
                    }
                }
            });
        }
    });
    (port, counts)
}

/// A proxy to one port that passes bytes while it is open and holds them while it is shut.
pub(crate) struct Gate {
    /// The port to connect to instead of the upstream's.
    pub(crate) port: u16,
    open: watch::Sender<bool>,
}

impl Gate {
    /// A gate in front of `upstream`, open, running on `runtime`.
    pub(crate) fn new(upstream: u16, runtime: &tokio::runtime::Runtime) -> Gate {
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("a port");
        let port = listener.local_addr().expect("an address").port();
        let (open, watching) = watch::channel(true);
        runtime.spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let watching = watching.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let (client_in, client_out) = client.into_split();
                    let (server_in, server_out) = server.into_split();
                    tokio::join!(
                        pump(client_in, server_out, watching.clone()),
                        pump(server_in, client_out, watching),
                    );
                });
            }
        });
        Gate { port, open }
    }

    /// Stops passing bytes: everything sent either way is held back.
    pub(crate) fn shut(&self) {
        self.open.send_replace(false);
    }

    /// Passes bytes again, those held back first.
    pub(crate) fn open(&self) {
        self.open.send_replace(true);
    }
}

/// Copies `from` to `to` while the gate is open; bytes read as it shuts wait for it to open.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut open: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if open.wait_for(|o| *o).await.is_err() {
            break;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if open.wait_for(|o| *o).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
