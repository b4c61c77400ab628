//! The engine as the JavaScript side drives it, in plain Rust (tested natively).
//!
//! A request's attempt (record key and fingerprint) lives in a numbered slot from
//! [`Host::begin`] to [`Host::end`], so that JavaScript holds a small integer instead of an
//! object per request, and each step of a request is one call with numbers in and numbers
//! (or one byte array) out. A slot goes through these states:
//!
//! * open: identified, not yet claimed;
//! * pending: the engine decided to execute, and its claim write is on its way to an
//!   asynchronous store ([`Host::commit`] once the store applied it);
//! * leased: this request holds the lease and runs the handler;
//! * done: the engine answered without executing (replay, in progress, mismatch, refused);
//!   [`Host::reply`] renders the answer.
//!
//! With the in-process [`MemoryStore`] the records stay inside the module and a request
//! costs two calls: [`Host::claim_in`] (the core's [`Store::claim`]) and [`Host::finish_in`]
//! (the core's [`Store::finish`]). Asynchronous stores get the compare-and-set writes as
//! bytes instead ([`Host::decide`], [`Host::complete`], [`Host::take_write`]) and run the
//! claim loop in JavaScript; a Durable Object decides next to its storage and sends the
//! claim back ([`Host::begin_encoded`], [`Host::encode_claim`], [`Host::claim_encoded`]).
//! Nothing here decides anything: every decision is idem-core's.

use crate::interop::{self, ErrorKind, ErrorParts, KeyKind, Kind, Options, StoreWrite};
use alloc::string::String;
use alloc::vec::Vec;
use core::mem;
use idem_core::{
    Applied, Attempt, Claim, Decision, Event, Fingerprint, FingerprintSpec, Finish, Lease,
    MemoryStore, Outcome, Precondition, RecordKey, RequestParts, Scope, Store, StoredResponse,
    UnixMillis, Write, WriteOp,
};

/// A request as the JavaScript side passes it.
#[derive(Clone, Copy, Debug)]
pub struct Incoming<'a> {
    /// The raw `Idempotency-Key` header value, `None` when absent.
    pub key: Option<&'a str>,
    /// The principal (by default the `Authorization` header); it enters the scope only as a
    /// digest.
    pub principal: &'a str,
    /// The method.
    pub method: &'a str,
    /// The route for the scope.
    pub route: &'a str,
    /// Path and query.
    pub target: &'a str,
    /// The `Content-Type` header.
    pub content_type: Option<&'a str>,
    /// The fingerprinted headers, a flat list text.
    pub headers: &'a str,
    /// The body.
    pub body: &'a [u8],
}

/// What the handler's run came to, for [`Host::outcome`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ran {
    /// It answered: the response is classified by status (`IDEM-OUT-4`).
    Answered = 0,
    /// It threw: an unknown outcome (`IDEM-OUT-3`).
    Threw = 1,
    /// It reports that nothing happened: the key is released (`IDEM-OUT-2`).
    NothingHappened = 2,
}

enum State {
    Open,
    Pending { lease: Lease, recovered: bool },
    Leased(Lease),
    Done(Decision),
}

struct Slot {
    key: RecordKey,
    fingerprint: Fingerprint,
    state: State,
    /// A heartbeat's lease, until the store has applied its write.
    extension: Option<Lease>,
}

/// The engine with its key and fingerprint settings, and the attempts in flight.
pub struct Host {
    engine: idem_core::Engine,
    key_kind: KeyKind,
    fingerprint: FingerprintSpec,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    /// The last principal and its digest: most requests of a process share a handful.
    principal: Option<(String, String)>,
    problem: Option<ErrorParts>,
    write: Vec<u8>,
    /// Reply bytes, read in place by JavaScript.
    out: Vec<u8>,
}

fn no_slot() -> ErrorParts {
    ErrorParts {
        kind: ErrorKind::Error,
        code: interop::CODE_OPTIONS,
        message: String::from("no such attempt, or not in this state"),
        problem: None,
    }
}

fn leased(slot: &Slot) -> Result<&Lease, ErrorParts> {
    match &slot.state {
        State::Leased(lease) | State::Pending { lease, .. } => Ok(lease),
        _ => Err(no_slot()),
    }
}

impl Host {
    /// An engine with these options. `IDEM-TTL-2` when `keyTtl < responseTtl`.
    pub fn new(options: Options) -> Result<Host, ErrorParts> {
        let engine = idem_core::Engine::new(options.config).map_err(|e| ErrorParts::config(&e))?;
        Ok(Host {
            engine,
            key_kind: options.key_kind,
            fingerprint: options.fingerprint,
            slots: Vec::new(),
            free: Vec::new(),
            principal: None,
            problem: None,
            write: Vec::new(),
            out: Vec::new(),
        })
    }

    /// Attempts open now (begun and not ended).
    pub fn open_slots(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn open(&mut self, key: RecordKey, fingerprint: Fingerprint) -> u32 {
        let slot = Some(Slot {
            key,
            fingerprint,
            state: State::Open,
            extension: None,
        });
        match self.free.pop() {
            Some(t) => {
                self.slots[t as usize] = slot;
                t
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        }
    }

    fn slot(&self, t: u32) -> Result<&Slot, ErrorParts> {
        self.slots
            .get(t as usize)
            .and_then(Option::as_ref)
            .ok_or_else(no_slot)
    }

    fn slot_mut(slots: &mut [Option<Slot>], t: u32) -> Result<&mut Slot, ErrorParts> {
        slots
            .get_mut(t as usize)
            .and_then(Option::as_mut)
            .ok_or_else(no_slot)
    }

    /// Identifies a request: parses the key, builds the scope, fingerprints the request,
    /// and opens a slot. A missing or malformed key or an unusable body is an error with a
    /// problem ([`Host::fail_with`] keeps it for [`Host::reply`]).
    pub fn begin(&mut self, req: &Incoming<'_>) -> Result<u32, ErrorParts> {
        let key = self
            .key_kind
            .parse(req.key)
            .map_err(|e| ErrorParts::key(&e))?;
        let items = interop::list(req.headers)?;
        let headers: Vec<(&str, &[u8])> = items
            .chunks_exact(2)
            .map(|p| (p[0], p[1].as_bytes()))
            .collect();
        let fingerprint = self
            .fingerprint
            .fingerprint(&RequestParts {
                method: req.method,
                target: req.target,
                content_type: req.content_type,
                headers: &headers,
                body: req.body,
            })
            .map_err(|e| ErrorParts::fingerprint(&e))?;
        let cached = matches!(&self.principal, Some((p, _)) if p == req.principal);
        if !cached {
            let digest = interop::principal_digest(req.principal);
            self.principal = Some((String::from(req.principal), digest));
        }
        let digest = self.principal.as_ref().map_or("", |(_, d)| d.as_str());
        let scope = Scope::new(digest, req.method, req.route);
        Ok(self.open(RecordKey::new(scope, key), fingerprint))
    }

    /// Opens a slot for an attempt sent by [`Host::encode_attempt`] (`IDEM-JS-2`).
    pub fn begin_encoded(&mut self, bytes: &[u8]) -> Result<u32, ErrorParts> {
        let (key, fingerprint) = interop::decode_attempt(bytes)?;
        Ok(self.open(key, fingerprint))
    }

    /// Keeps an error with a problem for [`Host::reply`] (slot `-1`).
    pub fn fail_with(&mut self, e: ErrorParts) {
        self.problem = Some(e);
    }

    /// The requirement ID of the last problem kept by [`Host::fail_with`].
    pub fn problem_code(&self) -> &'static str {
        self.problem.as_ref().map_or("", |p| p.code)
    }

    /// Refuses a body of `length` bytes, announced before it is read, when it is larger
    /// than the fingerprint limit (`IDEM-LIMIT-1`): the same problem as [`Host::begin`]
    /// would give after reading it.
    pub fn check_body_size(&self, length: f64) -> Result<(), ErrorParts> {
        let max = self.fingerprint.max_body;
        if length.is_finite() && length > max as f64 {
            let e = idem_core::FingerprintError::BodyTooLarge {
                len: length as usize,
                max,
            };
            return Err(ErrorParts::fingerprint(&e));
        }
        Ok(())
    }

    /// Closes a slot.
    pub fn end(&mut self, t: u32) {
        if let Some(slot) = self.slots.get_mut(t as usize) {
            if slot.take().is_some() {
                self.free.push(t);
            }
        }
    }

    /// The key the store keeps the record under ([`RecordKey::storage_key`]).
    pub fn storage_key(&self, t: u32) -> Result<String, ErrorParts> {
        Ok(self.slot(t)?.key.storage_key())
    }

    /// The idempotency key as parsed (a UUID in lowercase).
    pub fn key(&self, t: u32) -> Result<&str, ErrorParts> {
        Ok(&self.slot(t)?.key.key)
    }

    /// The attempt as bytes, for the Durable Object that owns its key.
    pub fn encode_attempt(&self, t: u32) -> Result<Vec<u8>, ErrorParts> {
        let slot = self.slot(t)?;
        Ok(interop::encode_attempt(&slot.key, &slot.fingerprint))
    }

    /// The lease's fencing number (`IDEM-LEASE-2`).
    pub fn fence(&self, t: u32) -> Result<u64, ErrorParts> {
        Ok(leased(self.slot(t)?)?.fence)
    }

    /// When the lease ends.
    pub fn expires(&self, t: u32) -> Result<UnixMillis, ErrorParts> {
        Ok(leased(self.slot(t)?)?.expires)
    }

    fn settle(slot: &mut Slot, claim: Claim) -> u32 {
        let code = interop::claim_code(&claim);
        slot.state = match claim {
            Claim::Execute { lease, .. } => State::Leased(lease),
            Claim::Done(d) => State::Done(d),
        };
        code
    }

    /// Claims the key in the in-process store: a claim code. This is [`Store::claim`]'s
    /// loop, reading the record in place instead of through [`Store::load`] (which copies
    /// it).
    pub fn claim_in(
        &mut self,
        store: &mut MemoryStore,
        t: u32,
        now: UnixMillis,
        nonce: u64,
    ) -> Result<u32, ErrorParts> {
        let slot = Host::slot_mut(&mut self.slots, t)?;
        let attempt = Attempt {
            key: &slot.key,
            fingerprint: &slot.fingerprint,
            nonce,
        };
        let mut claim = Claim::Done(Decision::CONTENDED);
        for _ in 0..idem_core::MAX_LOST_RACES {
            match self.engine.decide(now, &attempt, store.get(&slot.key)) {
                Decision::Execute {
                    lease,
                    write,
                    recovered,
                } => match store.apply(now, write) {
                    Ok(Applied::Applied) => {
                        claim = Claim::Execute { lease, recovered };
                        break;
                    }
                    Ok(Applied::Conflict) => continue,
                    // MemoryStore fails only when it is full (IDEM-STORE-3).
                    Err(_) => return Ok(Kind::Full as u32),
                },
                other => {
                    claim = Claim::Done(other);
                    break;
                }
            }
        }
        Ok(Host::settle(slot, claim))
    }

    /// Decides given the stored record bytes (`None`: no record), for an asynchronous store:
    /// a claim code. On execute the claim write waits in [`Host::take_write`] and the slot is
    /// pending until [`Host::commit`]. `IDEM-REC-1` for bytes that are not a record.
    pub fn decide(
        &mut self,
        t: u32,
        now: UnixMillis,
        nonce: u64,
        stored: Option<&[u8]>,
    ) -> Result<u32, ErrorParts> {
        let record = match stored {
            Some(bytes) => {
                Some(idem_core::decode_record(bytes).map_err(|e| ErrorParts::record(&e))?)
            }
            None => None,
        };
        let slot = Host::slot_mut(&mut self.slots, t)?;
        let decision = self.engine.decide(
            now,
            &Attempt {
                key: &slot.key,
                fingerprint: &slot.fingerprint,
                nonce,
            },
            record.as_ref(),
        );
        let event = decision.event();
        match decision {
            Decision::Execute {
                lease,
                write,
                recovered,
            } => {
                self.write = StoreWrite::from_core(&write).encode(Some(Event::Executed));
                slot.state = State::Pending { lease, recovered };
                Ok(interop::code(Kind::Execute, recovered, event))
            }
            done => Ok(Host::settle(slot, Claim::Done(done))),
        }
    }

    /// The store applied the pending claim write (or a heartbeat's write): the slot holds
    /// the lease.
    pub fn commit(&mut self, t: u32) -> Result<(), ErrorParts> {
        let slot = Host::slot_mut(&mut self.slots, t)?;
        if let Some(next) = slot.extension.take() {
            slot.state = State::Leased(next);
            return Ok(());
        }
        if let State::Pending { lease, .. } = mem::replace(&mut slot.state, State::Open) {
            slot.state = State::Leased(lease);
            return Ok(());
        }
        Err(no_slot())
    }

    /// The answer after a claim lost the race [`idem_core::MAX_LOST_RACES`] times in a row:
    /// "in progress", as [`Store::claim`] answers.
    pub fn contended(&mut self, t: u32) -> Result<u32, ErrorParts> {
        let slot = Host::slot_mut(&mut self.slots, t)?;
        Ok(Host::settle(slot, Claim::Done(Decision::CONTENDED)))
    }

    /// The claim a Durable Object sends back after it applied the claim write (or decided
    /// without one).
    pub fn encode_claim(&self, t: u32) -> Result<Vec<u8>, ErrorParts> {
        let claim = match &self.slot(t)?.state {
            State::Pending { lease, recovered } => Claim::Execute {
                lease: lease.clone(),
                recovered: *recovered,
            },
            State::Done(d) => Claim::Done(d.clone()),
            _ => Claim::Done(Decision::CONTENDED),
        };
        Ok(interop::encode_claim(&claim))
    }

    /// Takes a claim sent by [`Host::encode_claim`] (`IDEM-JS-2`): a claim code.
    pub fn claim_encoded(&mut self, t: u32, bytes: &[u8]) -> Result<u32, ErrorParts> {
        let claim = interop::decode_claim(bytes)?;
        let slot = Host::slot_mut(&mut self.slots, t)?;
        Ok(Host::settle(slot, claim))
    }

    /// The reply bytes of a slot whose claim did not execute, or with `t < 0` of the
    /// problem kept by [`Host::fail_with`]; empty when there is none. They are written into
    /// a buffer the host keeps (at [`Host::out_ptr`], valid until the next call), so that
    /// JavaScript reads them in place instead of receiving a copy.
    pub fn reply(&mut self, t: i32) -> &[u8] {
        let out = &mut self.out;
        out.clear();
        if t < 0 {
            if let Some(r) = self.problem.as_ref().and_then(ErrorParts::reply) {
                interop::encode_reply_into(out, r.status, &r.headers, &[], &r.body);
            }
            return out;
        }
        match self.slots.get(t as usize).and_then(Option::as_ref) {
            // The stored response is written out as it is, without a copy in between.
            Some(Slot {
                state: State::Done(Decision::Replay(r)),
                ..
            }) => interop::encode_reply_into(out, r.status, &r.headers, interop::REPLAYED, &r.body),
            Some(Slot {
                state: State::Done(d),
                ..
            }) => {
                if let Some(r) = interop::decision_reply(d) {
                    interop::encode_reply_into(out, r.status, &r.headers, &[], &r.body);
                }
            }
            _ => {}
        }
        out
    }

    /// Where the last [`Host::reply`] was written (an address in the module's memory).
    pub fn out_ptr(&self) -> usize {
        self.out.as_ptr() as usize
    }

    /// The handler's outcome from what JavaScript saw.
    pub fn outcome(
        ran: u8,
        status: u16,
        headers: &str,
        body: Vec<u8>,
    ) -> Result<Outcome, ErrorParts> {
        Ok(match ran {
            0 => Outcome::classify(StoredResponse {
                status,
                headers: interop::pairs(headers)?,
                body,
            }),
            1 => Outcome::Unknown(None),
            _ => Outcome::Retryable,
        })
    }

    /// Stores the outcome in the in-process store ([`Store::finish`]): the event index.
    pub fn finish_in(
        &mut self,
        store: &mut MemoryStore,
        t: u32,
        now: UnixMillis,
        outcome: Outcome,
    ) -> Result<u8, ErrorParts> {
        let slot = self.slot(t)?;
        let finish = store
            .finish(&self.engine, now, leased(slot)?, outcome)
            .unwrap_or(Finish::FencedOut);
        match finish {
            Finish::Invalid(e) => Err(ErrorParts::complete(&e)),
            f => Ok(interop::event_index(f.event())),
        }
    }

    /// The completion write for an asynchronous store (in [`Host::take_write`], with the
    /// event it yields once applied).
    pub fn complete(
        &mut self,
        t: u32,
        now: UnixMillis,
        outcome: Outcome,
    ) -> Result<(), ErrorParts> {
        let write = self
            .engine
            .complete(now, leased(self.slot(t)?)?, outcome)
            .map_err(|e| ErrorParts::complete(&e))?;
        self.write = StoreWrite::from_core(&write).encode(Some(interop::completion_event(&write)));
        Ok(())
    }

    /// A heartbeat in the in-process store (`IDEM-LEASE-3`): false when the lease was taken
    /// over. `IDEM-LEASE-3` once the lease has ended.
    pub fn extend_in(
        &mut self,
        store: &mut MemoryStore,
        t: u32,
        now: UnixMillis,
    ) -> Result<bool, ErrorParts> {
        let slot = Host::slot_mut(&mut self.slots, t)?;
        let (next, write) = self
            .engine
            .extend(now, leased(slot)?)
            .map_err(|e| ErrorParts::complete(&e))?;
        if let Ok(Applied::Applied) = store.apply(now, write) {
            slot.state = State::Leased(next);
            return Ok(true);
        }
        Ok(false)
    }

    /// A heartbeat's write for an asynchronous store (in [`Host::take_write`]); once the
    /// store applied it, [`Host::commit`] moves the slot to the extended lease.
    pub fn extend(&mut self, t: u32, now: UnixMillis) -> Result<(), ErrorParts> {
        let slot = Host::slot_mut(&mut self.slots, t)?;
        let (next, write) = self
            .engine
            .extend(now, leased(slot)?)
            .map_err(|e| ErrorParts::complete(&e))?;
        slot.extension = Some(next);
        self.write = StoreWrite::from_core(&write).encode(Some(Event::Extended));
        Ok(())
    }

    /// The write bytes of the last [`Host::decide`], [`Host::complete`] or
    /// [`Host::extend`].
    pub fn take_write(&mut self) -> Vec<u8> {
        mem::take(&mut self.write)
    }
}

/// The write bytes that apply the passage of time to a stored record at `now` (drop an
/// expired response, delete an expired key), or `None` when nothing is due
/// (`IDEM-TTL-4`). `IDEM-REC-1` for bytes that are not a record.
pub fn expire(now: UnixMillis, value: &[u8]) -> Result<Option<Vec<u8>>, ErrorParts> {
    let record = idem_core::decode_record(value).map_err(|e| ErrorParts::record(&e))?;
    // The write's key is not used by JS stores (they key by storage key), and expiry needs
    // no configuration.
    let key = RecordKey::new(Scope::custom(String::new()), String::new());
    Ok(idem_core::Engine::default()
        .expire(now, &key, &record)
        .map(|w| StoreWrite::from_core(&w).encode(None)))
}

/// What [`store_apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreApplied {
    /// The precondition failed; nothing changed.
    Conflict = 0,
    /// The write was made.
    Applied = 1,
    /// A new record was refused: the store is full (`IDEM-STORE-3`).
    Full = 2,
}

fn not_a_storage_key() -> ErrorParts {
    ErrorParts {
        kind: ErrorKind::Range,
        code: interop::CODE_OPTIONS,
        message: String::from("MemoryStore keys are the engine's storage keys"),
        problem: None,
    }
}

/// The record under a storage key, encoded, with its version: the generic store interface
/// of the in-process store.
pub fn store_load(store: &MemoryStore, key: &str) -> Option<(u64, Vec<u8>)> {
    let key = interop::parse_storage_key(key)?;
    store
        .get(&key)
        .map(|r| (r.version, idem_core::encode_record(r)))
}

/// Applies a compare-and-set write given as the generic store interface passes it (the
/// version travels inside the encoded record). `IDEM-JS-1` for a key that is not a storage
/// key or a version that is not a number, `IDEM-REC-1` for bytes that are not a record.
pub fn store_apply(
    store: &mut MemoryStore,
    now: UnixMillis,
    key: &str,
    expect: Option<&str>,
    value: Option<&[u8]>,
) -> Result<StoreApplied, ErrorParts> {
    let key = interop::parse_storage_key(key).ok_or_else(not_a_storage_key)?;
    let precondition = match expect {
        None => Precondition::Absent,
        Some(v) => Precondition::Version(v.parse().map_err(|_| not_a_storage_key())?),
    };
    let op = match value {
        Some(bytes) => {
            WriteOp::Put(idem_core::decode_record(bytes).map_err(|e| ErrorParts::record(&e))?)
        }
        None => WriteOp::Delete,
    };
    Ok(
        match store.apply(
            now,
            Write {
                key,
                precondition,
                op,
            },
        ) {
            Ok(Applied::Applied) => StoreApplied::Applied,
            Ok(Applied::Conflict) => StoreApplied::Conflict,
            Err(_) => StoreApplied::Full,
        },
    )
}
