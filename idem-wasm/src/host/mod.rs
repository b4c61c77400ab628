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

//!
//! The slots and their steps are here; what JavaScript reports back is in `inputs.rs`, what it
//! reads in `outputs.rs`, the operations beside the guarded request (tokens, sessions, inbox
//! deliveries) in `operations.rs`, and the generic store interface of the in-process store in
//! `store.rs`.

use crate::interop::{self, ErrorKind, ErrorParts};
use alloc::string::String;
use alloc::vec::Vec;
use idem_core::{Intake, MemoryStore, Policy, Request, Step, UnixMillis, Waiters, Write};

mod inputs;
mod operations;
mod outputs;
mod store;

pub use store::{expire, store_apply, store_load, StoreApplied};

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
    /// The client of a unix-time key that names none (`timeKeys.clientHeader`'s value).
    pub client: Option<&'a str>,
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

    /// Whether a request with this method (and a key or not) needs its body to be identified.
    pub fn reads_body(&self, method: &str, has_key: bool) -> bool {
        self.policy.reads_body(method, has_key)
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
            client: req.client,
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
}
