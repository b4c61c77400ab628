//! The engine as an inbox: deliveries processed once, duplicates acknowledged.
use idem_core::*;
use std::collections::HashMap;
use std::time::Duration;

const T0: u64 = 1_700_000_000_000;

fn fp(body: &str) -> Fingerprint {
    Fingerprint::from_digest({
        let mut d = [0u8; 32];
        for (i, b) in body.bytes().enumerate() {
            d[i % 32] ^= b.rotate_left(i as u32 % 8);
        }
        d[31] ^= body.len() as u8;
        d
    })
}

#[test]
fn the_first_delivery_is_processed_and_the_rest_acknowledged() {
    // IDEM-INBOX-1
    let inbox = Inbox::new(Engine::default());
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let key = inbox.message_key("stripe", "evt_1").unwrap();
    let d = inbox
        .receive(&mut store, now, &key, &fp("payload"), 1)
        .unwrap();
    let Delivery::Process {
        lease,
        recovered: false,
    } = d.clone()
    else {
        panic!("{d:?}")
    };
    assert!(!d.acknowledge());
    assert_eq!(d.event(), Event::Executed);
    assert_eq!(
        inbox.processed(&mut store, now, &lease).unwrap(),
        Finish::Stored
    );
    let again = inbox
        .receive(&mut store, now, &key, &fp("payload"), 2)
        .unwrap();
    assert_eq!(again, Delivery::Duplicate);
    assert!(again.acknowledge());
    assert_eq!(again.event(), Event::Duplicate);
    // Still a duplicate after the stored answer expired while the id is remembered.
    let late = now.saturating_add(Duration::from_secs(3 * 24 * 3600));
    store.sweep(late);
    assert!(matches!(
        store.get(&key).map(|r| &r.state),
        Some(RecordState::Tombstone)
    ));
    assert_eq!(
        inbox
            .receive(&mut store, late, &key, &fp("payload"), 3)
            .unwrap(),
        Delivery::Duplicate
    );
    // Other sources and ids are other messages.
    let other = inbox.message_key("github", "evt_1").unwrap();
    assert!(matches!(
        inbox
            .receive(&mut store, now, &other, &fp("payload"), 4)
            .unwrap(),
        Delivery::Process { .. }
    ));
}

#[test]
fn concurrent_and_failed_deliveries() {
    // IDEM-INBOX-2
    let inbox = Inbox::new(Engine::default());
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let key = inbox.message_key("queue", "m-1").unwrap();
    let Delivery::Process { lease, .. } =
        inbox.receive(&mut store, now, &key, &fp("x"), 1).unwrap()
    else {
        panic!()
    };
    let busy = inbox.receive(&mut store, now, &key, &fp("x"), 2).unwrap();
    assert_eq!(
        busy,
        Delivery::InProgress {
            // The default bound on the time left of a 60 s lease (IDEM-CONC-4).
            retry_after_secs: 2
        }
    );
    assert!(!busy.acknowledge(), "a busy message must come again");
    assert_eq!(
        inbox.failed(&mut store, now, &lease).unwrap(),
        Finish::Released
    );
    let Delivery::Process {
        lease,
        recovered: false,
    } = inbox.receive(&mut store, now, &key, &fp("x"), 3).unwrap()
    else {
        panic!("a failed message must be processed again")
    };
    // A processing that crashed is taken over once its lease ends.
    let later = now.saturating_add(Duration::from_secs(61));
    let Delivery::Process {
        lease: second,
        recovered: true,
    } = inbox.receive(&mut store, later, &key, &fp("x"), 4).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        inbox.processed(&mut store, later, &lease).unwrap(),
        Finish::FencedOut
    );
    assert_eq!(
        inbox.processed(&mut store, later, &second).unwrap(),
        Finish::Stored
    );
}

#[test]
fn a_changed_payload_under_a_known_id_is_a_conflict() {
    // IDEM-INBOX-3
    let inbox = Inbox::new(Engine::default());
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let key = inbox.message_key("hooks", "evt_9").unwrap();
    let Delivery::Process { lease, .. } =
        inbox.receive(&mut store, now, &key, &fp("a"), 1).unwrap()
    else {
        panic!()
    };
    let _ = inbox.processed(&mut store, now, &lease).unwrap();
    let d = inbox.receive(&mut store, now, &key, &fp("b"), 2).unwrap();
    assert!(matches!(d, Delivery::Conflict { .. }));
    assert!(d.acknowledge());
    assert!(d.event().is_security_relevant());
}

#[test]
fn bad_message_ids_are_refused() {
    // IDEM-INBOX-1
    let inbox = Inbox::default();
    assert_eq!(inbox.message_key("s", ""), Err(KeyError::Empty));
    assert_eq!(
        inbox.message_key("s", &"x".repeat(256)),
        Err(KeyError::TooLong { len: 256 })
    );
    assert_eq!(
        inbox.message_key("s", "a\nb"),
        Err(KeyError::InvalidByte { at: 1, byte: b'\n' })
    );
    assert!(inbox.message_key("s", &"x".repeat(255)).is_ok());
}

#[test]
fn held_outcomes_are_neither_processed_nor_acknowledged() {
    // IDEM-INBOX-2 IDEM-OUT-3
    let inbox = Inbox::new(
        Engine::new(Config {
            unknown_outcome: UnknownOutcomePolicy::Hold,
            ..Config::default()
        })
        .unwrap(),
    );
    let mut store = MemoryStore::default();
    let now = UnixMillis(T0);
    let key = inbox.message_key("q", "m").unwrap();
    let Delivery::Process { lease, .. } =
        inbox.receive(&mut store, now, &key, &fp("x"), 1).unwrap()
    else {
        panic!()
    };
    let _ = store
        .finish(inbox.engine(), now, &lease, Outcome::Unknown(None))
        .unwrap();
    let d = inbox.receive(&mut store, now, &key, &fp("x"), 2).unwrap();
    assert_eq!(d, Delivery::Held);
    assert!(!d.acknowledge());
}

/// A queue that redelivers: each message arrives one to four times, interleaved, and some
/// processings crash or fail. Every message is processed exactly once to completion.
#[test]
fn redelivery_simulation_processes_each_message_once() {
    // IDEM-INBOX-1 IDEM-INBOX-2
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for _ in 0..20 {
        let inbox = Inbox::new(
            Engine::new(Config {
                lease: Duration::from_secs(5),
                ..Config::default()
            })
            .unwrap(),
        );
        let mut store = MemoryStore::default();
        let mut now = T0;
        let mut queue: Vec<u64> = Vec::new();
        for m in 0..40 {
            for _ in 0..=rnd(4) {
                queue.push(m);
            }
        }
        let mut effects: HashMap<u64, u32> = HashMap::new();
        while !queue.is_empty() {
            let m = queue.remove(rnd(queue.len() as u64) as usize);
            now += rnd(3_000);
            let key = inbox.message_key("q", &format!("m{m}")).unwrap();
            match inbox
                .receive(
                    &mut store,
                    UnixMillis(now),
                    &key,
                    &fp(&format!("body{m}")),
                    now,
                )
                .unwrap()
            {
                Delivery::Process { lease, recovered } => match rnd(10) {
                    0 => queue.push(m), // crash before the effect: redelivered later
                    1 => {
                        let _ = inbox.failed(&mut store, UnixMillis(now), &lease).unwrap();
                        queue.push(m);
                    }
                    _ => {
                        // The effect is idempotent on recovery: a recovered run checks first.
                        let count = effects.entry(m).or_default();
                        if !recovered || *count == 0 {
                            *count += 1;
                        }
                        assert_eq!(
                            inbox
                                .processed(&mut store, UnixMillis(now), &lease)
                                .unwrap(),
                            Finish::Stored
                        );
                    }
                },
                Delivery::Duplicate => assert_eq!(effects.get(&m), Some(&1)),
                Delivery::InProgress { .. } => queue.push(m),
                other => panic!("{other:?}"),
            }
        }
        // A crashed or failed processing is always delivered again, so every message ends
        // processed, and none twice.
        assert!(effects.values().all(|c| *c == 1));
        assert_eq!(effects.len(), 40);
    }
}
