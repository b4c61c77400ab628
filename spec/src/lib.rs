//! The idem requirement table.
//!
//! `requirements.toml` beside this crate is the single source of truth for what idem
//! promises. Conformance cases take their requirement sentences from here instead of copying
//! them, and the tests of this crate fail when any test or case cites an ID that does not
//! exist, or when a MUST requirement is cited by nothing.

use serde::Deserialize;
use std::sync::OnceLock;

/// The requirement table, as written.
pub const REQUIREMENTS_TOML: &str = include_str!("../requirements.toml");

/// How binding a requirement is (RFC 2119).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Level {
    /// An absolute requirement.
    #[serde(rename = "MUST")]
    Must,
    /// Recommended; a server may have reasons to differ.
    #[serde(rename = "SHOULD")]
    Should,
    /// Optional.
    #[serde(rename = "MAY")]
    May,
}

impl Level {
    /// `MUST`, `SHOULD` or `MAY`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Level::Must => "MUST",
            Level::Should => "SHOULD",
            Level::May => "MAY",
        }
    }
}

/// One requirement.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    /// Stable ID, `IDEM-<AREA>-<N>`.
    pub id: String,
    /// MUST, SHOULD or MAY.
    pub level: Level,
    /// The requirement in one sentence.
    pub text: String,
    /// The HTTP status it maps to, if any.
    pub status: Option<u16>,
    /// The `application/problem+json` type it maps to, if any.
    pub problem: Option<String>,
    /// The section of draft-ietf-httpapi-idempotency-key-header-07 it comes from, if any.
    pub ietf: Option<String>,
}

#[derive(Deserialize)]
struct Table {
    requirement: Vec<Requirement>,
}

/// All requirements, in document order.
///
/// # Panics
///
/// Never in a released build: the table is embedded, and this crate's tests parse it.
pub fn requirements() -> &'static [Requirement] {
    static TABLE: OnceLock<Vec<Requirement>> = OnceLock::new();
    TABLE.get_or_init(|| {
        toml::from_str::<Table>(REQUIREMENTS_TOML)
            .expect("spec/requirements.toml is checked by the idem-spec tests")
            .requirement
    })
}

/// The requirement with this ID.
pub fn get(id: &str) -> Option<&'static Requirement> {
    requirements().iter().find(|r| r.id == id)
}

/// The requirement table as Markdown, as embedded in `spec/README.md` between the
/// `requirements:begin` and `requirements:end` markers.
pub fn render_markdown() -> String {
    let mut out = String::from(
        "| ID | Level | Requirement | HTTP | Problem type | IETF |\n|---|---|---|---|---|---|\n",
    );
    for r in requirements() {
        let status = r.status.map(|s| s.to_string()).unwrap_or_default();
        let problem = r
            .problem
            .as_deref()
            .map(|p| format!("`{p}`"))
            .unwrap_or_default();
        let ietf = r
            .ietf
            .as_deref()
            .map(|s| format!("§{s}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.id,
            r.level.as_str(),
            r.text.replace('|', "\\|"),
            status,
            problem,
            ietf
        ));
    }
    out
}
