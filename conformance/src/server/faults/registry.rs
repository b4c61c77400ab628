//! Every fault, one entry each: its name, its defect, how it is made, and the cases it must
//! fail with and without an oracle (the others pass). `tests/faults.rs` runs the whole suite
//! against each, both ways, and README's fault table is this one, rendered.
//!
//! It is long because it is a table: one entry per fault, data rather than logic.

use super::{broken, digest, fails, leaks, related, unsafe_, Apply, FaultDef, Want};
use crate::server::Route;
use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION, LOCATION, RETRY_AFTER};
use idem_core::{
    parse_opaque_lenient, KeyError, Precondition, Problem, Record, RecordState, Refusal, SlotState,
    UnixMillis, Write, WriteOp, KEY_HEADER, REPLAYED_HEADER, RETRY_SOON_SECS, STATUS_HEADER,
    TOKEN_PREFIX,
};
use std::sync::Arc;
use std::time::Duration;

/// The header whose value changes on every request, for `volatile-fingerprint`.
const VOLATILE_HEADER: &str = "x-request-nonce";

/// A lease that never ends.
const FOREVER: UnixMillis = UnixMillis(u64::MAX / 2);

/// Every fault, in a stable order.
pub const FAULTS: &[FaultDef] = &[
    FaultDef {
        name: "no-lock",
        defect: "no claim before the handler: concurrent duplicates all run; results are stored afterwards, last one wins",
        apply: Apply {
            // A key in flight is not seen, so duplicates run.
            load: Some(|_, r| (!in_flight(&r)).then_some(r)),
            // The claim is never written; a result is written whatever is stored now.
            write: Some(|mut w, stored| {
                if matches!(&w.op, WriteOp::Put(r) if in_flight(r)) {
                    return None;
                }
                w.precondition = match stored {
                    Some(r) => Precondition::Version(r.version),
                    None => Precondition::Absent,
                };
                Some(w)
            }),
            ..Apply::NONE
        },
        expect: &[
            unsafe_("concurrent/1"),
            // Unsafe when the dropped request still runs as its first retry arrives, which a
            // loaded machine may prevent; without an oracle the second retry replays the
            // last of the two, so the retries agree.
            related("lost-response/1"),
            related("concurrent/2"),
            related("lease/1"),
            // No claim is written, so no query sees the key in flight (status/2 skips) and a
            // failed request leaves nothing behind (status/3 reads unknown).
            related("status/2"),
            related("status/3"),
        ],
    },
    FaultDef {
        name: "no-fingerprint",
        defect: "the payload is not fingerprinted: a changed request replays",
        apply: Apply {
            // Every top-level member excluded: the body is still checked, but no longer tells
            // requests apart.
            fingerprint: Some(|spec| spec.exclude = vec!["/*".to_owned()]),
            ..Apply::NONE
        },
        expect: &[
            fails("mismatch/1"),
            fails("time/1"),
            fails("counter/3"),
            fails("counter/6"),
        ],
    },
    FaultDef {
        name: "no-store",
        defect: "final responses are never stored: retries re-execute",
        apply: Apply {
            write: Some(|w, _| Some(forget(w, |_| true))),
            ..Apply::NONE
        },
        expect: &[
            unsafe_("lost-response/1"),
            unsafe_("replay/1"),
            fails("replay/2"),
            fails("errors/1"),
            fails("expiry/1"),
            unsafe_("counter/2"),
            unsafe_("time/1"),
            // The consumed token is deleted with the response: the retry is refused.
            fails("token/1"),
            // A completed key is forgotten: the query answers unknown.
            fails("status/1"),
            related("replay/3"),
            related("mismatch/1"),
            related("lease/1"),
            related("expiry/2"),
            related("concurrent/1"),
            related("concurrent/2"),
            related("counter/3"),
            related("counter/4"),
            related("counter/6"),
            related("counter/7"),
        ],
    },
    FaultDef {
        name: "replay-across-principals",
        defect: "keys are not scoped by principal",
        apply: Apply {
            // A configuration mistake: the host says it is single-tenant.
            unscoped: true,
            ..Apply::NONE
        },
        // The replay comes first, and discloses A's stored response. Counter sessions and
        // tokens are opened for the caller's scope, which the layer no longer uses.
        expect: &[
            leaks("scope/1"),
            // The status query is unscoped with the layer.
            leaks("status/6"),
            related("counter/2"),
            related("counter/3"),
            related("counter/4"),
            related("counter/5"),
            related("counter/6"),
            related("counter/7"),
            broken("token/1"),
            related("token/3"),
        ],
    },
    FaultDef {
        name: "conflict-across-principals",
        defect: "the in-flight lock is taken on the key alone: another principal's request with a key in flight is refused as in progress",
        apply: Apply {
            before: Some(|memory, incoming, _| {
                let busy = memory.with(incoming, |note| {
                    if note.in_flight > 0 && note.principal != incoming.principal {
                        return true;
                    }
                    note.principal = incoming.principal.to_owned();
                    note.in_flight += 1;
                    false
                })?;
                busy.then(|| Refusal {
                    retry_after: Some(RETRY_SOON_SECS),
                    ..Refusal::new(
                        Problem::IN_PROGRESS,
                        "another request with this key is being processed; retry later",
                    )
                })
            }),
            after: Some(|memory, incoming, _| {
                memory.with(incoming, |note| note.in_flight = note.in_flight.saturating_sub(1));
            }),
            ..Apply::NONE
        },
        expect: &[leaks("scope/1")],
    },
    FaultDef {
        name: "mismatch-across-principals",
        defect: "payloads are compared by key alone: another principal's request with a used key and another body is refused as a mismatch",
        apply: Apply {
            before: Some(|memory, incoming, _| {
                let body = digest(incoming.body);
                let other = memory.with(incoming, |note| {
                    note.principal != incoming.principal && note.body.is_some_and(|b| b != body)
                })?;
                other.then(|| Refusal::new(Problem::MISMATCH, "the key was used with a different request"))
            }),
            after: Some(|memory, incoming, answer| {
                if (200..300).contains(&answer.status) && !answer.replay {
                    memory.with(incoming, |note| {
                        note.principal = incoming.principal.to_owned();
                        note.body = Some(digest(incoming.body));
                    });
                }
            }),
            ..Apply::NONE
        },
        expect: &[leaks("scope/1")],
    },
    FaultDef {
        name: "store-5xx",
        defect: "5xx answers are stored and replayed",
        apply: Apply {
            engine: Some(|c| c.unknown_outcome = idem_core::UnknownOutcomePolicy::Store),
            ..Apply::NONE
        },
        // The query reports the stored 503 as completed.
        expect: &[fails("errors/2"), fails("status/3")],
    },
    FaultDef {
        name: "lost-lease",
        defect: "in-flight keys never expire",
        apply: Apply {
            load: Some(|_, r| Some(endless(r))),
            ..Apply::NONE
        },
        // A 503 leaves its key to the lease under the default policy: it never ends, and the
        // query finds the failed key in progress for good.
        expect: &[fails("lease/1"), related("errors/2"), fails("status/3")],
    },
    FaultDef {
        name: "forget-early",
        defect: "responses dropped after a tenth of the advertised retention",
        apply: Apply {
            // Responses expire at a tenth of the retention...
            engine: Some(|c| {
                c.response_ttl = (c.response_ttl / 10).max(Duration::from_millis(1));
            }),
            // ...and the key goes with the response, as a store that dropped both would
            // show it. Keys in flight stay: a handler's lease is untouched.
            load: Some(|_, r| (!forgotten(&r)).then_some(r)),
            // A claim of a key the layer was not shown replaces what is stored.
            write: Some(|mut w, stored| {
                if let Some(r) = stored.filter(forgotten) {
                    if w.precondition == Precondition::Absent {
                        w.precondition = Precondition::Version(r.version);
                    }
                }
                Some(w)
            }),
            ..Apply::NONE
        },
        expect: &[
            unsafe_("expiry/1"),
            fails("expiry/2"),
            related("lost-response/1"),
            related("replay/1"),
            related("replay/2"),
            related("replay/3"),
            related("mismatch/1"),
            related("errors/1"),
            related("lease/1"),
            related("concurrent/1"),
            related("concurrent/2"),
            // A completed key is forgotten after a tenth of a second.
            related("status/1"),
            // The kinds' bounds shrink with the key retention: time keys, counter sessions
            // and tokens live a tenth of a second.
            broken("counter/2"),
            broken("counter/3"),
            broken("counter/4"),
            broken("counter/5"),
            broken("counter/6"),
            broken("counter/7"),
            broken("time/1"),
            broken("time/2"),
            broken("time/3"),
            broken("token/1"),
            related("token/3"),
        ],
    },
    FaultDef {
        name: "no-key-check",
        defect: "requests without a valid key run unprotected (also keys the kinds' rules refuse)",
        apply: Apply {
            ignores: Some(|_| {
                &[
                    Problem::MISSING_KEY,
                    Problem::MALFORMED_KEY,
                    Problem::KEY_STALE,
                    Problem::KEY_FROM_FUTURE,
                    Problem::UNKNOWN_CLIENT,
                    Problem::STALE_EPOCH,
                    Problem::UNKNOWN_EPOCH,
                    Problem::COUNTER_GAP,
                    Problem::TOKEN_FORGED,
                    Problem::TOKEN_UNKNOWN,
                    Problem::TOKEN_EXPIRED,
                ]
            }),
            ..Apply::NONE
        },
        expect: &[
            fails("keys/1"),
            fails("keys/2"),
            fails("keys/3"),
            fails("keys/4"),
            fails("keys/5"),
            fails("time/2"),
            fails("time/3"),
            fails("counter/1"),
            fails("counter/4"),
            fails("counter/5"),
            fails("counter/7"),
            fails("token/2"),
            fails("token/3"),
        ],
    },
    FaultDef {
        name: "short-keys",
        defect: "keys over 64 characters refused",
        apply: Apply {
            before: Some(|_, _, headers| {
                let len = headers
                    .get_all(idem_core::KEY_HEADER)
                    .iter()
                    .filter_map(|v| parse_opaque_lenient(v.as_bytes()).ok())
                    .map(|k| k.len())
                    .find(|&len| len > 64)?;
                Some(Refusal::key(&KeyError::TooLong { len }))
            }),
            ..Apply::NONE
        },
        // Tokens are longer than 64 characters: the token endpoint is refused too.
        expect: &[fails("keys/6"), broken("token/1"), related("token/3")],
    },
    FaultDef {
        name: "no-marker",
        defect: "replays lack `Idempotent-Replayed`",
        apply: Apply {
            after: Some(|_, _, answer| {
                answer.headers.remove(REPLAYED_HEADER);
            }),
            ..Apply::NONE
        },
        expect: &[fails("replay/2")],
    },
    FaultDef {
        name: "no-retry-after",
        defect: "409 without `Retry-After`",
        apply: Apply {
            after: Some(|_, _, answer| {
                if answer.status == 409 {
                    answer.headers.remove(RETRY_AFTER);
                }
            }),
            ..Apply::NONE
        },
        expect: &[fails("concurrent/2")],
    },
    FaultDef {
        name: "forget-errors",
        defect: "deterministic 4xx not stored",
        apply: Apply {
            write: Some(|w, _| Some(forget(w, |status| (400..500).contains(&status)))),
            ..Apply::NONE
        },
        expect: &[fails("errors/1")],
    },
    FaultDef {
        name: "no-tombstone",
        defect: "the key is forgotten with its response",
        apply: Apply {
            engine: Some(|c| c.key_ttl = c.response_ttl),
            ..Apply::NONE
        },
        expect: &[fails("expiry/2"), related("lease/1")],
    },
    FaultDef {
        name: "never-expire",
        defect: "keys never forgotten",
        apply: Apply {
            // A hundred years stands in for "never".
            engine: Some(|c| c.key_ttl = Duration::from_secs(100 * 365 * 24 * 3600)),
            ..Apply::NONE
        },
        expect: &[fails("expiry/3")],
    },
    FaultDef {
        name: "volatile-fingerprint",
        defect: "the fingerprint covers a value that differs per request: every retry gets 422",
        apply: Apply {
            fingerprint: Some(|spec| spec.headers = vec![VOLATILE_HEADER.to_owned()]),
            before: Some(|_, _, headers| {
                let value = HeaderValue::from(crate::server::nonce());
                headers.insert(HeaderName::from_static(VOLATILE_HEADER), value);
                None
            }),
            ..Apply::NONE
        },
        expect: &[
            fails("lost-response/1"),
            fails("replay/1"),
            fails("replay/2"),
            fails("replay/3"),
            fails("concurrent/1"),
            fails("mismatch/1"),
            fails("errors/1"),
            fails("errors/2"),
            fails("lease/1"),
            fails("expiry/1"),
            fails("expiry/2"),
            fails("time/1"),
            fails("counter/2"),
            fails("token/1"),
            // The retry of a released key, as the query said, gets 422.
            fails("status/3"),
            related("concurrent/2"),
            related("counter/3"),
            related("counter/6"),
        ],
    },
    FaultDef {
        name: "drop-location",
        defect: "replays leave out `Location`",
        apply: Apply {
            after: Some(|_, _, answer| {
                if answer.replay {
                    answer.headers.remove(LOCATION);
                }
            }),
            ..Apply::NONE
        },
        expect: &[fails("replay/3")],
    },
    FaultDef {
        name: "never-release",
        defect: "a failed attempt leaves its key in flight for good",
        apply: Apply {
            load: Some(|_, r| Some(endless(r))),
            // A failed attempt's release is dropped.
            write: Some(|w, stored| {
                let releases = matches!(w.op, WriteOp::Delete)
                    && stored.as_ref().is_some_and(in_flight);
                (!releases).then_some(w)
            }),
            ..Apply::NONE
        },
        expect: &[fails("errors/2"), fails("lease/1"), fails("status/3")],
    },
    FaultDef {
        name: "counter-no-wrap-check",
        defect: "a number in the window with another payload (a wrap onto a retained slot) runs",
        apply: Apply {
            ignores: Some(|route| only(route, Route::Transfers, &[Problem::KEY_COLLISION])),
            ..Apply::NONE
        },
        expect: &[fails("counter/3"), fails("counter/6")],
    },
    FaultDef {
        name: "counter-accept-stale",
        defect: "a number below the low-water mark runs",
        apply: Apply {
            ignores: Some(|route| only(route, Route::Transfers, &[Problem::KEY_STALE])),
            ..Apply::NONE
        },
        expect: &[fails("counter/4")],
    },
    FaultDef {
        name: "time-no-skew",
        defect: "timestamps far in the future are accepted",
        apply: Apply {
            // As far ahead as the retention allows: no bound a client clock could hit.
            time_keys: Some(|bounds, key_ttl| {
                bounds.max_ahead = key_ttl.saturating_sub(bounds.max_age);
            }),
            ..Apply::NONE
        },
        expect: &[fails("time/2")],
    },
    FaultDef {
        name: "token-reuse",
        defect: "a consumed token counts as unused again",
        apply: Apply {
            load: Some(|key, mut r| {
                if key.key.starts_with(TOKEN_PREFIX)
                    && matches!(r.state, RecordState::Completed { .. })
                {
                    r.state = RecordState::Issued {
                        expires: r.key_expires,
                    };
                }
                Some(r)
            }),
            ..Apply::NONE
        },
        expect: &[unsafe_("token/1")],
    },
    FaultDef {
        name: "status-across-principals",
        defect: "status queries look keys up by key alone: a query is answered from the record of whoever used the key last",
        apply: Apply {
            // Who used each key last...
            before: Some(|memory, incoming, _| {
                memory.with(incoming, |note| note.principal = incoming.principal.to_owned());
                None
            }),
            // ...is whom a status query about it is answered for.
            query: Some(|memory, incoming, headers| {
                let owner = memory
                    .with(incoming, |note| note.principal.clone())
                    .filter(|p| !p.is_empty() && p != incoming.principal);
                if let Some(owner) = owner {
                    match credential_of(&owner) {
                        Some(v) => headers.insert(AUTHORIZATION, v),
                        None => headers.remove(AUTHORIZATION),
                    };
                }
            }),
            ..Apply::NONE
        },
        expect: &[leaks("status/6")],
    },
    FaultDef {
        name: "settle-records-nothing",
        defect: "a settle answers not-executed but records nothing: the late original runs",
        apply: Apply {
            write: Some(|w, _| {
                let settles = matches!(&w.op, WriteOp::Put(r) if r.state == RecordState::Settled);
                (!settles).then_some(w)
            }),
            ..Apply::NONE
        },
        expect: &[fails("status/5")],
    },
    FaultDef {
        name: "status-settles-always",
        defect: "every status query settles an unknown key, asked to or not",
        apply: Apply {
            query: Some(|_, _, headers| {
                let field = headers.get(STATUS_HEADER).and_then(|v| v.to_str().ok());
                if let Some(method) = field.filter(|f| !f.contains("settle")) {
                    if let Ok(v) = HeaderValue::from_str(&format!("{method}; settle")) {
                        headers.insert(STATUS_HEADER, v);
                    }
                }
            }),
            ..Apply::NONE
        },
        // The request claims its key before the first query arrives, as a rule: status/2 may
        // see it or not.
        expect: &[related("status/2"), fails("status/4"), fails("status/6")],
    },
    FaultDef {
        name: "status-runs-handler",
        defect: "a status query runs the handler (the request asked about) before it answers",
        apply: Apply {
            query_runs: true,
            ..Apply::NONE
        },
        // Only the count oracle sees it: the answers are right.
        expect: &[
            fails("status/1").blind(Want::Pass),
            // The query runs the handler before it answers, so the request may be done
            // before any query sees it in flight.
            fails("status/2").blind(Want::Any),
            fails("status/3").blind(Want::Pass),
            fails("status/4").blind(Want::Pass),
            fails("status/5").blind(Want::Pass),
            fails("status/7").blind(Want::Pass),
        ],
    },
    FaultDef {
        name: "lenient-status",
        defect: "status queries are read leniently: the first of several keys is taken, and a malformed `Idempotency-Status` is read as its method",
        apply: Apply {
            query: Some(|_, _, headers| {
                if let Some(first) = headers.get(KEY_HEADER).cloned() {
                    headers.insert(KEY_HEADER, first);
                }
                let field = headers.get(STATUS_HEADER).and_then(|v| v.to_str().ok());
                let Some(field) = field else { return };
                let method: String = field
                    .split(';')
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .filter(char::is_ascii_alphabetic)
                    .collect();
                let plain = field.trim() == method || field.trim() == format!("{method}; settle");
                if !plain {
                    if let Ok(v) = HeaderValue::from_str(&method) {
                        headers.insert(STATUS_HEADER, v);
                    }
                }
            }),
            ..Apply::NONE
        },
        expect: &[fails("status/7")],
    },
];

fn in_flight(r: &Record) -> bool {
    matches!(r.state, RecordState::InFlight { .. })
}

/// Whether `r` holds a response past its expiry, or no longer holds its response: what a
/// store that drops keys with their responses has forgotten.
fn forgotten(r: &Record) -> bool {
    match r.state {
        RecordState::Completed {
            response_expires, ..
        } => UnixMillis::now() >= response_expires,
        RecordState::Tombstone => true,
        _ => false,
    }
}

/// The `Authorization` value that names `principal` as the server reads it, `None` for the
/// anonymous one.
fn credential_of(principal: &str) -> Option<HeaderValue> {
    let value = match (
        principal.strip_prefix("bearer "),
        principal.strip_prefix("authorization "),
    ) {
        (Some(token), _) => format!("Bearer {token}"),
        (None, Some(value)) => value.to_owned(),
        (None, None) => return None,
    };
    HeaderValue::from_str(&value).ok()
}

/// `r` with a lease, once taken, that never ends.
fn endless(mut r: Record) -> Record {
    if in_flight(&r) {
        r.state = RecordState::InFlight {
            lease_expires: FOREVER,
        };
    }
    r
}

/// `problems` on `route`, nothing elsewhere.
fn only(route: Route, on: Route, problems: &'static [Problem]) -> &'static [Problem] {
    if route == on {
        problems
    } else {
        &[]
    }
}

/// `w` with every final response whose status `forgets` deleted instead of stored, so that
/// its key (or counter slot) is new again.
fn forget(mut w: Write, forgets: fn(u16) -> bool) -> Write {
    if let WriteOp::Put(r) = &mut w.op {
        match &mut r.state {
            RecordState::Completed { response, .. } if forgets(response.status) => {
                w.op = WriteOp::Delete;
            }
            RecordState::Counter { session } => {
                let forgotten = |s: &SlotState| match s {
                    SlotState::Completed { response } => forgets(response.status),
                    _ => false,
                };
                if session.slots.iter().any(|s| forgotten(&s.state)) {
                    Arc::make_mut(session)
                        .slots
                        .retain(|s| !forgotten(&s.state));
                }
            }
            _ => {}
        }
    }
    w
}
