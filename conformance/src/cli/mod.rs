//! The command line: `run [URL]`, `openapi SPEC`, `serve`, `bench`.
//!
//! Exit codes of `run`: 0 all required cases passed, 1 a case failed, 2 a safety failure
//! was seen (a double execution, or a disclosure across principals), 3 usage error (a bad option or value, for any
//! subcommand), 4 the target could not be reached or judged, or the harness failed.
//!
//! Credentials never need to be on the command line: `--header-env NAME=VAR` and
//! `--header-file FILE` (and their `--second-credential-…` twins) read them from the
//! environment or a file, and reports redact every credential unless `--show-secrets`.

use crate::bench::{self, BenchConfig};
use crate::server::{Fault, Server, ServerConfig};
use crate::suite::{EXIT_HARNESS, EXIT_USAGE};
use clap::{Args, Parser, Subcommand};
use openapi::{openapi, OpenapiArgs};
use run::{run, RunArgs};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Writes a line to standard output. A reader that went away (a closed pipe, as with
/// `| head`) ends the output, not the program: the exit code still says how the run went.
macro_rules! outln {
    ($($arg:tt)*) => {
        out(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// Writes `text` to standard output, ignoring a reader that went away.
fn out(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

mod openapi;
mod run;

/// Tests whether an HTTP endpoint honours Idempotency-Key: lost responses, replays,
/// concurrent duplicates, payload mismatches, key validation, error replay, cross-principal
/// isolation and expiry.
#[derive(Debug, Parser)]
#[command(name = "idem-conformance", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the conformance cases against URL, or against the embedded reference server
    /// when no URL is given.
    Run(Box<RunArgs>),
    /// Run the conformance cases against every operation of an OpenAPI 3.0 or 3.1 document
    /// (YAML or JSON) that declares the key header, one after the other, with one report.
    Openapi(Box<OpenapiArgs>),
    /// Run the reference server alone.
    Serve(ServeArgs),
    /// Measure the reference server's requests per second (fresh keys and replays).
    Bench(BenchArgs),
}

/// Options of `serve`.
#[derive(Debug, Args)]
struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The handler's delay in milliseconds.
    #[arg(long, default_value_t = 100)]
    delay_ms: u64,
    /// Response retention in seconds.
    #[arg(long, default_value_t = 86_400.0)]
    response_ttl: f64,
    /// Key retention in seconds.
    #[arg(long, default_value_t = 604_800.0)]
    key_ttl: f64,
    /// Lease in seconds.
    #[arg(long, default_value_t = 60.0)]
    lease: f64,
    /// The largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = 1 << 20)]
    max_body: usize,
    /// The most records the store keeps (503 beyond).
    #[arg(long, default_value_t = 1_000_000)]
    max_entries: usize,
    /// Start with this deliberate defect.
    #[arg(long, value_enum)]
    fault: Option<Fault>,
    /// Serve HTTPS with a certificate for localhost, 127.0.0.1 and ::1, signed by a CA
    /// generated at start; the CA's certificate is written to --tls-dir.
    #[arg(long)]
    tls: bool,
    /// Where --tls writes ca.pem (default: a new directory in the system's temp dir).
    #[arg(long, value_name = "DIR", requires = "tls")]
    tls_dir: Option<PathBuf>,
    /// Accept only UUID keys.
    #[arg(long)]
    uuid_keys: bool,
    /// The counters of /transfers: their width in bits, 8 to 64 (default 32).
    #[arg(long)]
    counter_bits: Option<u8>,
    /// The counters of /transfers: the window of retained results (default 8).
    #[arg(long)]
    counter_window: Option<u32>,
    /// Where the records live: memory (one process), or redis://HOST:PORT or
    /// postgres://USER@HOST:PORT/DB, which several server processes can share (the count of
    /// executions at GET /count is shared too). Faults wrap any store.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Seal the records of the store (feature `seal`) with the keys in the environment
    /// variable NAME: `ID:BASE64` (a key id and 32 bytes of AES-256 key), comma-separated,
    /// the key that seals first; the others still open records sealed with them.
    #[arg(long, value_name = "NAME")]
    seal_env: Option<String>,
    /// Append a line for every handler run to FILE: the key, the fencing number, whether
    /// the run took over from an earlier attempt ("recovered"), and the process id,
    /// tab-separated (several processes may share one file).
    #[arg(long, value_name = "FILE")]
    execution_log: Option<PathBuf>,
}

/// Options of `bench`.
#[derive(Debug, Args)]
struct BenchArgs {
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Seconds per phase.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// The handler's delay in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// A store to measure (repeatable; all in one run, side by side): memory (the default),
    /// redis://HOST:PORT or postgres://USER@HOST:PORT/DB.
    #[arg(long, value_name = "URL")]
    store: Vec<String>,
}

/// Parses the process arguments, runs the command, and returns the exit code.
pub fn main() -> u8 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return EXIT_HARNESS;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run(*args).await,
            Command::Openapi(args) => openapi(*args).await,
            Command::Serve(args) => serve(args).await,
            Command::Bench(args) => bench(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}");
            EXIT_USAGE
        }
        Err(Failure::Harness(message)) => {
            eprintln!("error: {message}");
            EXIT_HARNESS
        }
    }
}

/// Why a command stopped early.
#[derive(Debug)]
enum Failure {
    /// A bad option or value: exit 3.
    Usage(String),
    /// The target, a server or a file could not be used: exit 4.
    Harness(String),
}

impl From<String> for Failure {
    /// Option checks report their errors as strings.
    fn from(message: String) -> Failure {
        Failure::Usage(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        Failure::Usage(message.to_owned())
    }
}

fn harness(message: impl std::fmt::Display) -> Failure {
    Failure::Harness(message.to_string())
}

/// Settings the server refuses are the user's to fix; a port it cannot bind is not.
fn start_error(e: crate::server::StartError) -> Failure {
    match e {
        crate::server::StartError::Config(_)
        | crate::server::StartError::Keys(_)
        | crate::server::StartError::Settings(_) => Failure::Usage(e.to_string()),
        crate::server::StartError::Bind(_)
        | crate::server::StartError::Store(_)
        | crate::server::StartError::Random(_)
        | crate::server::StartError::Log(_) => harness(e),
    }
}

/// The seal keys in the environment variable `name`: `ID:BASE64`, comma-separated.
#[cfg(not(feature = "seal"))]
fn seal_from_env(name: &str) -> Result<crate::store::Seal, String> {
    Err(format!(
        "--seal-env {name}: this build does not seal; install it with \
         `cargo install idem-conformance --features seal`"
    ))
}

/// The seal keys in the environment variable `name`: `ID:BASE64`, comma-separated.
#[cfg(feature = "seal")]
fn seal_from_env(name: &str) -> Result<crate::store::Seal, String> {
    use base64::Engine as _;
    let text =
        std::env::var(name).map_err(|_| format!("--seal-env {name}: the variable is not set"))?;
    let keys = text
        .split(',')
        .map(|entry| {
            let (id, key) = entry
                .trim()
                .split_once(':')
                .ok_or_else(|| format!("--seal-env {name}: each key is ID:BASE64"))?;
            let key = base64::engine::general_purpose::STANDARD
                .decode(key)
                .map_err(|_| format!("--seal-env {name}: the key of {id:?} is not base64"))?;
            Ok((id.to_owned(), key))
        })
        .collect::<Result<Vec<_>, String>>()?;
    // The keys themselves are never shown, only what is wrong with them.
    idem_tower::Seal::new(keys).map_err(|e| format!("--seal-env {name}: {e}"))
}

fn seconds(name: &str, v: f64) -> Result<Duration, String> {
    if v.is_finite() && v > 0.0 && v < 1e9 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(format!("--{name} must be a positive number of seconds"))
    }
}
async fn serve(a: ServeArgs) -> Result<u8, Failure> {
    let mut config = ServerConfig {
        response_ttl: seconds("response-ttl", a.response_ttl)?,
        key_ttl: seconds("key-ttl", a.key_ttl)?,
        lease: seconds("lease", a.lease)?,
        delay: Duration::from_millis(a.delay_ms),
        max_body: a.max_body,
        limits: idem_core::MemoryStoreLimits {
            max_entries: a.max_entries,
            ..idem_core::MemoryStoreLimits::default()
        },
        fault: a.fault,
        tls: None,
        uuid_keys: a.uuid_keys,
        store: a.store.clone(),
        seal: a.seal_env.as_deref().map(seal_from_env).transpose()?,
        execution_log: a.execution_log.clone(),
        ..ServerConfig::default()
    }
    .with_kind_bounds();
    if let Some(bits) = a.counter_bits {
        config.counter.bits = bits;
    }
    if let Some(window) = a.counter_window {
        config.counter.window = window;
    }
    let mut ca_path = None;
    if a.tls {
        let identity = crate::tls::Identity::generate().map_err(harness)?;
        let dir = match &a.tls_dir {
            Some(dir) => dir.clone(),
            None => std::env::temp_dir().join(format!(
                "idem-conformance-tls-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            )),
        };
        ca_path = Some(identity.write_ca(&dir).map_err(harness)?);
        config.tls = Some(identity);
    }
    let sealed = config
        .seal
        .as_ref()
        .and_then(|s| s.key_ids().next())
        .map(|id| format!(", sealed with key {id}"))
        .unwrap_or_default();
    let mut server = Server::start(a.listen, config).await.map_err(start_error)?;
    outln!(
        "idem reference server listening on {} (POST /orders, GET /count){}{}",
        server.base_url(),
        a.fault.map(|f| format!(", fault {f}")).unwrap_or_default(),
        a.store
            .as_deref()
            .filter(|s| *s != "memory")
            .map(|s| format!(", store {}", crate::store::shown(s)))
            .unwrap_or_default()
            + &sealed
    );
    if let Some(path) = ca_path {
        outln!(
            "TLS certificate authority written to {} (give it to the harness with --cacert)",
            path.display()
        );
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = server.wait() => {}
    }
    Ok(0)
}

async fn bench(a: BenchArgs) -> Result<u8, Failure> {
    if a.connections == 0 || a.connections > 1024 {
        return Err("--connections must be between 1 and 1024".into());
    }
    let config = BenchConfig {
        connections: a.connections,
        duration: seconds("seconds", a.seconds)?,
        delay: Duration::from_millis(a.delay_ms),
    };
    outln!(
        "reference server on 127.0.0.1, {} keep-alive connections, {:.1} s per phase, handler delay {} ms",
        config.connections,
        config.duration.as_secs_f64(),
        a.delay_ms
    );
    let mut stores: Vec<Option<String>> = Vec::new();
    for url in &a.store {
        crate::store::RefStore::check(url)?;
        stores.push((url != "memory").then(|| url.clone()));
    }
    if stores.is_empty() {
        stores.push(None);
    }
    for r in bench::run(config, &stores).await.map_err(harness)? {
        outln!(
            "{:<40} {:>9.0} req/s   p50 {:>7.3} ms   p99 {:>7.3} ms   {} requests, {} unexpected",
            r.label,
            r.rps(),
            r.p50.as_secs_f64() * 1e3,
            r.p99.as_secs_f64() * 1e3,
            r.requests,
            r.errors
        );
    }
    Ok(0)
}
