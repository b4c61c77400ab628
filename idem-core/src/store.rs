//! The store contract, and the claim/finish loop that runs the engine over any store.

use crate::engine::{Attempt, CompleteError, Decision, Engine, Lease, Outcome};
use crate::event::Event;
use crate::key::RecordKey;
use crate::record::{Record, Write, WriteOp};
use crate::time::UnixMillis;

/// Whether a [`Write`]'s precondition held.
#[must_use = "a Conflict means the write did not happen"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The precondition held and the write was performed.
    Applied,
    /// The precondition did not hold; nothing changed (a lost race, or a fenced-out lease).
    Conflict,
}

/// Lost races [`Store::claim`] tolerates before it answers [`Decision::CONTENDED`]. Each lost
/// race means another attempt wrote this key; a handful in a row means it is being fought
/// over, and the honest answer is "in progress". Asynchronous hosts running their own claim
/// loop use the same bound.
pub const MAX_LOST_RACES: usize = 8;

/// A place that keeps records: the one thing the engine needs from a database.
///
/// # Contract (`IDEM-STORE-1`)
///
/// * [`apply`](Store::apply) is a single atomic compare-and-set: it checks the write's
///   [`Precondition`](crate::Precondition) (no record, or a record with exactly that
///   version) and performs the write in one step, with no other write to the same key in
///   between. It returns [`Applied::Conflict`] and changes nothing when the precondition
///   fails. A unique index, `SET NX` with a version check, a Durable Object or a
///   conditional put are all enough.
/// * [`load`](Store::load) returns the last record applied for the key (or `None`). It may
///   return a record whose key has expired; the engine treats it as absent.
/// * A store may delete a record once its `key_expires` has passed, and may replace a
///   completed record by its tombstone once its response has expired ([`Record::expire`]).
///   It may never delete or alter a record before those times: that would let a retry run
///   again. When it runs out of room it refuses new claims; it never evicts a live record.
/// * A store may be wrong only in the safe direction: refusing a write it could have
///   applied costs a retry; applying a write whose precondition failed could run a
///   request twice.
pub trait Store {
    /// The store's own failure (I/O, capacity).
    type Error;

    /// Reads the record for `key`.
    fn load(&self, key: &RecordKey) -> Result<Option<Record>, Self::Error>;

    /// Applies `write` atomically if its precondition holds. `now` lets the store do
    /// bounded expiry work on the way.
    fn apply(&mut self, now: UnixMillis, write: Write) -> Result<Applied, Self::Error>;

    /// Reads, decides and claims, deciding again after a lost race. Returns
    /// [`Claim::Execute`] once this attempt holds the lease.
    fn claim(
        &mut self,
        engine: &Engine,
        now: UnixMillis,
        attempt: &Attempt<'_>,
    ) -> Result<Claim, Self::Error> {
        for _ in 0..MAX_LOST_RACES {
            let current = self.load(attempt.key)?;
            match engine.decide(now, attempt, current.as_ref()) {
                Decision::Execute {
                    lease,
                    write,
                    recovered,
                } => match self.apply(now, write)? {
                    Applied::Applied => return Ok(Claim::Execute { lease, recovered }),
                    Applied::Conflict => continue,
                },
                other => return Ok(Claim::Done(other)),
            }
        }
        Ok(Claim::Done(Decision::CONTENDED))
    }

    /// Records the outcome of the handler that ran under `lease`.
    fn finish(
        &mut self,
        engine: &Engine,
        now: UnixMillis,
        lease: &Lease,
        outcome: Outcome,
    ) -> Result<Finish, Self::Error> {
        let write = match engine.complete(now, lease, outcome) {
            Ok(w) => w,
            Err(e) => return Ok(Finish::Invalid(e)),
        };
        let finish = Finish::of(&write);
        Ok(match self.apply(now, write)? {
            Applied::Applied => finish,
            Applied::Conflict => Finish::FencedOut,
        })
    }
}

/// The result of [`Store::claim`].
#[must_use = "an Execute claim holds a lease that must be finished"]
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Claim {
    /// This attempt holds the lease: run the handler, then [`Store::finish`].
    Execute {
        /// The lease.
        lease: Lease,
        /// Whether an earlier attempt may have started the work.
        recovered: bool,
    },
    /// Anything but execute: replay, in progress, mismatch, rejected. Never holds
    /// [`Decision::Execute`].
    Done(Decision),
}

impl Claim {
    /// The event for this claim.
    pub fn event(&self) -> Event {
        match self {
            Claim::Execute {
                recovered: false, ..
            } => Event::Executed,
            Claim::Execute {
                recovered: true,
                lease,
            } => Event::TookOver { fence: lease.fence },
            Claim::Done(d) => d.event(),
        }
    }
}

/// The result of [`Store::finish`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The response is stored and will be replayed.
    Stored,
    /// The key was released.
    Released,
    /// The unknown outcome was recorded under the configured policy.
    OutcomeUnknown,
    /// The lease had been taken over; nothing was written (`IDEM-LEASE-2`).
    FencedOut,
    /// The outcome was refused (an invalid status); nothing was written.
    Invalid(CompleteError),
}

impl Finish {
    /// What applying a completion write from [`Engine::complete`] means, for hosts that
    /// apply it themselves (an asynchronous store): stored, released or outcome-unknown.
    /// A refused precondition is [`Finish::FencedOut`] instead.
    pub fn of(write: &Write) -> Finish {
        match &write.op {
            WriteOp::Delete => Finish::Released,
            WriteOp::Put(r) if matches!(r.state, crate::RecordState::Completed { .. }) => {
                Finish::Stored
            }
            WriteOp::Put(_) => Finish::OutcomeUnknown,
        }
    }

    /// The event for this completion.
    pub fn event(&self) -> Event {
        match self {
            Finish::Stored => Event::Completed,
            Finish::Released => Event::Released,
            Finish::OutcomeUnknown => Event::OutcomeUnknown,
            Finish::FencedOut => Event::FencedOut,
            Finish::Invalid(_) => Event::Rejected,
        }
    }
}
