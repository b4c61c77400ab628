//! The lease a request holds while its handler runs: the handler's context, heartbeats, the
//! completion, and what an attempt whose lease was taken over answers.

use super::*;

/// The lease a request holds while its handler runs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Hold {
    /// A record's lease (opaque, UUID, time and token keys).
    Record(Lease),
    /// A counter slot's lease.
    Slot(CounterLease),
}

impl Hold {
    /// The fencing number.
    pub fn fence(&self) -> u64 {
        match self {
            Hold::Record(l) => l.fence,
            Hold::Slot(l) => l.fence,
        }
    }

    /// When the lease ends.
    pub fn expires(&self) -> UnixMillis {
        match self {
            Hold::Record(l) => l.expires,
            Hold::Slot(l) => l.expires,
        }
    }
}

/// What a store that claims for the host sends back: the lease, or the decision.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Claimed {
    /// The claim was applied: run the handler under this lease.
    Execute {
        /// The lease.
        hold: Hold,
        /// Whether an earlier attempt may have started the work.
        recovered: bool,
    },
    /// Anything but execute.
    Done(Decision),
}

/// What a handler is told when it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    /// An earlier attempt's lease expired and this one took over: reconcile before acting
    /// (`IDEM-LEASE-1`).
    pub recovered: bool,
    /// The fencing number (`IDEM-LEASE-2`): hand it to resources that can check it.
    pub fence: u64,
    /// When the lease ends unless a heartbeat extends it.
    pub lease_expires: UnixMillis,
    /// This attempt's identity: the random value the host made its request with, the same
    /// in [`Completing::attempt`]. A store that keeps something for one attempt (a
    /// handler's transaction) keys it by this, never by the fence alone: a key released and
    /// claimed again starts over at fence 1.
    pub attempt: u64,
}

/// Where a request's heartbeats stand (`IDEM-LEASE-3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heartbeat {
    /// None asked for, or the last one is on its way to the store.
    Quiet,
    /// The lease was extended; it now ends here.
    Extended(UnixMillis),
    /// The lease was taken over by another attempt: stop, nothing this attempt writes will
    /// be kept (`IDEM-LEASE-2`).
    FencedOut,
    /// The lease had ended before the heartbeat (`IDEM-LEASE-3`).
    Expired,
    /// The store failed; the lease may or may not have been extended.
    Failed(StoreFailure),
}

#[derive(Debug)]
pub(super) enum Op {
    None,
    /// A completion write is out; applying it means this.
    Completing(Finish),
    /// A heartbeat's write is out, for this lease.
    Extending(Hold),
    /// The record must be read (`out`: the read is handed out).
    Load {
        purpose: Purpose,
        out: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Purpose {
    /// To complete (counter sessions).
    Complete,
    /// To extend (counter sessions).
    Extend,
    /// After a conflict, to see whether the record is still this lease's.
    Conflict { heartbeat: bool },
}

impl Op {
    pub(super) fn load(purpose: Purpose) -> Op {
        Op::Load {
            purpose,
            out: false,
        }
    }

    pub(super) fn is_heartbeat(&self) -> bool {
        matches!(
            self,
            Op::Extending(_)
                | Op::Load {
                    purpose: Purpose::Extend | Purpose::Conflict { heartbeat: true },
                    ..
                }
        )
    }
}

#[derive(Debug)]
pub(super) struct Holding {
    pub(super) hold: Hold,
    pub(super) recovered: bool,
    pub(super) started: bool,
    pub(super) outcome: Option<SharedOutcome>,
    pub(super) heartbeat: Heartbeat,
    pub(super) wants_heartbeat: bool,
    pub(super) op: Op,
    pub(super) rounds: usize,
    /// The version the record's last completion write put (none for a delete): what the
    /// record reads once that write landed, whatever became of its answer.
    pub(super) completion: Option<u64>,
}

/// Why a final response is not kept (`IDEM-STORE-5`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unkept {
    /// Its body is larger than the store keeps.
    Oversized,
    /// It ends with trailer fields, which a stored answer does not carry.
    Trailers,
}

/// The stored answer for a final response the store does not keep (`IDEM-STORE-5`).
pub(super) fn not_stored(why: Unkept, max: usize) -> StoredResponse {
    let detail = match why {
        Unkept::Oversized => alloc::format!(
            "the request was processed, but its response was larger than the {max} bytes the store keeps, and cannot be replayed"
        ),
        Unkept::Trailers => String::from(
            "the request was processed, but its response carried trailer fields, which the store does not keep, and cannot be replayed",
        ),
    };
    let refusal = Refusal::new(Problem::RESPONSE_NOT_STORED, detail);
    StoredResponse {
        status: refusal.problem.status,
        headers: alloc::vec![(
            String::from("content-type"),
            String::from("application/problem+json")
        )],
        body: refusal.body().into_bytes(),
    }
}

/// Whether `response` is [`not_stored`]'s answer, as a store gives it back: the request ran,
/// and its own response is gone, which a status query reports as `expired`, never as a
/// completed key whose answer can be replayed.
pub(super) fn is_not_stored(response: &StoredResponse) -> bool {
    let uri = Problem::RESPONSE_NOT_STORED.type_uri.as_bytes();
    response.status == Problem::RESPONSE_NOT_STORED.status
        && response.body.windows(uri.len()).any(|w| w == uri)
}

impl Request {
    /// A completion or heartbeat of a record lease lost a race: if the record read now is
    /// still this lease's (same incarnation, same fencing number, in flight), a write of this
    /// lease moved it on and its answer was lost; carry on from it. If it is what this
    /// lease's completion wrote (its version, this incarnation and fencing number, which no
    /// other attempt holds, and its response), that completion landed and only its answer
    /// was lost (a client that sent it again, as ioredis does, found it made): it is
    /// finished. Otherwise the lease was taken over.
    pub(super) fn after_conflict(
        &mut self,
        now: UnixMillis,
        record: Option<&Record>,
        heartbeat: bool,
    ) {
        let State::Holding(h) = &mut self.state else {
            return;
        };
        let Hold::Record(lease) = &mut h.hold else {
            return;
        };
        if let (false, Some(version), Some(r)) = (heartbeat, h.completion, record) {
            // Its response too: a twin of this lease (the same ticket held twice) that
            // completed first wrote the same version and fence, with its own answer.
            let landed = match (&r.state, &h.outcome) {
                (RecordState::Completed { response, .. }, Some(SharedOutcome::Final(ours))) => {
                    **response == **ours
                }
                _ => false,
            };
            if landed
                && r.version == version
                && r.fence == lease.fence
                && r.created == lease.created
            {
                self.finish(Finish::Stored);
                return;
            }
        }
        let ours = record.and_then(|r| match r.state {
            RecordState::InFlight { lease_expires }
                if r.fence == lease.fence
                    && r.created == lease.created
                    && r.version.wrapping_sub(lease.version) < MAX_COMPLETION_ROUNDS as u64 =>
            {
                Some((r.version, lease_expires, r.key_expires))
            }
            _ => None,
        });
        match ours {
            Some((version, expires, key_expires)) => {
                lease.version = version;
                lease.expires = expires;
                lease.key_expires = key_expires;
                if heartbeat {
                    h.heartbeat = Heartbeat::Extended(expires);
                }
            }
            None => self.fenced_out(now, heartbeat, record),
        }
    }

    /// The completion step while holding, with an outcome and nothing out.
    pub(super) fn complete(&mut self, now: UnixMillis) -> Step {
        let State::Holding(h) = &mut self.state else {
            return Step::Idle;
        };
        if matches!(h.hold, Hold::Slot(_)) {
            h.op = Op::Load {
                purpose: Purpose::Complete,
                out: true,
            };
            return Step::Load;
        }
        let (Hold::Record(lease), Some(outcome), Some(engine)) =
            (&h.hold, &h.outcome, self.rules.engine())
        else {
            return Step::Idle;
        };
        let completed = match (&self.rules, &self.subject) {
            (Rules::Token(t), Subject::Token { scope, token }) => {
                t.complete_shared(now, scope, token, lease, outcome.clone())
            }
            _ => engine.complete_shared(now, lease, outcome.clone()),
        };
        match completed {
            Ok(write) => {
                h.op = Op::Completing(Finish::of(&write));
                h.completion = match &write.op {
                    crate::WriteOp::Put(r) => Some(r.version),
                    crate::WriteOp::Delete => None,
                };
                Step::Apply(write)
            }
            Err(e) => {
                self.finish(Finish::Invalid(e));
                self.poll_finished()
            }
        }
    }

    pub(super) fn complete_counter(&mut self, now: UnixMillis, record: Option<&Record>) {
        let (Rules::Counter(c), State::Holding(h)) = (&self.rules, &mut self.state) else {
            return;
        };
        let (Hold::Slot(lease), Some(outcome)) = (&h.hold, &h.outcome) else {
            return;
        };
        match c.complete_shared(now, lease, outcome.clone(), record) {
            Ok((write, finish)) => {
                h.op = Op::Completing(finish);
                self.write = Some(write);
            }
            Err(CounterError::InvalidStatus(s)) => {
                self.finish(Finish::Invalid(CompleteError::InvalidStatus(s)))
            }
            Err(_) => self.fenced_out(now, false, record),
        }
    }

    /// The heartbeat step while holding, with nothing out.
    pub(super) fn extend(&mut self, now: UnixMillis) -> Step {
        let State::Holding(h) = &mut self.state else {
            return Step::Idle;
        };
        let Hold::Record(lease) = &h.hold else {
            h.op = Op::Load {
                purpose: Purpose::Extend,
                out: true,
            };
            return Step::Load;
        };
        let Some(engine) = self.rules.engine() else {
            return Step::Idle;
        };
        match engine.extend(now, lease) {
            Ok((next, write)) => {
                h.op = Op::Extending(Hold::Record(next));
                Step::Apply(write)
            }
            Err(_) => {
                h.heartbeat = Heartbeat::Expired;
                Step::Idle
            }
        }
    }

    pub(super) fn extend_counter(&mut self, now: UnixMillis, record: Option<&Record>) {
        let (Rules::Counter(c), State::Holding(h)) = (&self.rules, &mut self.state) else {
            return;
        };
        let Hold::Slot(lease) = &h.hold else {
            return;
        };
        match c.extend(now, lease, record) {
            Ok((next, write)) => {
                h.op = Op::Extending(Hold::Slot(next));
                self.write = Some(write);
            }
            Err(CounterError::LeaseExpired) => h.heartbeat = Heartbeat::Expired,
            Err(_) => self.fenced_out(now, true, record),
        }
    }

    /// The lease was taken over (`record`: the record as last read, if it was). A
    /// heartbeat before the outcome only says so; a completion ends the request with the
    /// answer its caller gets instead of the handler's.
    pub(super) fn fenced_out(&mut self, now: UnixMillis, heartbeat: bool, record: Option<&Record>) {
        self.events.push(Event::FencedOut);
        if let State::Holding(h) = &mut self.state {
            if heartbeat && h.outcome.is_none() {
                h.heartbeat = Heartbeat::FencedOut;
                return;
            }
        }
        self.state = State::Superseded(self.superseded(now, record));
    }

    /// What the caller of an attempt whose lease was taken over is told (`IDEM-LEASE-5`): the
    /// key's outcome as a retry would find it in `record` (the response stored by the
    /// attempt that completed, replayed; the attempt still in flight; the response expired;
    /// the outcome held), or `superseded` when no outcome is recorded. Never the handler's
    /// own answer: it was not recorded, and it may describe work that was rolled back.
    pub(super) fn superseded(&self, now: UnixMillis, record: Option<&Record>) -> Answer {
        match self.decide(now, record) {
            Decided::Decision(
                d @ (Decision::Replay(_)
                | Decision::InProgress { .. }
                | Decision::Rejected(RejectReason::KeyExpired | RejectReason::OutcomeUnknown)),
            ) => Answer::Decision(d),
            _ => Answer::Refusal(Refusal {
                retry_after: Some(crate::engine::RETRY_SOON_SECS),
                ..Refusal::new(
                    Problem::SUPERSEDED,
                    "another attempt with this key took over while this one ran; its outcome was not recorded; retry with the same key",
                )
            }),
        }
    }

    pub(super) fn finish(&mut self, finish: Finish) {
        self.events.push(finish.event());
        self.state = State::Finished(finish);
    }

    pub(super) fn poll_finished(&self) -> Step {
        match &self.state {
            State::Finished(f) => Step::Done(f.clone()),
            _ => Step::Idle,
        }
    }
}
