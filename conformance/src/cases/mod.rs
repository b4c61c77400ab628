//! The cases, one file per section. Each case is defined in one place in its section's
//! file: a stable ID (`section/n`, never a list position), the requirement it checks (an ID
//! in `spec/requirements.toml`, whose sentence and per-profile level are read from there),
//! a one-line description of what it sends, and the code that runs it.
//!
//! A case ends in a check: a pass (with how sure it is and the outcome it saw), a miss
//! of a requirement, unsafe behaviour (a double execution), or a skip. Along the way it may
//! record further misses that do not stop it. The runner grades every miss
//! by the level its requirement has under the profile: a MUST is a failure, a SHOULD is
//! non-strict unless `--strict`, and a MAY is an accepted outcome. A [`HarnessError`] is an
//! error verdict: the harness could not judge.

mod concurrent;
mod counter;
mod ctx;
mod ctx_kinds;
mod ctx_status;
mod errors;
mod expiry;
mod keys;
mod lease;
mod lost;
mod mismatch;
mod replay;
mod scope;
mod status;
mod time;
mod token;

pub use ctx::Waiting;
pub(crate) use ctx::{Ctx, KeyHeader, Who, POLL};

use crate::http::{HarnessError, Resp};
use crate::suite::{Confidence, Target};
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

/// What running a case yields.
type Running<'c> = Pin<Box<dyn Future<Output = Result<Check, HarnessError>> + Send + 'c>>;

/// A conformance case.
pub struct Case {
    /// Stable ID: `section/n`.
    pub id: &'static str,
    /// The requirement it checks.
    pub requirement: &'static str,
    /// What it sends and expects, in one line.
    pub title: &'static str,
    run: for<'c> fn(&'c Ctx<'c>) -> Running<'c>,
    /// Whether it spends most of its time waiting for the server's clock (a lease, a
    /// retention, a token's life): against a server of its own, it can run beside the
    /// others.
    pub waits: bool,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("id", &self.id)
            .field("requirement", &self.requirement)
            .finish_non_exhaustive()
    }
}

/// A section of the suite: its cases, under a heading.
#[derive(Debug)]
pub struct Section {
    /// The ID prefix of its cases.
    pub name: &'static str,
    /// The heading in reports.
    pub title: &'static str,
    /// Its cases, in order.
    pub cases: &'static [Case],
}

/// Every section, in suite order.
pub const SECTIONS: &[Section] = &[
    Section {
        name: "lost-response",
        title: "Lost responses",
        cases: lost::CASES,
    },
    Section {
        name: "replay",
        title: "Replay of a completed request",
        cases: replay::CASES,
    },
    Section {
        name: "concurrent",
        title: "Concurrent duplicates",
        cases: concurrent::CASES,
    },
    Section {
        name: "mismatch",
        title: "Payload mismatch",
        cases: mismatch::CASES,
    },
    Section {
        name: "keys",
        title: "Key validation",
        cases: keys::CASES,
    },
    Section {
        name: "errors",
        title: "Error responses",
        cases: errors::CASES,
    },
    Section {
        name: "scope",
        title: "Cross-principal isolation",
        cases: scope::CASES,
    },
    Section {
        name: "status",
        title: "The status query (where offered)",
        cases: status::CASES,
    },
    Section {
        name: "lease",
        title: "Orphaned in-flight keys (opt-in)",
        cases: lease::CASES,
    },
    Section {
        name: "expiry",
        title: "Expiry (opt-in)",
        cases: expiry::CASES,
    },
    Section {
        name: "time",
        title: "Unix-time keys (--key-kind time)",
        cases: time::CASES,
    },
    Section {
        name: "counter",
        title: "Wrapping counter keys (--key-kind counter)",
        cases: counter::CASES,
    },
    Section {
        name: "token",
        title: "Server-issued tokens (--key-kind token)",
        cases: token::CASES,
    },
];

/// Every case, in suite order.
pub fn all() -> &'static [&'static Case] {
    static ALL: OnceLock<Vec<&'static Case>> = OnceLock::new();
    ALL.get_or_init(|| SECTIONS.iter().flat_map(|s| s.cases.iter()).collect())
}

impl Case {
    /// The section: the ID up to the slash.
    pub fn section(&self) -> &'static str {
        self.id.split('/').next().unwrap_or(self.id)
    }

    /// The requirement as written in `spec/requirements.toml`.
    ///
    /// # Panics
    ///
    /// If the case cites an ID that does not exist; a test checks every case.
    pub fn spec(&self) -> &'static idem_spec::Requirement {
        spec(self.requirement)
    }

    /// The requirement's level under `profile`.
    pub fn level(&self, profile: idem_spec::Profile) -> idem_spec::Level {
        level(self.requirement, profile)
    }

    /// The requirement sentence.
    pub fn requirement_text(&self) -> &'static str {
        &self.spec().text
    }

    pub(crate) fn run<'c>(&self, ctx: &'c Ctx<'c>) -> Running<'c> {
        (self.run)(ctx)
    }
}

/// Requirement `id`.
///
/// # Panics
///
/// If it does not exist: every ID a case cites is checked by a test.
pub(crate) fn spec(id: &str) -> &'static idem_spec::Requirement {
    idem_spec::get(id).unwrap_or_else(|| panic!("no requirement {id}"))
}

/// The level of requirement `id` under `profile` (idem's own where the spec grades no
/// profiles for it; a test checks that every cited requirement has them).
pub(crate) fn level(id: &str, profile: idem_spec::Profile) -> idem_spec::Level {
    let r = spec(id);
    r.level_in(profile).unwrap_or(r.level)
}

/// A requirement that was not met.
#[derive(Clone, Debug)]
pub(crate) struct Miss {
    /// The requirement; `None` is the case's own.
    pub(crate) requirement: Option<&'static str>,
    pub(crate) expected: String,
    pub(crate) observed: String,
}

/// What a case concluded.
#[derive(Debug)]
pub(crate) enum Check {
    /// The requirement holds: how sure the harness is, and the outcome it saw.
    Pass(Confidence, String),
    /// A requirement was missed; the profile's level for it decides the verdict.
    Miss(Miss),
    /// A safety failure (a double execution, a disclosure across principals), graded the
    /// same whatever the profile.
    Safety(Breach),
    /// Not run, and why.
    Skip(String),
}

/// A miss of the case's own requirement.
pub(crate) fn fail(expected: impl Into<String>, observed: impl Into<String>) -> Check {
    Check::Miss(Miss {
        requirement: None,
        expected: expected.into(),
        observed: observed.into(),
    })
}

/// A miss of requirement `requirement`.
pub(crate) fn miss(
    requirement: &'static str,
    expected: impl Into<String>,
    observed: impl Into<String>,
) -> Check {
    Check::Miss(Miss {
        requirement: Some(requirement),
        expected: expected.into(),
        observed: observed.into(),
    })
}

/// A safety failure a case observed: which, how sure the harness is and why, what was
/// expected and what happened.
#[derive(Debug)]
pub(crate) struct Breach {
    pub(crate) kind: Safety,
    /// The requirement it breaks where that is not the spec's for its kind (a status query
    /// that discloses a record breaks `IDEM-STATUS-2`); `None` for the spec's.
    pub(crate) requirement: Option<&'static str>,
    pub(crate) confidence: Confidence,
    pub(crate) why: String,
    pub(crate) expected: String,
    pub(crate) observed: String,
}

/// The two safety failures, each the breach of one requirement that the spec names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Safety {
    /// A request executed more often than once.
    Unsafe,
    /// One principal's record disclosed to another.
    Leak,
}

impl Safety {
    /// The requirement the spec says this breach misses.
    pub(crate) fn requirement(self) -> &'static str {
        let kind = match self {
            Safety::Unsafe => idem_spec::Safety::Unsafe,
            Safety::Leak => idem_spec::Safety::Leak,
        };
        idem_spec::requirements()
            .iter()
            .find(|r| r.safety == Some(kind))
            .map_or("IDEM-EXEC-1", |r| r.id.as_str())
    }

    /// Its verdict.
    pub(crate) fn verdict(self) -> crate::suite::Verdict {
        match self {
            Safety::Unsafe => crate::suite::Verdict::Unsafe,
            Safety::Leak => crate::suite::Verdict::Leak,
        }
    }
}

/// A double execution an oracle saw (the count oracle counted it, or the id oracle names two
/// resources).
pub(crate) fn unsafe_(expected: impl Into<String>, observed: impl Into<String>) -> Check {
    Check::Safety(Breach {
        kind: Safety::Unsafe,
        requirement: None,
        confidence: Confidence::High,
        why: "an oracle saw it: the count URL counted the executions, or the created resources' ids differ".into(),
        expected: expected.into(),
        observed: observed.into(),
    })
}

/// Two different success answers to one key: each is the result of an execution of its
/// own unless the server renders its replays anew. Medium when neither claims to be a
/// replay, low when the server marks one as a replay of the other.
pub(crate) fn two_answers(
    ctx: &Ctx<'_>,
    a: &Resp,
    b: &Resp,
    expected: impl Into<String>,
    observed: impl Into<String>,
) -> Check {
    let marked = ctx.marked(a) || ctx.marked(b);
    let (confidence, why) = if marked {
        (
            Confidence::Low,
            "two different success answers to one key, without an oracle; the server marks one as a replay, so it either ran the request twice or does not replay what it stored",
        )
    } else {
        (
            Confidence::Medium,
            "two different success answers to one key, neither marked as a replay: without an oracle that is the evidence of two executions (a server that replays what it stored answers the same bytes)",
        )
    };
    Check::Safety(Breach {
        kind: Safety::Unsafe,
        requirement: None,
        confidence,
        why: why.into(),
        expected: expected.into(),
        observed: observed.into(),
    })
}

/// One principal's record disclosed to another: certain, since the answer shows it.
pub(crate) fn leak(expected: impl Into<String>, observed: impl Into<String>) -> Check {
    leak_of(None, expected, observed)
}

/// A disclosure that breaks `requirement` (the spec's for leaks when `None`).
pub(crate) fn leak_of(
    requirement: Option<&'static str>,
    expected: impl Into<String>,
    observed: impl Into<String>,
) -> Check {
    Check::Safety(Breach {
        kind: Safety::Leak,
        requirement,
        confidence: Confidence::High,
        why: "the other principal's answer reveals the first principal's record with this key"
            .into(),
        expected: expected.into(),
        observed: observed.into(),
    })
}

/// Milliseconds since the Unix epoch, by this machine's clock.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A client id no earlier run used.
pub(crate) fn client_id() -> String {
    format!("idem-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// A body that differs from the target's, for collisions.
pub(crate) fn other_body(t: &Target) -> Bytes {
    t.mismatch_body
        .clone()
        .unwrap_or_else(|| crate::cases::mismatch::changed(&t.body))
}

/// Executions between two readings of the count oracle.
pub(crate) fn runs(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    Some(after?.saturating_sub(before?))
}

fn parse_count(body: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(body).ok()?.trim();
    if let Ok(n) = text.parse::<u64>() {
        return Some(n);
    }
    match serde_json::from_str::<serde_json::Value>(text).ok()? {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::Object(map) => map.get("count")?.as_u64(),
        _ => None,
    }
}

/// Fails with an error verdict when an answer the case builds on is not a success: the
/// harness cannot judge the requirement without one. (For a first request only: a retry
/// that fails is judged with [`Ctx::wrong_answer`].)
pub(crate) fn require_success(r: &Resp, what: &str) -> Result<(), HarnessError> {
    if r.is_success() {
        Ok(())
    } else {
        Err(HarnessError::Protocol(format!(
            "{what} must succeed for this case, but got {}; check the method, body and credential options",
            r.summary()
        )))
    }
}

/// A `Check::Pass` whose confidence depends on whether a count oracle watched.
pub(crate) fn pass_counted(ctx: &Ctx<'_>, counted: &str, uncounted: (Confidence, &str)) -> Check {
    if ctx.has_count() {
        Check::Pass(Confidence::High, counted.to_owned())
    } else {
        Check::Pass(uncounted.0, uncounted.1.to_owned())
    }
}

/// The `type` of a problem+json body, if it has one.
pub(crate) fn problem_type(r: &Resp) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
    v.get("type")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_sectioned_and_cite_graded_requirements() {
        let mut seen = std::collections::HashSet::new();
        for s in SECTIONS {
            assert!(!s.cases.is_empty(), "section {} is empty", s.name);
            for c in s.cases {
                assert_eq!(c.section(), s.name, "{} is filed under {}", c.id, s.name);
                assert!(seen.insert(c.id), "duplicate case id {}", c.id);
                let r = idem_spec::get(c.requirement).expect(c.requirement);
                assert!(
                    r.profiles.is_some(),
                    "{} cites {}, which grades no profiles",
                    c.id,
                    c.requirement
                );
                assert!(!c.requirement_text().is_empty());
            }
        }
        assert_eq!(all().len(), seen.len());
    }

    #[test]
    fn every_requirement_a_case_may_miss_grades_the_profiles() {
        // The requirements cases cite by name when they miss something other than their own.
        let src = [
            include_str!("mod.rs"),
            include_str!("ctx.rs"),
            include_str!("ctx_kinds.rs"),
            include_str!("ctx_status.rs"),
            include_str!("concurrent.rs"),
            include_str!("errors.rs"),
            include_str!("expiry.rs"),
            include_str!("keys.rs"),
            include_str!("lease.rs"),
            include_str!("lost.rs"),
            include_str!("mismatch.rs"),
            include_str!("replay.rs"),
            include_str!("scope.rs"),
            include_str!("status.rs"),
            include_str!("time.rs"),
            include_str!("counter.rs"),
            include_str!("token.rs"),
        ];
        for text in src {
            for part in text.split("\"IDEM-").skip(1) {
                let tail: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '-')
                    .collect();
                if !tail.ends_with(|c: char| c.is_ascii_digit())
                    || !part[tail.len()..].starts_with('"')
                {
                    continue;
                }
                let id = format!("IDEM-{tail}");
                let r = idem_spec::get(&id).unwrap_or_else(|| panic!("{id} is not in the spec"));
                assert!(r.profiles.is_some(), "{id} grades no profiles");
            }
        }
    }

    #[test]
    fn counts_parse_as_numbers_or_objects() {
        assert_eq!(parse_count(b"17\n"), Some(17));
        assert_eq!(parse_count(br#"{"count": 3}"#), Some(3));
        assert_eq!(parse_count(b"3.5"), None);
        assert_eq!(parse_count(br#"{"n": 3}"#), None);
        assert_eq!(parse_count(b"\xff"), None);
    }
}
