//! What a run concludes: the [`Verdict`] of each case with its evidence ([`CaseResult`]),
//! the whole [`Report`], the exit codes, and the [`Progress`] events on the way.

use super::Profile;
use crate::cases::{Case, Waiting};
use crate::http::{Exchange, RoundCount, WaitSpan};
use crate::server::Fault;
use idem_spec::Level;
use serde::Serialize;

/// The outcome of one case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// The server did what the requirement says.
    Pass,
    /// A SHOULD-level requirement was missed (counted as a failure only with `--strict`).
    NonStrict,
    /// The server is wrong.
    Fail,
    /// A safety failure, whatever the profile: the server executed a request more often
    /// than once.
    Unsafe,
    /// A safety failure, whatever the profile: the server disclosed one principal's record
    /// to another (a replay of its response, or a conflict or mismatch answer that reveals
    /// its key).
    Leak,
    /// Not run: it needs an option that was not given, or does not apply to the profile.
    Skip,
    /// The harness could not tell: unreachable, timeout, unexpected protocol.
    Error,
}

impl Verdict {
    /// How bad it is, for picking the worst of several: leak, unsafe, fail, error,
    /// non-strict, pass, skip.
    pub(crate) fn rank(self) -> u8 {
        match self {
            Verdict::Skip => 0,
            Verdict::Pass => 1,
            Verdict::NonStrict => 2,
            Verdict::Error => 3,
            Verdict::Fail => 4,
            Verdict::Unsafe => 5,
            Verdict::Leak => 6,
        }
    }

    /// The verdict for a missed requirement of `level`.
    pub fn for_miss(level: Level, strict: bool) -> Verdict {
        match level {
            Level::Must => Verdict::Fail,
            Level::Should if strict => Verdict::Fail,
            Level::Should => Verdict::NonStrict,
            Level::May => Verdict::Pass,
        }
    }
}

impl Verdict {
    /// Lower-case name, as in the reports.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::NonStrict => "non-strict",
            Verdict::Fail => "fail",
            Verdict::Unsafe => "unsafe",
            Verdict::Leak => "leak",
            Verdict::Skip => "skip",
            Verdict::Error => "error",
        }
    }
}

/// How sure a pass is, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Confidence {
    /// A side-effect oracle confirmed it (or, for a leak, the answers themselves show it).
    High,
    /// The responses and the replay marker support it; no oracle saw the side effects.
    Medium,
    /// Only the responses support it, and another reading of them remains possible.
    Low,
}

/// A requirement a case found missed, and what that means under the profile.
#[derive(Clone, Debug, Serialize)]
pub struct Missed {
    /// The requirement ID.
    pub requirement: String,
    /// Its level under the profile.
    pub level: Level,
    /// What the miss alone makes of the case.
    pub verdict: Verdict,
    /// What the requirement expects.
    pub expected: String,
    /// What the server did.
    pub observed: String,
}

/// One case's result.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    /// Stable case ID (`concurrent/1`).
    pub id: String,
    /// Its section (the ID up to the slash).
    pub section: String,
    /// The requirement's level under the profile.
    pub level: Level,
    /// The requirement ID (`IDEM-CONC-1`).
    pub requirement: String,
    /// The requirement sentence, from `spec/requirements.toml`.
    pub requirement_text: String,
    /// What the case sends and checks.
    pub title: String,
    /// The verdict.
    pub verdict: Verdict,
    /// For passes, and for the safety verdicts (unsafe, leak): how sure, and why.
    pub confidence: Option<Confidence>,
    /// Why (passes: the outcome seen and the evidence; skips and errors: the reason).
    pub reason: Option<String>,
    /// For failures: what the requirement that decided the verdict expects.
    pub expected: Option<String>,
    /// For failures: what the server did.
    pub observed: Option<String>,
    /// Every requirement the case found missed, including those the profile accepts.
    pub missed: Vec<Missed>,
    /// Measurements and remarks.
    pub notes: Vec<String>,
    /// Wall time of the case.
    pub duration_ms: f64,
    /// The HTTP exchanges, in order.
    pub exchanges: Vec<Exchange>,
    /// The waits for the server's clock or for a key to leave in-progress, in order.
    pub waits: Vec<WaitSpan>,
    /// The executions the count oracle attributes to each round of raced duplicates.
    pub rounds: Vec<RoundCount>,
}

/// Counts of verdicts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Passed.
    pub pass: usize,
    /// SHOULD missed without `--strict`.
    pub non_strict: usize,
    /// Failed.
    pub fail: usize,
    /// Unsafe.
    #[serde(rename = "unsafe")]
    pub unsafe_: usize,
    /// Disclosures across principals.
    pub leak: usize,
    /// Skipped.
    pub skip: usize,
    /// Harness errors.
    pub error: usize,
}

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// `idem-conformance`.
    pub tool: &'static str,
    /// The tool's version.
    pub version: &'static str,
    /// The endpoint.
    pub target: String,
    /// Whether it was the embedded reference server.
    pub embedded: bool,
    /// The reference server's fault, if any.
    pub fault: Option<Fault>,
    /// The profile used.
    pub profile: Profile,
    /// Whether SHOULD-level misses counted as failures.
    pub strict: bool,
    /// For an `https://` target: which certificates were trusted.
    pub tls: Option<&'static str>,
    /// Wall time of the run.
    pub duration_ms: f64,
    /// Verdict counts.
    pub summary: Summary,
    /// The process exit code this report calls for.
    pub exit_code: u8,
    /// The options the run used, as `(name, value)` (credentials redacted unless
    /// `--show-secrets`).
    pub options: Vec<(String, String)>,
    /// Every case run, in order.
    pub cases: Vec<CaseResult>,
}

impl Report {
    /// The exit code: [`EXIT_UNSAFE`] if anything was unsafe or leaked, else [`EXIT_FAIL`] if a
    /// case failed, else [`EXIT_HARNESS`] if the harness could not judge a case (connection
    /// or protocol trouble), else 0.
    pub fn compute_exit_code(cases: &[CaseResult]) -> u8 {
        let has = |v: Verdict| cases.iter().any(|c| c.verdict == v);
        if has(Verdict::Unsafe) || has(Verdict::Leak) {
            EXIT_UNSAFE
        } else if has(Verdict::Fail) {
            EXIT_FAIL
        } else if has(Verdict::Error) {
            EXIT_HARNESS
        } else {
            0
        }
    }

    /// The result of case `id`, if it ran.
    pub fn case(&self, id: &str) -> Option<&CaseResult> {
        self.cases.iter().find(|c| c.id == id)
    }
}

/// Exit code: a case failed.
pub const EXIT_FAIL: u8 = 1;
/// Exit code: a safety failure: a request executed more often than once (unsafe), or a
/// principal's record disclosed to another (leak).
pub const EXIT_UNSAFE: u8 = 2;
/// Exit code: the command line or an option's value is wrong.
pub const EXIT_USAGE: u8 = 3;
/// Exit code: the target could not be reached or judged (connection, TLS, timeout,
/// unusable answers), or the harness itself failed.
pub const EXIT_HARNESS: u8 = 4;

/// Progress events, for a live terminal display.
#[derive(Debug)]
pub enum Progress<'a> {
    /// Case `index` of `total` (1-based) starts.
    Started {
        /// 1-based position in this run.
        index: usize,
        /// Cases in this run.
        total: usize,
        /// The case.
        case: &'a Case,
    },
    /// The running case waits, for longer than a second: announced when it has lasted a
    /// second, then every few seconds.
    Waiting {
        /// The case.
        case: &'a Case,
        /// What it waits for, and how long is left at most.
        wait: &'a Waiting,
    },
    /// It finished. Finished events come in suite order, whichever lane ran the case: a
    /// case that finished before an earlier one of another lane is reported after it.
    Finished {
        /// 1-based position in this run.
        index: usize,
        /// Cases in this run.
        total: usize,
        /// Its result.
        result: &'a CaseResult,
    },
}
