//! Model-based tests: random operation sequences run against the engine with MemoryStore and
//! against a small, independent model of the specification; every answer must agree.
//!
//! The model is written from the requirement table, not from the engine: per (scope, key) a
//! physical state (what the store holds) and the logical reading of it at `now`.
use idem_core::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

mod common;

const RESPONSE_TTL: u64 = 10_000;
const KEY_TTL: u64 = 30_000;
const LEASE: u64 = 3_000;
/// Below the lease, so that both sides of the Retry-After bound are reached (IDEM-CONC-4).
const MAX_RETRY_AFTER: u64 = 2_000;

#[derive(Clone, Debug)]
enum Op {
    Claim { scope: u8, key: u8, payload: u8 },
    Finish { handler: usize, outcome: u8 },
    Extend { handler: usize },
    Advance(u64),
    JumpBack(u64),
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2u8, 0..3u8, 0..2u8).prop_map(|(scope, key, payload)| Op::Claim { scope, key, payload }),
        3 => (0..8usize, 0..4u8).prop_map(|(handler, outcome)| Op::Finish { handler, outcome }),
        1 => (0..8usize).prop_map(|handler| Op::Extend { handler }),
        2 => (0..8_000u64).prop_map(Op::Advance),
        // Exact periods land on the boundaries, where off-by-one bugs live.
        1 => prop_oneof![Just(1), Just(1_000), Just(LEASE), Just(RESPONSE_TTL), Just(KEY_TTL - RESPONSE_TTL)]
            .prop_map(Op::Advance),
        1 => (0..5_000u64).prop_map(Op::JumpBack),
        1 => Just(Op::Sweep),
    ]
}

#[derive(Clone, Debug, PartialEq)]
enum M {
    InFlight {
        payload: u8,
        lease_expires: u64,
        fence: u64,
        lease_id: u64,
        key_expires: u64,
    },
    Completed {
        payload: u8,
        body: Vec<u8>,
        response_expires: u64,
        key_expires: u64,
    },
    Tombstone {
        payload: u8,
        key_expires: u64,
    },
}

impl M {
    fn key_expires(&self) -> u64 {
        match self {
            M::InFlight { key_expires, .. }
            | M::Completed { key_expires, .. }
            | M::Tombstone { key_expires, .. } => *key_expires,
        }
    }
    /// Whether the record counts at `now`: its key is remembered, or its lease is live
    /// (IDEM-LEASE-4: a lease never outlives its key).
    fn live(&self, now: u64) -> bool {
        now < self.key_expires()
            || matches!(self, M::InFlight { lease_expires, .. } if now < *lease_expires)
    }
    fn payload(&self) -> u8 {
        match self {
            M::InFlight { payload, .. }
            | M::Completed { payload, .. }
            | M::Tombstone { payload, .. } => *payload,
        }
    }
}

/// What the model expects a claim to return.
#[derive(Debug, PartialEq)]
enum Expect {
    Execute { recovered: bool, fence: u64 },
    Replay(Vec<u8>),
    InProgress(u64),
    Mismatch,
    KeyExpired,
}

#[derive(Default)]
struct Model {
    records: HashMap<(u8, u8), M>,
    next_lease_id: u64,
}

impl Model {
    /// The store's expiry, applied before every write (the key space is small enough for the
    /// store's per-write sweep budget to cover everything due).
    fn sweep(&mut self, now: u64) {
        self.records.retain(|_, m| m.live(now));
        for m in self.records.values_mut() {
            if let M::Completed {
                payload,
                response_expires,
                key_expires,
                ..
            } = m
            {
                if now >= *response_expires {
                    *m = M::Tombstone {
                        payload: *payload,
                        key_expires: *key_expires,
                    };
                }
            }
        }
    }

    fn claim(&mut self, now: u64, k: (u8, u8), payload: u8) -> (Expect, Option<u64>) {
        let live = self.records.get(&k).filter(|m| m.live(now)).cloned();
        let expect = match &live {
            None => Expect::Execute {
                recovered: false,
                fence: 1,
            },
            Some(m) if m.payload() != payload => Expect::Mismatch,
            Some(M::InFlight { lease_expires, .. }) if now < *lease_expires => {
                // IDEM-CONC-4: the time left, capped.
                Expect::InProgress(
                    (lease_expires - now)
                        .div_ceil(1000)
                        .clamp(1, MAX_RETRY_AFTER / 1000),
                )
            }
            Some(M::InFlight { fence, .. }) => Expect::Execute {
                recovered: true,
                fence: fence + 1,
            },
            Some(M::Completed {
                body,
                response_expires,
                ..
            }) if now < *response_expires => Expect::Replay(body.clone()),
            Some(_) => Expect::KeyExpired,
        };
        let Expect::Execute { fence, .. } = expect else {
            return (expect, None);
        };
        self.sweep(now);
        self.next_lease_id += 1;
        let id = self.next_lease_id;
        self.records.insert(
            k,
            M::InFlight {
                payload,
                lease_expires: now + LEASE,
                fence,
                lease_id: id,
                key_expires: now + KEY_TTL,
            },
        );
        (expect, Some(id))
    }

    fn holds(&self, k: (u8, u8), lease_id: u64) -> bool {
        matches!(self.records.get(&k), Some(M::InFlight { lease_id: id, .. }) if *id == lease_id)
    }
}

/// A request whose handler runs: its machine holds the lease.
struct Handler {
    k: (u8, u8),
    req: Request,
    lease_id: u64,
}

fn key(k: (u8, u8)) -> RecordKey {
    RecordKey::new(
        Scope::new(&format!("principal-{}", k.0), "POST", "/pay"),
        format!("key-{}", k.1),
    )
}

fn fingerprint(payload: u8) -> Fingerprint {
    FingerprintSpec::default()
        .fingerprint(&RequestParts {
            method: "POST",
            target: "/pay",
            content_type: None,
            headers: &[],
            body: &[payload],
        })
        .unwrap()
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let policy = Policy::new(
        Engine::new(Config {
            response_ttl: Duration::from_millis(RESPONSE_TTL),
            key_ttl: Duration::from_millis(KEY_TTL),
            lease: Duration::from_millis(LEASE),
            unknown_outcome: UnknownOutcomePolicy::Reexecute,
            max_retry_after: Duration::from_millis(MAX_RETRY_AFTER),
        })
        .unwrap(),
    );
    let mut store = MemoryStore::default();
    let mut model = Model::default();
    let mut handlers: Vec<Handler> = Vec::new();
    let mut now = 1_000_000u64;
    let mut nonce = 0u64;
    let mut bodies = 0u64;
    for op in ops {
        match op {
            Op::Claim {
                scope,
                key: kk,
                payload,
            } => {
                let k = (scope, kk);
                let ticket = Ticket {
                    key: key(k),
                    fingerprint: fingerprint(payload),
                    subject: Subject::Record,
                };
                nonce = nonce.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut req = policy.resume(ticket, nonce);
                let got = common::claim(&mut req, &mut store, UnixMillis(now)).unwrap();
                let (expect, lease_id) = model.claim(now, k, payload);
                match (got, expect) {
                    (
                        Claimed::Execute { hold, recovered },
                        Expect::Execute {
                            recovered: r,
                            fence,
                        },
                    ) => {
                        prop_assert_eq!(recovered, r);
                        prop_assert_eq!(hold.fence(), fence);
                        handlers.push(Handler {
                            k,
                            req,
                            lease_id: lease_id.unwrap(),
                        });
                    }
                    (Claimed::Done(Decision::Replay(resp)), Expect::Replay(body)) => {
                        prop_assert_eq!(&resp.body, &body)
                    }
                    (
                        Claimed::Done(Decision::InProgress { retry_after_secs }),
                        Expect::InProgress(s),
                    ) => {
                        prop_assert_eq!(retry_after_secs, s)
                    }
                    (Claimed::Done(Decision::Mismatch { .. }), Expect::Mismatch) => {}
                    (
                        Claimed::Done(Decision::Rejected(RejectReason::KeyExpired)),
                        Expect::KeyExpired,
                    ) => {}
                    (got, expect) => {
                        prop_assert!(false, "engine said {:?}, model expected {:?}", got, expect)
                    }
                }
            }
            Op::Finish { handler, outcome } => {
                if handlers.is_empty() {
                    continue;
                }
                let mut h = handlers.swap_remove(handler % handlers.len());
                bodies += 1;
                let body = format!("{:?}#{bodies}", h.k).into_bytes();
                let outcome = match outcome {
                    0 => Outcome::Retryable,
                    1 => Outcome::Unknown(None),
                    _ => Outcome::Final(StoredResponse {
                        status: 200,
                        headers: vec![],
                        body: body.clone(),
                    }),
                };
                let holds = model.holds(h.k, h.lease_id);
                let got = common::finish(&mut h.req, &mut store, UnixMillis(now), outcome.clone())
                    .unwrap();
                model.sweep(now);
                // The store sweeps before checking; a lease whose key expired loses its record.
                let holds = holds && model.holds(h.k, h.lease_id);
                if !holds {
                    prop_assert_eq!(got, Finish::FencedOut);
                    continue;
                }
                let payload = model.records[&h.k].payload();
                match outcome {
                    Outcome::Retryable => {
                        prop_assert_eq!(got, Finish::Released);
                        model.records.remove(&h.k);
                    }
                    Outcome::Unknown(_) => {
                        prop_assert_eq!(got, Finish::OutcomeUnknown);
                        model.next_lease_id += 1;
                        let (fence, key_expires) = match &model.records[&h.k] {
                            M::InFlight {
                                fence, key_expires, ..
                            } => (*fence, *key_expires),
                            _ => unreachable!(),
                        };
                        let id = model.next_lease_id;
                        model.records.insert(
                            h.k,
                            M::InFlight {
                                payload,
                                lease_expires: now,
                                fence,
                                lease_id: id,
                                key_expires,
                            },
                        );
                    }
                    Outcome::Final(_) => {
                        prop_assert_eq!(got, Finish::Stored);
                        let key_expires = model.records[&h.k].key_expires().max(now + KEY_TTL);
                        model.records.insert(
                            h.k,
                            M::Completed {
                                payload,
                                body,
                                response_expires: now + RESPONSE_TTL,
                                key_expires,
                            },
                        );
                    }
                }
            }
            Op::Extend { handler } => {
                if handlers.is_empty() {
                    continue;
                }
                let i = handler % handlers.len();
                let h = &mut handlers[i];
                let expires = h.req.context().unwrap().lease_expires;
                let holds = model.holds(h.k, h.lease_id);
                match h.req.heartbeat(UnixMillis(now)) {
                    Err(Heartbeat::Expired) => prop_assert!(now >= expires.0),
                    // An earlier heartbeat learned that the lease was taken over.
                    Err(Heartbeat::FencedOut) => prop_assert!(!holds),
                    Err(e) => prop_assert!(false, "{e:?}"),
                    Ok(()) => {
                        let step = h
                            .req
                            .drive(&mut store, UnixMillis(now), &mut Waiters::default())
                            .unwrap();
                        prop_assert_eq!(step, Step::Idle);
                        model.sweep(now);
                        let holds = holds && model.holds(h.k, h.lease_id);
                        let extended = matches!(h.req.heartbeat_state(), Heartbeat::Extended(_));
                        prop_assert_eq!(extended, holds);
                        if holds {
                            model.next_lease_id += 1;
                            h.lease_id = model.next_lease_id;
                            // The key's retention moves with the lease (IDEM-LEASE-4).
                            if let Some(M::InFlight {
                                lease_expires,
                                lease_id,
                                key_expires,
                                ..
                            }) = model.records.get_mut(&h.k)
                            {
                                *lease_expires = now + LEASE;
                                *lease_id = h.lease_id;
                                *key_expires = (*key_expires).max(now + KEY_TTL);
                            }
                        } else {
                            prop_assert_eq!(h.req.heartbeat_state(), Heartbeat::FencedOut);
                        }
                    }
                }
            }
            Op::Advance(ms) => now += ms,
            Op::JumpBack(ms) => now -= ms,
            Op::Sweep => {
                store.sweep(UnixMillis(now));
                model.sweep(now);
            }
        }
        // The store holds exactly what the model holds.
        prop_assert_eq!(store.stats().entries, model.records.len());
        for (k, m) in &model.records {
            let r = store.get(&key(*k));
            prop_assert!(r.is_some(), "store lost {:?}", k);
            let r = r.unwrap();
            prop_assert_eq!(r.key_expires.0, m.key_expires());
            let same_kind = matches!(
                (&r.state, m),
                (RecordState::InFlight { .. }, M::InFlight { .. })
                    | (RecordState::Completed { .. }, M::Completed { .. })
                    | (RecordState::Tombstone, M::Tombstone { .. })
            );
            prop_assert!(same_kind, "{:?} vs {:?}", r.state, m);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    /// IDEM-EXEC-1 IDEM-CONC-1 IDEM-REPLAY-1 IDEM-FP-1 IDEM-LEASE-1 IDEM-LEASE-2 IDEM-LEASE-3 IDEM-LEASE-4
    /// IDEM-OUT-1 IDEM-OUT-2 IDEM-OUT-3 IDEM-SCOPE-1 IDEM-TTL-1 IDEM-TTL-2 IDEM-TTL-3 IDEM-STORE-1
    #[test]
    fn engine_and_store_agree_with_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}
