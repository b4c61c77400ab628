//! Random operation sequences against the engine and MemoryStore: nothing panics, and a
//! replay always returns the response stored for that key.
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
    let engine = Engine::new(Config {
        response_ttl: std::time::Duration::from_secs(5),
        key_ttl: std::time::Duration::from_secs(20),
        lease: std::time::Duration::from_secs(2),
        unknown_outcome: UnknownOutcomePolicy::Reexecute,
    })
    .unwrap();
    let mut store = MemoryStore::new(MemoryStoreLimits { max_entries: 4, max_bytes: 1 << 20 });
    let mut handlers: Vec<Lease> = Vec::new();
    let mut stored: HashMap<RecordKey, StoredResponse> = HashMap::new();
    let mut now = UnixMillis(1_000_000);
    for op in ops {
        match op {
            Operation::Claim { key, payload, nonce } => {
                let k = RecordKey::new(Scope::new("p", "POST", "/"), format!("{}", key % 8));
                let fp = Fingerprint::from_digest([payload % 2; 32]);
                match store.claim(&engine, now, &Attempt { key: &k, fingerprint: &fp, nonce }) {
                    Ok(Claim::Execute { lease, .. }) => handlers.push(*lease),
                    Ok(Claim::Done(Decision::Replay(r))) => assert_eq!(Some(&*r), stored.get(&k)),
                    Ok(_) | Err(MemoryStoreError::Full { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            Operation::Finish { handler, status, retryable } if !handlers.is_empty() => {
                let lease = handlers.swap_remove(handler as usize % handlers.len());
                let response = StoredResponse { status, headers: vec![], body: status.to_be_bytes().to_vec() };
                let outcome = if retryable { Outcome::Retryable } else { Outcome::classify(response.clone()) };
                if let Ok(Finish::Stored) = store.finish(&engine, now, &lease, outcome) {
                    stored.insert(lease.key.clone(), response);
                }
            }
            Operation::Extend { handler } if !handlers.is_empty() => {
                let i = handler as usize % handlers.len();
                if let Ok((next, write)) = engine.extend(now, &handlers[i]) {
                    if store.apply(now, write) == Ok(Applied::Applied) {
                        handlers[i] = next;
                    }
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
