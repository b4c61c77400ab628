//! The inputs of the machine: what the store answered, what the handler did, and the
//! heartbeats it asks for.

use super::*;
use crate::record::{Precondition, WriteOp};

impl Request {
    /// The record read for [`Step::Claim`] or [`Step::Load`] (`None`: there is none).
    pub fn handle_record(
        &mut self,
        now: UnixMillis,
        record: Option<&Record>,
        waiters: &mut Waiters,
    ) {
        match &mut self.state {
            State::Reading { lost, wait } => {
                let (lost, wait) = (*lost, *wait);
                self.claiming = None;
                let decided = self.decide(now, record);
                self.decided(now, decided, lost, wait, waiters);
            }
            State::Holding(h) => {
                let Op::Load { purpose, out: true } = h.op else {
                    return;
                };
                h.op = Op::None;
                match purpose {
                    Purpose::Complete => self.complete_counter(now, record),
                    Purpose::Extend => self.extend_counter(now, record),
                    Purpose::Conflict { heartbeat } => self.after_conflict(now, record, heartbeat),
                }
            }
            State::Opening(_) => self.opening_read(now, record),
            State::Querying(_) => self.query_read(now, record),
            _ => {}
        }
    }

    /// What a store that claims for the host answered (for [`Step::Claim`]).
    pub fn handle_claimed(&mut self, now: UnixMillis, claimed: Claimed, waiters: &mut Waiters) {
        let State::Reading { lost, wait } = self.state else {
            return;
        };
        self.claiming = None;
        match claimed {
            Claimed::Execute { hold, recovered } => {
                self.claimed_lease(hold, recovered, wait, waiters)
            }
            // A store that claimed answers an execute as `Claimed::Execute`, having applied
            // its write. An execute inside `Done` carries a write nobody applied (hosts that
            // decode claims refuse it); if one gets here, nothing is applied and the request
            // reads as contended, never as an answer without a reply.
            Claimed::Done(Decision::Execute { .. }) => self.decided(
                now,
                Decided::Decision(Decision::CONTENDED),
                lost,
                wait,
                waiters,
            ),
            Claimed::Done(d) => self.decided(now, Decided::Decision(d), lost, wait, waiters),
        }
    }

    /// Whether the write of [`Step::Apply`] was applied.
    pub fn handle_applied(&mut self, now: UnixMillis, applied: Applied, waiters: &mut Waiters) {
        match &self.state {
            State::Opening(_) => return self.opening_applied(applied),
            State::Issuing(_) => return self.issuing_applied(applied),
            State::Querying(_) => return self.query_applied(applied),
            _ => {}
        }
        match &mut self.state {
            State::Applying {
                recovered,
                lost,
                wait,
                ..
            } => {
                let (recovered, lost, wait) = (*recovered, *lost, *wait);
                match applied {
                    Applied::Applied => {
                        // The lease moves from the claim to the holding, without a copy.
                        let State::Applying { hold, .. } =
                            core::mem::replace(&mut self.state, State::Finished(Finish::FencedOut))
                        else {
                            return;
                        };
                        self.claimed_lease(hold, recovered, wait, waiters);
                    }
                    Applied::Conflict if lost + 1 >= MAX_LOST_RACES => {
                        self.decided(
                            now,
                            Decided::Decision(Decision::CONTENDED),
                            0,
                            wait,
                            waiters,
                        );
                    }
                    Applied::Conflict => {
                        self.state = State::Claim {
                            lost: lost + 1,
                            wait,
                        }
                    }
                }
            }
            State::Holding(h) => {
                let op = core::mem::replace(&mut h.op, Op::None);
                match (op, applied) {
                    (Op::Completing(finish), Applied::Applied) => self.finish(finish),
                    (Op::Extending(next), Applied::Applied) => {
                        h.heartbeat = Heartbeat::Extended(next.expires());
                        h.hold = next;
                        h.rounds = 0;
                        self.events.push(Event::Extended);
                    }
                    (op @ (Op::Completing(_) | Op::Extending(_)), Applied::Conflict) => {
                        let heartbeat = matches!(op, Op::Extending(_));
                        h.rounds += 1;
                        if h.rounds >= MAX_COMPLETION_ROUNDS {
                            self.fenced_out(now, heartbeat, None);
                        } else if matches!(h.hold, Hold::Slot(_)) {
                            // Another request of the client wrote the session: read it
                            // again and redo the write against it.
                            h.op = Op::load(if heartbeat {
                                Purpose::Extend
                            } else {
                                Purpose::Complete
                            });
                        } else {
                            h.op = Op::load(Purpose::Conflict { heartbeat });
                        }
                    }
                    (op, _) => h.op = op,
                }
            }
            _ => {}
        }
    }

    /// The store failed on the step handed out. Before the handler ran: the request is
    /// answered 503 and nothing runs (`IDEM-STORE-3`, `IDEM-STORE-4`); when the failed step
    /// was a claim that creates the key's record (a write of it, or a store's own claim
    /// with the nonce of [`claim_ticket`](Request::claim_ticket)) and the store may still
    /// have written it ([`StoreFailure::Unavailable`]: no answer), the next step is the
    /// [`Step::Apply`] that withdraws it, a delete on condition that the record is still the
    /// claim's, and then the reply (`IDEM-STORE-12`). While completing: the
    /// response is still sent and the lease is left to expire (`IDEM-OUT-5`). While
    /// extending: [`Heartbeat::Failed`].
    pub fn handle_store_error(&mut self, failure: StoreFailure, waiters: &mut Waiters) {
        match &mut self.state {
            State::Reading { wait, .. } | State::Applying { wait, .. } => {
                if let Some(w) = wait {
                    waiters.leave(&self.key, w.ticket);
                }
                // A claim that was to create the record may land after its answer was lost:
                // it is withdrawn before the refusal goes out, on condition that the record
                // is still its own (`IDEM-STORE-12`). A store that refused (full) wrote
                // nothing.
                let created = match self.state {
                    State::Applying { created, .. } => created,
                    // A store that claims for the host creates a record with the nonce it
                    // was given.
                    _ => self.claiming.take(),
                };
                if let (Some(version), StoreFailure::Unavailable) = (created, failure) {
                    self.write = Some(Write {
                        key: self.key.clone(),
                        precondition: Precondition::Version(version),
                        op: WriteOp::Delete,
                    });
                }
                self.events.push(Event::Rejected);
                self.state = State::Answered(Answer::Refusal(Refusal::store(failure)));
            }
            State::Opening(_) | State::Issuing(_) | State::Querying(_) => {
                self.write = None;
                self.events.push(Event::Rejected);
                self.state = State::Answered(Answer::Refusal(Refusal::store(failure)));
            }
            State::Holding(h) => {
                let heartbeat = h.op.is_heartbeat();
                h.op = Op::None;
                if heartbeat {
                    h.heartbeat = Heartbeat::Failed(failure);
                } else if h.outcome.is_some() {
                    self.events.push(Event::Rejected);
                    self.state = State::Finished(Finish::StoreFailed(failure));
                }
            }
            _ => {}
        }
    }

    /// Asks for a heartbeat (`IDEM-LEASE-3`): the next poll hands out the write that extends
    /// the lease by one lease period from then. Refused once the lease has ended, after the
    /// outcome, and when the lease was lost; a heartbeat already on its way serves this one
    /// too.
    pub fn heartbeat(&mut self, now: UnixMillis) -> Result<(), Heartbeat> {
        let State::Holding(h) = &mut self.state else {
            return Err(Heartbeat::FencedOut);
        };
        if h.outcome.is_some() || h.heartbeat == Heartbeat::FencedOut {
            return Err(Heartbeat::FencedOut);
        }
        if now >= h.hold.expires() {
            h.heartbeat = Heartbeat::Expired;
            return Err(Heartbeat::Expired);
        }
        if !h.op.is_heartbeat() {
            h.heartbeat = Heartbeat::Quiet;
            h.wants_heartbeat = true;
        }
        Ok(())
    }

    /// The handler's outcome (`IDEM-OUT-1` to `IDEM-OUT-4`). A response larger than the
    /// store keeps is replaced by a `response-not-stored` answer (`IDEM-STORE-5`).
    pub fn handle_outcome(&mut self, outcome: Outcome) {
        self.record_outcome(outcome, None);
    }

    /// The handler answered with `status` and a body that grew past the
    /// [`max_response_bytes`](Self::max_response_bytes) the store keeps, and that is still
    /// being sent (`IDEM-STORE-5`): a host that passes such a body through as it streams, so
    /// as never to hold more than the limit, records it here before the response leaves.
    /// It is classified by its status as [`Outcome::classify`] does, and what would be
    /// stored is the `response-not-stored` answer.
    pub fn handle_oversized(&mut self, status: u16) {
        self.record_unkept(status, Unkept::Oversized);
    }

    /// The store let go of the handler's own writes without committing them, as the attempt
    /// ended ([`AsyncStore::end_attempt`](crate::AsyncStore::end_attempt) said so): a request
    /// that finished with a store failure, whose handler's response would go out
    /// (`IDEM-OUT-5`), answers the 503 of [`StoreFailure::Uncommitted`] instead, as that
    /// response may describe the writes (`IDEM-STORE-7`). A completion that lost its race
    /// keeps the handler's writes for the next one; if reading the record again then fails,
    /// only the end of the attempt shows that they were never committed.
    pub fn handle_writes_dropped(&mut self) {
        if let State::Finished(Finish::StoreFailed(failure)) = &mut self.state {
            *failure = StoreFailure::Uncommitted;
        }
    }

    /// The handler answered with `status` and a body that ends with trailer fields, which a
    /// stored answer does not carry (`IDEM-STORE-5`): as for
    /// [`handle_oversized`](Self::handle_oversized), what would be stored is the
    /// `response-not-stored` answer, and the host sends the answer on as it is, trailers
    /// included.
    pub fn handle_with_trailers(&mut self, status: u16) {
        self.record_unkept(status, Unkept::Trailers);
    }

    fn record_unkept(&mut self, status: u16, why: Unkept) {
        let unread = StoredResponse {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        };
        self.record_outcome(Outcome::classify(unread), Some(why));
    }

    /// The largest response body the store keeps: a host that streams a longer one through
    /// stops holding it at this many bytes and reports it with
    /// [`handle_oversized`](Self::handle_oversized).
    pub fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }

    fn record_outcome(&mut self, outcome: Outcome, unkept: Option<Unkept>) {
        let max = self.max_response_bytes;
        let State::Holding(h) = &mut self.state else {
            return;
        };
        if h.outcome.is_some() {
            return;
        }
        let keep = |r: StoredResponse| {
            Arc::new(match unkept {
                Some(why) => not_stored(why, max),
                None if r.size() > max => not_stored(Unkept::Oversized, max),
                None => r,
            })
        };
        h.outcome = Some(match outcome {
            Outcome::Final(r) => SharedOutcome::Final(keep(r)),
            Outcome::Retryable => SharedOutcome::Retryable,
            Outcome::Unknown(r) => SharedOutcome::Unknown(r.map(keep)),
        });
        h.wants_heartbeat = false;
    }
}
