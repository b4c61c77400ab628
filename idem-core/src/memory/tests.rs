//! Unit tests of the memory module.

use super::*;
use crate::fingerprint::Fingerprint;
use crate::record::RecordState;
use alloc::format;
use alloc::sync::Arc;

fn key(scope: &str, k: &str) -> RecordKey {
    RecordKey::new(Scope::new(scope, "POST", "/orders"), k)
}

/// A completed record whose response expires at `response` and key at `key`.
fn completed(version: u64, response: u64, key: u64) -> Record {
    Record {
        version,
        fence: 1,
        fingerprint: Fingerprint::from_digest([7; 32]),
        created: UnixMillis(0),
        key_expires: UnixMillis(key),
        state: RecordState::Completed {
            response: Arc::new(crate::response::StoredResponse {
                status: 201,
                headers: Vec::new(),
                body: Vec::new(),
            }),
            response_expires: UnixMillis(response),
        },
    }
}

fn put(store: &mut MemoryStore, k: &RecordKey, pre: Precondition, r: Record) {
    let write = Write {
        key: k.clone(),
        precondition: pre,
        op: WriteOp::Put(r),
    };
    assert_eq!(store.apply(UnixMillis(0), write), Ok(Applied::Applied));
}

mod expiry_against_a_model {
    use super::*;
    use alloc::collections::BTreeMap;
    use alloc::vec;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    /// Response lifetimes of twelve policies: with their tombstones, many more streams of
    /// deadlines than the index has queues, so that many fall back to its heap.
    /// Each key outlives its response by half as much again.
    const TTLS: [u64; 12] = [7, 13, 50, 64, 100, 128, 255, 256, 300, 1_000, 4_096, 10_000];

    #[derive(Clone, Debug)]
    enum Op {
        /// Writes key `k` under policy `p`: a new record, or a new version of one.
        Put(u8, usize),
        /// Time passes.
        Wait(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u8..24, 0..TTLS.len()).prop_map(|(k, p)| Op::Put(k, p)),
            2 => (0u64..600).prop_map(Op::Wait),
        ]
    }

    /// What the store should hold for a key: version, whether only the tombstone is
    /// left, the response's and the key's expiry.
    #[derive(Clone, Copy, Debug)]
    struct M {
        version: u64,
        tombstone: bool,
        response: u64,
        key: u64,
    }

    proptest! {
        /// `IDEM-TTL-4`, with `IDEM-TTL-2` and `IDEM-TTL-3`'s tombstones: records written
        /// under many policies, rewritten with deadlines that move both ways. After every
        /// sweep the store holds exactly what is not yet due, with its responses dropped on
        /// time, and its next deadline is the earliest one.
        #[test]
        fn sweeps_expire_exactly_what_is_due(ops in proptest::collection::vec(op(), 1..200)) {
            let mut store = MemoryStore::default();
            let mut model: BTreeMap<u8, M> = BTreeMap::new();
            let mut now = 1_000u64;
            for op in ops {
                match op {
                    Op::Wait(ms) => now += ms,
                    Op::Put(k, p) => {
                        let rk = key("s", &format!("k{k}"));
                        let (pre, version) = match model.get(&k) {
                            Some(m) => (Precondition::Version(m.version), m.version + 1),
                            None => (Precondition::Absent, 1),
                        };
                        let (response, key_expires) = (now + TTLS[p], now + TTLS[p] * 3 / 2);
                        let write = Write {
                            key: rk,
                            precondition: pre,
                            op: WriteOp::Put(completed(version, response, key_expires)),
                        };
                        let applied = store.apply(UnixMillis(now), write);
                        prop_assert_eq!(applied, Ok(Applied::Applied));
                        let m = M { version, tombstone: false, response, key: key_expires };
                        model.insert(k, m);
                    }
                }
                store.sweep(UnixMillis(now));
                model = model
                    .into_iter()
                    .filter_map(|(k, m)| expired(m, now).map(|m| (k, m)))
                    .collect();
                prop_assert_eq!(store.stats().entries, model.len());
                for (k, m) in &model {
                    let got = store.get(&key("s", &format!("k{k}")));
                    prop_assert!(got.is_some(), "k{} is gone at {}", k, now);
                    let got = got.unwrap();
                    prop_assert_eq!(got.version, m.version);
                    prop_assert_eq!(matches!(got.state, RecordState::Tombstone), m.tombstone);
                }
                let earliest = model.values().map(|&m| due_at(m)).min();
                prop_assert_eq!(store.next_deadline(), earliest.map(UnixMillis));
            }
        }
    }

    /// What `m` becomes when expiry is applied at `now`: nothing once its key expired, a
    /// tombstone (one version on) once its response expired.
    fn expired(m: M, now: u64) -> Option<M> {
        if m.key <= now {
            None
        } else if !m.tombstone && m.response <= now {
            Some(M {
                version: m.version + 1,
                tombstone: true,
                ..m
            })
        } else {
            Some(m)
        }
    }

    /// When `m` is next due.
    fn due_at(m: M) -> u64 {
        if m.tombstone {
            m.key
        } else {
            m.response.min(m.key)
        }
    }

    /// How the store holds key `k` now, in the model's terms.
    fn observed(store: &MemoryStore, k: u8, m: M) -> Option<M> {
        store.get(&key("s", &format!("k{k}"))).map(|r| M {
            version: r.version,
            tombstone: matches!(r.state, RecordState::Tombstone),
            ..m
        })
    }

    #[derive(Clone, Debug)]
    enum Step {
        /// Writes key `k` under policy `p` against the version the store holds.
        Put(u8, usize),
        /// Time passes.
        Wait(u64),
        /// A full sweep.
        Sweep,
    }

    /// Steps, with bursts of writes under one policy at one time (so that more records
    /// fall due together than one write's sweep expires).
    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let one = prop_oneof![
            6 => (0u8..KEYS, 0..TTLS.len()).prop_map(|(k, p)| vec![Step::Put(k, p)]),
            2 => (0u8..KEYS, 1u8..KEYS, 0..TTLS.len())
                .prop_map(|(k, n, p)| (0..n).map(|i| Step::Put((k + i) % KEYS, p)).collect()),
            3 => (0u64..300).prop_map(|ms| vec![Step::Wait(ms)]),
            1 => Just(vec![Step::Sweep]),
        ];
        proptest::collection::vec(one, 1..80).prop_map(|v| v.concat())
    }

    /// Keys of the budgeted test: more than one write's sweep expires.
    const KEYS: u8 = 72;

    /// The deadline index while records that are due wait for a sweep (`IDEM-TTL-4`):
    /// `apply` expires at most `SWEEP_PER_WRITE` due records before its write, earliest
    /// first, and writes land on records that are due but not yet expired. After every
    /// step each record is as written or as expiry left it, nothing due is left behind
    /// while a sweep had budget to spare, and the next deadline is the earliest of the
    /// records the store holds.
    #[test]
    fn budgeted_sweeps_leave_the_index_exact() {
        proptest!(|(steps in steps())| {
            let mut store = MemoryStore::default();
            // Each key's record as the store was last seen to hold it.
            let mut model: BTreeMap<u8, M> = BTreeMap::new();
            let mut now = 1_000u64;
            for step in steps {
                let before = model.clone();
                let mut written = None;
                match step {
                    Step::Wait(ms) => now += ms,
                    Step::Sweep => {
                        store.sweep(UnixMillis(now));
                    }
                    Step::Put(k, p) => {
                        let (pre, version) = match model.get(&k) {
                            Some(m) => (Precondition::Version(m.version), m.version + 1),
                            None => (Precondition::Absent, 1),
                        };
                        let (response, key_expires) = (now + TTLS[p], now + TTLS[p] * 3 / 2);
                        let write = Write {
                            key: key("s", &format!("k{k}")),
                            precondition: pre,
                            op: WriteOp::Put(completed(version, response, key_expires)),
                        };
                        match store.apply(UnixMillis(now), write) {
                            Ok(Applied::Applied) => {
                                let m = M {
                                    version,
                                    tombstone: false,
                                    response,
                                    key: key_expires,
                                };
                                written = Some((k, m));
                            }
                            // Only the sweep before the write may have moved the record
                            // on, and only if it was due.
                            Ok(Applied::Conflict) => {
                                let due = due_at(model[&k]) <= now;
                                prop_assert!(due, "k{} conflicted, not due", k);
                            }
                            other => prop_assert!(false, "k{}: {:?}", k, other),
                        }
                    }
                }
                let (mut swept, mut left) = (0, 0);
                // The latest deadline expired and the earliest left due.
                let (mut latest_swept, mut earliest_left) = (0, u64::MAX);
                let mut next = BTreeMap::new();
                for (&k, &m) in &before {
                    if written.is_some_and(|(w, _)| w == k) {
                        continue;
                    }
                    let seen = observed(&store, k, m);
                    let due = expired(m, now);
                    let as_left = seen.map(|s| (s.version, s.tombstone))
                        == Some((m.version, m.tombstone));
                    let as_expired = seen.map(|s| (s.version, s.tombstone))
                        == due.map(|d| (d.version, d.tombstone));
                    if as_expired && !as_left {
                        swept += 1;
                        latest_swept = latest_swept.max(due_at(m));
                    } else if as_left && !as_expired {
                        left += 1;
                        earliest_left = earliest_left.min(due_at(m));
                    } else {
                        let both = as_left && as_expired;
                        prop_assert!(both, "k{}: {:?}, not {:?} or {:?}", k, seen, m, due);
                    }
                    if let Some(s) = seen {
                        next.insert(k, s);
                    }
                }
                if let Some((k, m)) = written {
                    next.insert(k, m);
                }
                match step {
                    Step::Wait(_) => prop_assert_eq!(swept, 0),
                    Step::Sweep => prop_assert_eq!(left, 0),
                    Step::Put(..) => {
                        let budget = SWEEP_PER_WRITE;
                        prop_assert!(swept <= budget, "{} expired by one write", swept);
                        let spared = left > 0 && swept < budget;
                        prop_assert!(!spared, "{} due left, {} expired", left, swept);
                        prop_assert!(latest_swept <= earliest_left, "expired out of order");
                    }
                }
                model = next;
                prop_assert_eq!(store.stats().entries, model.len());
                let earliest = model.values().map(|&m| due_at(m)).min();
                prop_assert_eq!(store.next_deadline(), earliest.map(UnixMillis));
            }
        });
    }
}

#[test]
fn keys_inside_the_slot_and_on_the_heap_are_told_apart_by_every_byte() {
    let mut store = MemoryStore::default();
    let fits = "a".repeat(INLINE_KEY);
    let longer = format!("{fits}b");
    let longest = format!("{fits}c");
    let empty = alloc::string::String::new();
    for (i, k) in [&fits, &longer, &longest, &empty].into_iter().enumerate() {
        put(
            &mut store,
            &key("s", k),
            Precondition::Absent,
            completed(i as u64 + 1, 10, 20),
        );
    }
    for (i, k) in [&fits, &longer, &longest, &empty].into_iter().enumerate() {
        assert_eq!(
            store.get(&key("s", k)).map(|r| r.version),
            Some(i as u64 + 1),
            "{k:?}"
        );
    }
    assert!(store.get(&key("s", &fits[1..])).is_none());
    assert!(store.get(&key("t", &longer)).is_none(), "another scope");
    // Deleting each frees its slot and its index entry.
    for (i, k) in [&fits, &longer, &longest, &empty].into_iter().enumerate() {
        let write = Write {
            key: key("s", k),
            precondition: Precondition::Version(i as u64 + 1),
            op: WriteOp::Delete,
        };
        assert_eq!(store.apply(UnixMillis(0), write), Ok(Applied::Applied));
    }
    assert_eq!(store.stats().entries, 0);
    assert_eq!(store.stats().bytes, 0);
}

#[test]
fn a_reused_slot_never_takes_an_earlier_occupants_deadline() {
    let mut store = MemoryStore::default();
    let a = key("alice", "k1");
    put(&mut store, &a, Precondition::Absent, completed(1, 10, 20));
    let delete = Write {
        key: a.clone(),
        precondition: Precondition::Version(1),
        op: WriteOp::Delete,
    };
    assert_eq!(store.apply(UnixMillis(0), delete), Ok(Applied::Applied));
    // The next record takes the freed slot, with later deadlines.
    let b = key("bob", "k2");
    put(
        &mut store,
        &b,
        Precondition::Absent,
        completed(5, 1_000, 2_000),
    );
    assert_eq!(store.next_deadline(), Some(UnixMillis(1_000)));
    assert_eq!(store.sweep(UnixMillis(30)), 0);
    assert!(store.get(&b).is_some());
    assert!(store.get(&a).is_none());
    // Its own deadlines still apply: a tombstone, then nothing.
    assert_eq!(store.sweep(UnixMillis(1_000)), 1);
    assert!(matches!(
        store.get(&b).map(|r| &r.state),
        Some(RecordState::Tombstone)
    ));
    assert_eq!(store.next_deadline(), Some(UnixMillis(2_000)));
    assert_eq!(store.sweep(UnixMillis(2_000)), 1);
    assert!(store.get(&b).is_none());
    assert_eq!(store.next_deadline(), None);
    assert_eq!(store.stats().entries, 0);
    assert_eq!(store.stats().bytes, 0);
}

#[test]
fn the_next_deadline_follows_deadlines_that_move_both_ways() {
    let mut store = MemoryStore::default();
    let k = key("alice", "k");
    let other = key("alice", "other");
    put(
        &mut store,
        &other,
        Precondition::Absent,
        completed(1, 500, 600),
    );
    put(&mut store, &k, Precondition::Absent, completed(1, 100, 200));
    assert_eq!(store.next_deadline(), Some(UnixMillis(100)));
    // Later: the heap keeps the old place, the store still says the true earliest.
    put(
        &mut store,
        &k,
        Precondition::Version(1),
        completed(2, 300, 400),
    );
    assert_eq!(store.next_deadline(), Some(UnixMillis(300)));
    assert_eq!(store.sweep(UnixMillis(299)), 0);
    // Earlier again.
    put(
        &mut store,
        &k,
        Precondition::Version(2),
        completed(3, 50, 400),
    );
    assert_eq!(store.next_deadline(), Some(UnixMillis(50)));
    assert_eq!(store.sweep(UnixMillis(50)), 1);
    assert_eq!(store.next_deadline(), Some(UnixMillis(400)));
}

#[test]
fn a_scope_is_kept_once_and_freed_with_its_last_key() {
    let mut store = MemoryStore::default();
    for i in 0..100 {
        let k = key(if i % 2 == 0 { "alice" } else { "bob" }, &format!("k{i}"));
        put(&mut store, &k, Precondition::Absent, completed(1, 10, 20));
    }
    let live = |s: &MemoryStore| s.scopes.iter().filter(|s| s.is_some()).count();
    assert_eq!(live(&store), 2);
    // The same key under another scope is another record.
    assert!(store.get(&key("carol", "k0")).is_none());
    assert!(store.get(&key("alice", "k0")).is_some());
    assert!(store.get(&key("alice", "k1")).is_none());
    assert_eq!(store.sweep(UnixMillis(20)), 100);
    assert_eq!(live(&store), 0);
    put(
        &mut store,
        &key("carol", "x"),
        Precondition::Absent,
        completed(1, 10, 20),
    );
    assert_eq!(live(&store), 1);
    assert_eq!(store.scopes.len(), 2, "a freed scope number is reused");
}
