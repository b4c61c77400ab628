//! The basic request lifecycle through MemoryStore.
use idem_core::*;

#[test]
fn claim_complete_replay_mismatch() {
    // IDEM-EXEC-1 IDEM-REPLAY-1 IDEM-FP-1
    let engine = Engine::default();
    let mut store = MemoryStore::default();
    let key = RecordKey::new(Scope::new("alice", "POST", "/orders"), "k1");
    let spec = FingerprintSpec::default();
    let parts = |body: &'static [u8]| RequestParts {
        method: "POST",
        target: "/orders",
        content_type: Some("application/json"),
        headers: &[],
        body,
    };
    let fp = spec.fingerprint(&parts(br#"{"a":1,"b":2}"#)).unwrap();
    let now = UnixMillis(1_000_000);
    let attempt = Attempt {
        key: &key,
        fingerprint: &fp,
        nonce: 42,
    };
    let Claim::Execute { lease, recovered } = store.claim(&engine, now, &attempt).unwrap() else {
        panic!("expected execute")
    };
    assert!(!recovered);
    assert_eq!(
        store.claim(&engine, now, &attempt).unwrap(),
        Claim::Done(Decision::InProgress {
            // The default bound on the time left of a 60 s lease (IDEM-CONC-4).
            retry_after_secs: 2
        })
    );
    let resp = StoredResponse {
        status: 201,
        headers: vec![],
        body: b"created".to_vec(),
    };
    assert_eq!(
        store
            .finish(&engine, now, &lease, Outcome::Final(resp.clone()))
            .unwrap(),
        Finish::Stored
    );
    let fp2 = spec.fingerprint(&parts(br#"{ "b":2, "a":1 }"#)).unwrap();
    let again = Attempt {
        key: &key,
        fingerprint: &fp2,
        nonce: 7,
    };
    match store.claim(&engine, now, &again).unwrap() {
        Claim::Done(Decision::Replay(r)) => assert_eq!(*r, resp),
        other => panic!("{other:?}"),
    }
    let fp3 = spec.fingerprint(&parts(br#"{"a":1,"b":3}"#)).unwrap();
    let changed = Attempt {
        key: &key,
        fingerprint: &fp3,
        nonce: 7,
    };
    assert_eq!(
        store.claim(&engine, now, &changed).unwrap(),
        Claim::Done(Decision::Mismatch {
            differing: vec!["b".into()]
        })
    );
}
