//! The per-request machine: everything that happens around one request, written once.

use crate::counter::{CounterAttempt, CounterConfig, CounterDecision, CounterKey, CounterLease};
use crate::counter::{CounterError, Counters};
use crate::engine::{
    Attempt, CompleteError, Config, ConfigError, Decision, Engine, Lease, Outcome, RejectReason,
};
use crate::event::Event;
use crate::fingerprint::{Fingerprint, FingerprintSpec, RequestParts};
use crate::key::{
    parse_opaque_lenient, parse_opaque_strict, parse_uuid, KeyError, RecordKey, Scope, UuidVersion,
};
use crate::kind::{parse_decimal, KindConfigError};
use crate::problem::Problem;
use crate::record::{Record, RecordState, Write};
use crate::reply::{Plain, Refusal, Reply};
use crate::response::StoredResponse;
use crate::store::{Applied, Completing, Finish, Store, StoreFailure};
use crate::time::UnixMillis;
use crate::timekey::{time_key_of, TimeKey, TimeKeyConfig, TimeKeys};
use crate::token::{TokenSecret, Tokens};
use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::time::Duration;
use hashbrown::HashMap;

mod claim;
mod deliver;
mod events;
mod hold;
mod input;
mod intake;
mod policy;
mod session;
mod status;
#[cfg(test)]
mod tests;
mod token;
mod waiters;

use crate::engine::SharedOutcome;
use claim::{Decided, Wait};
use events::Events;
use hold::{not_stored, Holding, Op, Purpose, Unkept};
pub(crate) use policy::principal_digest;
use policy::Rules;
use session::Opening;
use status::Querying;
use token::Issuing;

pub use deliver::Message;
pub use hold::{Claimed, Context, Heartbeat, Hold};
pub use intake::{BodyReader, Intake, Target, Ticket};
pub use policy::{InFlight, KeyFallback, KeyKind, Policy, Subject, DEFAULT_MAX_RESPONSE_BYTES};
pub use status::{KeyStatus, StatusQuery};
pub use waiters::Waiters;

/// Lost races a claim tolerates before it answers [`Decision::CONTENDED`]. Each lost race
/// means another attempt wrote the record between this request's read and its write; many in
/// a row mean the key is being fought over, and the honest answer is "in progress". Counter
/// sessions, which all requests of one client share, lose more races than keys do: the bound
/// covers a window of concurrent requests.
pub const MAX_LOST_RACES: usize = 16;

/// Lost races a completion or heartbeat tolerates before it gives up as fenced out (the
/// record then stays in flight until its lease ends, as after a crash). A completion loses a
/// race only to its own heartbeat (records) or to other requests of the same client
/// (counter sessions), so it keeps trying for longer than a claim.
pub const MAX_COMPLETION_ROUNDS: usize = 64;

/// What the host does next. See [`Request`].
#[must_use = "a Step is the next thing the host must do"]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Read the record under [`Request::key`] and pass it to [`Request::handle_record`]. A
    /// store that claims for the host instead gets [`Request::ticket`] and its answer goes
    /// to [`Request::handle_claimed`].
    Claim,
    /// Read the record under [`Request::key`] and pass it to [`Request::handle_record`] (a
    /// completion or heartbeat that needs the current record).
    Load,
    /// Apply this compare-and-set write atomically and pass the result to
    /// [`Request::handle_applied`].
    Apply(Write),
    /// Nothing to do before this time: poll again then (waiting for a request in flight).
    WaitUntil(UnixMillis),
    /// Run the handler, then pass its outcome to [`Request::handle_outcome`]. Returned once.
    Run(Context),
    /// Waiting for an input: the handler's outcome, or the result of a step handed out.
    Idle,
    /// Send [`Request::reply`]: the request is over without running the handler.
    Reply,
    /// The handler's outcome is recorded (or could not be, as this says): send the handler's
    /// response, except after [`Finish::FencedOut`]: then send [`Request::reply`], the
    /// key's outcome as a retry would find it (`IDEM-LEASE-5`). The request is over.
    Done(Finish),
}

/// What a machine serves: the guarded request, or one of the operations beside it. Each
/// is driven with the same [`Step`]s, by the same loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation {
    /// A guarded request: claim the key, run the handler, record its outcome
    /// ([`Policy::request`]).
    Guard,
    /// Opening a client's counter session ([`Policy::open_session`]).
    OpenSession,
    /// Issuing a one-time token ([`Policy::issue_token`]).
    IssueToken,
    /// One delivery of a message to an inbox ([`Inbox::deliver`](crate::Inbox::deliver)).
    Deliver,
    /// What became of a key ([`Policy::status`]).
    Status,
}

#[derive(Debug)]
enum Answer {
    Decision(Decision),
    Refusal(Refusal),
    /// An answer rendered whole: an operation's document, or a problem of the HTTP edge.
    Reply(Reply),
    /// What a status query found, and its document.
    Status(Box<(KeyStatus, Reply)>),
}

#[derive(Debug)]
enum State {
    /// Next: read the record (or ask the store to claim).
    Claim { lost: usize, wait: Option<Wait> },
    /// The read is out.
    Reading { lost: usize, wait: Option<Wait> },
    /// The claim write is out.
    Applying {
        hold: Hold,
        recovered: bool,
        lost: usize,
        wait: Option<Wait>,
        /// The version of the record the claim creates, when there was none: what a
        /// withdrawal deletes if the store's answer is lost (`IDEM-STORE-12`).
        created: Option<u64>,
    },
    /// Waiting for a request in flight.
    Waiting { next: UnixMillis, wait: Wait },
    /// The handler runs under the lease, or has run and its outcome is being recorded.
    Holding(Holding),
    /// Answered without running the handler.
    Answered(Answer),
    /// The handler's outcome is recorded, or could not be.
    Finished(Finish),
    /// The handler ran, but its lease was taken over and its outcome refused: its caller
    /// gets this answer instead of the handler's (`IDEM-LEASE-5`).
    Superseded(Answer),
    /// Opening a counter session.
    Opening(Box<Opening>),
    /// Issuing a token: its write is out.
    Issuing(Box<Issuing>),
    /// A status query: its read, or its settling write, is out.
    Querying(Box<Querying>),
}

/// One request's lifecycle, sans-IO: identify, claim (deciding again after a lost race),
/// wait for or refuse a duplicate in flight, run the handler under a lease with heartbeats,
/// record the outcome before the response leaves, and render every answer. Every host
/// (a Rust server, the WebAssembly package, a Durable Object) drives this machine, so none
/// of them holds a lifecycle rule, a retry bound or a reply format of its own.
///
/// # Driving it
///
/// Make one with [`Policy::request`] (or, where a store claims for the host, with
/// [`Policy::resume`] of the request's [`Ticket`]); the operations beside the guarded request
/// come from [`Policy::open_session`], [`Policy::issue_token`] and
/// [`Inbox::deliver`](crate::Inbox::deliver). Then call [`poll`](Request::poll) with the
/// current time and do what the [`Step`] says, feeding the result back through the matching
/// `handle_*` method, until it says [`Step::Reply`] or [`Step::Done`] (over a synchronous
/// [`Store`], [`drive`](Request::drive) does this):
///
/// * [`Step::Claim`] / [`Step::Load`]: read the record under [`Request::key`] →
///   [`handle_record`](Request::handle_record) (or, with a store that claims itself,
///   [`handle_claimed`](Request::handle_claimed));
/// * [`Step::Apply`]: apply the write atomically → [`handle_applied`](Request::handle_applied);
///   a store failure in either → [`handle_store_error`](Request::handle_store_error) (after
///   a claim whose answer was lost, the next step is the write that withdraws it,
///   `IDEM-STORE-12`);
/// * [`Step::WaitUntil`]: sleep until then, and poll again;
/// * [`Step::Run`]: run the handler; meanwhile [`heartbeat`](Request::heartbeat) extends the
///   lease; afterwards [`handle_outcome`](Request::handle_outcome);
/// * [`Step::Idle`]: an input is due (the handler's outcome, or the result of a step handed
///   out);
/// * [`Step::Reply`]: send [`reply`](Request::reply); [`Step::Done`]: send the handler's own
///   response, or [`reply`](Request::reply) when the lease was taken over
///   ([`Finish::FencedOut`], `IDEM-LEASE-5`).
///
/// The methods fall into families, as in quinn-proto's `Connection`: getters ([`key`],
/// [`context`], [`heartbeat_state`]), inputs (`handle_*`, [`heartbeat`]) and outputs
/// ([`poll`], [`poll_event`], [`reply`]). Inputs that do not fit the current state are
/// ignored. Time must not go backwards between calls by more than a clock's jitter; the
/// engine reads every expiry from the records, so a late or early clock is never less safe,
/// only slower.
///
/// Only one store operation is out at a time: a heartbeat asked for while the outcome is
/// being written is answered as finished, and an outcome that arrives while a heartbeat is
/// on its way is written after it, with the lease that heartbeat produced. So a completion
/// always carries the latest committed lease, and a heartbeat and a completion never fence
/// each other out (`IDEM-LEASE-4`). A completion that still finds the record changed reads
/// it again: if it is still in flight under this lease's fencing number (a heartbeat whose
/// answer was lost), it completes from there.
///
/// [`key`]: Request::key
/// [`context`]: Request::context
/// [`heartbeat_state`]: Request::heartbeat_state
/// [`heartbeat`]: Request::heartbeat
/// [`poll`]: Request::poll
/// [`poll_event`]: Request::poll_event
/// [`reply`]: Request::reply
#[derive(Debug)]
pub struct Request {
    operation: Operation,
    rules: Rules,
    in_flight: InFlight,
    max_response_bytes: usize,
    key: RecordKey,
    fingerprint: Fingerprint,
    subject: Subject,
    nonce: u64,
    /// Whether the handler ran as a recovery (for a delivery's result).
    recovered: bool,
    /// The nonce a store that claims for the host was given ([`Request::claim_ticket`]),
    /// while its claim is out.
    claiming: Option<u64>,
    write: Option<Write>,
    state: State,
    events: Events,
}

fn refused_key() -> RecordKey {
    RecordKey::new(Scope::custom(String::new()), String::new())
}

impl Request {
    fn new(
        policy: &Policy,
        key: RecordKey,
        fingerprint: Fingerprint,
        subject: Subject,
        nonce: u64,
    ) -> Request {
        Request {
            in_flight: policy.in_flight,
            max_response_bytes: policy.max_response_bytes,
            ..Request::with_rules(policy.rules.clone(), key, fingerprint, subject, nonce)
        }
    }

    /// A request refused before it could be identified: it answers `refusal` at once.
    pub fn refused(refusal: Refusal) -> Request {
        let mut req = Request::with_rules(
            Rules::Record(Engine::default()),
            refused_key(),
            Fingerprint::from_digest([0; 32]),
            Subject::Record,
            0,
        );
        req.events.push(Event::Rejected);
        req.state = State::Answered(Answer::Refusal(refusal));
        req
    }

    /// A machine that answers `reply` at once: an operation that cannot run here (a policy
    /// without the key kind it needs), or a request the HTTP edge refuses.
    pub fn answered(reply: Reply) -> Request {
        let mut req = Request::refused(Refusal::store(StoreFailure::Unavailable));
        req.state = State::Answered(Answer::Reply(reply));
        req
    }

    /// What the machine serves.
    pub fn operation(&self) -> Operation {
        self.operation
    }

    fn with_rules(
        rules: Rules,
        key: RecordKey,
        fingerprint: Fingerprint,
        subject: Subject,
        nonce: u64,
    ) -> Request {
        Request {
            operation: Operation::Guard,
            rules,
            in_flight: InFlight::Reject,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            key,
            fingerprint,
            subject,
            nonce,
            recovered: false,
            claiming: None,
            write: None,
            state: State::Claim {
                lost: 0,
                wait: None,
            },
            events: Events::default(),
        }
    }

    /// The record this request reads and writes.
    pub fn key(&self) -> &RecordKey {
        &self.key
    }

    /// What a store that claims for the host needs ([`Policy::resume`] on its side).
    pub fn ticket(&self) -> Ticket {
        Ticket {
            key: self.key.clone(),
            fingerprint: self.fingerprint.clone(),
            subject: self.subject.clone(),
        }
    }

    /// The ticket for a store that claims for the host ([`Step::Claim`]), which it claims
    /// with `nonce`: the version of a record its claim creates. Until its answer comes
    /// ([`handle_claimed`](Request::handle_claimed)), a store failure withdraws such a record
    /// ([`handle_store_error`](Request::handle_store_error), `IDEM-STORE-12`).
    pub fn claim_ticket(&mut self, nonce: u64) -> Ticket {
        if matches!(self.state, State::Reading { .. }) {
            self.claiming = Some(nonce);
        }
        self.ticket()
    }

    /// The handler's context, while it runs.
    pub fn context(&self) -> Option<Context> {
        match &self.state {
            State::Holding(h) => Some(Context {
                recovered: h.recovered,
                fence: h.hold.fence(),
                lease_expires: h.hold.expires(),
                attempt: self.nonce,
            }),
            _ => None,
        }
    }

    /// Until when the host reads the handler's answer (`IDEM-OUT-7`): the end of the lease,
    /// as the heartbeats have extended it so far; `None` once the handler's outcome is in
    /// hand or no lease is held. A body that has neither ended nor passed the store's limit
    /// by then is let go, and the outcome recorded as [`Outcome::Unknown`], so that a body
    /// that stalls never holds the key past its lease. Ask again when it passes: a heartbeat
    /// may have moved it.
    pub fn answer_due(&self) -> Option<UnixMillis> {
        match &self.state {
            State::Holding(h) if h.outcome.is_none() => Some(h.hold.expires()),
            _ => None,
        }
    }

    /// The lease held, while the handler runs.
    pub fn hold(&self) -> Option<Hold> {
        match &self.state {
            State::Holding(h) => Some(h.hold.clone()),
            _ => None,
        }
    }

    /// Where the heartbeats stand.
    pub fn heartbeat_state(&self) -> Heartbeat {
        match &self.state {
            State::Holding(h) => h.heartbeat,
            _ => Heartbeat::Quiet,
        }
    }

    /// The decision that answered the request, if it was answered by a decision.
    pub fn decision(&self) -> Option<&Decision> {
        match &self.state {
            State::Answered(Answer::Decision(d)) => Some(d),
            _ => None,
        }
    }

    /// What a store that claims for the host sends back ([`Request::handle_claimed`] on the
    /// other side): the lease once the claim is applied, or the decision.
    pub fn claimed(&self) -> Option<Claimed> {
        match &self.state {
            State::Holding(h) => Some(Claimed::Execute {
                hold: h.hold.clone(),
                recovered: h.recovered,
            }),
            State::Answered(Answer::Decision(d)) => Some(Claimed::Done(d.clone())),
            _ => None,
        }
    }

    /// The answer to send when [`poll`](Request::poll) says [`Step::Reply`], or, in place of
    /// the handler's response, when it says [`Step::Done`] with [`Finish::FencedOut`]
    /// (`IDEM-LEASE-5`) or [`Finish::StoreFailed`] with [`StoreFailure::Uncommitted`]
    /// (`IDEM-STORE-7`). `None` after any other [`Step::Done`]: the handler's response goes
    /// out.
    pub fn reply(&self) -> Option<Reply> {
        if self.operation == Operation::Deliver {
            return self.delivery().map(|d| self.receipt(&d));
        }
        match &self.state {
            // A counter's collision and staleness cite the counter rules, not the time
            // keys' that their problem types name by default.
            State::Answered(Answer::Decision(
                d @ Decision::Rejected(RejectReason::Collision | RejectReason::Stale),
            )) if matches!(self.subject, Subject::Counter { .. }) => {
                let mut refusal = Refusal::of_decision(d)?;
                refusal.requirement = match d {
                    Decision::Rejected(RejectReason::Collision) => "IDEM-CTR-7",
                    _ => "IDEM-CTR-6",
                };
                Some(refusal.reply())
            }
            State::Answered(Answer::Decision(d)) | State::Superseded(Answer::Decision(d)) => {
                Reply::of_decision(d)
            }
            State::Answered(Answer::Refusal(r)) | State::Superseded(Answer::Refusal(r)) => {
                Some(r.reply())
            }
            State::Answered(Answer::Reply(r)) | State::Superseded(Answer::Reply(r)) => {
                Some(r.clone())
            }
            State::Answered(Answer::Status(found)) | State::Superseded(Answer::Status(found)) => {
                Some(found.1.clone())
            }
            // The handler's writes may not have committed with its response: the response
            // does not go out (`IDEM-STORE-7`).
            State::Finished(Finish::StoreFailed(f @ StoreFailure::Uncommitted)) => {
                Some(Refusal::store(*f).reply())
            }
            _ => None,
        }
    }

    /// The refusal that answered the request, if it was not answered by a decision.
    pub fn refusal(&self) -> Option<&Refusal> {
        match &self.state {
            State::Answered(Answer::Refusal(r)) => Some(r),
            _ => None,
        }
    }

    /// What applying the write handed out by the last [`Step::Apply`] means, when that
    /// write is the handler's completion: [`Finish::Stored`] when it stores the response,
    /// [`Finish::Released`] or [`Finish::OutcomeUnknown`] otherwise, with the fence of the
    /// attempt's lease. `None` for a claim or a heartbeat. A host passes it to
    /// [`AsyncStore::apply_completion`](crate::AsyncStore::apply_completion).
    pub fn completing(&self) -> Option<Completing> {
        match &self.state {
            State::Holding(h) => match &h.op {
                Op::Completing(finish) => Some(Completing {
                    finish: finish.clone(),
                    fence: h.hold.fence(),
                    attempt: self.nonce,
                }),
                _ => None,
            },
            _ => None,
        }
    }

    /// The next event (`IDEM-EVT-1`): hosts log or count them.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop()
    }

    /// What to do next.
    pub fn poll(&mut self, now: UnixMillis, waiters: &mut Waiters) -> Step {
        if let Some(write) = self.write.take() {
            return Step::Apply(write);
        }
        loop {
            match &mut self.state {
                State::Claim { lost, wait } => {
                    let (lost, wait) = (*lost, *wait);
                    if let Some(d) = self.precheck(now) {
                        self.decided(now, Decided::Decision(d), lost, wait, waiters);
                        continue;
                    }
                    self.state = State::Reading { lost, wait };
                    return Step::Claim;
                }
                State::Waiting { next, wait } => {
                    let (next, mut wait) = (*next, *wait);
                    let latest = waiters.is_latest(&self.key, wait.ticket);
                    if latest && now < next {
                        return Step::WaitUntil(next);
                    }
                    // Time to look again; superseded or past the bound, for the last time.
                    wait.last_look = !latest || now >= wait.until;
                    self.state = State::Claim {
                        lost: 0,
                        wait: Some(wait),
                    };
                }
                State::Holding(h) => {
                    if !h.started {
                        h.started = true;
                        return Step::Run(Context {
                            recovered: h.recovered,
                            fence: h.hold.fence(),
                            lease_expires: h.hold.expires(),
                            attempt: self.nonce,
                        });
                    }
                    match &mut h.op {
                        Op::None => {}
                        Op::Load { out, .. } if !*out => {
                            *out = true;
                            return Step::Load;
                        }
                        _ => return Step::Idle,
                    }
                    if h.outcome.is_some() {
                        return self.complete(now);
                    }
                    if h.wants_heartbeat {
                        h.wants_heartbeat = false;
                        return self.extend(now);
                    }
                    return Step::Idle;
                }
                State::Opening(o) => return o.poll(),
                State::Querying(q) => return q.poll(),
                State::Reading { .. } | State::Applying { .. } | State::Issuing(_) => {
                    return Step::Idle
                }
                State::Answered(_) => return Step::Reply,
                State::Finished(f) => return Step::Done(f.clone()),
                State::Superseded(_) => return Step::Done(Finish::FencedOut),
            }
        }
    }

    /// Drives the machine over a synchronous store until the host has something else to do
    /// (run the handler, wait, reply, or send the handler's response): never returns
    /// [`Step::Claim`], [`Step::Load`] or [`Step::Apply`]. A store error is returned after
    /// the machine has recorded it ([`Request::handle_store_error`], with the failure the
    /// store reports through [`Store::failure`]), and after the withdrawal of a claim whose
    /// answer was lost (`IDEM-STORE-12`); polling again then gives the answer.
    pub fn drive<S: Store + ?Sized>(
        &mut self,
        store: &mut S,
        now: UnixMillis,
        waiters: &mut Waiters,
    ) -> Result<Step, S::Error> {
        loop {
            let result = match self.poll(now, waiters) {
                Step::Claim | Step::Load => store
                    .read(&self.key)
                    .map(|r| self.handle_record(now, r.as_deref(), waiters)),
                Step::Apply(write) => store
                    .apply(now, write)
                    .map(|a| self.handle_applied(now, a, waiters)),
                other => return Ok(other),
            };
            if let Err(e) = result {
                self.handle_store_error(S::failure(&e), waiters);
                // A claim whose answer was lost is withdrawn before the answer, whatever
                // the withdrawal's own result (`IDEM-STORE-12`).
                if let Some(withdrawal) = self.write.take() {
                    let _ = store.apply(now, withdrawal);
                }
                return Err(e);
            }
        }
    }
}
