//! The faults: deliberate defects of the reference server, each defined in one place, as
//! h2spec defines a case. An entry of [`FAULTS`] holds the fault's name, the defect in one
//! line, how it is made, and what the suite must make of it with and without an oracle;
//! the command line, the server and `tests/faults.rs` all read it.
//!
//! A fault is made from outside idem-tower's layer, which has no fault hooks: a wrapper
//! around the store the layer is given ([`Apply::load`], [`Apply::write`]), a middleware
//! around the layer ([`Apply::before`], [`Apply::ignores`], [`Apply::after`]) or around the
//! status query ([`Apply::query`], [`Apply::query_runs`]), or a configuration mistake
//! ([`Apply::engine`], [`Apply::fingerprint`], [`Apply::time_keys`], [`Apply::unscoped`]).

mod middleware;
mod registry;
mod store;

pub use registry::FAULTS;

pub(super) use middleware::{misask, misbehave};
pub(super) use store::FaultyStore;

use super::Route;
use bytes::Bytes;
use hyper::HeaderMap;
use idem_core::{
    Config, FingerprintSpec, Problem, Record, RecordKey, Refusal, TimeKeyConfig, Write,
};
use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

/// One deliberate defect, as the registry defines it.
pub struct FaultDef {
    /// Its name on the command line (`--fault NAME`).
    pub name: &'static str,
    /// The defect, in one line.
    pub defect: &'static str,
    /// How it is made.
    pub(crate) apply: Apply,
    /// What the suite must make of it: every case not listed passes, with and without an
    /// oracle, under the `idem` profile with `--strict`.
    pub expect: &'static [Expect],
}

/// A deliberate defect of the reference server: a handle on its [`FaultDef`].
#[derive(Clone, Copy)]
pub struct Fault(&'static FaultDef);

impl Fault {
    /// Every fault, in the registry's order.
    pub fn all() -> impl Iterator<Item = Fault> {
        FAULTS.iter().map(Fault)
    }

    /// The fault named `name` on the command line.
    pub fn named(name: &str) -> Option<Fault> {
        FAULTS.iter().find(|f| f.name == name).map(Fault)
    }

    /// Every fault's name, for the command line's help and its errors.
    pub fn names() -> impl Iterator<Item = &'static str> {
        FAULTS.iter().map(|f| f.name)
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// Its definition.
    pub fn def(self) -> &'static FaultDef {
        self.0
    }

    pub(crate) fn apply(self) -> &'static Apply {
        &self.0.apply
    }

    /// The engine configuration the fault makes of `c`.
    pub(crate) fn engine(self, c: &mut Config) {
        if let Some(f) = self.apply().engine {
            f(c);
        }
    }
}

impl PartialEq for Fault {
    fn eq(&self, other: &Fault) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Fault {}

impl std::hash::Hash for Fault {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl fmt::Debug for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for Fault {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl clap::ValueEnum for Fault {
    fn value_variants<'a>() -> &'a [Self] {
        static ALL: std::sync::OnceLock<Vec<Fault>> = std::sync::OnceLock::new();
        ALL.get_or_init(|| Fault::all().collect())
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()).help(self.0.defect))
    }
}

/// What a case must be against a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// It passes: the fault does not touch it.
    Pass,
    /// It fails, or worse (unsafe, leak).
    Fail,
    /// A double execution was observed.
    Unsafe,
    /// A principal's record was disclosed to another.
    Leak,
    /// Plausibly related: anything but a harness error.
    Any,
    /// The fault breaks what the case needs (its endpoint refuses every request it must
    /// build on): any verdict, a harness error included.
    Broken,
}

/// What a case must be against a fault, with an oracle (a count URL and an id pointer) and
/// without any.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    /// The case.
    pub case: &'static str,
    /// With both oracles.
    pub oracle: Want,
    /// Without any oracle.
    pub blind: Want,
}

impl Expect {
    /// The same without an oracle: `blind`.
    pub const fn blind(self, blind: Want) -> Expect {
        Expect { blind, ..self }
    }
}

/// A case that fails against the fault, with or without an oracle.
pub(super) const fn fails(case: &'static str) -> Expect {
    Expect {
        case,
        oracle: Want::Fail,
        blind: Want::Fail,
    }
}

/// A case that sees a double execution, with or without an oracle.
pub(super) const fn unsafe_(case: &'static str) -> Expect {
    Expect {
        case,
        oracle: Want::Unsafe,
        blind: Want::Unsafe,
    }
}

/// A case that sees a disclosure across principals, with or without an oracle.
pub(super) const fn leaks(case: &'static str) -> Expect {
    Expect {
        case,
        oracle: Want::Leak,
        blind: Want::Leak,
    }
}

/// A case whose endpoint the fault breaks: any verdict, a harness error included.
pub(super) const fn broken(case: &'static str) -> Expect {
    Expect {
        case,
        oracle: Want::Broken,
        blind: Want::Broken,
    }
}

/// A case the fault plausibly touches: anything but a harness error.
pub(super) const fn related(case: &'static str) -> Expect {
    Expect {
        case,
        oracle: Want::Any,
        blind: Want::Any,
    }
}

impl FaultDef {
    /// What case `id` must be, with an oracle (`oracle`) or without.
    pub fn want(&self, id: &str, oracle: bool) -> Want {
        self.expect
            .iter()
            .find(|e| e.case == id)
            .map_or(Want::Pass, |e| if oracle { e.oracle } else { e.blind })
    }
}

/// A request as the fault's middleware sees it, before the layer.
pub(crate) struct Incoming<'a> {
    /// The guarded route.
    pub(crate) route: Route,
    /// Who sent it, as the server names principals.
    pub(crate) principal: &'a str,
    /// The first key header's raw value, if any.
    pub(crate) key: Option<&'a [u8]>,
    /// The body.
    pub(crate) body: &'a Bytes,
}

/// An answer as the fault's middleware sees it, after the layer.
pub(crate) struct Answer<'a> {
    /// The status.
    pub(crate) status: u16,
    /// Whether the layer replayed it.
    pub(crate) replay: bool,
    /// Its headers, to change.
    pub(crate) headers: &'a mut HeaderMap,
}

/// What a stateful fault remembers of the requests it saw, per route and key.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    keys: Mutex<HashMap<(Route, Vec<u8>), Note>>,
}

/// What a fault remembers of a key.
#[derive(Clone, Debug, Default)]
pub(crate) struct Note {
    /// Who used it last.
    pub(crate) principal: String,
    /// A digest of the body it was last executed with, once one was.
    pub(crate) body: Option<u64>,
    /// Requests with it between the middleware and the layer's answer.
    pub(crate) in_flight: usize,
}

/// Keys a stateful fault remembers at most: a long-running faulty server forgets them all
/// past this.
const REMEMBERED: usize = 100_000;

impl Memory {
    /// Reads and changes what is remembered of `incoming`'s key (nothing without one).
    pub(crate) fn with<T>(
        &self,
        incoming: &Incoming<'_>,
        f: impl FnOnce(&mut Note) -> T,
    ) -> Option<T> {
        let key = incoming.key?;
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if keys.len() >= REMEMBERED {
            keys.clear();
        }
        Some(f(keys.entry((incoming.route, key.to_vec())).or_default()))
    }
}

/// A digest of a body, for faults that compare payloads the way a careless cache would.
pub(crate) fn digest(body: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    h.finish()
}

/// A write as the store applies it, given the record stored now; `None` drops it.
pub(crate) type WriteHook = fn(Write, Option<Record>) -> Option<Write>;

/// Before the layer: a refusal to send instead, after changing the request's headers.
pub(crate) type BeforeHook = fn(&Memory, &Incoming<'_>, &mut HeaderMap) -> Option<Refusal>;

/// Before a status query is answered: what it changes in the query's headers.
pub(crate) type QueryHook = fn(&Memory, &Incoming<'_>, &mut HeaderMap);

/// How a fault is made: each hook is optional, and [`Apply::NONE`] changes nothing.
#[derive(Clone, Copy)]
pub(crate) struct Apply {
    /// The engine's configuration (times, outcome policy).
    pub(crate) engine: Option<fn(&mut Config)>,
    /// The fingerprint's specification.
    pub(crate) fingerprint: Option<fn(&mut FingerprintSpec)>,
    /// The time keys' bounds, given the key retention.
    pub(crate) time_keys: Option<fn(&mut TimeKeyConfig, Duration)>,
    /// Keys not scoped by principal (the layer is told the host is single-tenant).
    pub(crate) unscoped: bool,
    /// A record as the layer reads it; `None` hides it.
    pub(crate) load: Option<fn(&RecordKey, Record) -> Option<Record>>,
    /// A write as the store applies it, given the record stored now; `None` drops it (and
    /// reports it applied).
    pub(crate) write: Option<WriteHook>,
    /// Before the layer: a refusal the middleware sends instead, after changing the
    /// request's headers if it likes.
    pub(crate) before: Option<BeforeHook>,
    /// Refusals of the layer on a route that the middleware ignores: it runs the handler
    /// without protection instead.
    pub(crate) ignores: Option<fn(Route) -> &'static [Problem]>,
    /// After the layer: what it changes in the answer, and remembers of it.
    pub(crate) after: Option<fn(&Memory, &Incoming<'_>, &mut Answer<'_>)>,
    /// Before a status query is answered (a middleware on the route's `GET`): what it
    /// changes in the query's headers (whose credential it carries, what it asks).
    pub(crate) query: Option<QueryHook>,
    /// A status query runs the handler first, as if it were the request it asks about.
    pub(crate) query_runs: bool,
}

impl Apply {
    /// No change.
    pub(crate) const NONE: Apply = Apply {
        engine: None,
        fingerprint: None,
        time_keys: None,
        unscoped: false,
        load: None,
        write: None,
        before: None,
        ignores: None,
        after: None,
        query: None,
        query_runs: false,
    };

    /// Whether the fault needs its middleware around the layer.
    pub(crate) fn middleware(&self) -> bool {
        self.before.is_some() || self.ignores.is_some() || self.after.is_some()
    }

    /// Whether the fault needs its middleware around the status query.
    pub(crate) fn queries(&self) -> bool {
        self.query.is_some() || self.query_runs
    }
}

/// The faults as README's table: each fault, its defect, and the cases that catch it with
/// both oracles and without any (`unsafe` and `leak` marked).
pub fn markdown_table() -> String {
    let caught = |f: &FaultDef, oracle: bool| {
        let cases: Vec<String> = f
            .expect
            .iter()
            .filter_map(|e| {
                let want = if oracle { e.oracle } else { e.blind };
                match want {
                    Want::Fail => Some(format!("`{}`", e.case)),
                    Want::Unsafe => Some(format!("`{}` (unsafe)", e.case)),
                    Want::Leak => Some(format!("`{}` (leak)", e.case)),
                    Want::Pass | Want::Any | Want::Broken => None,
                }
            })
            .collect();
        if cases.is_empty() {
            "none".to_owned()
        } else {
            cases.join(", ")
        }
    };
    let mut out = String::from(
        "| fault | defect | caught with oracles by | caught without oracles by |\n| --- | --- | --- | --- |\n",
    );
    for f in FAULTS {
        let with = caught(f, true);
        let without = caught(f, false);
        let without = if without == with {
            "the same".to_owned()
        } else {
            without
        };
        out.push_str(&format!(
            "| `{}` | {} | {with} | {without} |\n",
            f.name, f.defect
        ));
    }
    out
}
