//! The reference server's settings ([`ServerConfig`]) and why it may not start
//! ([`StartError`]).

use super::Fault;
use idem_core::{Config, CounterConfig, MemoryStoreLimits, TimeKeyConfig};
use std::fmt;
use std::time::Duration;

/// Settings of the reference server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// How long a completed response is replayed (advertised; the `forget-early` fault drops them sooner).
    pub response_ttl: Duration,
    /// How long a key is remembered.
    pub key_ttl: Duration,
    /// How long an in-flight claim lasts before a retry may take over.
    pub lease: Duration,
    /// How long each handler run takes.
    pub delay: Duration,
    /// The largest request body accepted (413 beyond).
    pub max_body: usize,
    /// Store capacity (503 when full).
    pub limits: MemoryStoreLimits,
    /// The deliberate defect, if any.
    pub fault: Option<Fault>,
    /// Serve HTTPS with this certificate instead of plain HTTP.
    pub tls: Option<crate::tls::Identity>,
    /// Accept only UUID keys (as many APIs do) instead of any opaque key.
    pub uuid_keys: bool,
    /// The time keys of [`PAYMENTS_PATH`](super::PAYMENTS_PATH): the clock skew and the maximum age
    /// (`max_age + max_ahead` at most the key retention).
    pub time_keys: TimeKeyConfig,
    /// The counters of [`TRANSFERS_PATH`](super::TRANSFERS_PATH): bits and window.
    pub counter: CounterConfig,
    /// How long a token issued at [`TOKENS_PATH`](super::TOKENS_PATH) stays valid (at most the key retention).
    pub token_ttl: Duration,
    /// Where the records live: `None` for memory (one process), or `redis://…` or
    /// `postgres://…`, which several server processes can share (with the count of
    /// executions). Faults wrap whichever store it is.
    pub store: Option<String>,
    /// The keys that seal the records of the store (`IDEM-SEAL-1`).
    pub seal: Option<crate::store::Seal>,
    /// A file every handler run appends one line to (created if missing): the key, the
    /// fencing number, whether the run took over from an earlier attempt, and the process
    /// id, tab-separated. Each line is one write to a file opened for appending, so it
    /// survives the process being killed right after, and lines of several processes on one
    /// file never interleave: the per-key execution log of the chaos tests.
    pub execution_log: Option<std::path::PathBuf>,
    /// How long a request's body may go without a frame: a body that stalls longer fails, and
    /// the layer answers it 400 with nothing claimed, instead of holding its connection and
    /// task for ever (tower-http's `RequestBodyTimeout`). 30 s by default.
    pub body_timeout: Duration,
}

impl Default for ServerConfig {
    /// idem-core's default retention and lease, a 100 ms handler, 1 MiB bodies.
    fn default() -> Self {
        let engine = Config::default();
        ServerConfig {
            response_ttl: engine.response_ttl,
            key_ttl: engine.key_ttl,
            lease: engine.lease,
            delay: Duration::from_millis(100),
            max_body: 1 << 20,
            limits: MemoryStoreLimits::default(),
            fault: None,
            tls: None,
            uuid_keys: false,
            time_keys: TimeKeyConfig {
                max_ahead: Duration::from_secs(5 * 60),
                max_age: engine.response_ttl,
            },
            counter: CounterConfig::default(),
            token_ttl: Duration::from_secs(3600),
            store: None,
            seal: None,
            execution_log: None,
            body_timeout: Duration::from_secs(30),
        }
    }
}

impl ServerConfig {
    /// Bounds of the key kinds that fit the retention times: a clock skew of at most 5
    /// minutes (a quarter of the key retention when that is shorter), time keys accepted for
    /// the response retention (less the skew where the key retention requires it), tokens
    /// valid for an hour at most (the key retention when that is shorter).
    pub fn with_kind_bounds(mut self) -> ServerConfig {
        self.time_keys = TimeKeyConfig {
            max_age: self.response_ttl,
            ..TimeKeyConfig::default()
        }
        .fit(self.key_ttl);
        self.token_ttl = Duration::from_secs(3600);
        self
    }

    /// Short retention and lease (1 s response, 2 s key, 1 s lease) so that the expiry and
    /// lease cases finish within seconds: the settings of the embedded default run.
    ///
    /// The key kinds get matching bounds: a 0.5 s clock skew and 1 s maximum age for time
    /// keys, 8-bit counters with a window of 4 (so that a run really wraps), 1 s tokens.
    pub fn fast() -> ServerConfig {
        ServerConfig {
            response_ttl: Duration::from_secs(1),
            key_ttl: Duration::from_secs(2),
            lease: Duration::from_secs(1),
            time_keys: TimeKeyConfig {
                max_ahead: Duration::from_millis(500),
                max_age: Duration::from_secs(1),
            },
            counter: CounterConfig { bits: 8, window: 4 },
            token_ttl: Duration::from_secs(1),
            ..ServerConfig::default()
        }
    }

    /// The engine configuration actually used, faults included.
    pub(super) fn engine_config(&self) -> Config {
        let mut c = Config {
            response_ttl: self.response_ttl,
            key_ttl: self.key_ttl,
            lease: self.lease,
            ..Config::default()
        };
        if let Some(fault) = self.fault {
            fault.engine(&mut c);
        }
        c
    }
}

/// Why the server could not start.
#[derive(Debug)]
pub enum StartError {
    /// The settings are inconsistent (for example a key retention shorter than the response
    /// retention).
    Config(idem_core::ConfigError),
    /// The address could not be bound.
    Bind(std::io::Error),
    /// The key kind cannot be configured.
    Keys(idem_core::KindConfigError),
    /// The store cannot be reached.
    Store(String),
    /// Settings that do not go together (an unknown store).
    Settings(String),
    /// The operating system gave no random bytes for the token secret.
    Random(getrandom::Error),
    /// The execution log cannot be opened.
    Log(std::io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Config(e) => write!(f, "invalid server settings: {e}"),
            StartError::Bind(e) => write!(f, "cannot listen: {e}"),
            StartError::Keys(e) => write!(f, "invalid key kind: {e}"),
            StartError::Store(e) => write!(f, "store: {e}"),
            StartError::Settings(e) => write!(f, "{e}"),
            StartError::Random(e) => write!(f, "no random bytes for the token secret: {e}"),
            StartError::Log(e) => write!(f, "execution log: {e}"),
        }
    }
}

impl std::error::Error for StartError {}
