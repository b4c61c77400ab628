//! Safety before keywords, as a user sees it: a server without a lock run with no oracle
//! is unsafe, and a disclosure across principals is a leak under every profile; both exit 2.

mod served;

use served::{serve, word_after};
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem-conformance"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited normally")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-conformance-safety-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// Without any oracle, a server with no lock is unsafe: the concurrent duplicates get
/// different success answers for one key.
#[test]
fn a_server_without_a_lock_is_unsafe_without_an_oracle() {
    let (_served, lines) = serve(&["--fault", "no-lock"], 1);
    let url = format!("{}/orders", word_after(&lines[0], "http://"));
    let o = run(&[
        "run",
        &url,
        "--case",
        "concurrent/1",
        "--rounds",
        "2",
        "--quiet",
    ]);
    assert_eq!(code(&o), 2, "{}", text(&o.stdout));
    let out = text(&o.stdout);
    assert!(
        out.contains("UNSAFE")
            && out.contains("confidence medium")
            && out.contains("two different success answers"),
        "{out}"
    );
}

/// A disclosure across principals exits 2 under every profile and is named in the
/// terminal and JUnit reports.
#[test]
fn a_leak_exits_2_under_every_profile_and_is_named() {
    for profile in ["ietf", "stripe", "idem"] {
        let junit = temp(&format!("leak-{profile}.xml"));
        let o = run(&[
            "run",
            "--fault",
            "mismatch-across-principals",
            "--case",
            "scope",
            "--profile",
            profile,
            "--junit",
            junit.to_str().expect("utf-8"),
            "--quiet",
        ]);
        assert_eq!(code(&o), 2, "{profile}: {}", text(&o.stdout));
        let out = text(&o.stdout);
        assert!(
            out.contains("LEAK") && out.contains("another payload"),
            "{profile}: {out}"
        );
        let xml = std::fs::read_to_string(&junit).expect("JUnit written");
        assert_eq!(xml.matches("<failure").count(), 1, "{xml}");
        assert!(xml.contains(r#"type="leak""#), "{xml}");
    }
}
