//! `run --html DIR`: the static report of the embedded run and of a fault run. Every case
//! has its page and its row in the index with the verdict of the JSON report, the raced
//! rounds and the waits have their timelines, nothing is loaded from elsewhere, and no
//! credential appears in any file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const SECRETS: [&str; 2] = ["sk_live_html_5f0c2d9e8b7a", "sess-html-0a1b2c3d4e5f-cookie"];
/// The embedded reference server's own bearer credentials: redacted like any other.
const REFERENCE_CREDENTIALS: [&str; 2] = ["conformance-a", "conformance-b"];

/// The text of an HTML file with the entities minijinja writes decoded, so that a search
/// sees what a reader sees.
fn unescaped(html: &str) -> String {
    html.replace("&#x2f;", "/")
        .replace("&#x27;", "'")
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

struct Run {
    code: i32,
    /// Case id → (verdict, requirement), from the JSON report of the same run.
    verdicts: BTreeMap<String, (String, String)>,
    /// File name → unescaped contents.
    pages: BTreeMap<String, String>,
}

fn run(name: &str, extra: &[&str]) -> Run {
    let dir = std::env::temp_dir().join(format!(
        "idem-conformance-html-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let html = dir.join("report");
    let json = dir.join("report.json");
    let output = Command::new(env!("CARGO_BIN_EXE_idem-conformance"))
        .args(["run", "--quiet", "--html"])
        .arg(&html)
        .arg("--json")
        .arg(&json)
        .args(["-H", &format!("X-Api-Key: {}", SECRETS[0])])
        .args(["-H", &format!("Cookie: session={}", SECRETS[1])])
        .args(extra)
        .output()
        .expect("the binary runs");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON report")).expect("JSON");
    let verdicts = report["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().expect(k).to_owned();
            (s("id"), (s("verdict"), s("requirement")))
        })
        .collect();
    let pages = read_dir(&html);
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        code: output.status.code().expect("exited"),
        verdicts,
        pages,
    }
}

fn read_dir(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("the HTML report directory") {
        let path: PathBuf = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_owned();
        let text = std::fs::read_to_string(&path).expect("UTF-8 HTML");
        out.insert(name, unescaped(&text));
    }
    out
}

fn page_of(id: &str) -> String {
    format!("{}.html", id.replace('/', "-"))
}

/// The index's table row of `id`.
fn index_row<'a>(index: &'a str, id: &str) -> &'a str {
    let link = format!("<a href=\"{}\">{id}</a>", page_of(id));
    let at = index
        .find(&link)
        .unwrap_or_else(|| panic!("the index links {id}"));
    let end = index[at..].find("</tr>").map_or(index.len(), |e| at + e);
    &index[at..end]
}

/// Checks everything a report must hold, whatever the server did.
fn check_common(run: &Run) {
    let index = run.pages.get("index.html").expect("index.html");
    assert_eq!(
        run.pages.len(),
        run.verdicts.len() + 1,
        "one page per case, and the index: {:?}",
        run.pages.keys()
    );
    for (id, (verdict, requirement)) in &run.verdicts {
        let row = index_row(index, id);
        assert!(
            row.contains(&format!("badge v-{verdict}\">{verdict}<")),
            "index row of {id} shows {verdict}: {row}"
        );
        assert!(row.contains(requirement.as_str()), "{row}");
        let page = run
            .pages
            .get(&page_of(id))
            .unwrap_or_else(|| panic!("a page for {id}"));
        assert!(
            page.contains(&format!(
                "<h1>{id} <span class=\"badge v-{verdict}\">{verdict}</span></h1>"
            )),
            "the page of {id} shows {verdict}"
        );
        assert!(page.contains(requirement.as_str()));
    }
    for (name, text) in &run.pages {
        for secret in SECRETS.iter().chain(&REFERENCE_CREDENTIALS) {
            assert!(!text.contains(secret), "{name} leaks {secret}");
        }
        for external in ["src=", "<link", "<script", "@import", "url(", "href=\"http"] {
            assert!(
                !text.contains(external),
                "{name} loads something ({external})"
            );
        }
    }
    assert!(
        index.contains("x-api-key: <"),
        "the options list the header, redacted"
    );
    assert!(index.contains("bytes redacted>"));
    assert!(index.contains("ietf"), "the profile");
}

fn svg_count(page: &str) -> usize {
    page.matches("<svg").count()
}

#[test]
fn the_embedded_run_and_a_fault_run_as_html() {
    let good = run("embedded", &[]);
    assert_eq!(good.code, 0);
    check_common(&good);
    // Every round of concurrent/1 has its timeline: a lane per connection (16 × 5 rounds),
    // and the count oracle's one execution.
    let conc = &good.pages["concurrent-1.html"];
    assert_eq!(svg_count(conc), 5, "one timeline per round");
    for round in 1..=5 {
        assert!(
            conc.contains(&format!("Round {round}: the count oracle saw 1 execution<")),
            "round {round}"
        );
    }
    assert_eq!(
        conc.matches("text-anchor=\"end\">connection ").count(),
        16 * 5,
        "a lane per connection"
    );
    assert!(conc.contains("replayed") || conc.contains("in progress"));
    // The cases that wait for the server's clock show the waits.
    for waiting in ["expiry-1.html", "expiry-3.html", "lease-1.html"] {
        let page = &good.pages[waiting];
        assert!(page.contains("Timeline of the waits"), "{waiting}");
        assert_eq!(svg_count(page), 1, "{waiting}");
        assert!(page.contains(">wait: "), "{waiting} names its wait");
    }
    // A case without raced rounds or waits has neither.
    assert_eq!(svg_count(&good.pages["replay-1.html"]), 0);

    let bad = run("no-lock", &["--fault", "no-lock"]);
    assert_eq!(bad.code, 2, "no-lock is unsafe");
    check_common(&bad);
    assert_eq!(bad.verdicts["concurrent/1"].0, "unsafe");
    let index = &bad.pages["index.html"];
    assert!(index.contains("no-lock"), "the index names the fault");
    assert!(index.contains("badge v-unsafe\">unsafe<"));
    let conc = &bad.pages["concurrent-1.html"];
    assert!(conc.contains("Expected:") && conc.contains("Observed:"));
    let executions: u64 = conc
        .split("Round 1: the count oracle saw ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("round 1 names its executions");
    assert!(executions > 1, "round 1 ran {executions} times");
}
