//! The status query (`IDEM-STATUS-1` to `IDEM-STATUS-4`) as an operation of the machine: what
//! became of a key, from one read of its record, without ever executing, claiming or
//! revealing another principal's record; and, when asked, settling a key nobody used so that
//! it never runs.
//!
//! Over HTTP it is a `GET` on the URL of the request asked about, with that request's
//! `Idempotency-Key` and an `Idempotency-Status` field naming its method (an RFC 8941 token,
//! with the boolean parameter `settle` to settle an unknown key: `POST; settle`). A `GET`
//! never runs a handler, so a server without the operation answers it as its own `GET` (or
//! 405), never as the request; its answer is recognised by
//! [`STATUS_MEDIA_TYPE`](crate::STATUS_MEDIA_TYPE).

use super::*;
use crate::engine::Config;
use crate::record::{Precondition, WriteOp};
use crate::session::{CounterSession, SlotState};

/// What became of a key, as a status query finds it (`IDEM-STATUS-1`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyStatus {
    /// It ran and its outcome is stored: the stored response's status, and whether the
    /// response is still replayed (a retry with the key gets it).
    Completed {
        /// The stored response's status.
        status: u16,
        /// Whether a retry with the key still gets the response.
        replayable: bool,
    },
    /// An attempt holds the key: ask again after this many seconds.
    InProgress {
        /// When to ask again.
        retry_after_secs: u64,
    },
    /// An attempt failed in a way that a retry runs again (its lease ended without an
    /// outcome recorded, or it was left for a retry to take over).
    Released,
    /// Its outcome is unknown and held for reconciliation.
    Held,
    /// It ran; its response is gone; the key is still remembered.
    Expired,
    /// Never seen, or forgotten: nothing with this key is recorded.
    Unknown,
    /// Settled as never to run (by this query or an earlier one): it did not run, and no
    /// request with the key ever will while the key is remembered (`IDEM-STATUS-3`).
    NotExecuted,
}

impl KeyStatus {
    /// Its name in a status document: `completed`, `in-progress`, `released`, `held`,
    /// `expired`, `unknown`, `not-executed`.
    pub fn name(&self) -> &'static str {
        match self {
            KeyStatus::Completed { .. } => "completed",
            KeyStatus::InProgress { .. } => "in-progress",
            KeyStatus::Released => "released",
            KeyStatus::Held => "held",
            KeyStatus::Expired => "expired",
            KeyStatus::Unknown => "unknown",
            KeyStatus::NotExecuted => "not-executed",
        }
    }
}

impl KeyStatus {
    /// The members of a status document that a client reads, as member names from the
    /// top-level object: the key's status name, the stored response's status and whether it
    /// is still replayed, and `retryAfter`. [`KeyStatus::from_values`] takes their values in
    /// this order.
    pub const DOCUMENT_MEMBERS: [&'static [&'static str]; 4] = [
        &["status"],
        &["response", "status"],
        &["response", "replayable"],
        &["retryAfter"],
    ];

    /// Reads a status document (the body of a reply of
    /// [`STATUS_MEDIA_TYPE`](crate::STATUS_MEDIA_TYPE)), as a client receives it: `None` when
    /// it is not one (not JSON, an unknown status name, a completed key without its response
    /// status, a status outside 200-599). A missing `retryAfter` reads as
    /// [`RETRY_SOON_SECS`](crate::engine::RETRY_SOON_SECS).
    pub fn from_document(body: &[u8]) -> Option<KeyStatus> {
        Self::from_found(crate::canon::members_at(body, Self::DOCUMENT_MEMBERS).ok()?)
    }

    /// Reads a status document that the host has parsed itself (a browser's `JSON.parse`),
    /// as [`KeyStatus::from_document`] reads its text: the value at each of
    /// [`DOCUMENT_MEMBERS`](KeyStatus::DOCUMENT_MEMBERS) as JSON text, written by the host's
    /// serialiser (`JSON.stringify`), or `None` where the document has none. A serialiser
    /// writes numbers in their shortest form, so a status written `200.0` reads as 200 here,
    /// where [`KeyStatus::from_document`] refuses it.
    pub fn from_values(values: [Option<&str>; 4]) -> Option<KeyStatus> {
        use crate::canon::Found;
        Self::from_found(values.map(|v| v.map_or(Found::Missing, Found::of_json_text)))
    }

    fn from_found(found: [crate::canon::Found; 4]) -> Option<KeyStatus> {
        use crate::canon::Found;
        let [name, status, replayable, retry_after] = found;
        let number = |found: Found| match found {
            // A JSON number's text: digits only (no sign, no fraction) is a whole number.
            Found::Number(n) => crate::kind::parse_decimal(&n, "status").ok(),
            _ => None,
        };
        let Found::String(name) = name else {
            return None;
        };
        Some(match name.as_str() {
            "completed" => {
                let status = number(status)
                    .and_then(|s| u16::try_from(s).ok())
                    .filter(|s| (200..=599).contains(s))?;
                let Found::Bool(replayable) = replayable else {
                    return None;
                };
                KeyStatus::Completed { status, replayable }
            }
            "in-progress" => KeyStatus::InProgress {
                retry_after_secs: number(retry_after).unwrap_or(crate::engine::RETRY_SOON_SECS),
            },
            "released" => KeyStatus::Released,
            "held" => KeyStatus::Held,
            "expired" => KeyStatus::Expired,
            "unknown" => KeyStatus::Unknown,
            "not-executed" => KeyStatus::NotExecuted,
            _ => return None,
        })
    }
}

/// A status query as the host received it.
#[derive(Clone, Copy, Debug)]
pub struct StatusQuery<'a> {
    /// Who asks, as for the request asked about (the same principal function): an
    /// empty one is refused (`IDEM-SCOPE-3`), and a key is only ever looked up in the asker's
    /// own scope (`IDEM-STATUS-2`).
    pub principal: Option<&'a str>,
    /// The route of the request asked about.
    pub route: &'a str,
    /// Every value of the key header, as received.
    pub keys: &'a [&'a [u8]],
    /// The value of the `Idempotency-Status` field.
    pub status: &'a [u8],
    /// The client a unix-time key is from when the key names none, as for the request asked
    /// about ([`Intake::client`](crate::Intake::client)).
    pub client: Option<&'a str>,
}

/// Where a status query stands.
#[derive(Debug)]
pub(super) struct Querying {
    /// The key as the client sent it (parsed).
    key: String,
    /// The counter slot asked about, for counter keys: its epoch and number.
    seq: Option<(u64, u64)>,
    /// The timestamp of a unix-time key asked about.
    time_at: Option<UnixMillis>,
    settle: bool,
    /// Whether the read is handed out.
    reading: bool,
    /// Whether a settling write is out.
    settling: bool,
    rounds: usize,
}

impl Policy {
    /// The machine of a status query (`IDEM-STATUS-1`): one read of the key's record in the
    /// asker's scope, then a 200 document of [`STATUS_MEDIA_TYPE`](crate::STATUS_MEDIA_TYPE),
    /// never cached,
    /// `{"key", "status", …}` ([`KeyStatus::name`]; a completed key adds
    /// `"response": {"status", "replayable"}`, one in progress `"retryAfter"` and a
    /// `Retry-After` field). With `settle`, a key that is unknown is settled with one
    /// compare-and-set from what was read: a copy of the original request arriving later is
    /// refused (409 `key-settled`) and never runs; if the original claims the key first, its
    /// write wins and the query answers what it then finds (`IDEM-STATUS-3`). Counter keys
    /// are read, never settled: a number below the client's low-water mark never runs again
    /// anyway. It never runs a handler and never claims. Refused at once: no key or a
    /// malformed one (400), a malformed status field or a method this policy does not guard
    /// (400 `about:blank`), an empty principal. `nonce` is random: a settled record's first
    /// version.
    pub fn status(&self, query: &StatusQuery<'_>, nonce: u64) -> Request {
        let mut req = self.status_machine(query, nonce);
        req.operation = Operation::Status;
        req
    }

    fn status_machine(&self, query: &StatusQuery<'_>, nonce: u64) -> Request {
        let Some((method, settle)) = parse_status_field(query.status) else {
            return Request::answered(Reply::plain(
                Plain::BadRequest,
                "Idempotency-Status names the method of the request asked about, optionally with settle: POST; settle",
            ));
        };
        if !self.methods.iter().any(|m| m == method) {
            return Request::answered(Reply::plain(
                Plain::BadRequest,
                "Idempotency-Status names a method whose requests are not guarded here",
            ));
        }
        let scope = match self.scope(query.principal, method, query.route) {
            Ok(scope) => scope,
            Err(refusal) => return Request::refused(refusal),
        };
        let value = match query.keys {
            [] => Err(KeyError::Empty),
            [one] => Ok(*one),
            _ => Err(KeyError::List),
        };
        let key = match value.and_then(|v| self.parse.key(v)) {
            Ok(key) => key,
            Err(e) => return Request::refused(Refusal::key(&e)),
        };
        let mut time_at = None;
        let (record_key, seq) = match &self.rules {
            Rules::Record(_) => (RecordKey::new(scope, key.clone()), None),
            Rules::Time(t) => match time_key_of(&key, query.client) {
                Ok(k) => {
                    time_at = Some(k.at);
                    (t.record_key(&scope, &k), None)
                }
                Err(e) => return Request::refused(Refusal::kind_key(&e, "IDEM-TIME-1")),
            },
            Rules::Token(t) => {
                if let Err(reason) = t.verify(&scope, &key) {
                    return Request::refused(Refusal::rejected(&reason));
                }
                (t.record_key(&scope, &key), None)
            }
            Rules::Counter(c) => match crate::counter::parse_counter_key(&key, c.config().bits) {
                Ok(k) => (c.session_key(&scope, &k.client), Some((k.epoch, k.seq))),
                Err(e) => return Request::refused(Refusal::kind_key(&e, "IDEM-CTR-1")),
            },
        };
        let mut req = Request::with_rules(
            self.rules.clone(),
            record_key,
            Fingerprint::from_digest([0; 32]),
            Subject::Record,
            nonce,
        );
        req.state = State::Querying(Box::new(Querying {
            key,
            settle: settle && seq.is_none(),
            seq,
            time_at,
            reading: false,
            settling: false,
            rounds: 0,
        }));
        req
    }
}

impl StatusQuery<'_> {
    /// The `Idempotency-Status` field a client sends to ask about a request with `method`:
    /// `POST`, or `POST; settle` to settle the key if the server never saw it.
    pub fn field(method: &str, settle: bool) -> String {
        let mut field = String::from(method);
        if settle {
            field.push_str("; settle");
        }
        field
    }
}

/// `METHOD` or `METHOD; settle` (RFC 8941: a token item, its boolean parameter `settle`).
fn parse_status_field(value: &[u8]) -> Option<(&str, bool)> {
    let text = core::str::from_utf8(value).ok()?;
    let mut parts = text.split(';');
    let method = parts.next()?.trim();
    let tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if method.is_empty() || !method.chars().all(tchar) {
        return None;
    }
    let mut settle = false;
    for param in parts {
        match param.trim() {
            "settle" | "settle=?1" => settle = true,
            "settle=?0" => settle = false,
            _ => return None,
        }
    }
    Some((method, settle))
}

impl Querying {
    /// The next step: the read, unless it (or the settling write) is out.
    pub(super) fn poll(&mut self) -> Step {
        if !self.reading && !self.settling {
            self.reading = true;
            return Step::Load;
        }
        Step::Idle
    }
}

impl Request {
    /// The key's record as read: its status, or the settling write.
    pub(super) fn query_read(&mut self, now: UnixMillis, record: Option<&Record>) {
        let State::Querying(q) = &mut self.state else {
            return;
        };
        if !q.reading {
            return;
        }
        q.reading = false;
        let config = self.rules.config();
        let status = match q.seq {
            Some((epoch, seq)) => slot_status(now, record, epoch, seq, config),
            None => record_status(now, record, config),
        };
        // A unix-time key still ahead of its window is refused as it is now, and may run once
        // the window reaches it, maybe after a settled record would have expired: it is read,
        // never settled.
        let ahead = match (&self.rules, q.time_at) {
            (Rules::Time(t), Some(at)) => t.ahead_of_window(now, at),
            _ => false,
        };
        if !(q.settle && status == KeyStatus::Unknown && q.rounds < MAX_LOST_RACES && !ahead) {
            let reply = status_document(&q.key, &status);
            self.state = State::Answered(Answer::Status(Box::new((status, reply))));
            return;
        }
        // Settled from what was read: absent (or forgotten), or a token issued and unused.
        let (version, precondition) = match record {
            Some(r) => (r.version.wrapping_add(1), Precondition::Version(r.version)),
            None => (self.nonce, Precondition::Absent),
        };
        q.settling = true;
        self.write = Some(Write {
            key: self.key.clone(),
            precondition,
            op: WriteOp::Put(Record {
                version,
                fence: 0,
                fingerprint: Fingerprint::from_digest([0; 32]),
                created: now,
                key_expires: now.saturating_add(self.rules.config().key_ttl),
                state: RecordState::Settled,
            }),
        });
    }

    /// Whether the settling write was applied: settled, or read again (the original, or
    /// another query, wrote first).
    pub(super) fn query_applied(&mut self, applied: Applied) {
        let State::Querying(q) = &mut self.state else {
            return;
        };
        if !q.settling {
            return;
        }
        q.settling = false;
        if applied == Applied::Applied {
            let status = KeyStatus::NotExecuted;
            let reply = status_document(&q.key, &status);
            self.state = State::Answered(Answer::Status(Box::new((status, reply))));
            return;
        }
        q.rounds += 1;
    }

    /// What a status query found, once it is answered (`None` before, and for other
    /// operations).
    pub fn key_status(&self) -> Option<&KeyStatus> {
        match &self.state {
            State::Answered(Answer::Status(found)) => Some(&found.0),
            _ => None,
        }
    }
}

/// The status of a key whose record is `record`.
fn record_status(now: UnixMillis, record: Option<&Record>, config: &Config) -> KeyStatus {
    let Some(record) = record.filter(|r| r.is_live(now)) else {
        return KeyStatus::Unknown;
    };
    match &record.state {
        RecordState::InFlight { lease_expires } if now < *lease_expires => KeyStatus::InProgress {
            retry_after_secs: config.retry_after(now, *lease_expires),
        },
        RecordState::InFlight { .. } => KeyStatus::Released,
        RecordState::Completed {
            response,
            response_expires,
        } if now < *response_expires && !super::hold::is_not_stored(response) => {
            KeyStatus::Completed {
                status: response.status,
                replayable: true,
            }
        }
        // It ran, and its response is gone: expired, or too large to keep (IDEM-STORE-5).
        RecordState::Completed { .. } | RecordState::Tombstone => KeyStatus::Expired,
        RecordState::OutcomeUnknown { .. } => KeyStatus::Held,
        RecordState::Settled => KeyStatus::NotExecuted,
        // A token issued and never presented, or another kind's record under the key.
        RecordState::Issued { .. } | RecordState::Counter { .. } => KeyStatus::Unknown,
    }
}

/// The status of number `seq` of `epoch` in the counter session `record`. Only the session's
/// current epoch has slots: a number of another epoch is unknown, never the current epoch's
/// slot of the same number, which is another request (`IDEM-CTR-5`).
fn slot_status(
    now: UnixMillis,
    record: Option<&Record>,
    epoch: u64,
    seq: u64,
    config: &Config,
) -> KeyStatus {
    let session: Option<&CounterSession> = record.and_then(|r| match &r.state {
        RecordState::Counter { session } if r.is_live(now) && session.epoch == epoch => {
            Some(&**session)
        }
        _ => None,
    });
    let Some(slot) = session.and_then(|s| s.slots.iter().find(|slot| slot.seq == seq)) else {
        return KeyStatus::Unknown;
    };
    match &slot.state {
        SlotState::InFlight { lease_expires } if now < *lease_expires => KeyStatus::InProgress {
            retry_after_secs: config.retry_after(now, *lease_expires),
        },
        SlotState::InFlight { .. } => KeyStatus::Released,
        SlotState::Completed { response } if super::hold::is_not_stored(response) => {
            KeyStatus::Expired
        }
        SlotState::Completed { response } => KeyStatus::Completed {
            status: response.status,
            replayable: true,
        },
        SlotState::OutcomeUnknown { .. } => KeyStatus::Held,
    }
}

/// The status document, 200, never cached; `Retry-After` for a key in progress.
fn status_document(key: &str, status: &KeyStatus) -> Reply {
    use crate::canon::{write_int, write_str};
    let mut body = Vec::with_capacity(96 + key.len());
    body.extend_from_slice(b"{\"key\":");
    write_str(&mut body, key);
    let mut retry_after = None;
    match status {
        KeyStatus::Completed { status, replayable } => {
            body.extend_from_slice(b",\"response\":{\"replayable\":");
            body.extend_from_slice(if *replayable { b"true" } else { b"false" });
            body.extend_from_slice(b",\"status\":");
            write_int(&mut body, u64::from(*status), false);
            body.push(b'}');
        }
        KeyStatus::InProgress { retry_after_secs } => {
            body.extend_from_slice(b",\"retryAfter\":");
            write_int(&mut body, *retry_after_secs, false);
            retry_after = Some(*retry_after_secs);
        }
        _ => {}
    }
    body.extend_from_slice(b",\"status\":");
    write_str(&mut body, status.name());
    body.push(b'}');
    Reply::status_document(body, retry_after)
}
