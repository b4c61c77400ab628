//! The basic request lifecycle through MemoryStore.
use idem_core::*;

mod common;

#[test]
fn claim_complete_replay_mismatch() {
    // IDEM-EXEC-1 IDEM-REPLAY-1 IDEM-FP-1
    let policy = Policy::new(Engine::default());
    let mut store = MemoryStore::default();
    let request = |body: &str, nonce: u64| {
        policy.request(
            &Intake {
                principal: Some("alice"),
                method: "POST",
                route: "/orders",
                target: "/orders",
                keys: &[b"k1".as_slice()],
                low_water: None,
                client: None,
                content_type: Some("application/json"),
                headers: &[],
                body: body.as_bytes(),
            },
            nonce,
        )
    };
    let now = UnixMillis(1_000_000);
    let mut first = request(r#"{"a":1,"b":2}"#, 42);
    let Claimed::Execute { recovered, .. } = common::claim(&mut first, &mut store, now).unwrap()
    else {
        panic!("expected execute")
    };
    assert!(!recovered);
    assert_eq!(
        common::claim(&mut request(r#"{"a":1,"b":2}"#, 42), &mut store, now).unwrap(),
        Claimed::Done(Decision::InProgress {
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
        common::finish(&mut first, &mut store, now, Outcome::Final(resp.clone())).unwrap(),
        Finish::Stored
    );
    let mut again = request(r#"{ "b":2, "a":1 }"#, 7);
    match common::claim(&mut again, &mut store, now).unwrap() {
        Claimed::Done(Decision::Replay(r)) => assert_eq!(*r, resp),
        other => panic!("{other:?}"),
    }
    assert_eq!(again.reply().unwrap().body(), b"created");
    let mut changed = request(r#"{"a":1,"b":3}"#, 7);
    assert_eq!(
        common::claim(&mut changed, &mut store, now).unwrap(),
        Claimed::Done(Decision::Mismatch {
            differing: vec!["b".into()],
            processed: true,
        })
    );
    assert_eq!(changed.reply().unwrap().status(), 422);
}
