//! What the claim/finish loop does when the store itself fails.
use idem_core::*;
use std::time::Duration;

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

fn setup() -> (Engine, RecordKey, Fingerprint) {
    let engine = Engine::new(Config {
        lease: Duration::from_secs(5),
        ..Config::default()
    })
    .unwrap();
    let key = RecordKey::new(Scope::new("p", "POST", "/x"), "k");
    let fp = Fingerprint::from_digest([7; 32]);
    (engine, key, fp)
}

#[test]
fn an_unreadable_or_unwritable_store_executes_nothing() {
    // IDEM-STORE-4
    let (engine, key, fp) = setup();
    let attempt = Attempt {
        key: &key,
        fingerprint: &fp,
        nonce: 1,
    };
    let mut store = Flaky {
        fail_load: true,
        ..Default::default()
    };
    assert_eq!(store.claim(&engine, UnixMillis(0), &attempt), Err(Down));
    let mut store = Flaky {
        fail_apply: true,
        ..Default::default()
    };
    assert_eq!(store.claim(&engine, UnixMillis(0), &attempt), Err(Down));
    assert!(store.inner.get(&key).is_none(), "no claim was recorded");
    assert_eq!(Problem::STORE_UNAVAILABLE.status, 503);
}

#[test]
fn lost_races_are_decided_again_and_endless_ones_are_in_progress() {
    // IDEM-STORE-1
    let (engine, key, fp) = setup();
    let attempt = Attempt {
        key: &key,
        fingerprint: &fp,
        nonce: 1,
    };
    let mut store = Flaky {
        conflicts: 3,
        ..Default::default()
    };
    assert!(matches!(
        store.claim(&engine, UnixMillis(0), &attempt),
        Ok(Claim::Execute { .. })
    ));
    let mut store = Flaky {
        conflicts: 1_000,
        ..Default::default()
    };
    assert_eq!(
        store.claim(&engine, UnixMillis(0), &attempt),
        Ok(Claim::Done(Decision::InProgress {
            retry_after_secs: 1
        }))
    );
}

#[test]
fn a_failed_completion_leaves_the_lease_to_expire() {
    // IDEM-OUT-5 IDEM-LEASE-1
    let (engine, key, fp) = setup();
    let attempt = Attempt {
        key: &key,
        fingerprint: &fp,
        nonce: 1,
    };
    let mut store = Flaky::default();
    let Ok(Claim::Execute { lease, .. }) = store.claim(&engine, UnixMillis(0), &attempt) else {
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
        store.finish(&engine, UnixMillis(10), &lease, Outcome::Final(response)),
        Err(Down)
    );
    store.fail_apply = false;
    // Nothing was stored: retries wait for the lease, then take over and reconcile.
    assert!(matches!(
        store.claim(&engine, UnixMillis(4_999), &attempt),
        Ok(Claim::Done(Decision::InProgress { .. }))
    ));
    match store.claim(&engine, UnixMillis(5_000), &attempt) {
        Ok(Claim::Execute {
            recovered: true,
            lease: l2,
        }) => assert_eq!(l2.fence, 2),
        other => panic!("{other:?}"),
    }
}
