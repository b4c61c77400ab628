//! What the claim/finish loop does when the store itself fails.
use idem_core::*;
use std::time::Duration;

mod common;

/// A MemoryStore whose reads and writes can be made to fail.
#[derive(Default)]
struct Flaky {
    inner: MemoryStore,
    fail_load: bool,
    fail_apply: bool,
    /// Lose the race this many times: another writer "wins" each time.
    conflicts: u32,
}

#[derive(Debug, PartialEq)]
struct Down;

impl Store for Flaky {
    type Error = Down;
    fn load(&self, key: &RecordKey) -> Result<Option<Record>, Down> {
        if self.fail_load {
            return Err(Down);
        }
        Ok(self.inner.get(key).cloned())
    }
    fn apply(&mut self, now: UnixMillis, write: Write) -> Result<Applied, Down> {
        if self.fail_apply {
            return Err(Down);
        }
        if self.conflicts > 0 {
            self.conflicts -= 1;
            return Ok(Applied::Conflict);
        }
        Ok(self.inner.apply(now, write).unwrap())
    }
}

fn setup() -> (Policy, Ticket) {
    let engine = Engine::new(Config {
        lease: Duration::from_secs(5),
        ..Config::default()
    })
    .unwrap();
    let ticket = Ticket {
        key: RecordKey::new(Scope::new("p", "POST", "/x"), "k"),
        fingerprint: Fingerprint::from_digest([7; 32]),
        subject: Subject::Record,
    };
    (Policy::new(engine), ticket)
}

/// The claim of the request of `ticket` on `store` at `now`.
fn claim(policy: &Policy, ticket: &Ticket, store: &mut Flaky, now: u64) -> Result<Claimed, Down> {
    common::claim(
        &mut policy.resume(ticket.clone(), 1),
        store,
        UnixMillis(now),
    )
}

#[test]
fn an_unreadable_or_unwritable_store_executes_nothing() {
    // IDEM-STORE-4
    let (policy, ticket) = setup();
    let mut store = Flaky {
        fail_load: true,
        ..Default::default()
    };
    assert_eq!(claim(&policy, &ticket, &mut store, 0), Err(Down));
    let mut store = Flaky {
        fail_apply: true,
        ..Default::default()
    };
    let mut req = policy.resume(ticket.clone(), 1);
    assert_eq!(
        common::claim(&mut req, &mut store, UnixMillis(0)),
        Err(Down)
    );
    assert_eq!(req.reply().unwrap().status(), 503);
    assert!(
        store.inner.get(&ticket.key).is_none(),
        "no claim was recorded"
    );
    assert_eq!(Problem::STORE_UNAVAILABLE.status, 503);
}

#[test]
fn lost_races_are_decided_again_and_endless_ones_are_in_progress() {
    // IDEM-STORE-1
    let (policy, ticket) = setup();
    let mut store = Flaky {
        conflicts: 3,
        ..Default::default()
    };
    assert!(matches!(
        claim(&policy, &ticket, &mut store, 0),
        Ok(Claimed::Execute { .. })
    ));
    let mut store = Flaky {
        conflicts: 1_000,
        ..Default::default()
    };
    assert_eq!(
        claim(&policy, &ticket, &mut store, 0),
        Ok(Claimed::Done(Decision::InProgress {
            retry_after_secs: 1
        }))
    );
}

#[test]
fn a_failed_completion_leaves_the_lease_to_expire() {
    // IDEM-OUT-5 IDEM-LEASE-1
    let (policy, ticket) = setup();
    let mut store = Flaky::default();
    let mut req = policy.resume(ticket.clone(), 1);
    let Ok(Claimed::Execute { .. }) = common::claim(&mut req, &mut store, UnixMillis(0)) else {
        panic!()
    };
    store.fail_apply = true;
    let response = StoredResponse {
        status: 200,
        headers: vec![],
        body: b"done".to_vec(),
    };
    // The host learns that the write failed (and still sends its response).
    assert_eq!(
        common::finish(
            &mut req,
            &mut store,
            UnixMillis(10),
            Outcome::Final(response)
        ),
        Err(Down)
    );
    assert_eq!(
        req.poll(UnixMillis(10), &mut Waiters::default()),
        Step::Done(Finish::StoreFailed(StoreFailure::Unavailable))
    );
    store.fail_apply = false;
    // Nothing was stored: retries wait for the lease, then take over and reconcile.
    assert!(matches!(
        claim(&policy, &ticket, &mut store, 4_999),
        Ok(Claimed::Done(Decision::InProgress { .. }))
    ));
    match claim(&policy, &ticket, &mut store, 5_000) {
        Ok(Claimed::Execute {
            recovered: true,
            hold,
        }) => assert_eq!(hold.fence(), 2),
        other => panic!("{other:?}"),
    }
}
