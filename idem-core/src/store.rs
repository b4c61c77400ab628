//! The store contracts: synchronous ([`Store`]) and asynchronous ([`AsyncStore`]), with the
//! same compare-and-set rules. Both are driven through the one request machine
//! ([`Request`](crate::Request)): it reads and writes, a store only keeps records.

use crate::engine::CompleteError;
use crate::event::Event;
use crate::key::RecordKey;
use crate::record::{Record, Write, WriteOp};
use crate::time::UnixMillis;
use alloc::borrow::Cow;
use core::future::Future;

/// Whether a [`Write`]'s precondition held.
#[must_use = "a Conflict means the write did not happen"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The precondition held and the write was performed.
    Applied,
    /// The precondition did not hold; nothing changed (a lost race, or a fenced-out lease).
    Conflict,
}

/// How a store failed, as far as the answer is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreFailure {
    /// The store is full and refuses new records (`IDEM-STORE-3`).
    Full,
    /// Anything else: unreachable, timed out, refused (`IDEM-STORE-4`).
    Unavailable,
    /// The record is sealed ([`crate::seal`]) and cannot be opened: under a key the host
    /// does not hold, or moved from another key, or damaged (`IDEM-SEAL-3`). It is answered,
    /// never treated as absent: the request is not executed.
    Sealed,
    /// A completion that was to commit the handler's own writes with its stored response (a
    /// transaction, `IDEM-STORE-7`) failed: whether they were committed is unknown, so the
    /// handler's response, which may describe work that was rolled back, does not go out;
    /// its caller gets [`Request::reply`](crate::Request::reply)'s 503 instead.
    Uncommitted,
}

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
/// * Expiry is the record's to say, through [`Record::expire`] and
///   [`Record::next_deadline`] (`IDEM-STORE-3`): a store may replace a completed record by
///   its tombstone once its response has expired, and delete a record once its key has
///   expired, **but never a record in flight whose lease is live**, whatever its key's
///   expiry. It may never delete or alter a record before those times: that would let a
///   retry run again. A store that sets a time-to-live of its own takes it from the key's
///   expiry (and the lease's), never from the response's.
/// * When it runs out of room it refuses new claims; it never evicts a live record.
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

    /// Reads the record for `key`, borrowed where the store can (the request machine only
    /// looks at it). The default copies it through [`Store::load`].
    fn read(&self, key: &RecordKey) -> Result<Option<Cow<'_, Record>>, Self::Error> {
        Ok(self.load(key)?.map(Cow::Owned))
    }

    /// What a failure of this store means for the answer: full (`IDEM-STORE-3`) or
    /// unavailable (`IDEM-STORE-4`, the default).
    fn failure(_error: &Self::Error) -> StoreFailure {
        StoreFailure::Unavailable
    }
}

/// A completion write as the engine describes it to the store that applies it
/// ([`AsyncStore::apply_completion`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Completing {
    /// What applying the write means: [`Finish::Stored`] when it stores the handler's
    /// response.
    pub finish: Finish,
    /// The fence of the attempt's lease (as its handler's context gives it).
    pub fence: u64,
    /// The attempt's identity ([`Context::attempt`](crate::Context::attempt)): every attempt
    /// at every key has its own, also after a key was released and claimed again at fence 1.
    pub attempt: u64,
}

/// The store contract for network and database stores, with the same rules as [`Store`]
/// (see its contract): `load` returns the last record applied, `apply` is one atomic
/// compare-and-set, and expiry never removes a record whose lease is live. Stores are
/// shared between concurrent requests, so both methods take `&self`. A host drives
/// [`Request`](crate::Request) over it: each [`Step`](crate::Step) that reads or writes is one
/// call here.
pub trait AsyncStore {
    /// The store's own failure (I/O, capacity).
    type Error;

    /// Reads the record for `key`.
    fn load(
        &self,
        key: &RecordKey,
    ) -> impl Future<Output = Result<Option<Record>, Self::Error>> + Send;

    /// Applies `write` atomically if its precondition holds.
    fn apply(
        &self,
        now: UnixMillis,
        write: Write,
    ) -> impl Future<Output = Result<Applied, Self::Error>> + Send;

    /// Applies the handler's completion `write`, as [`AsyncStore::apply`] does.
    /// `completion` says what applying it means, as the engine decided it
    /// ([`Request::completing`](crate::Request::completing)), and whose attempt it is. A
    /// completion that loses its race (a [`Applied::Conflict`]) may be made again by the same
    /// attempt, against the record as it then reads: a store keeps what it holds for the
    /// attempt (its transaction) open until the attempt's completion commits or the attempt
    /// ends ([`AsyncStore::end_attempt`]), so that a response is never stored without the
    /// rows it describes. A store
    /// that commits the handler's own writes with its completion commits them only with
    /// [`Finish::Stored`], and only the writes of that attempt: a release, an outcome held as
    /// unknown, or a completion that is fenced out commits none of them (`IDEM-STORE-7`). By
    /// default, [`AsyncStore::apply`].
    fn apply_completion(
        &self,
        now: UnixMillis,
        write: Write,
        completion: Completing,
    ) -> impl Future<Output = Result<Applied, Self::Error>> + Send {
        let _ = completion;
        self.apply(now, write)
    }

    /// What a failure of this store means for the answer (unavailable by default).
    fn failure(_error: &Self::Error) -> StoreFailure {
        StoreFailure::Unavailable
    }

    /// The request of the attempt at `key` with identity `attempt`
    /// ([`Context::attempt`](crate::Context::attempt)) is over, however it
    /// ended: recorded, fenced out, refused, failed, or dropped half-way (a panic, a task
    /// that was aborted). A store that holds something for the attempt, a handler's open
    /// transaction above all, lets go of it now: rolled back, unless its completion already
    /// committed it. A host calls it exactly when the request ends, also from a destructor,
    /// so it must not block or wait. Returns whether it let go of writes of the handler's
    /// that no completion committed (a transaction handed over, rolled back): a host then
    /// tells the request ([`Request::handle_writes_dropped`](crate::Request::handle_writes_dropped)),
    /// whose response may describe them (`IDEM-STORE-7`). By default, nothing, and false.
    fn end_attempt(&self, key: &RecordKey, attempt: u64) -> bool {
        let _ = (key, attempt);
        false
    }
}

/// A store shared behind an `Arc` (the layer and a handler that opens transactions on it)
/// is the same store.
impl<T: AsyncStore + Send + Sync + ?Sized> AsyncStore for alloc::sync::Arc<T> {
    type Error = T::Error;

    fn load(
        &self,
        key: &RecordKey,
    ) -> impl Future<Output = Result<Option<Record>, Self::Error>> + Send {
        (**self).load(key)
    }

    fn apply(
        &self,
        now: UnixMillis,
        write: Write,
    ) -> impl Future<Output = Result<Applied, Self::Error>> + Send {
        (**self).apply(now, write)
    }

    fn apply_completion(
        &self,
        now: UnixMillis,
        write: Write,
        completion: Completing,
    ) -> impl Future<Output = Result<Applied, Self::Error>> + Send {
        (**self).apply_completion(now, write, completion)
    }

    fn failure(error: &Self::Error) -> StoreFailure {
        T::failure(error)
    }

    fn end_attempt(&self, key: &RecordKey, attempt: u64) -> bool {
        (**self).end_attempt(key, attempt)
    }
}

/// How the handler's outcome was recorded: the end of a request that ran its handler
/// ([`Step::Done`](crate::Step::Done)), and what a completion write means to the store that
/// applies it ([`Completing::finish`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The response is stored and will be replayed.
    Stored,
    /// The key was released.
    Released,
    /// The unknown outcome was recorded under the configured policy.
    OutcomeUnknown,
    /// The lease had been taken over; nothing was written (`IDEM-LEASE-2`). A request
    /// machine that ends so has the answer its caller gets instead of the handler's
    /// ([`Request::reply`](crate::Request::reply), `IDEM-LEASE-5`).
    FencedOut,
    /// The outcome was refused (an invalid status); nothing was written.
    Invalid(CompleteError),
    /// The store failed; the outcome may not be recorded, and the lease is left to expire
    /// (`IDEM-OUT-5`).
    StoreFailed(StoreFailure),
}

impl Finish {
    /// What applying a record's completion write means: stored, released or
    /// outcome-unknown. A refused precondition is [`Finish::FencedOut`] instead.
    pub(crate) fn of(write: &Write) -> Finish {
        match &write.op {
            // A consumed token given back for a retry is released as a deleted key is.
            WriteOp::Delete => Finish::Released,
            WriteOp::Put(r) if matches!(r.state, crate::RecordState::Issued { .. }) => {
                Finish::Released
            }
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
            Finish::Invalid(_) | Finish::StoreFailed(_) => Event::Rejected,
        }
    }
}
