//! The async host of idem-core's request machine: each store step the machine asks for is
//! one call to the [`AsyncStore`], its answer handed back; everything else (decisions,
//! retries after a lost race, heartbeats, completions, replies) is the machine's.

use crate::{EventFn, FilterFn, LeaseError, Principal, RouteFn};
use idem_core::{
    AsyncStore, Event, Heartbeat, Outcome, Policy, RecordKey, Request, Step, UnixMillis, Waiters,
};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// What every request of a layer shares.
pub(crate) struct Shared<St> {
    pub(crate) store: St,
    pub(crate) policy: Policy,
    pub(crate) principal: Principal,
    pub(crate) route: Option<Arc<RouteFn>>,
    pub(crate) filter: Option<Arc<FilterFn>>,
    pub(crate) on_event: Option<Arc<EventFn>>,
    /// Who waits for a request in flight: only the latest waiter of a key waits.
    pub(crate) waiters: Mutex<Waiters>,
}

impl<St> Shared<St> {
    fn waiters(&self) -> MutexGuard<'_, Waiters> {
        // The waiters hold no invariant a panic elsewhere could break.
        self.waiters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn emit(&self, request: &mut Request<'static>) {
        while let Some(event) = request.poll_event() {
            match &self.on_event {
                Some(f) => f(&event, request.key()),
                None => log(&event, request.key()),
            }
        }
    }
}

/// The default event hook: `tracing`, security-relevant events at `warn`.
fn log(event: &Event, key: &RecordKey) {
    if event.is_security_relevant() {
        tracing::warn!(event = ?event, key = %key.key, "idempotency");
    } else {
        tracing::debug!(event = ?event, key = %key.key, "idempotency");
    }
}

/// A random nonce for a new record's first version (`IDEM-STORE-2`).
pub(crate) fn nonce() -> u64 {
    let mut bytes = [0u8; 8];
    // Without a random source the nonce would repeat: better to stop than to reuse versions.
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    u64::from_le_bytes(bytes)
}

/// Performs the machine's store steps until it asks for something else: run, wait, reply,
/// done, or an input it is waiting for (idle).
pub(crate) async fn advance<St>(shared: &Shared<St>, request: &mut Request<'static>) -> Step
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    loop {
        let now = UnixMillis::now();
        let step = request.poll(now, &mut shared.waiters());
        shared.emit(request);
        match step {
            Step::Claim | Step::Load => {
                let key = request.key().clone();
                match shared.store.load(&key).await {
                    Ok(record) => request.handle_record(
                        UnixMillis::now(),
                        record.as_ref(),
                        &mut shared.waiters(),
                    ),
                    Err(e) => failed::<St>(shared, request, &e),
                }
            }
            Step::Apply(write) => match match request.completing() {
                // The engine's word on what the completion means reaches the store, which
                // commits a handler's own writes only with a stored response.
                Some(completion) => shared.store.apply_completion(now, write, completion).await,
                None => shared.store.apply(now, write).await,
            } {
                Ok(applied) => {
                    request.handle_applied(UnixMillis::now(), applied, &mut shared.waiters())
                }
                Err(e) => failed::<St>(shared, request, &e),
            },
            other => return other,
        }
    }
}

fn failed<St>(shared: &Shared<St>, request: &mut Request<'static>, error: &St::Error)
where
    St: AsyncStore,
    St::Error: fmt::Display,
{
    tracing::warn!(error = %error, key = %request.key().key, "idempotency store failed");
    request.handle_store_error(St::failure(error), &mut shared.waiters());
}

/// A heartbeat, as the handler's context holds it (the store's type erased).
pub(crate) trait Beat: Send + Sync {
    fn extend(&self) -> Pin<Box<dyn Future<Output = Result<UnixMillis, LeaseError>> + Send + '_>>;
}

/// A request whose handler runs: the machine, shared by the heartbeats and the completion,
/// one at a time, in the order the machine orders them.
pub(crate) struct Running<St> {
    shared: Arc<Shared<St>>,
    machine: tokio::sync::Mutex<Option<Request<'static>>>,
}

impl<St> Running<St>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    pub(crate) fn new(shared: Arc<Shared<St>>, machine: Request<'static>) -> Self {
        Running {
            shared,
            machine: tokio::sync::Mutex::new(Some(machine)),
        }
    }

    /// Records the handler's outcome (`IDEM-OUT-5`) and ends the request.
    pub(crate) async fn finish(&self, outcome: Outcome) {
        let mut guard = self.machine.lock().await;
        let Some(mut machine) = guard.take() else {
            return;
        };
        machine.handle_outcome(outcome);
        let _done = advance(&self.shared, &mut machine).await;
    }
}

impl<St> Beat for Running<St>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    fn extend(&self) -> Pin<Box<dyn Future<Output = Result<UnixMillis, LeaseError>> + Send + '_>> {
        Box::pin(async move {
            let mut guard = self.machine.lock().await;
            let Some(machine) = guard.as_mut() else {
                return Err(LeaseError::Finished);
            };
            let state = match machine.heartbeat(UnixMillis::now()) {
                Err(refused) => refused,
                Ok(()) => {
                    let _ = advance(&self.shared, machine).await;
                    machine.heartbeat_state()
                }
            };
            match state {
                Heartbeat::Extended(until) => Ok(until),
                Heartbeat::FencedOut => Err(LeaseError::FencedOut),
                Heartbeat::Expired => Err(LeaseError::Expired),
                Heartbeat::Failed(_) | Heartbeat::Quiet => Err(LeaseError::StoreFailed),
            }
        })
    }
}
