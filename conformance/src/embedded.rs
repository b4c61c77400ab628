//! The embedded run: the reference server started in-process, as many times as the cases
//! need, so that the whole suite runs in one go and every case is judged by a count oracle
//! that sees its executions alone.
//!
//! The cases are laid out in [`Lane`]s: one lane per key kind (the generic cases against
//! `/orders`, the `time/…` family against `/payments`, `counter/…` against `/transfers`,
//! `token/…` against `/checkout`), each against a server of its own, and one lane for each
//! case that waits for the server's clock (a lease, a retention, a token's life), so that its
//! waits overlap the others. The families of the key kinds race nothing, so their servers
//! answer at once: the wrap case sends hundreds of requests one after the other.

use crate::cases::Case;
use crate::server::{Server, ServerConfig, StartError};
use crate::suite::{KeyKind, Lane, Target};
use std::net::SocketAddr;
use std::time::Duration;

/// Reference servers started for a run, and the lanes that use them. The servers stop when
/// it is dropped.
#[derive(Debug)]
pub struct Embedded {
    /// The lanes, the generic cases' first; each target has the reference server's options
    /// for its endpoint (both oracles, the bodies that decline, fail and crash, retention,
    /// lease and the key kinds' bounds).
    pub lanes: Vec<Lane>,
    servers: Vec<Server>,
}

impl Embedded {
    /// Starts the servers for `cases` with `settings` (the families of the key kinds with no
    /// handler delay) and lays the cases out in lanes, in suite order within each.
    pub async fn start(
        settings: &ServerConfig,
        cases: &[&'static Case],
    ) -> Result<Self, StartError> {
        let mut embedded = Embedded {
            lanes: Vec::new(),
            servers: Vec::new(),
        };
        for kind in [
            KeyKind::Opaque,
            KeyKind::Time,
            KeyKind::Counter,
            KeyKind::Token,
        ] {
            let (waiting, others): (Vec<&'static Case>, Vec<&'static Case>) = cases
                .iter()
                .filter(|c| kind_of(c) == kind)
                .partition(|c| c.waits);
            let config = if kind == KeyKind::Opaque {
                settings.clone()
            } else {
                ServerConfig {
                    delay: Duration::ZERO,
                    ..settings.clone()
                }
            };
            if !others.is_empty() {
                embedded.lane(&config, kind, others).await?;
            }
            for case in waiting {
                embedded.lane(&config, kind, vec![case]).await?;
            }
        }
        Ok(embedded)
    }

    async fn lane(
        &mut self,
        config: &ServerConfig,
        kind: KeyKind,
        cases: Vec<&'static Case>,
    ) -> Result<(), StartError> {
        let server = Server::start(SocketAddr::from(([127, 0, 0, 1], 0)), config.clone()).await?;
        self.lanes.push(Lane {
            target: Target::for_reference_kind(&server, config, kind),
            cases,
        });
        self.servers.push(server);
        Ok(())
    }

    /// The servers, in the order of the lanes.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }
}

/// The kind of endpoint `case` runs against: its family's, or opaque for the generic cases.
pub fn kind_of(case: &Case) -> KeyKind {
    KeyKind::of_section(case.section()).unwrap_or(KeyKind::Opaque)
}
