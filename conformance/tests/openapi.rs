//! `openapi SPEC` as a user runs it: the reference server's own document, every operation
//! passing; the same document against a server with a fault on one route, exactly that
//! operation failing; an operation whose request cannot be built, skipped with its reason.

mod served;

use served::{serve, word_after};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn document() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi/reference.yaml")
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-conformance-openapi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// Runs `openapi` on `doc` against a `serve` with `fault`, with the options that enable the
/// kinds' families; its output and JSON report.
fn run(doc: &Path, fault: Option<&str>, extra: &[&str]) -> (Output, serde_json::Value) {
    let mut args = vec![
        "--delay-ms",
        "5",
        "--counter-bits",
        "8",
        "--counter-window",
        "4",
    ];
    if let Some(f) = fault {
        args.extend(["--fault", f]);
    }
    let (_served, lines) = serve(&args, 1);
    let base = word_after(&lines[0], "http://").to_owned();
    let json = temp(&format!("{}.json", fault.unwrap_or("clean")));
    let output = Command::new(env!("CARGO_BIN_EXE_idem-conformance"))
        .arg("openapi")
        .arg(doc)
        .args(["--base-url", &base])
        .args(["-H", "Authorization: Bearer openapi-a"])
        .args(["--second-credential", "Authorization: Bearer openapi-b"])
        .args(["--count-url", "/count", "--id-pointer", "/id"])
        .args([
            "--session-url",
            "/sessions",
            "--token-url",
            "/idempotency-tokens",
        ])
        .args([
            "--counter-bits",
            "8",
            "--counter-window",
            "4",
            "--rounds",
            "2",
            "--quiet",
        ])
        .arg("--json")
        .arg(&json)
        .args(extra)
        .output()
        .expect("the binary runs");
    let report =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON report")).expect("JSON");
    (output, report)
}

/// Operation id → its verdict, from the combined JSON report.
fn verdicts(report: &serde_json::Value) -> Vec<(String, String)> {
    report["operations"]
        .as_array()
        .expect("operations")
        .iter()
        .map(|o| {
            let id = o["operation"]["id"].as_str().expect("id").to_owned();
            let verdict = match o["report"]["exit_code"].as_u64() {
                None => "skipped".to_owned(),
                Some(0) => "pass".to_owned(),
                Some(code) => format!("exit {code}"),
            };
            (id, verdict)
        })
        .collect()
}

#[test]
fn every_operation_of_the_reference_document_passes() {
    let html = temp("html");
    let junit = temp("clean.xml");
    let (o, report) = run(
        &document(),
        None,
        &[
            "--html",
            html.to_str().expect("utf-8"),
            "--junit",
            junit.to_str().expect("utf-8"),
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let v = verdicts(&report);
    let ids: Vec<&str> = v.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        ["checkout", "createOrder", "createPayment", "createTransfer"]
    );
    assert!(v.iter().all(|(_, verdict)| verdict == "pass"), "{v:?}");
    // Each operation ran its own kind's cases, every one of them.
    for o in report["operations"].as_array().expect("operations") {
        let cases = o["report"]["cases"].as_array().expect("cases");
        assert!(cases
            .iter()
            .all(|c| c["verdict"] == "pass" || c["verdict"] == "skip"));
        assert!(cases.iter().any(|c| c["verdict"] == "pass"));
    }
    // The closing table names every operation, and the HTML report has a page for each.
    for id in &ids {
        assert!(
            out.lines().any(|l| l.starts_with(id) && l.contains("PASS")),
            "{out}"
        );
        assert!(html.join(id).join("index.html").is_file(), "{id}'s page");
    }
    let index = std::fs::read_to_string(html.join("index.html")).expect("index");
    assert!(index.contains("createTransfer/index.html"), "{index}");
    let xml = std::fs::read_to_string(&junit).expect("JUnit");
    assert!(
        xml.contains("idem-conformance.createOrder.concurrent"),
        "{xml}"
    );
}

#[test]
fn a_fault_on_one_route_fails_exactly_that_operation() {
    // counter-no-wrap-check is a defect of /transfers alone.
    let (o, report) = run(&document(), Some("counter-no-wrap-check"), &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let v = verdicts(&report);
    for (id, verdict) in &v {
        let want = if id == "createTransfer" {
            "exit 1"
        } else {
            "pass"
        };
        assert_eq!(verdict, want, "{id}: {v:?}");
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("createTransfer") && l.contains("FAIL")),
        "{out}"
    );
}

#[test]
fn an_operation_that_cannot_be_built_is_skipped_with_its_reason() {
    let text = std::fs::read_to_string(document()).expect("the document");
    let extra = r##"  /orders/{orderId}/refunds:
    post:
      operationId: refundOrder
      parameters:
        - { $ref: "#/components/parameters/IdempotencyKey" }
        - { name: orderId, in: path, required: true, schema: { type: string } }
      responses:
        "201": { description: The refund. }
"##;
    let doc = temp("with-refunds.yaml");
    std::fs::write(&doc, format!("{text}{extra}")).expect("written");
    let (o, report) = run(
        &doc,
        None,
        &["--operation", "createOrder", "--operation", "refundOrder"],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert_eq!(
        verdicts(&report),
        [
            ("createOrder".to_owned(), "pass".to_owned()),
            ("refundOrder".to_owned(), "skipped".to_owned())
        ]
    );
    assert!(
        out.lines().any(|l| l.starts_with("refundOrder")
            && l.contains("SKIPPED")
            && l.contains("\"orderId\" has no example")),
        "{out}"
    );
}

#[test]
fn bad_documents_and_options_are_usage_errors() {
    let not_openapi = temp("not-openapi.yaml");
    std::fs::write(&not_openapi, "hello: world\n").expect("written");
    for args in [
        vec!["openapi", "/nonexistent/spec.yaml"],
        vec!["openapi", not_openapi.to_str().expect("utf-8")],
        vec![
            "openapi",
            document().to_str().expect("utf-8"),
            "--operation",
            "noSuchOperation",
        ],
        vec![
            "openapi",
            document().to_str().expect("utf-8"),
            "--body-for",
            "no-equals",
        ],
        vec![
            "openapi",
            document().to_str().expect("utf-8"),
            "--base-url",
            "ftp://x/",
        ],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_idem-conformance"))
            .args(&args)
            .output()
            .expect("runs");
        assert_eq!(
            o.status.code(),
            Some(3),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!o.stderr.is_empty());
    }
}
