//! The request machine as the JavaScript side drives it, in plain Rust (tested natively).
//!
//! Each request is an idem-core [`Request`] in a numbered slot, from [`Host::begin`] to
//! [`Host::end`], so that JavaScript holds a small integer instead of an object, and each
//! step is one call with numbers in and numbers (or one byte array) out. JavaScript polls the
//! slot for the next [`Step`], performs it (reads or writes its store, sleeps, runs the
//! handler) and reports back; the machine decides everything.
//!
//! With the in-process [`MemoryStore`] the records stay inside the module and
//! [`Host::drive_in`] runs every store step at once, so a request costs a few calls. A
//! Durable Object claims next to its storage: the worker sends [`Host::ticket`], the object
//! runs the claim of a slot opened with [`Host::resume`] and sends back
//! [`Host::claimed_bytes`], and the worker passes them to [`Host::claimed`].

use crate::interop::{self, ErrorKind, ErrorParts, StoreWrite};
use alloc::string::String;
use alloc::vec::Vec;
use idem_core::{
    Applied, Delivery, Event, Inbox, Intake, MemoryStore, Message, Outcome, Policy, Precondition,
    RecordKey, Refusal, Request, Scope, Step, Store, StoreFailure, StoredResponse, Target,
    UnixMillis, Waiters, Write, WriteOp,
};

/// A request as the JavaScript side passes it.
#[derive(Clone, Copy, Debug)]
pub struct Incoming<'a> {
    /// The raw key header value, `None` when absent.
    pub key: Option<&'a str>,
    /// The principal the host stated, `None` for a single-tenant host.
    pub principal: Option<&'a str>,
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
    /// The client's low-water mark (counter keys), `None` when absent.
    pub low_water: Option<&'a str>,
}

pub use crate::interop::{HeartbeatState, Ran, StepKind};

struct Slot {
    req: Request,
    /// The write of the last [`Step::Apply`], until JavaScript takes it.
    write: Option<Write>,
    /// The time of the last [`Step::WaitUntil`].
    wait_until: UnixMillis,
    /// What the last [`Step::Done`] said.
    done: Option<idem_core::Finish>,
}

/// The policy, the requests in flight, and who waits for what.
pub struct Host {
    policy: Policy,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    waiters: Waiters,
    /// Reply bytes, read in place by JavaScript.
    out: Vec<u8>,
}

/// Stored record bytes as a record (`None`: no record); `IDEM-REC-1` for bytes that are not
/// one.
fn stored_record(value: Option<&[u8]>) -> Result<Option<idem_core::Record>, ErrorParts> {
    value
        .map(|bytes| idem_core::decode_record(bytes).map_err(|e| ErrorParts::record(&e)))
        .transpose()
}

/// Entry `i` of a numbered table (request slots, operations), if it is open.
fn numbered<T>(table: &[Option<T>], i: u32) -> Result<&T, ErrorParts> {
    table
        .get(i as usize)
        .and_then(Option::as_ref)
        .ok_or_else(no_slot)
}

fn numbered_mut<T>(table: &mut [Option<T>], i: u32) -> Result<&mut T, ErrorParts> {
    table
        .get_mut(i as usize)
        .and_then(Option::as_mut)
        .ok_or_else(no_slot)
}

fn no_slot() -> ErrorParts {
    ErrorParts {
        kind: ErrorKind::Error,
        code: interop::CODE_OPTIONS,
        message: String::from("no such request, or not in this state"),
    }
}

impl Host {
    /// A host with this policy.
    pub fn new(policy: Policy) -> Host {
        Host {
            policy,
            slots: Vec::new(),
            free: Vec::new(),
            waiters: Waiters::default(),
            out: Vec::new(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Requests open now (begun and not ended).
    pub fn open_slots(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Keys with a request waiting for them.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    fn open(&mut self, req: Request) -> u32 {
        let slot = Some(Slot {
            req,
            write: None,
            wait_until: UnixMillis::ZERO,
            done: None,
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
        numbered(&self.slots, t)
    }

    fn slot_mut(&mut self, t: u32) -> Result<&mut Slot, ErrorParts> {
        numbered_mut(&mut self.slots, t)
    }

    /// The request in slot `t`, with the host's waiters beside it.
    fn request(&mut self, t: u32) -> Result<(&mut Slot, &mut Waiters), ErrorParts> {
        let Host { slots, waiters, .. } = self;
        Ok((numbered_mut(slots, t)?, waiters))
    }

    /// Whether a request with this method (and a key or not) is protected; other requests
    /// go straight to the handler.
    pub fn protects(&self, method: &str, has_key: bool) -> bool {
        self.policy.protects(method, has_key)
    }

    /// Identifies a request and opens its slot. A request that cannot be identified gets a
    /// slot too, whose first step is its refusal. `IDEM-JS-2` for a header list that is not
    /// a list text.
    pub fn begin(&mut self, req: &Incoming<'_>, nonce: u64) -> Result<u32, ErrorParts> {
        let items = interop::list(req.headers)?;
        let headers: Vec<(&str, &[u8])> = items
            .chunks_exact(2)
            .map(|p| (p[0], p[1].as_bytes()))
            .collect();
        let key = req.key.map(str::as_bytes);
        let keys: &[&[u8]] = match &key {
            Some(k) => core::slice::from_ref(k),
            None => &[],
        };
        let intake = Intake {
            principal: req.principal,
            method: req.method,
            route: req.route,
            target: req.target,
            keys,
            low_water: req.low_water,
            content_type: req.content_type,
            headers: &headers,
            body: req.body,
        };
        let request = self.policy.request(&intake, nonce);
        Ok(self.open(request))
    }

    /// A slot that refuses a body of `length` bytes, announced before it is read, when it is
    /// larger than the fingerprint accepts (`IDEM-LIMIT-1`); `None` when it may be read.
    pub fn refuse_body(&mut self, length: f64) -> Option<u32> {
        let length = if length.is_finite() && length > 0.0 {
            length as u64
        } else {
            0
        };
        match self.policy.check_body_size(length) {
            Ok(()) => None,
            Err(refusal) => Some(self.open(Request::refused(refusal))),
        }
    }

    /// Opens a slot for a ticket a worker sent (a Durable Object claims for it).
    /// `IDEM-JS-2` for bytes that are not a ticket.
    pub fn resume(&mut self, ticket: &[u8], nonce: u64) -> Result<u32, ErrorParts> {
        let ticket = interop::decode_ticket(ticket)?;
        let req = self.policy.resume(ticket, nonce);
        Ok(self.open(req))
    }

    /// Closes a slot.
    pub fn end(&mut self, t: u32) {
        if let Some(slot) = self.slots.get_mut(t as usize) {
            if slot.take().is_some() {
                self.free.push(t);
            }
        }
    }

    /// Keeps what a step carries (a write, a time, a finish) for the getters, and names it.
    fn stepped(slot: &mut Slot, step: Step) -> StepKind {
        match step {
            Step::Claim => StepKind::Claim,
            Step::Load => StepKind::Load,
            Step::Apply(write) => {
                slot.write = Some(write);
                StepKind::Apply
            }
            Step::WaitUntil(t) => {
                slot.wait_until = t;
                StepKind::WaitUntil
            }
            Step::Run(_) => StepKind::Run,
            Step::Idle => StepKind::Idle,
            Step::Reply => StepKind::Reply,
            Step::Done(f) => {
                slot.done = Some(f);
                StepKind::Done
            }
        }
    }

    /// The next step. The write of [`StepKind::Apply`] waits in [`Host::take_write`].
    pub fn poll(&mut self, t: u32, now: UnixMillis) -> Result<StepKind, ErrorParts> {
        let (slot, waiters) = self.request(t)?;
        let step = slot.req.poll(now, waiters);
        Ok(Host::stepped(slot, step))
    }

    /// Runs every store step in the in-process store and returns the first other step.
    pub fn drive_in(
        &mut self,
        store: &mut MemoryStore,
        t: u32,
        now: UnixMillis,
    ) -> Result<StepKind, ErrorParts> {
        let (slot, waiters) = self.request(t)?;
        // A full store is recorded by the machine (503 store-full); poll again for it.
        let step = match slot.req.drive(store, now, waiters) {
            Ok(step) => step,
            Err(_) => slot.req.poll(now, waiters),
        };
        Ok(Host::stepped(slot, step))
    }

    /// The write of the last [`Step::Apply`], as the store interface takes it.
    pub fn take_write(&mut self, t: u32) -> Result<StoreWrite, ErrorParts> {
        let slot = self.slot_mut(t)?;
        let stores_response = slot
            .req
            .completing()
            .is_some_and(|c| c.finish == idem_core::Finish::Stored);
        slot.write
            .take()
            .map(|w| StoreWrite {
                stores_response,
                ..StoreWrite::from_core(&w)
            })
            .ok_or_else(no_slot)
    }

    /// The record read for [`Step::Claim`] or [`Step::Load`], as stored bytes (`None`: no
    /// record). `IDEM-REC-1` for bytes that are not a record.
    pub fn record(
        &mut self,
        t: u32,
        now: UnixMillis,
        value: Option<&[u8]>,
    ) -> Result<(), ErrorParts> {
        let record = stored_record(value)?;
        let (slot, waiters) = self.request(t)?;
        slot.req.handle_record(now, record.as_ref(), waiters);
        Ok(())
    }

    /// Whether the write of [`Step::Apply`] was applied.
    pub fn applied(&mut self, t: u32, now: UnixMillis, applied: bool) -> Result<(), ErrorParts> {
        let (slot, waiters) = self.request(t)?;
        let applied = if applied {
            Applied::Applied
        } else {
            Applied::Conflict
        };
        slot.req.handle_applied(now, applied, waiters);
        Ok(())
    }

    /// The store failed on the step handed out: full (`IDEM-STORE-3`) or not.
    pub fn store_failed(&mut self, t: u32, full: bool) -> Result<(), ErrorParts> {
        let (slot, waiters) = self.request(t)?;
        let failure = if full {
            StoreFailure::Full
        } else {
            StoreFailure::Unavailable
        };
        slot.req.handle_store_error(failure, waiters);
        Ok(())
    }

    /// What a Durable Object claimed for [`Step::Claim`] (`IDEM-JS-2` for bytes that are
    /// not a claim).
    pub fn claimed(&mut self, t: u32, now: UnixMillis, bytes: &[u8]) -> Result<(), ErrorParts> {
        let claimed = interop::decode_claimed(bytes)?;
        let (slot, waiters) = self.request(t)?;
        slot.req.handle_claimed(now, claimed, waiters);
        Ok(())
    }

    /// What a Durable Object sends back after the claim of a resumed slot.
    pub fn claimed_bytes(&self, t: u32) -> Result<Vec<u8>, ErrorParts> {
        let claimed = self.slot(t)?.req.claimed().ok_or_else(no_slot)?;
        Ok(interop::encode_claimed(&claimed))
    }

    /// The ticket a Durable Object needs to claim for this request.
    pub fn ticket(&self, t: u32) -> Result<Vec<u8>, ErrorParts> {
        Ok(interop::encode_ticket(&self.slot(t)?.req.ticket()))
    }

    /// The handler's outcome: `status`, `headers` (a flat list text) and `body` when it
    /// answered.
    pub fn outcome(
        &mut self,
        t: u32,
        ran: Ran,
        status: u16,
        headers: &str,
        body: Vec<u8>,
    ) -> Result<(), ErrorParts> {
        let outcome = match ran {
            Ran::Answered => {
                if !(100..=599).contains(&status) {
                    return Err(ErrorParts::complete(
                        &idem_core::CompleteError::InvalidStatus(status),
                    ));
                }
                Outcome::classify(StoredResponse {
                    status,
                    headers: interop::pairs(headers)?,
                    body,
                })
            }
            Ran::Threw => Outcome::Unknown(None),
            Ran::NothingHappened => Outcome::Retryable,
            Ran::Processed => Inbox::processed(),
        };
        self.slot_mut(t)?.req.handle_outcome(outcome);
        Ok(())
    }

    /// Asks for a heartbeat; the next poll hands out its write. [`HeartbeatState::Quiet`]
    /// when it is on its way, otherwise why it is refused: the lease has ended, or was lost,
    /// or the outcome is in.
    pub fn heartbeat(&mut self, t: u32, now: UnixMillis) -> Result<HeartbeatState, ErrorParts> {
        Ok(match self.slot_mut(t)?.req.heartbeat(now) {
            Ok(()) => HeartbeatState::Quiet,
            Err(h) => HeartbeatState::of(h),
        })
    }

    /// Where the heartbeats stand.
    pub fn heartbeat_state(&self, t: u32) -> Result<HeartbeatState, ErrorParts> {
        Ok(HeartbeatState::of(self.slot(t)?.req.heartbeat_state()))
    }

    /// The next event, if any.
    pub fn poll_event(&mut self, t: u32) -> Result<Option<Event>, ErrorParts> {
        Ok(self.slot_mut(t)?.req.poll_event())
    }

    /// The handler's context while it runs: whether it recovers, the fence, and when the
    /// lease ends.
    pub fn context(&self, t: u32) -> Result<idem_core::Context, ErrorParts> {
        self.slot(t)?.req.context().ok_or_else(no_slot)
    }

    /// When the last [`Step::WaitUntil`] asked to be polled again.
    pub fn wait_until(&self, t: u32) -> Result<UnixMillis, ErrorParts> {
        Ok(self.slot(t)?.wait_until)
    }

    /// What the last [`Step::Done`] said.
    pub fn done(&self, t: u32) -> Result<Option<idem_core::Finish>, ErrorParts> {
        Ok(self.slot(t)?.done.clone())
    }

    /// The key the store keeps the record under ([`RecordKey::storage_key`]).
    pub fn storage_key(&self, t: u32) -> Result<String, ErrorParts> {
        Ok(self.slot(t)?.req.key().storage_key())
    }

    /// The idempotency key as parsed (a UUID in lowercase).
    pub fn key(&self, t: u32) -> Result<&str, ErrorParts> {
        Ok(&self.slot(t)?.req.key().key)
    }

    /// The requirement of the refusal that answered the request, if one did.
    pub fn refusal(&self, t: u32) -> Result<Option<&Refusal>, ErrorParts> {
        Ok(self.slot(t)?.req.refusal())
    }

    /// The reply bytes of a request answered without its handler ([`Step::Reply`]), written
    /// into a buffer the host keeps (at [`Host::out_ptr`], valid until the next call), so
    /// that JavaScript reads them in place instead of receiving a copy. Empty when there is
    /// none.
    pub fn reply(&mut self, t: u32) -> &[u8] {
        let out = &mut self.out;
        out.clear();
        if let Some(reply) = self
            .slots
            .get(t as usize)
            .and_then(Option::as_ref)
            .and_then(|s| s.req.reply())
        {
            interop::encode_reply_into(out, reply.status(), reply.headers(), reply.body());
        }
        out
    }

    /// The running handler's context and key as context bytes (see [`interop`]), where
    /// [`Host::reply`] writes, so that JavaScript reads them in one call.
    pub fn context_out(&mut self, t: u32) -> Result<&[u8], ErrorParts> {
        let Host { slots, out, .. } = self;
        let req = &numbered(slots, t)?.req;
        let context = req.context().ok_or_else(no_slot)?;
        interop::encode_context_into(out, &context, &req.key().key);
        Ok(out)
    }

    /// `write` as write bytes (see [`interop`]), where [`Host::reply`] writes, so that
    /// JavaScript reads them in place.
    pub fn write_out(&mut self, write: &StoreWrite) -> &[u8] {
        write.encode_into(&mut self.out);
        &self.out
    }

    /// Where the last [`Host::reply`] was written (an address in the module's memory).
    pub fn out_ptr(&self) -> usize {
        self.out.as_ptr() as usize
    }
}

/// The write bytes that apply the passage of time to a stored record at `now` (drop an
/// expired response, delete an expired key), or `None` when nothing is due
/// (`IDEM-TTL-4`). `IDEM-REC-1` for bytes that are not a record.
pub fn expire(now: UnixMillis, value: &[u8]) -> Result<Option<StoreWrite>, ErrorParts> {
    let record = idem_core::decode_record(value).map_err(|e| ErrorParts::record(&e))?;
    // The write's key is not used by JS stores (they key by storage key), and expiry needs
    // no configuration.
    let key = RecordKey::new(Scope::custom(String::new()), String::new());
    Ok(idem_core::Engine::default()
        .expire(now, &key, &record)
        .map(|w| StoreWrite::from_core(&w)))
}

impl Host {
    /// Opens a slot for the operation that issues a token for `principal`'s requests with
    /// `method` to `route` (`IDEM-TOKEN-1`): driven like any request, it answers 201 with the
    /// token (or 500 when the keys are not tokens).
    pub fn issue_token(
        &mut self,
        principal: Option<&str>,
        method: &str,
        route: &str,
        now: UnixMillis,
        random: [u64; 2],
    ) -> u32 {
        let target = Target {
            principal,
            method,
            route,
        };
        let req = self.policy.issue_token(&target, now, random);
        self.open(req)
    }

    /// Opens a slot for the operation that opens (or moves to a new epoch) the counter
    /// session of `client` for `principal`'s requests with `method` to `route`, its first
    /// sequence number `first_seq` (decimal text): driven like any request, it answers 201
    /// with the session, or the core's refusal (`IDEM-CTR-1` for a first number that is not
    /// one).
    #[allow(clippy::too_many_arguments)]
    pub fn open_session(
        &mut self,
        principal: Option<&str>,
        method: &str,
        route: &str,
        client: &str,
        first_seq: &str,
        nonce: u64,
    ) -> u32 {
        let target = Target {
            principal,
            method,
            route,
        };
        let req = match interop::decimal("the first sequence number", first_seq) {
            Ok(first) => self.policy.open_session(&target, client, first, nonce),
            Err(_) => Request::refused(Refusal {
                requirement: "IDEM-CTR-1",
                ..Refusal::new(
                    idem_core::Problem::MALFORMED_KEY,
                    "the first sequence number must be a whole number",
                )
            }),
        };
        self.open(req)
    }

    /// Opens a slot for the session operation from the body of a session endpoint
    /// (`{"client": "…", "firstSeq": n}`).
    pub fn open_session_from(
        &mut self,
        principal: Option<&str>,
        method: &str,
        route: &str,
        body: &[u8],
        nonce: u64,
    ) -> u32 {
        let target = Target {
            principal,
            method,
            route,
        };
        let req = self.policy.open_session_from(&target, body, nonce);
        self.open(req)
    }

    /// Opens a slot for one delivery of a message to the inbox of this policy's engine and
    /// fingerprint (`IDEM-INBOX-1`): driven like any request, its handler is the processing.
    pub fn deliver(&mut self, message: &Message<'_>, nonce: u64) -> u32 {
        let inbox = Inbox::new(self.policy.engine().clone())
            .with_fingerprint(self.policy.fingerprint_spec().clone());
        let req = inbox.deliver(message, nonce);
        self.open(req)
    }

    /// What became of the delivery in slot `t`, once it is over.
    pub fn delivery(&self, t: u32) -> Result<Option<Delivery>, ErrorParts> {
        Ok(self.slot(t)?.req.delivery())
    }
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
    ErrorParts::options("MemoryStore keys are the engine's storage keys")
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

impl From<&Refusal> for ErrorParts {
    fn from(r: &Refusal) -> ErrorParts {
        ErrorParts::refusal(r)
    }
}
