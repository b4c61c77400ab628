//! What the suite concluded of every operation of a document: each operation's report, and
//! the exit code of them all.

use super::Operation;
use serde::Serialize;

/// What a run of the suite against one operation gave.
#[derive(Clone, Debug, Serialize)]
pub struct OperationReport {
    /// The operation.
    pub operation: Operation,
    /// Its report, if it ran.
    pub report: Option<crate::suite::Report>,
}

impl OperationReport {
    /// `pass`, `fail`, `unsafe`, `leak`, `error` or `skipped`.
    pub fn verdict(&self) -> &'static str {
        match &self.report {
            None => "skipped",
            Some(r) => match r.exit_code {
                0 => "pass",
                crate::suite::EXIT_UNSAFE if r.summary.leak > 0 => "leak",
                crate::suite::EXIT_UNSAFE => "unsafe",
                crate::suite::EXIT_FAIL => "fail",
                _ => "error",
            },
        }
    }
}

/// The run of the suite against every operation of a document.
#[derive(Clone, Debug, Serialize)]
pub struct Combined {
    /// `idem-conformance`.
    pub tool: &'static str,
    /// The tool's version.
    pub version: &'static str,
    /// The document.
    pub document: String,
    /// Wall time of the whole run.
    pub duration_ms: f64,
    /// The process exit code: the worst of the operations' (a safety failure, then a
    /// failure, then a harness error); 4 when no operation could be run.
    pub exit_code: u8,
    /// Every operation, in the document's order.
    pub operations: Vec<OperationReport>,
}

impl Combined {
    /// The exit code for `operations`.
    pub fn exit_code(operations: &[OperationReport]) -> u8 {
        let codes: Vec<u8> = operations
            .iter()
            .filter_map(|o| o.report.as_ref().map(|r| r.exit_code))
            .collect();
        if codes.is_empty() {
            return crate::suite::EXIT_HARNESS;
        }
        for code in [
            crate::suite::EXIT_UNSAFE,
            crate::suite::EXIT_FAIL,
            crate::suite::EXIT_HARNESS,
        ] {
            if codes.contains(&code) {
                return code;
            }
        }
        0
    }
}
