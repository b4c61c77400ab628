//! A deterministic simulation: many clients, a fake clock, lost responses, crashes in the
//! middle of handlers, lease expiry and takeover, zombie completions, clock jumps, and
//! clients that misuse keys. Every run is reproducible from its seed.
//!
//! The handlers are written the way the engine asks hosts to write them: a handler told
//! `recovered: true` reconciles before acting, and the side effect goes to a resource that
//! checks the lease's fencing number (as a database row version or a fenced lock would).
//! Under those rules the simulation checks the engine's promises:
//!
//! * at most one side effect per (scope, key) while its record is retained (IDEM-EXEC-1);
//! * every replay is byte-identical to what was stored, and names the request's own scope
//!   and key (IDEM-REPLAY-1, IDEM-SCOPE-1);
//! * a stale lease never overwrites: fenced-out completions change nothing, and a stored
//!   response always comes from the newest lease (IDEM-LEASE-2);
//! * a mismatched payload never executes (IDEM-FP-1);
//! * a lease never outlives its key: long handlers keep their leases alive with heartbeats
//!   through the request machine, and their records are never dropped while the lease is
//!   live, whatever the key's first expiry said (IDEM-LEASE-4).
use idem_core::*;
use std::collections::HashMap;
use std::time::Duration;

mod common;

/// SplitMix64: small, seedable, good enough to drive a simulation.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What one logical request should do.
struct Logical {
    key: RecordKey,
    payload: String,
    /// Set when the client has seen a final response.
    done: bool,
}

/// A handler between claim and finish: its request's machine holds the lease.
struct Handler {
    logical: usize,
    req: Request,
    /// The lease, as of the last heartbeat.
    lease: Lease,
    recovered: bool,
    payload: String,
    effect_done: bool,
    /// When it finishes (it may be a zombie by then).
    finish_at: UnixMillis,
    /// It crashes instead of finishing.
    crash: bool,
    /// Its response is lost on the way back.
    lose_response: bool,
    /// The incarnation of the key it was claimed in.
    incarnation: u64,
    /// It runs long and keeps its lease alive with heartbeats.
    heartbeats: bool,
}

/// The fenced resource and what the simulation knows about each key's current incarnation.
#[derive(Default)]
struct KeyTruth {
    /// Bumped whenever the key's record ends (expiry): a new incarnation may run again.
    incarnation: u64,
    max_fence: u64,
    effects: u32,
    payload: Option<String>,
    stored: Option<StoredResponse>,
    key_expires: UnixMillis,
}

struct Sim {
    rng: Rng,
    now: UnixMillis,
    policy: Policy,
    store: MemoryStore,
    logical: Vec<Logical>,
    handlers: Vec<Handler>,
    truth: HashMap<RecordKey, KeyTruth>,
    /// The latest time seen (the clock may jump back).
    max_now: UnixMillis,
    stats: HashMap<&'static str, u64>,
    /// Percent of handlers that run long and send heartbeats.
    heartbeat_percent: u64,
}

impl Sim {
    fn new(seed: u64, config: Config, clients: usize, keys_per_client: usize) -> Sim {
        let mut rng = Rng(seed);
        let mut logical = Vec::new();
        for c in 0..clients {
            for k in 0..keys_per_client {
                // Different principals deliberately reuse the same key strings.
                let key = RecordKey::new(
                    Scope::new(&format!("client-{c}"), "POST", "/transfer"),
                    format!("key-{k}"),
                );
                logical.push(Logical {
                    key,
                    payload: format!("{{\"amount\":{}}}", rng.below(1000)),
                    done: false,
                });
            }
        }
        Sim {
            rng,
            now: UnixMillis(1_700_000_000_000),
            policy: Policy::new(Engine::new(config).unwrap()),
            store: MemoryStore::default(),
            logical,
            handlers: Vec::new(),
            truth: HashMap::new(),
            max_now: UnixMillis(0),
            stats: HashMap::new(),
            heartbeat_percent: 0,
        }
    }

    /// IDEM-LEASE-4: the record of every handler whose lease may still be live is in the
    /// store, and a record in flight never has a key that expires before its lease.
    fn check_leases(&self) {
        let max_now = self.max_now.max(self.now);
        for h in &self.handlers {
            let Some(r) = self.store.get(&h.lease.key) else {
                assert!(
                    max_now >= h.lease.expires,
                    "IDEM-LEASE-4: the record of a live lease is gone: {:?}",
                    h.lease
                );
                continue;
            };
            if let RecordState::InFlight { lease_expires } = r.state {
                assert!(
                    r.key_expires >= lease_expires || max_now >= r.key_expires.max(lease_expires),
                    "IDEM-LEASE-4: a key expires before its live lease"
                );
            }
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.stats.entry(what).or_default() += 1;
    }

    fn fingerprint(payload: &str) -> Fingerprint {
        FingerprintSpec::default()
            .fingerprint(&RequestParts {
                method: "POST",
                target: "/transfer",
                content_type: Some("application/json"),
                headers: &[],
                body: payload.as_bytes(),
            })
            .unwrap()
    }

    fn step(&mut self) {
        self.max_now = self.max_now.max(self.now);
        match self.rng.below(100) {
            0..=44 => self.send(),
            45..=79 => self.progress_handler(),
            80..=94 => self.now = UnixMillis(self.now.0 + self.rng.below(2_000)),
            95..=97 => {
                // A forward jump past leases, sometimes past response retention.
                self.now = UnixMillis(self.now.0 + self.rng.below(40_000));
                self.count("clock-jump-forward");
            }
            _ => {
                self.now = UnixMillis(self.now.0.saturating_sub(self.rng.below(20_000)));
                self.count("clock-jump-back");
            }
        }
        if self.rng.chance(5) {
            self.store.sweep(self.now);
        }
        self.check_leases();
    }

    fn send(&mut self) {
        let i = self.rng.below(self.logical.len() as u64) as usize;
        // Clients retry pending requests, repeat finished ones (duplicates after a lost
        // response look the same to the server), and sometimes misuse a key with a changed
        // payload.
        let misuse = self.rng.chance(5);
        let payload = if misuse {
            format!("{{\"amount\":{}}}", 1000 + self.rng.below(1000))
        } else {
            self.logical[i].payload.clone()
        };
        let key = self.logical[i].key.clone();
        let fp = Sim::fingerprint(&payload);
        let nonce = self.rng.next();
        let pre = self.store.get(&key).cloned();
        let ticket = Ticket {
            key: key.clone(),
            fingerprint: fp,
            subject: Subject::Record,
        };
        let mut req = self.policy.resume(ticket, nonce);
        let claim = common::claim(&mut req, &mut self.store, self.now).unwrap();
        let now = self.now;
        let truth = self.truth.entry(key.clone()).or_default();
        if truth.payload.is_some() && pre.as_ref().is_none_or(|r| now >= r.key_expires) {
            // The record is no longer retained. That may only happen through expiry: the
            // key's time has come (perhaps before a backward clock jump).
            assert!(
                self.max_now >= truth.key_expires,
                "IDEM-TTL-2: a record vanished before its key expired"
            );
            *truth = KeyTruth {
                incarnation: truth.incarnation + 1,
                ..Default::default()
            };
        }
        match claim {
            Claimed::Execute { recovered, .. } => {
                let lease = common::lease(&req);
                if let Some(p) = &truth.payload {
                    assert_eq!(p, &payload, "IDEM-FP-1: a mismatched payload executed");
                }
                if !recovered {
                    assert_eq!(
                        truth.effects, 0,
                        "IDEM-EXEC-1: a fresh claim on a key whose effect is retained"
                    );
                }
                assert!(lease.fence > 0);
                truth.max_fence = truth.max_fence.max(lease.fence);
                truth.payload = Some(payload.clone());
                truth.key_expires = lease.key_expires;
                let lease_ms = self.policy.engine().config().lease.as_millis() as u64;
                let key_ms = self.policy.engine().config().key_ttl.as_millis() as u64;
                let heartbeats = self.rng.chance(self.heartbeat_percent);
                // Most handlers finish inside the lease; some are slow enough to be zombies;
                // those that send heartbeats outlast the key retention several times.
                let duration = if heartbeats {
                    key_ms * 3
                } else if self.rng.chance(10) {
                    lease_ms + self.rng.below(lease_ms)
                } else {
                    self.rng.below(lease_ms / 2)
                };
                let crash = self.rng.chance(8);
                let lose_response = self.rng.chance(15);
                let incarnation = truth.incarnation;
                self.handlers.push(Handler {
                    incarnation,
                    logical: i,
                    req,
                    lease,
                    recovered,
                    payload,
                    effect_done: false,
                    finish_at: UnixMillis(now.0 + duration),
                    crash,
                    lose_response,
                    heartbeats,
                });
                self.count(if recovered { "took-over" } else { "executed" });
            }
            Claimed::Done(Decision::Replay(response)) => {
                let stored = truth
                    .stored
                    .as_ref()
                    .expect("IDEM-REPLAY-1: replay of a response never stored");
                assert_eq!(
                    &*response, stored,
                    "IDEM-REPLAY-1: replay differs from what was stored"
                );
                let body = String::from_utf8(response.body.clone()).unwrap();
                assert!(
                    body.starts_with(&format!("{}|{}|", key.scope.as_str(), key.key)),
                    "IDEM-SCOPE-1: replayed another scope's response: {body}"
                );
                assert_eq!(
                    truth.payload.as_deref(),
                    Some(payload.as_str()),
                    "IDEM-FP-1: replayed for another payload"
                );
                if !misuse {
                    self.logical[i].done = true;
                }
                self.count("replayed");
            }
            Claimed::Done(Decision::Mismatch { differing, .. }) => {
                assert_ne!(
                    truth.payload.as_deref(),
                    Some(payload.as_str()),
                    "mismatch reported for the same payload"
                );
                assert_eq!(differing, vec!["amount".to_string()]);
                self.count("mismatch");
            }
            Claimed::Done(Decision::InProgress { retry_after_secs }) => {
                assert!(retry_after_secs >= 1);
                self.count("in-progress");
            }
            Claimed::Done(Decision::Rejected(RejectReason::KeyExpired)) => {
                assert!(
                    truth.stored.is_some(),
                    "IDEM-TTL-3: tombstone for a key that never completed"
                );
                self.count("tombstone-hit");
            }
            Claimed::Done(other) => panic!("unexpected decision {other:?}"),
        }
    }

    fn progress_handler(&mut self) {
        if self.handlers.is_empty() {
            return;
        }
        let h = self.rng.below(self.handlers.len() as u64) as usize;
        let handler = &mut self.handlers[h];
        let truth = self.truth.get_mut(&handler.lease.key).unwrap();
        if handler.incarnation != truth.incarnation {
            // A handler from a previous incarnation of the key (a zombie that outlived the
            // key itself): whatever it does belongs to that request, and it must not be able
            // to complete the new one.
            let mut handler = self.handlers.swap_remove(h);
            let response = StoredResponse {
                status: 200,
                headers: vec![],
                body: b"ancient".to_vec(),
            };
            let finish = common::finish(
                &mut handler.req,
                &mut self.store,
                self.now,
                Outcome::Final(response),
            )
            .unwrap();
            assert_eq!(
                finish,
                Finish::FencedOut,
                "IDEM-STORE-2: a lease from an expired record completed a new one"
            );
            self.count("ancient-zombie");
            return;
        }
        if handler.heartbeats && handler.effect_done && self.now < handler.finish_at {
            // A long handler keeps its lease alive, through its request's machine.
            let heartbeat = common::heartbeat(&mut handler.req, &mut self.store, self.now).unwrap();
            if let Heartbeat::Extended(_) = heartbeat {
                let lease = common::lease(&handler.req);
                truth.key_expires = truth.key_expires.max(lease.key_expires);
                handler.lease = lease;
                self.count("extended");
            }
            return;
        }
        if !handler.effect_done {
            // Reconcile when recovering; act through the fenced resource.
            if handler.lease.fence < truth.max_fence {
                // Fenced out at the resource: this handler can only fail now.
            } else if handler.recovered && truth.effects > 0 {
                // The earlier attempt already acted; adopt its effect.
            } else {
                truth.effects += 1;
                assert!(
                    truth.effects <= 1,
                    "IDEM-EXEC-1: the side effect ran twice for {:?}",
                    handler.lease.key
                );
            }
            handler.effect_done = true;
            if self.rng.chance(50) {
                return; // finish later
            }
        }
        if self.now < handler.finish_at && !self.rng.chance(10) {
            return;
        }
        let mut handler = self.handlers.swap_remove(h);
        if handler.crash {
            self.count("crashed");
            return;
        }
        let key = handler.lease.key.clone();
        let response = StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: format!(
                "{}|{}|{}|fence={}",
                key.scope.as_str(),
                key.key,
                handler.payload,
                handler.lease.fence
            )
            .into_bytes(),
        };
        let (outcome, response) = match self.rng.below(10) {
            0 => {
                let failed = StoredResponse {
                    status: 502,
                    ..response
                };
                (Outcome::Unknown(Some(failed.clone())), failed)
            }
            _ => (Outcome::Final(response.clone()), response),
        };
        let before = self.store.get(&key).cloned();
        let finish = common::finish(&mut handler.req, &mut self.store, self.now, outcome).unwrap();
        let truth = self.truth.get_mut(&key).unwrap();
        match finish {
            Finish::Stored => {
                assert_eq!(
                    handler.lease.fence, truth.max_fence,
                    "IDEM-LEASE-2: a stale lease stored its response"
                );
                assert!(
                    truth.stored.is_none() || self.now >= truth.key_expires,
                    "IDEM-REPLAY-1: a stored response was replaced"
                );
                truth.stored = Some(response);
                truth.key_expires = self.store.get(&key).unwrap().key_expires;
                if !handler.lose_response {
                    self.logical[handler.logical].done = true;
                }
                self.count("stored");
            }
            Finish::FencedOut => {
                // The store may have applied expiry on the way (IDEM-TTL-4); nothing else.
                let after = self.store.get(&key).cloned();
                let expired = before.as_ref().and_then(|r| match r.expire(self.now) {
                    Expiry::Keep(_) => None,
                    Expiry::Tombstone(t) => Some(Some(t)),
                    Expiry::Delete => Some(None),
                });
                assert!(
                    after == before || Some(&after) == expired.as_ref(),
                    "IDEM-LEASE-2: a fenced-out completion changed the record"
                );
                self.count("fenced-out");
            }
            Finish::OutcomeUnknown => self.count("outcome-unknown"),
            other => panic!("unexpected finish {other:?}"),
        }
    }
}

fn config() -> Config {
    Config {
        response_ttl: Duration::from_secs(60),
        key_ttl: Duration::from_secs(300),
        lease: Duration::from_secs(5),
        unknown_outcome: UnknownOutcomePolicy::Reexecute,
        max_retry_after: DEFAULT_MAX_RETRY_AFTER,
    }
}

#[test]
fn many_clients_under_faults() {
    let mut totals: HashMap<&'static str, u64> = HashMap::new();
    for seed in 0..40 {
        let mut sim = Sim::new(seed, config(), 20, 4);
        for _ in 0..3_000 {
            sim.step();
        }
        for (k, v) in sim.stats {
            *totals.entry(k).or_default() += v;
        }
    }
    // The faults the simulation exists for actually happened.
    for what in [
        "executed",
        "took-over",
        "replayed",
        "in-progress",
        "mismatch",
        "fenced-out",
        "crashed",
        "stored",
        "tombstone-hit",
        "clock-jump-back",
        "clock-jump-forward",
        "outcome-unknown",
    ] {
        assert!(
            totals.get(what).copied().unwrap_or(0) > 0,
            "no {what} in the whole simulation: {totals:?}"
        );
    }
}

#[test]
fn long_handlers_with_heartbeats_keep_their_keys() {
    // IDEM-LEASE-3 IDEM-LEASE-4 IDEM-STORE-3: the key retention is only twice the lease, and
    // a fifth of the handlers run for three key retentions on heartbeats.
    let mut totals: HashMap<&'static str, u64> = HashMap::new();
    for seed in 200..230 {
        let mut sim = Sim::new(
            seed,
            Config {
                response_ttl: Duration::from_secs(10),
                key_ttl: Duration::from_secs(10),
                lease: Duration::from_secs(5),
                unknown_outcome: UnknownOutcomePolicy::Reexecute,
                max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            },
            6,
            2,
        );
        sim.heartbeat_percent = 20;
        for _ in 0..3_000 {
            sim.step();
        }
        for (k, v) in sim.stats {
            *totals.entry(k).or_default() += v;
        }
    }
    for what in ["extended", "stored", "in-progress", "took-over"] {
        assert!(
            totals.get(what).copied().unwrap_or(0) > 0,
            "no {what} in the whole simulation: {totals:?}"
        );
    }
}

#[test]
fn store_policy_never_replays_across_scopes_or_payloads() {
    for seed in 100..120 {
        let mut sim = Sim::new(
            seed,
            Config {
                unknown_outcome: UnknownOutcomePolicy::Store,
                ..config()
            },
            10,
            3,
        );
        for _ in 0..3_000 {
            sim.step();
        }
    }
}

#[test]
fn runs_are_reproducible() {
    // IDEM-CORE-1: the same seed gives the same history.
    let run = |seed| {
        let mut sim = Sim::new(seed, config(), 5, 2);
        for _ in 0..2_000 {
            sim.step();
        }
        let mut stats: Vec<_> = sim.stats.into_iter().collect();
        stats.sort();
        (stats, sim.store.stats())
    };
    assert_eq!(run(7), run(7));
}
