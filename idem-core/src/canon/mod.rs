//! JSON canonicalisation (RFC 8785 where practical) for fingerprints, by a purpose-built
//! scanner: the body is validated and written out canonically in one pass, with no value
//! tree and no allocation per nested object (one output buffer, and scratch buffers shared
//! by every level). Each object's members are written in input order, `"key":value`; when
//! their names are not already in order, they are then put in sorted order in place.
//! Excluded fields are skipped while scanning. For the top-level object the
//! members' canonical bytes are also digested one by one, so that a mismatch can name the
//! fields that differ.
//!
//! The canonical form, and which bodies are refused, are those of the serde_json-based
//! canonicaliser this replaces (a unit test races the two): numbers are read as serde_json
//! reads them (integers that fit stay integers, other numbers become the `f64` its default
//! parser computes), integral floats below 2^53 are written as integers and other floats in
//! their shortest round-trip form, strings with RFC 8785's minimal escapes, nesting up to
//! 127 levels; a skipped (excluded) value is only checked for its syntax.

use crate::fingerprint::FieldDigests;
use alloc::string::String;
use alloc::vec::Vec;
use core::ops::Range;

mod escape;
mod pointer;
#[cfg(test)]
mod reference;
mod scan;
mod text;
mod write;

pub(crate) use pointer::{members_at, string_at, Found};
use scan::{room, Number, Scan, Text};
use text::{write_bytes, write_f64};
pub(crate) use text::{write_int, write_str, Decimal};
pub(crate) use write::canonicalise;

/// Exclusion patterns: each a JSON Pointer split into unescaped tokens (`*` matches all).
pub(crate) fn parse_patterns(pointers: &[String]) -> Vec<Vec<String>> {
    pointers
        .iter()
        .map(|p| {
            let path = p.strip_prefix('/').unwrap_or(p);
            path.split('/')
                .map(|t| t.replace("~1", "/").replace("~0", "~"))
                .collect()
        })
        .collect()
}

/// Where a body stops being JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct JsonError {
    /// The index of the offending byte (the body's length at its end).
    at: usize,
}

impl JsonError {
    /// The 1-based line, and the column (bytes up to and including the offending one).
    pub(crate) fn position(&self, body: &[u8]) -> (usize, usize) {
        let end = (self.at + 1).min(body.len());
        let seen = &body[..end];
        let line = 1 + seen.iter().filter(|&&b| b == b'\n').count();
        let line_start = seen.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        (line, end - line_start)
    }
}

type Result<T> = core::result::Result<T, JsonError>;

/// Containers nest at most this deep (serde_json's limit, so the same bodies are refused).
const MAX_DEPTH: usize = 127;
