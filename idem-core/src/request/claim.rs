//! The claim: deciding on the record read, deciding again after a lost race, and waiting
//! for a duplicate in flight.

use super::*;
use crate::record::{Precondition, WriteOp};

#[derive(Clone, Copy, Debug)]
pub(super) struct Wait {
    pub(super) until: UnixMillis,
    pub(super) ticket: u64,
    pub(super) last_look: bool,
}

/// What deciding produced: the engine's decision (for a record, an execute holds its lease
/// and write boxed), or a counter slot's claim, boxed too, so that every other answer
/// moves as a small value.
pub(super) enum Decided {
    Decision(Decision),
    Slot(Box<(CounterLease, Write, bool)>),
}

impl Request {
    /// Refusals that need no record: a time key outside its window, a forged token.
    pub(super) fn precheck(&self, now: UnixMillis) -> Option<Decision> {
        match (&self.rules, &self.subject) {
            (Rules::Time(t), Subject::Time(k)) => t.check(now, k).err().map(Decision::Rejected),
            (Rules::Token(t), Subject::Token { scope, token }) => {
                t.verify(scope, token).err().map(Decision::Rejected)
            }
            _ => None,
        }
    }

    pub(super) fn decide(&self, now: UnixMillis, record: Option<&Record>) -> Decided {
        let attempt = Attempt {
            key: &self.key,
            fingerprint: &self.fingerprint,
            nonce: self.nonce,
        };
        let decision = match (&self.rules, &self.subject) {
            (Rules::Record(e), _) => e.decide(now, &attempt, record),
            (Rules::Time(t), Subject::Time(k)) => t.decide(now, k, &attempt, record),
            (Rules::Token(t), Subject::Token { scope, token }) => {
                t.decide(now, scope, token, &attempt, record)
            }
            (
                Rules::Counter(c),
                Subject::Counter {
                    scope,
                    key,
                    low_water,
                },
            ) => {
                let attempt = CounterAttempt {
                    scope,
                    key,
                    fingerprint: &self.fingerprint,
                    low_water: *low_water,
                };
                return match c.decide(now, &attempt, record) {
                    CounterDecision::Execute {
                        lease,
                        write,
                        recovered,
                    } => Decided::Slot(Box::new((lease, write, recovered))),
                    CounterDecision::Replay(r) => Decided::Decision(Decision::Replay(r)),
                    CounterDecision::InProgress { retry_after_secs } => {
                        Decided::Decision(Decision::InProgress { retry_after_secs })
                    }
                    CounterDecision::Rejected(r) => Decided::Decision(Decision::Rejected(r)),
                };
            }
            // A subject of another kind than the rules: the ticket was built by a host with
            // other settings. It names another kind of record (`IDEM-KIND-1`).
            _ => Decision::Rejected(crate::engine::RejectReason::Collision),
        };
        Decided::Decision(decision)
    }

    pub(super) fn decided(
        &mut self,
        now: UnixMillis,
        decided: Decided,
        lost: usize,
        wait: Option<Wait>,
        waiters: &mut Waiters,
    ) {
        let (hold, write, recovered) = match decided {
            Decided::Decision(Decision::Execute {
                lease,
                write,
                recovered,
            }) => (Hold::Record(*lease), *write, recovered),
            Decided::Slot(claim) => {
                let (lease, write, recovered) = *claim;
                (Hold::Slot(lease), write, recovered)
            }
            Decided::Decision(Decision::InProgress { .. })
                if !wait.is_some_and(|w| w.last_look)
                    && matches!(self.in_flight, InFlight::Wait { .. }) =>
            {
                let InFlight::Wait { max, poll } = self.in_flight else {
                    return;
                };
                let wait = match wait {
                    Some(w) => w,
                    None => {
                        let until = now.saturating_add(max);
                        Wait {
                            until,
                            ticket: waiters.enter(&self.key, until, now),
                            last_look: false,
                        }
                    }
                };
                let next = now.saturating_add(poll).min(wait.until);
                self.state = State::Waiting { next, wait };
                return;
            }
            Decided::Decision(d) => {
                if let Some(w) = wait {
                    waiters.leave(&self.key, w.ticket);
                }
                self.events.push(d.event());
                self.state = State::Answered(Answer::Decision(d));
                return;
            }
        };
        let created = match (&write.precondition, &write.op) {
            (Precondition::Absent, WriteOp::Put(record)) => Some(record.version),
            _ => None,
        };
        self.write = Some(write);
        self.state = State::Applying {
            hold,
            recovered,
            lost,
            wait,
            created,
        };
    }

    pub(super) fn claimed_lease(
        &mut self,
        hold: Hold,
        recovered: bool,
        wait: Option<Wait>,
        waiters: &mut Waiters,
    ) {
        if let Some(w) = wait {
            waiters.leave(&self.key, w.ticket);
        }
        self.recovered = recovered;
        self.events.push(if recovered {
            Event::TookOver {
                fence: hold.fence(),
            }
        } else {
            Event::Executed
        });
        self.state = State::Holding(Holding {
            hold,
            recovered,
            started: false,
            outcome: None,
            heartbeat: Heartbeat::Quiet,
            wants_heartbeat: false,
            op: Op::None,
            rounds: 0,
            completion: None,
        });
    }
}
