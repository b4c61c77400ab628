//! Private redis-server and postgres processes for the tests: started from the Debian
//! packages (`cargo xtask setup` installs them) on 127.0.0.1, on a port the OS chose, with
//! their data in a temporary directory, and stopped (process group killed, directory
//! removed) when dropped, also when a test fails.
#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server: stopped when dropped.
pub struct Server {
    pub url: String,
    pub port: u16,
    child: Child,
    dir: PathBuf,
    /// How it was started, to start it again on the same port and data.
    command: (String, Vec<String>),
    kind: Kind,
}

/// Which server, for knowing when it is ready again.
#[derive(Clone, Copy)]
enum Kind {
    Redis,
    Postgres,
}

impl Server {
    /// Signals the whole process group (runuser and postgres's children too).
    fn signal(&self, signal: &str) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args([signal, "--", &group])
            .stderr(Stdio::null())
            .status();
    }

    /// Kills every process of the server with SIGKILL, as a crash would, and waits until
    /// none is left (postgres's children outlive its postmaster for a moment, holding its
    /// shared memory).
    pub fn kill(&mut self) {
        self.signal("-KILL");
        let _ = self.child.wait();
        let group = format!("-{}", self.child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let alive = Command::new("kill")
                .args(["-0", "--", &group])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !alive {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops every process of the server where it stands (SIGSTOP), as a server that hangs:
    /// connections stay open, and nothing answers until [`Server::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Starts the server again on its port and data directory (after [`Server::kill`]), and
    /// waits until it answers.
    pub fn restart(&mut self) {
        let (cmd, args) = &self.command;
        self.child = spawn(cmd, args);
        match self.kind {
            Kind::Redis => wait_listening(self.port, &mut self.child, "redis-server"),
            Kind::Postgres => wait_postgres(self.port, &mut self.child),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A server a failed test left paused could not stop.
        self.signal("-CONT");
        self.signal("-INT");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.signal("-KILL");
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

fn temp_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "idem-{label}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

fn missing(what: &str) -> String {
    format!("{what} is not installed: run `cargo xtask setup` (it installs the Debian packages redis-server and postgresql)")
}

fn spawn(cmd: &str, args: &[String]) -> Child {
    use std::os::unix::process::CommandExt;
    Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

fn wait_listening(port: u16, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before it was ready: {status}");
        }
        assert!(Instant::now() < deadline, "{what} was not ready after 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A private redis-server without persistence.
pub fn redis() -> Server {
    redis_with(false)
}

/// A private redis-server; with `append_only`, every write is in its append-only file
/// before it is answered (`appendonly yes`, `appendfsync always`), so that a restart after
/// SIGKILL has every write it answered.
pub fn redis_with(append_only: bool) -> Server {
    assert!(
        Path::new("/usr/bin/redis-server").exists(),
        "{}",
        missing("redis-server")
    );
    let dir = temp_dir("redis");
    let port = free_port();
    let args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        if append_only { "yes" } else { "no" },
        "--appendfsync",
        "always",
        "--dir",
        dir.to_str().expect("a UTF-8 path"),
        "--loglevel",
        "warning",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut child = spawn("/usr/bin/redis-server", &args);
    wait_listening(port, &mut child, "redis-server");
    Server {
        url: format!("redis://127.0.0.1:{port}"),
        port,
        child,
        dir,
        command: ("/usr/bin/redis-server".to_owned(), args),
        kind: Kind::Redis,
    }
}

fn postgres_bin() -> PathBuf {
    let base = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<u32> = std::fs::read_dir(base)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .filter(|v: &u32| base.join(v.to_string()).join("bin/postgres").exists())
                .collect()
        })
        .unwrap_or_default();
    versions.sort_unstable();
    let v = versions
        .pop()
        .unwrap_or_else(|| panic!("{}", missing("postgresql")));
    base.join(v.to_string()).join("bin")
}

/// A private Postgres cluster (user `idem`, trust authentication, database `postgres`),
/// without fsync. As root it runs as the `postgres` user the Debian package creates.
pub fn postgres() -> Server {
    postgres_with(false)
}

/// A private Postgres cluster; with `durable_commits`, a commit is answered only once its
/// WAL is written (`synchronous_commit=on`, the default), so that a restart after SIGKILL
/// has every commit it answered. Without, commits are answered before (faster tests). Either
/// way without fsync: what the kernel holds survives a killed process, not a lost machine.
pub fn postgres_with(durable_commits: bool) -> Server {
    let bin = postgres_bin();
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false);
    let dir = temp_dir("postgres");
    let data = dir.join("data");
    if root {
        let ok = Command::new("chown")
            .args(["postgres:postgres", dir.to_str().unwrap()])
            .status();
        assert!(ok.is_ok_and(|s| s.success()), "chown of the data directory");
    }
    let as_postgres = |cmd: PathBuf, args: Vec<String>| -> (String, Vec<String>) {
        let cmd = cmd.to_str().expect("a UTF-8 path").to_owned();
        if root {
            let mut all = vec!["-u".to_owned(), "postgres".to_owned(), "--".to_owned(), cmd];
            all.extend(args);
            ("runuser".to_owned(), all)
        } else {
            (cmd, args)
        }
    };
    let d = data.to_str().expect("a UTF-8 path").to_owned();
    let (cmd, args) = as_postgres(
        bin.join("initdb"),
        [
            "-D",
            &d,
            "-A",
            "trust",
            "-U",
            "idem",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    );
    let out = Command::new(&cmd)
        .args(&args)
        .output()
        .expect("initdb runs");
    assert!(
        out.status.success(),
        "initdb: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let port = free_port();
    let socket_dir = dir.to_str().expect("a UTF-8 path").to_owned();
    let (cmd, args) = as_postgres(
        bin.join("postgres"),
        [
            "-D",
            &d,
            "-p",
            &port.to_string(),
            "-k",
            &socket_dir,
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            if durable_commits {
                "synchronous_commit=on"
            } else {
                "synchronous_commit=off"
            },
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=300",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    );
    let mut child = spawn(&cmd, &args);
    wait_postgres(port, &mut child);
    Server {
        url: format!("postgres://idem@127.0.0.1:{port}/postgres"),
        port,
        child,
        dir,
        command: (cmd, args),
        kind: Kind::Postgres,
    }
}

/// Waits until the postgres started as `child` on `port` answers a query (accepting
/// connections is not ready).
fn wait_postgres(port: u16, child: &mut Child) {
    wait_listening(port, child, "postgres");
    let deadline = Instant::now() + Duration::from_secs(20);
    let psql = postgres_bin().join("psql");
    loop {
        let ok = Command::new(&psql)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "idem",
                "-d",
                "postgres",
                "-c",
                "SELECT 1",
                "-q",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "postgres did not answer after 20 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
