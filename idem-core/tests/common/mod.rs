//! What the tests share: a request machine driven over a synchronous store the way a host
//! drives it, one claim or one completion at a time, with nothing waiting.
// Each test file uses some of these.
#![allow(dead_code)]

use idem_core::*;

/// Drives `req` over `store` at `now` until it runs its handler or answers without running
/// it, and returns what its claim came to: the lease it holds (the machine then waits for
/// the handler's outcome: [`finish`]), or the decision that answered it.
pub(crate) fn claim<S: Store>(
    req: &mut Request,
    store: &mut S,
    now: UnixMillis,
) -> Result<Claimed, S::Error> {
    match req.drive(store, now, &mut Waiters::default())? {
        Step::Run(_) | Step::Reply => {}
        other => panic!("a claim ends running or answered, not at {other:?}"),
    }
    Ok(req
        .claimed()
        .unwrap_or_else(|| panic!("answered without a decision: {:?}", req.reply())))
}

/// Records the handler's `outcome` through the machine that holds the lease (after
/// [`claim`] answered an execute), and returns what that came to.
pub(crate) fn finish<S: Store>(
    req: &mut Request,
    store: &mut S,
    now: UnixMillis,
    outcome: Outcome,
) -> Result<Finish, S::Error> {
    req.handle_outcome(outcome);
    match req.drive(store, now, &mut Waiters::default())? {
        Step::Done(finish) => Ok(finish),
        other => panic!("a completion ends done, not at {other:?}"),
    }
}

/// Asks for a heartbeat at `now` and drives it over `store`: where the heartbeats stand
/// afterwards, or why the machine refused to send one.
pub(crate) fn heartbeat<S: Store>(
    req: &mut Request,
    store: &mut S,
    now: UnixMillis,
) -> Result<Heartbeat, S::Error> {
    if let Err(refused) = req.heartbeat(now) {
        return Ok(refused);
    }
    assert_eq!(req.drive(store, now, &mut Waiters::default())?, Step::Idle);
    Ok(req.heartbeat_state())
}

/// The machine of `ticket`'s request holding `hold` with its handler running: what a host
/// has once a store that claims for it (a Durable Object) hands back a lease.
pub(crate) fn holding(policy: &Policy, ticket: Ticket, hold: Hold, now: UnixMillis) -> Request {
    let mut waiters = Waiters::default();
    let mut req = policy.resume(ticket, 0);
    assert_eq!(req.poll(now, &mut waiters), Step::Claim);
    req.handle_claimed(
        now,
        Claimed::Execute {
            hold,
            recovered: false,
        },
        &mut waiters,
    );
    let Step::Run(_) = req.poll(now, &mut waiters) else {
        panic!("a machine holding a lease runs its handler");
    };
    req
}

/// The record lease a machine holds while its handler runs.
pub(crate) fn lease(req: &Request) -> Lease {
    match req.hold() {
        Some(Hold::Record(lease)) => lease,
        other => panic!("no record lease: {other:?}"),
    }
}

/// The counter slot's lease a machine holds while its handler runs.
pub(crate) fn slot(req: &Request) -> CounterLease {
    match req.hold() {
        Some(Hold::Slot(lease)) => lease,
        other => panic!("no slot lease: {other:?}"),
    }
}

/// The events the machine has yielded since they were last read.
pub(crate) fn events(req: &mut Request) -> Vec<Event> {
    std::iter::from_fn(|| req.poll_event()).collect()
}
