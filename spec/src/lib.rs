//! The idem requirement table.
//!
//! `requirements.toml` beside this crate is the single source of truth for what idem
//! promises. Conformance cases take their requirement sentences from here instead of copying
//! them, and the tests of this crate fail when any test or case cites an ID that does not
//! exist, or when a MUST requirement is cited by nothing.

use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// The requirement table, as written.
pub const REQUIREMENTS_TOML: &str = include_str!("../requirements.toml");

/// How binding a requirement is (RFC 2119).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
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

/// A way of grading a server: whose rules a conformance run holds it to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// draft-ietf-httpapi-idempotency-key-header-07 as written: MUST only where the draft or
    /// RFC 8941 says MUST, SHOULD where it says SHOULD or is silent.
    Ietf,
    /// idem's own levels, stricter than the draft in places.
    Idem,
    /// Stripe's documented behaviour: the IETF levels, with Stripe's own choices accepted.
    Stripe,
}

impl Profile {
    /// Every profile, in the order the table shows them.
    pub const ALL: [Profile; 3] = [Profile::Ietf, Profile::Idem, Profile::Stripe];

    /// `ietf`, `idem` or `stripe`.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Ietf => "ietf",
            Profile::Idem => "idem",
            Profile::Stripe => "stripe",
        }
    }
}

/// A breach graded as a safety failure under every profile, whatever the requirement's
/// level: the harness reports it with a verdict of its own, and the run exits 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Safety {
    /// A request executed more often than once.
    Unsafe,
    /// One principal's record disclosed to another.
    Leak,
}

impl Safety {
    /// `unsafe` or `leak`.
    pub fn as_str(self) -> &'static str {
        match self {
            Safety::Unsafe => "unsafe",
            Safety::Leak => "leak",
        }
    }
}

/// The levels of an HTTP-observable requirement under the profiles other than `idem`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileLevels {
    /// Under `ietf`.
    pub ietf: Level,
    /// Under `stripe`.
    pub stripe: Level,
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
    /// The keyword the draft (or RFC 8941) uses for this server behaviour; `None` where the
    /// draft does not ask for it.
    pub draft: Option<Level>,
    /// For requirements checked over HTTP: the level under each profile but `idem`.
    pub profiles: Option<ProfileLevels>,
    /// Why the `ietf` level differs from the draft's keyword, where it does.
    pub why: Option<String>,
    /// Why the `stripe` level differs from the draft's keyword, where it does: what
    /// Stripe documents.
    pub stripe_why: Option<String>,
    /// Whether a breach of it is a safety failure, graded the same under every profile.
    pub safety: Option<Safety>,
}

impl Requirement {
    /// The level under `profile`: `idem` uses [`Requirement::level`]; the others need
    /// [`Requirement::profiles`] and are `None` without it.
    pub fn level_in(&self, profile: Profile) -> Option<Level> {
        match profile {
            Profile::Idem => Some(self.level),
            Profile::Ietf => self.profiles.map(|p| p.ietf),
            Profile::Stripe => self.profiles.map(|p| p.stripe),
        }
    }
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
        "| ID | idem | draft-07 | ietf | stripe | Requirement | HTTP | Problem type |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in requirements() {
        let status = r.status.map(|s| s.to_string()).unwrap_or_default();
        let problem = r
            .problem
            .as_deref()
            .map(|p| format!("`{p}`"))
            .unwrap_or_default();
        let draft = match (r.draft, r.ietf.as_deref()) {
            (Some(level), Some(section)) => format!("{} §{section}", level.as_str()),
            (Some(level), None) => level.as_str().to_owned(),
            (None, Some(section)) => format!("§{section}"),
            (None, None) => String::new(),
        };
        let graded = |p: Profile| {
            r.level_in(p).map_or_else(String::new, |l| {
                let (why, mark) = match p {
                    Profile::Stripe => (&r.stripe_why, "²"),
                    _ => (&r.why, "¹"),
                };
                let changed = why.is_some() && l != r.draft.unwrap_or(Level::Should);
                let safety = r
                    .safety
                    .map_or(String::new(), |s| format!(", {}³", s.as_str()));
                format!("{}{}{safety}", l.as_str(), if changed { mark } else { "" })
            })
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.id,
            r.level.as_str(),
            draft,
            graded(Profile::Ietf),
            graded(Profile::Stripe),
            r.text.replace('|', "\\|"),
            status,
            problem,
        ));
    }
    out.push_str("\n¹ The ietf profile's level differs from the draft's keyword:\n\n");
    for r in requirements() {
        if let Some(why) = &r.why {
            out.push_str(&format!("- {}: {why}\n", r.id));
        }
    }
    out.push_str("\n² The stripe profile's level differs from the draft's keyword, as Stripe documents its idempotent requests:\n\n");
    for r in requirements() {
        if let Some(why) = &r.stripe_why {
            out.push_str(&format!("- {}: {why}\n", r.id));
        }
    }
    out.push_str("\n³ A safety failure under every profile, whatever the level: the conformance suite reports a breach with a verdict of its own (`unsafe`, `leak`) and exits 2.\n\n");
    for r in requirements() {
        if let Some(s) = r.safety {
            out.push_str(&format!("- {}: {}\n", r.id, s.as_str()));
        }
    }
    out
}
