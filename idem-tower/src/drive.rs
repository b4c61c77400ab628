//! The async host of idem-core's request machine: each store step the machine asks for is
//! one call to the [`AsyncStore`], its answer handed back; everything else (decisions,
//! retries after a lost race, heartbeats, completions, replies) is the machine's.

use crate::context::LeaseError;
use crate::layer::{EventFn, FilterFn, Principal, RouteFn};
use crate::telemetry::{self, Trace};
use idem_core::{
    AsyncStore, Event, Heartbeat, Outcome, Policy, RecordKey, Reply, Request, Step, StoreFailure,
    UnixMillis, Waiters,
};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// What every request of a layer shares.
pub(crate) struct Shared<St> {
    pub(crate) store: St,
    pub(crate) policy: Policy,
    pub(crate) principal: Principal,
    pub(crate) route: Option<Arc<RouteFn>>,
    pub(crate) filter: Option<Arc<FilterFn>>,
    pub(crate) on_event: Option<Arc<EventFn>>,
    /// Whether a `GET` with `Idempotency-Status` is answered as a status query.
    pub(crate) status_queries: bool,
    /// Who waits for a request in flight: only the latest waiter of a key waits.
    pub(crate) waiters: Mutex<Waiters>,
}

/// The waiters, locked: they hold no invariant a panic elsewhere could break.
pub(crate) fn lock(waiters: &Mutex<Waiters>) -> MutexGuard<'_, Waiters> {
    waiters.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<St> Shared<St> {
    /// Who sends `parts` and to which route, for its scope.
    pub(crate) fn scope_of(&self, parts: &http::request::Parts) -> (Option<String>, String) {
        let principal = match &self.principal {
            Principal::Single => None,
            Principal::Extract(f) => Some(f(parts).unwrap_or_default()),
        };
        let route = match &self.route {
            Some(f) => f(parts),
            None => parts.uri.path().to_owned(),
        };
        (principal, route)
    }

    pub(crate) fn emit(&self, request: &mut Request, trace: &Trace) {
        while let Some(event) = request.poll_event() {
            trace.observe(&event);
            match &self.on_event {
                Some(f) => f(&event, request.key()),
                None => log(&event, request.key()),
            }
        }
    }
}

/// The default event hook: `tracing`, security-relevant events at `warn`. The record is
/// named by its digest, never by its key (`IDEM-EVT-2`).
pub(crate) fn log(event: &Event, key: &RecordKey) {
    if event.is_security_relevant() {
        tracing::warn!(event = ?event, key.digest = %key.digest(), "idempotency");
    } else {
        tracing::debug!(event = ?event, key.digest = %key.digest(), "idempotency");
    }
}

/// A random nonce for a new record's first version (`IDEM-STORE-2`).
pub(crate) fn nonce() -> u64 {
    let mut bytes = [0u8; 8];
    // Without a random source the nonce would repeat: better to stop than to reuse versions.
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    u64::from_le_bytes(bytes)
}

/// Waits until `t`, as the machine asks ([`Step::WaitUntil`]: a duplicate in flight).
pub(crate) async fn sleep_until(t: UnixMillis) {
    tokio::time::sleep(std::time::Duration::from_millis(UnixMillis::now().until(t))).await;
}

/// Performs the machine's store steps until it asks for something else: run, wait, reply,
/// done, or an input it is waiting for (idle).
///
/// Cancel-safe: a caller that drops this future while a store call is out (a handler that
/// wraps a heartbeat in a timeout, races it in `select!`, or aborts the task that sends it)
/// leaves the machine told that the call failed, so that it never waits for an answer that
/// cannot come. Whether or not the store made the write, the machine then goes on safely: a
/// completion that finds the record moved on by its own lease completes from there.
pub(crate) async fn advance<St>(shared: &Shared<St>, request: &mut Request, trace: &Trace) -> Step
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    drive_steps(
        &shared.store,
        &shared.waiters,
        &|r| shared.emit(r, trace),
        request,
    )
    .await
}

/// [`advance`] over any store, with the host's waiters and event hook.
pub(crate) async fn drive_steps<St>(
    store: &St,
    waiters: &Mutex<Waiters>,
    emit: &(dyn Fn(&mut Request) + Sync),
    request: &mut Request,
) -> Step
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    let mut out = Outstanding {
        waiters,
        emit,
        request,
        armed: false,
    };
    let waiters = || lock(waiters);
    loop {
        let now = UnixMillis::now();
        let step = out.request.poll(now, &mut waiters());
        emit(out.request);
        match step {
            Step::Claim | Step::Load => {
                let key = out.request.key().clone();
                out.armed = true;
                let since = std::time::Instant::now();
                let record = store.load(&key).await;
                telemetry::store_call(idem_core::telemetry::store_op::LOAD, since, false);
                out.armed = false;
                match record {
                    Ok(record) => out.request.handle_record(
                        UnixMillis::now(),
                        record.as_ref(),
                        &mut waiters(),
                    ),
                    Err(e) => failed::<St>(&mut waiters(), out.request, &e),
                }
            }
            Step::Apply(write) => {
                let completion = out.request.completing();
                out.armed = true;
                let since = std::time::Instant::now();
                let applied = match completion {
                    // The engine's word on what the completion means reaches the store, which
                    // commits a handler's own writes only with a stored response.
                    Some(completion) => store.apply_completion(now, write, completion).await,
                    None => store.apply(now, write).await,
                };
                let written = matches!(applied, Ok(idem_core::Applied::Applied));
                telemetry::store_call(idem_core::telemetry::store_op::APPLY, since, written);
                out.armed = false;
                match applied {
                    Ok(applied) => {
                        out.request
                            .handle_applied(UnixMillis::now(), applied, &mut waiters())
                    }
                    Err(e) => failed::<St>(&mut waiters(), out.request, &e),
                }
            }
            other => return other,
        }
    }
}

/// The machine while [`drive_steps`] drives it: if the future is dropped with a store call
/// out (`armed`), the machine learns that the call failed.
struct Outstanding<'a> {
    waiters: &'a Mutex<Waiters>,
    emit: &'a (dyn Fn(&mut Request) + Sync),
    request: &'a mut Request,
    armed: bool,
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        if self.armed {
            tracing::warn!(
                key.digest = %self.request.key().digest(),
                "idempotency: a store call was abandoned; its answer is taken as a failure"
            );
            self.request
                .handle_store_error(StoreFailure::Unavailable, &mut lock(self.waiters));
            (self.emit)(self.request);
        }
    }
}

fn failed<St>(waiters: &mut Waiters, request: &mut Request, error: &St::Error)
where
    St: AsyncStore,
    St::Error: fmt::Display,
{
    tracing::warn!(error = %error, key.digest = %request.key().digest(), "idempotency store failed");
    request.handle_store_error(St::failure(error), waiters);
}

/// A heartbeat, as the handler's context holds it (the store's type erased).
pub(crate) trait Beat: Send + Sync {
    fn extend(&self) -> Pin<Box<dyn Future<Output = Result<UnixMillis, LeaseError>> + Send + '_>>;

    /// Whether the attempt is over: set before the store is told (`end_attempt`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn is_over(&self) -> bool;
}

/// A request whose handler runs: the machine, shared by the heartbeats and the completion,
/// one at a time, in the order the machine orders them. However the request ends (its
/// outcome recorded, or the request dropped half-way by a panic or an aborted task), the
/// store is told that the attempt is over ([`AsyncStore::end_attempt`]), so that nothing it
/// holds for the attempt (a handler's transaction) outlives it.
pub(crate) struct Running<St: AsyncStore> {
    shared: Arc<Shared<St>>,
    machine: tokio::sync::Mutex<Option<Request>>,
    /// Set as the attempt ends, before the store is told (`end_attempt`): from then on a
    /// store refuses to keep anything more for it.
    over: std::sync::atomic::AtomicBool,
    /// The record and the attempt's identity, as the store knows them.
    attempt: (RecordKey, u64),
    /// The request's telemetry.
    trace: Arc<Trace>,
}

impl<St> Running<St>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    pub(crate) fn new(
        shared: Arc<Shared<St>>,
        machine: Request,
        attempt: u64,
        trace: Arc<Trace>,
    ) -> Self {
        Running {
            attempt: (machine.key().clone(), attempt),
            trace,
            shared,
            machine: tokio::sync::Mutex::new(Some(machine)),
            over: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Awaits `work` (the read of the handler's answer) no longer than the attempt's lease,
    /// as its heartbeats extend it (`IDEM-OUT-7`): `None` when the lease ended first, `work`
    /// then dropped.
    pub(crate) async fn within_lease<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        let mut work = std::pin::pin!(work);
        let mut due = self.answer_due().await?;
        loop {
            let left = Duration::from_millis(UnixMillis::now().until(due));
            if let Ok(done) = tokio::time::timeout(left, &mut work).await {
                return Some(done);
            }
            // A heartbeat may have moved the lease on while this one slept (its write done:
            // the machine is locked while it is out).
            match self.answer_due().await {
                Some(later) if later > due => due = later,
                // Once more, for a body that ended while the heartbeat's write was out.
                _ => return tokio::time::timeout(Duration::ZERO, &mut work).await.ok(),
            }
        }
    }

    async fn answer_due(&self) -> Option<UnixMillis> {
        self.machine.lock().await.as_ref()?.answer_due()
    }

    /// Records the handler's outcome (`IDEM-OUT-5`) and ends the request. Returns the answer
    /// to send instead of the handler's when its lease was taken over (`IDEM-LEASE-5`).
    pub(crate) async fn finish(&self, outcome: Outcome) -> Option<Reply> {
        self.finish_with(|machine| machine.handle_outcome(outcome))
            .await
    }

    /// As [`finish`](Self::finish), with the outcome given to the machine by `record` (an
    /// answer too long to keep: [`idem_core::Request::handle_oversized`]).
    pub(crate) async fn finish_with(
        &self,
        record: impl FnOnce(&mut idem_core::Request),
    ) -> Option<Reply> {
        let mut guard = self.machine.lock().await;
        let machine = guard.as_mut()?;
        record(machine);
        let step = advance(&self.shared, machine, &self.trace).await;
        self.over.store(true, std::sync::atomic::Ordering::SeqCst);
        // The attempt is over: what the store held for it goes, and if that was the
        // handler's own writes, uncommitted, its response does not go out (IDEM-STORE-7).
        if self
            .shared
            .store
            .end_attempt(&self.attempt.0, self.attempt.1)
        {
            machine.handle_writes_dropped();
        }
        let answer = match step {
            // Another attempt's outcome (IDEM-LEASE-5), or the 503 of a completion that may not
            // have committed the handler's own writes (IDEM-STORE-7); otherwise none.
            Step::Done(_) => machine.reply(),
            // The machine asked for something else with the outcome in hand: nothing was
            // recorded. The lease is left to expire, as after a failed write.
            other => {
                tracing::error!(
                    step = ?other,
                    key.digest = %self.attempt.0.digest(),
                    "idempotency: the outcome was not recorded"
                );
                None
            }
        };
        *guard = None;
        answer
    }
}

impl<St: AsyncStore> Drop for Running<St> {
    fn drop(&mut self) {
        // Dropped before `finish` ran to its end: the attempt is over all the same.
        if self.machine.get_mut().is_some() {
            self.over.store(true, std::sync::atomic::Ordering::SeqCst);
            self.shared
                .store
                .end_attempt(&self.attempt.0, self.attempt.1);
        }
    }
}

impl<St> Beat for Running<St>
where
    St: AsyncStore + Send + Sync,
    St::Error: fmt::Display,
{
    fn is_over(&self) -> bool {
        self.over.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn extend(&self) -> Pin<Box<dyn Future<Output = Result<UnixMillis, LeaseError>> + Send + '_>> {
        Box::pin(async move {
            let mut guard = self.machine.lock().await;
            let Some(machine) = guard.as_mut() else {
                return Err(LeaseError::Finished);
            };
            let state = match machine.heartbeat(UnixMillis::now()) {
                Err(refused) => refused,
                Ok(()) => {
                    // Cancel-safe: dropped half-way, the machine records the heartbeat as
                    // failed (see `advance`).
                    let _ = advance(&self.shared, machine, &self.trace).await;
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
