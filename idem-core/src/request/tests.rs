//! Unit tests of the request machine.
use super::{Events, Request};
use crate::{
    Attempt, Claim, Config, Decision, Engine, Event, Fingerprint, MemoryStore, Outcome, RecordKey,
    Scope, Store, StoredResponse, UnixMillis,
};
use core::time::Duration;

/// `Store::claim` answers a replay, a mismatch or a refusal from its read
/// (`claim_attempt`): the same claim as the whole machine's from the same record, in
/// flight, completed, and past its response's expiry.
#[test]
fn a_claim_answered_by_its_read_is_the_machines_claim() {
    let engine = Engine::default();
    let now = UnixMillis(1_700_000_000_000);
    let key = RecordKey::new(Scope::new("tenant", "POST", "/orders"), "k-1");
    let (same, other) = (
        Fingerprint::from_digest([1; 32]),
        Fingerprint::from_digest([2; 32]),
    );
    let attempt = |fingerprint, nonce| Attempt {
        key: &key,
        fingerprint,
        nonce,
    };
    let mut store = MemoryStore::default();
    let Claim::Execute { lease, .. } = store.claim(&engine, now, &attempt(&same, 1)).unwrap()
    else {
        panic!("a new key executes");
    };
    let mut answers = std::vec::Vec::new();
    let mut check = |store: &mut MemoryStore, at: UnixMillis| {
        for (fingerprint, nonce) in [(&same, 2), (&other, 3)] {
            let by_read = store
                .claim(&engine, at, &attempt(fingerprint, nonce))
                .unwrap();
            let by_machine = Request::for_attempt(&engine, &attempt(fingerprint, nonce))
                .claim_record_on(store, at)
                .unwrap();
            assert_eq!(by_read, by_machine);
            answers.push(by_read);
        }
    };
    check(&mut store, now);
    let response = StoredResponse {
        status: 201,
        headers: std::vec::Vec::new(),
        body: b"{}".to_vec(),
    };
    let _ = store
        .finish(&engine, now, &lease, Outcome::Final(response))
        .unwrap();
    check(&mut store, now);
    let later = Config::default().response_ttl + Duration::from_secs(1);
    check(&mut store, now.saturating_add(later));
    // In flight, the same payload waits (the machine answers) and another is a mismatch;
    // completed, a replay; past the response's expiry, a refusal: each kind of answer
    // the shortcut takes came up.
    assert!(matches!(
        answers[0],
        Claim::Done(Decision::InProgress { .. })
    ));
    assert!(matches!(answers[1], Claim::Done(Decision::Mismatch { .. })));
    assert!(matches!(answers[2], Claim::Done(Decision::Replay(_))));
    assert!(matches!(answers[4], Claim::Done(Decision::Rejected(_))));
}

#[test]
fn events_keep_the_latest_when_nobody_reads_them() {
    let mut e = Events::default();
    for ev in [
        Event::Executed,
        Event::Extended,
        Event::Extended,
        Event::Completed,
        Event::Replayed,
    ] {
        e.push(ev);
    }
    let drained: std::vec::Vec<Event> = core::iter::from_fn(|| e.pop()).collect();
    assert_eq!(
        drained,
        [
            Event::Extended,
            Event::Extended,
            Event::Completed,
            Event::Replayed
        ]
    );
    assert_eq!(e.pop(), None);
}
