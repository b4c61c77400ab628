//! Random operation sequences against request machines over MemoryStore: nothing panics, and
//! a replay always returns the response stored for that key.
#![no_main]
use arbitrary::Arbitrary;
use idem_core::*;
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;

#[derive(Arbitrary, Debug)]
enum Operation {
    Claim { key: u8, payload: u8, nonce: u64 },
    Finish { handler: u8, status: u16, retryable: bool },
    Extend { handler: u8 },
    Advance(u16),
    Back(u16),
    Sweep,
}

fuzz_target!(|ops: Vec<Operation>| {
    let policy = Policy::new(
        Engine::new(Config {
            response_ttl: std::time::Duration::from_secs(5),
            key_ttl: std::time::Duration::from_secs(20),
            lease: std::time::Duration::from_secs(2),
            unknown_outcome: UnknownOutcomePolicy::Reexecute,
            ..Config::default()
        })
        .unwrap(),
    );
    let mut store = MemoryStore::new(MemoryStoreLimits { max_entries: 4, max_bytes: 1 << 20 });
    let mut waiters = Waiters::default();
    // The machines of the requests whose handlers run.
    let mut handlers: Vec<Request> = Vec::new();
    let mut stored: HashMap<RecordKey, StoredResponse> = HashMap::new();
    let mut now = UnixMillis(1_000_000);
    for op in ops {
        match op {
            Operation::Claim { key, payload, nonce } => {
                let ticket = Ticket {
                    key: RecordKey::new(Scope::new("p", "POST", "/"), format!("{}", key % 8)),
                    fingerprint: Fingerprint::from_digest([payload % 2; 32]),
                    subject: Subject::Record,
                };
                let mut req = policy.resume(ticket, nonce);
                match req.drive(&mut store, now, &mut waiters) {
                    Ok(Step::Run(_)) => handlers.push(req),
                    Ok(Step::Reply) => {
                        if let Some(Decision::Replay(r)) = req.decision() {
                            assert_eq!(Some(&**r), stored.get(req.key()));
                        }
                    }
                    Ok(step) => panic!("a claim ends running or answered, not at {step:?}"),
                    Err(MemoryStoreError::Full { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            Operation::Finish { handler, status, retryable } if !handlers.is_empty() => {
                let mut req = handlers.swap_remove(handler as usize % handlers.len());
                let response = StoredResponse { status, headers: vec![], body: status.to_be_bytes().to_vec() };
                let outcome = if retryable { Outcome::Retryable } else { Outcome::classify(response.clone()) };
                req.handle_outcome(outcome);
                if let Ok(Step::Done(Finish::Stored)) = req.drive(&mut store, now, &mut waiters) {
                    stored.insert(req.key().clone(), response);
                }
            }
            Operation::Extend { handler } if !handlers.is_empty() => {
                let i = handler as usize % handlers.len();
                if handlers[i].heartbeat(now).is_ok() {
                    let step = handlers[i].drive(&mut store, now, &mut waiters);
                    assert!(matches!(step, Ok(Step::Idle) | Err(_)), "{step:?}");
                }
            }
            Operation::Advance(ms) => now = UnixMillis(now.0 + u64::from(ms)),
            Operation::Back(ms) => now = UnixMillis(now.0.saturating_sub(u64::from(ms))),
            Operation::Sweep => {
                store.sweep(now);
            }
            _ => {}
        }
    }
});
