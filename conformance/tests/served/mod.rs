//! A `serve` process for the tests that run the binary, stopped when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// Starts `serve` with `args` and returns it with the first line it printed for each of
/// `lines` (the banner, and for --tls the CA line).
pub(crate) fn serve(args: &[&str], lines: usize) -> (Served, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem-conformance"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve starts");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let served = Served(child);
    let mut got = Vec::new();
    for _ in 0..lines {
        let mut line = String::new();
        out.read_line(&mut line).expect("a line");
        got.push(line);
    }
    (served, got)
}

/// A served reference server, stopped when dropped (also when the test fails).
pub(crate) struct Served(std::process::Child);

// Not every test that includes this module kills or measures its servers.
#[allow(dead_code)]
impl Served {
    /// Kills the process with SIGKILL, as a crash would, and reaps it.
    pub(crate) fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The word of `line` that starts with `prefix`.
pub(crate) fn word_after<'a>(line: &'a str, prefix: &str) -> &'a str {
    line.split_whitespace()
        .find(|w| w.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {line:?}"))
}

/// The port of the `http://127.0.0.1:PORT` address in `serve`'s banner `line`.
// Not every test that includes this module reads ports.
#[allow(dead_code)]
pub(crate) fn port(line: &str) -> u16 {
    word_after(line, "http://127.0.0.1:")
        .trim_start_matches("http://127.0.0.1:")
        .parse()
        .unwrap_or_else(|_| panic!("no port in {line:?}"))
}
