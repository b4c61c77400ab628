//! Spec and code cannot drift apart silently: every cited requirement ID exists, every MUST
//! is checked by at least one test or conformance case, and the README's table is current.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Files that may cite requirement IDs, relative to the workspace root.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(
                name.as_str(),
                "target" | "node_modules" | ".git" | "pkg" | "dist" | "corpus" | "artifacts"
            ) {
                sources(&path, out);
            }
        } else if [".rs", ".mjs", ".js", ".ts", ".md"]
            .iter()
            .any(|ext| name.ends_with(ext))
        {
            out.push(path);
        }
    }
}

/// `IDEM-AREA-N` citations in a text.
fn citations(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("IDEM-") {
        let tail = &rest[i + 5..];
        let area: String = tail
            .chars()
            .take_while(|c| c.is_ascii_uppercase())
            .collect();
        let after = &tail[area.len()..];
        if !area.is_empty() && after.starts_with('-') {
            let num: String = after[1..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect();
            if !num.is_empty() {
                found.push(format!("IDEM-{area}-{num}"));
            }
        }
        rest = &rest[i + 5..];
    }
    found
}

/// Whether a file checks behaviour (a test or a conformance case), rather than describes it.
fn is_check(rel: &str) -> bool {
    !rel.ends_with(".md")
        && (rel.contains("/tests/")
            || rel.contains("/test/")
            || rel.starts_with("conformance/src/")
            || rel.contains(".test."))
}

#[test]
fn table_is_well_formed() {
    let reqs = idem_spec::requirements();
    assert!(reqs.len() >= 30);
    let mut ids = BTreeSet::new();
    for r in reqs {
        assert!(ids.insert(r.id.clone()), "duplicate ID {}", r.id);
        assert_eq!(
            citations(&r.id),
            vec![r.id.clone()],
            "malformed ID {}",
            r.id
        );
        assert!(
            r.text.ends_with('.'),
            "{}: one sentence, ending with a period",
            r.id
        );
        if let Some(s) = r.status {
            assert!((400..=599).contains(&s), "{}: status {s}", r.id);
            assert!(
                r.problem
                    .as_deref()
                    .is_some_and(|p| p.starts_with("urn:idem:problem:")),
                "{}: a status needs a problem type",
                r.id
            );
        }
    }
}

#[test]
fn citations_exist_and_every_must_is_checked() {
    let root = root();
    let mut files = Vec::new();
    sources(&root, &mut files);
    let known: BTreeSet<&str> = idem_spec::requirements()
        .iter()
        .map(|r| r.id.as_str())
        .collect();
    let mut unknown = BTreeMap::new();
    let mut checked = BTreeSet::new();
    for f in &files {
        let rel = f
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if rel.starts_with("spec/") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for id in citations(&text) {
            if !known.contains(id.as_str()) {
                unknown
                    .entry(id.clone())
                    .or_insert_with(Vec::new)
                    .push(rel.clone());
            } else if is_check(&rel) {
                checked.insert(id);
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "cited IDs missing from spec/requirements.toml: {unknown:?}"
    );
    let unchecked: Vec<&str> = idem_spec::requirements()
        .iter()
        .filter(|r| r.level == idem_spec::Level::Must && !checked.contains(&r.id))
        .map(|r| r.id.as_str())
        .collect();
    assert!(
        unchecked.is_empty(),
        "MUST requirements cited by no test or conformance case: {unchecked:?}"
    );
}

#[test]
fn readme_table_is_current() {
    let path = root().join("spec/README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- requirements:begin -->\n", "<!-- requirements:end -->");
    let start = readme.find(begin).expect("begin marker") + begin.len();
    let stop = readme.find(end).expect("end marker");
    let rendered = idem_spec::render_markdown();
    if readme[start..stop] != rendered {
        if std::env::var_os("IDEM_SPEC_BLESS").is_some() {
            let updated = format!("{}{}{}", &readme[..start], rendered, &readme[stop..]);
            std::fs::write(&path, updated).unwrap();
        } else {
            panic!("spec/README.md's table is out of date: run `IDEM_SPEC_BLESS=1 cargo test -p idem-spec`");
        }
    }
}

#[test]
fn profile_levels_follow_the_draft_unless_explained() {
    use idem_spec::Level;
    for r in idem_spec::requirements() {
        let Some(p) = r.profiles else {
            assert!(
                r.why.is_none() && r.stripe_why.is_none(),
                "{}: a why without profile levels",
                r.id
            );
            continue;
        };
        // The ietf profile uses the draft's keyword, and SHOULD where the draft is silent;
        // a level that departs from it says why, ietf's in `why`, Stripe's (what Stripe
        // documents) in `stripe_why`.
        let rule = r.draft.unwrap_or(Level::Should);
        assert_eq!(
            p.ietf != rule,
            r.why.is_some(),
            "{}: an ietf level that departs from the draft's keyword (ietf {:?}, draft {:?}) needs a why, and only such a level",
            r.id,
            p.ietf,
            r.draft
        );
        assert_eq!(
            p.stripe != rule,
            r.stripe_why.is_some(),
            "{}: a stripe level that departs from the draft's keyword (stripe {:?}, draft {:?}) needs a stripe_why, and only such a level",
            r.id,
            p.stripe,
            r.draft
        );
        // idem is never more lenient than the draft.
        let rank = |l: Level| match l {
            Level::Must => 2,
            Level::Should => 1,
            Level::May => 0,
        };
        assert!(
            rank(r.level) >= rank(rule),
            "{}: idem's level is below the draft's",
            r.id
        );
    }
}
