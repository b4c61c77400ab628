//! The store as a faulty server's layer sees it: the fault's [`Apply::load`] and
//! [`Apply::write`] between the layer and the store it was given.

use super::{Apply, Fault};
use idem_core::{
    Applied, AsyncStore, Completing, Record, RecordKey, StoreFailure, UnixMillis, Write,
};

/// A store whose reads and writes go through a fault.
#[derive(Clone)]
pub(crate) struct FaultyStore<S> {
    inner: S,
    apply: &'static Apply,
}

impl<S> FaultyStore<S> {
    pub(crate) fn new(inner: S, fault: Fault) -> Self {
        FaultyStore {
            inner,
            apply: fault.apply(),
        }
    }
}

impl<S> AsyncStore for FaultyStore<S>
where
    S: AsyncStore + Send + Sync,
    S::Error: Send,
{
    type Error = S::Error;

    async fn load(&self, key: &RecordKey) -> Result<Option<Record>, S::Error> {
        let record = self.inner.load(key).await?;
        Ok(match self.apply.load {
            Some(seen) => record.and_then(|r| seen(key, r)),
            None => record,
        })
    }

    async fn apply(&self, now: UnixMillis, write: Write) -> Result<Applied, S::Error> {
        for _ in 0..REWRITE_ROUNDS {
            let Some(faulted) = self.faulted(write.clone()).await? else {
                return Ok(Applied::Applied);
            };
            let rewritten = faulted.precondition != write.precondition;
            match self.inner.apply(now, faulted).await? {
                Applied::Conflict if rewritten => continue,
                applied => return Ok(applied),
            }
        }
        Ok(Applied::Conflict)
    }

    async fn apply_completion(
        &self,
        now: UnixMillis,
        write: Write,
        completion: Completing,
    ) -> Result<Applied, S::Error> {
        for _ in 0..REWRITE_ROUNDS {
            let Some(faulted) = self.faulted(write.clone()).await? else {
                return Ok(Applied::Applied);
            };
            let rewritten = faulted.precondition != write.precondition;
            match self
                .inner
                .apply_completion(now, faulted, completion.clone())
                .await?
            {
                Applied::Conflict if rewritten => continue,
                applied => return Ok(applied),
            }
        }
        Ok(Applied::Conflict)
    }

    fn failure(error: &S::Error) -> StoreFailure {
        S::failure(error)
    }

    fn end_attempt(&self, key: &RecordKey, attempt: u64) -> bool {
        self.inner.end_attempt(key, attempt)
    }
}

/// How often a write whose precondition a fault rewrote from what is stored is made again
/// when the record changed between that read and the write (a sweep, a racing request): the
/// fault's "whatever is stored now" holds for a write, not only for the read before it.
const REWRITE_ROUNDS: usize = 8;

impl<S> FaultyStore<S>
where
    S: AsyncStore + Send + Sync,
    S::Error: Send,
{
    /// `write` as the fault changes it, given what is stored now, or `None` when the fault
    /// drops it.
    async fn faulted(&self, write: Write) -> Result<Option<Write>, S::Error> {
        match self.apply.write {
            Some(change) => {
                let stored = self.inner.load(&write.key).await?;
                Ok(change(write, stored))
            }
            None => Ok(Some(write)),
        }
    }
}
